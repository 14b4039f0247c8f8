// Compare two traces of the same prompt (A = current, B = compared): per
// head, tokens kept by A and not B and the reverse at the current step; for
// the current head a token strip of who holds what; a focus span (the
// selected tokens, else A's needle) followed over the steps — per head, the
// share of it held by A and not B (or B and not A), and the attention A and
// B put on it at each decode step; survival and budget of A and B overlaid.
#pragma once

#include <memory>
#include <vector>

#include "core/analysis/survival.h"
#include "core/analysis/trace_diff.h"
#include "views/current_state.h"
#include "views/figure.h"
#include "views/task_marks.h"
#include "views/trace_data.h"

namespace kvscope::views {

class CompareFigure : public Figure {
 public:
  // Throws InputError when the traces are not comparable.
  static std::shared_ptr<CompareFigure> load(TraceData& a, TraceData& b, const Selection& sel);
  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  void write_csv(QTextStream& out) const override;

  QString name_a, name_b;
  int layer = 0, kv_head = 0;
  int64_t shared_tokens = 0;  // same token ids in both: only these are compared
  int64_t step_a = 0, step_b = 0, layers = 0, kv_heads = 0, steps_a = 0, steps_b = 0;
  std::vector<analysis::HeadDiffCounts> heads;  // L*K
  std::vector<uint8_t> tokens;                  // TokenDiff per token, current head
  analysis::SurvivalCurve survival_a, survival_b;
  std::vector<int64_t> budget_a, budget_b;  // current head's entries per step
  // The focus span: sorted token indices and what they are ("needle",
  // "selection"; empty: no span).
  std::vector<int64_t> span;
  QString span_name;
  analysis::SpanDiff span_diff;                  // over A's steps
  std::vector<double> span_mass_a, span_mass_b;  // per step of A, NaN before decode
  int64_t answer_step = -1;                      // A's first decode step

 private:
  void paint_heads(QPainter& p, const QRectF& r) const;
  void paint_tokens(QPainter& p, const QRectF& r) const;
  void paint_budget(QPainter& p, const QRectF& r) const;
  void paint_diff_bar(QPainter& p, const QRectF& r) const;
  void paint_span_heads(QPainter& p, const QRectF& r) const;
  void paint_span_mass(QPainter& p, const QRectF& r) const;

 public:
  TaskSpans spans;  // needle and question tokens of A
};

}  // namespace kvscope::views
