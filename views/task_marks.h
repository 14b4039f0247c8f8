// The task followed on every token axis: the needle and question spans of a
// retrieval task (the /tokens roles) as bands just inside a plot's token
// axis, in one colour each, with legend entries naming them. Heatmap,
// timeline, layers, compare and gates draw the same marks.
#pragma once

#include <QPainter>
#include <QRectF>
#include <utility>
#include <vector>

#include "core/trace/types.h"
#include "views/figure.h"
#include "views/legend.h"

namespace kvscope::views {

struct TaskSpans {
  std::vector<std::pair<int64_t, int64_t>> needle, question;  // [begin, end) token ranges
  bool empty() const { return needle.empty() && question.empty(); }
};
TaskSpans task_spans(const std::vector<trace::TokenRecord>& tokens);

inline const QColor kNeedleColor{213, 94, 0};       // vermillion
inline const QColor kQuestionColor{204, 121, 167};  // reddish purple

// Bands 5 px deep inside `plot` along its token axis: the bottom edge when
// tokens run along x (Qt::Horizontal), the left edge when along y. `map`
// takes a token index to pixels; tokens outside the plot are not drawn.
void paint_task_spans(QPainter& p, const QRectF& plot, const plot::Map& map, Qt::Orientation axis,
                      const TaskSpans& spans);
// "needle (N tokens)" and "question" entries for the spans present.
void add_task_legend(std::vector<LegendEntry>& out, const TaskSpans& spans);
// Short entries ("needle", "question") for a narrow column.
std::vector<LegendEntry> task_legend_short(const TaskSpans& spans);
// A figure with a colour bar keeps the bottom of the bar's column for a
// legend: the bar shortened by legend_column_height(), the entries under it,
// one per row.
double legend_column_height(const std::vector<LegendEntry>& entries);
void paint_legend_column(QPainter& p, const QPointF& top_left, double width,
                         const std::vector<LegendEntry>& entries);

// A policy's context-reconstruction steps (KVzip's scoring pass, step kind
// Reconstruction): [begin, end) step ranges, and how step axes mark them.
using StepRanges = std::vector<std::pair<int64_t, int64_t>>;
StepRanges reconstruction_steps(const std::vector<trace::StepRecord>& steps);
inline const QColor kReconstructionColor{117, 112, 179};  // slate purple
// A band 5 px deep inside `plot` along its top edge over the steps of
// `ranges` (`map`: steps to x).
void paint_step_ranges(QPainter& p, const QRectF& plot, const plot::Map& map,
                       const StepRanges& ranges);
// "context reconstruction (N steps)" when there are any.
void add_reconstruction_legend(std::vector<LegendEntry>& out, const StepRanges& ranges);

}  // namespace kvscope::views
