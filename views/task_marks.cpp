#include "views/task_marks.h"

#include <algorithm>

namespace kvscope::views {

namespace {

void append(std::vector<std::pair<int64_t, int64_t>>& spans, int64_t t) {
  if (!spans.empty() && spans.back().second == t)
    spans.back().second = t + 1;
  else
    spans.push_back({t, t + 1});
}

int64_t count(const std::vector<std::pair<int64_t, int64_t>>& spans) {
  int64_t n = 0;
  for (const auto& s : spans) n += s.second - s.first;
  return n;
}

}  // namespace

TaskSpans task_spans(const std::vector<trace::TokenRecord>& tokens) {
  TaskSpans out;
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t].role == trace::TokenRole::Needle) append(out.needle, int64_t(t));
    if (tokens[t].role == trace::TokenRole::Question) append(out.question, int64_t(t));
  }
  return out;
}

void paint_task_spans(QPainter& p, const QRectF& plot, const plot::Map& map, Qt::Orientation axis,
                      const TaskSpans& spans) {
  if (spans.empty()) return;
  p.save();
  p.setClipRect(plot);
  p.setPen(Qt::NoPen);
  const double depth = 5;
  auto band = [&](const std::vector<std::pair<int64_t, int64_t>>& list, const QColor& color) {
    for (const auto& [b, e] : list) {
      // At least 2 px: a one-token needle on a 4K axis stays visible.
      double a = map(double(b)), z = map(double(e));
      if (std::abs(z - a) < 2) z = a + (z >= a ? 2 : -2);
      QRectF r = axis == Qt::Horizontal
                     ? QRectF(QPointF(a, plot.bottom() - depth), QPointF(z, plot.bottom()))
                     : QRectF(QPointF(plot.left(), a), QPointF(plot.left() + depth, z));
      p.fillRect(r.normalized(), color);
    }
  };
  band(spans.question, kQuestionColor);
  band(spans.needle, kNeedleColor);
  p.restore();
}

StepRanges reconstruction_steps(const std::vector<trace::StepRecord>& steps) {
  StepRanges out;
  for (size_t s = 0; s < steps.size(); ++s) {
    if (steps[s].kind != trace::StepKind::Reconstruction) continue;
    if (!out.empty() && out.back().second == int64_t(s))
      out.back().second += 1;
    else
      out.push_back({int64_t(s), int64_t(s) + 1});
  }
  return out;
}

void paint_step_ranges(QPainter& p, const QRectF& plot, const plot::Map& map,
                       const StepRanges& ranges) {
  if (ranges.empty()) return;
  p.save();
  p.setClipRect(plot);
  for (const auto& [b, e] : ranges) {
    double a = map(double(b)), z = std::max(map(double(e)), a + 2);  // 2 px at least
    p.fillRect(QRectF(QPointF(a, plot.top()), QPointF(z, plot.top() + 5)), kReconstructionColor);
  }
  p.restore();
}

void add_reconstruction_legend(std::vector<LegendEntry>& out, const StepRanges& ranges) {
  int64_t n = 0;
  for (const auto& [b, e] : ranges) n += e - b;
  if (n > 0)
    out.push_back(
        legend_box(QString("context reconstruction (%1 step%2)").arg(n).arg(n == 1 ? "" : "s"),
                   kReconstructionColor));
}

void add_task_legend(std::vector<LegendEntry>& out, const TaskSpans& spans) {
  if (!spans.needle.empty())
    out.push_back(legend_box(QString("needle (%1 tokens)").arg(count(spans.needle)), kNeedleColor));
  if (!spans.question.empty()) out.push_back(legend_box("question", kQuestionColor));
}

std::vector<LegendEntry> task_legend_short(const TaskSpans& spans) {
  std::vector<LegendEntry> out;
  if (!spans.needle.empty()) out.push_back(legend_box("needle", kNeedleColor));
  if (!spans.question.empty()) out.push_back(legend_box("question", kQuestionColor));
  return out;
}

double legend_column_height(const std::vector<LegendEntry>& entries) {
  if (entries.empty()) return 0;
  return double(entries.size()) * legend_height({legend_box("x", Qt::black)}, 1000) + 8;
}

void paint_legend_column(QPainter& p, const QPointF& top_left, double width,
                         const std::vector<LegendEntry>& entries) {
  double y = top_left.y();
  for (const LegendEntry& e : entries) {
    double h = legend_height({e}, 1000);
    paint_legend_rows(p, QRectF(top_left.x(), y, width, h), {e});
    y += h;
  }
}

}  // namespace kvscope::views
