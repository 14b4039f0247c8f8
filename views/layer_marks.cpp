#include "views/layer_marks.h"

#include <map>

#include "views/colormap.h"

namespace kvscope::views {

void paint_window_bar(QPainter& p, double right, double top, double bottom) {
  p.fillRect(QRectF(right + 2, top, 3, std::max(1.0, bottom - top)), palette::kSky);
}

QString window_layers_caption(const std::vector<int64_t>& windows) {
  std::map<int64_t, int> count;
  for (int64_t w : windows)
    if (w > 0) ++count[w];
  if (count.empty()) return "";
  QString out = "blue bar: window ";
  bool first = true;
  for (const auto& [w, n] : count) {
    out += (first ? "" : ", ") + QString("%1 on %2/%3 layers").arg(w).arg(n).arg(windows.size());
    first = false;
  }
  return out;
}

}  // namespace kvscope::views
