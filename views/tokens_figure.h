// Token text: the prompt and the output laid out as text, each token
// coloured by how many heads still hold it at the current step (all heads,
// or the current layer's), by whether the current head holds it, or by its
// gate score. Hover tells the per-head status; a click selects the token.
//
// Token history: for the selected token, every head's admission, tier moves
// and eviction over the steps, with the current head's score samples.
#pragma once

#include <QFont>
#include <memory>
#include <vector>

#include "views/current_state.h"
#include "views/figure.h"
#include "views/legend.h"
#include "views/trace_data.h"

namespace kvscope::views {

enum class TokenColoring { AllHeads, Layer, Head, Score };

class TokensFigure : public Figure {
 public:
  static std::shared_ptr<TokensFigure> load(TraceData& data, const Selection& sel,
                                            TokenColoring coloring);
  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  void write_csv(QTextStream& out) const override;

  // Layout for a width; token_at / height use the last layout.
  double content_height(double width) const;
  int64_t token_at(const QRectF& area, const QPointF& point) const;
  QString tooltip(int64_t token) const;
  double value(int64_t token) const;  // 0..1 colour position (NaN: no value)

  TokenColoring coloring = TokenColoring::AllHeads;
  int layer = 0, kv_head = 0;
  int64_t step = 0, layers = 0, kv_heads = 0;
  double scroll = 0;  // pixels scrolled from the top
  std::vector<int64_t> selected;
  std::vector<QString> text;
  std::vector<uint8_t> role;
  std::vector<int32_t> fed_step;
  std::vector<uint8_t> held;  // L*K*T at the step
  std::vector<float> score;   // gate 0 at the current head (may be empty)
  QString gate_name;

  // The token text's area: under the title and the key of token styles.
  QRectF body(const QRectF& area) const;

 private:
  void layout(double width, QPaintDevice* device) const;
  std::vector<LegendEntry> key() const;
  mutable double layout_width_ = -1;
  mutable int layout_dpi_ = -1;
  mutable std::vector<QRectF> boxes_;  // per token, in content coordinates
  mutable double height_ = 0;
};

class TokenHistoryFigure : public Figure {
 public:
  static std::shared_ptr<TokenHistoryFigure> load(TraceData& data, const Selection& sel);
  QString title() const override;
  void paint(QPainter& p, const QRectF& area) const override;
  void write_csv(QTextStream& out) const override;

  int64_t token = -1, n_steps = 0, layers = 0, kv_heads = 0, step = 0, fed_step = 0;
  int layer = 0, kv_head = 0;
  QString token_text;
  std::vector<int32_t> admit, evict;                    // per head (L*K)
  std::vector<std::vector<trace::TierInterval>> tiers;  // per head (tiered traces)
  std::vector<QString> tier_names;
  std::vector<float> gate_value;  // per head, first gate
  QString gate_name;
  std::vector<std::pair<int32_t, float>> samples;  // (step, value) at the current head
  QString sample_gate;
};

}  // namespace kvscope::views
