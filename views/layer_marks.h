// What the layer-grid views (overview, head budgets) share about the layers'
// types (/run layer_window): a sky-blue bar right of each sliding-window
// layer's row, and the caption that names what the bar means.
#pragma once

#include <QPainter>
#include <QRectF>
#include <QString>
#include <cstdint>
#include <vector>

namespace kvscope::views {

// The bar beside row [top, bottom) of a grid whose right edge is `right`:
// 3 px wide, 2 px off the grid (the colour bars sit 8 px or more away).
void paint_window_bar(QPainter& p, double right, double top, double bottom);
// "blue bar: window 4096 on 20/28 layers", or "" when every layer is global.
QString window_layers_caption(const std::vector<int64_t>& windows);
inline bool is_window_row(const std::vector<int64_t>& windows, int64_t l) {
  return l >= 0 && size_t(l) < windows.size() && windows[size_t(l)] > 0;
}

}  // namespace kvscope::views
