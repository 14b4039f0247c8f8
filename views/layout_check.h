// Layout checks: every text a figure paints, where it lands, and which of it
// is cut or overlaps other text. A figure is painted into a recording paint
// device exactly as an export paints it (same page geometry, same DPI), so the
// rectangles are the ones a PNG, SVG or PDF would show. The layout test runs
// every view through it at window and paper sizes; `kvscope export
// --check-layout` runs one.
#pragma once

#include <QRectF>
#include <QString>
#include <vector>

#include "views/figure.h"

namespace kvscope::views {

struct DrawnText {
  QString text;
  QRectF rect;           // on the page, logical pixels (96 per inch)
  bool clipped = false;  // cut by the painter's clip or the page edge
  bool elided = false;   // shortened with an ellipsis to fit
};

struct LayoutReport {
  std::vector<DrawnText> texts;
  std::vector<QString> problems;  // "clipped: 'kv head' at (x, y, w, h)", "overlap: ..."
  bool ok() const { return problems.empty(); }
};

// Paints `figure` on a page of `options` and checks its text: nothing
// clipped by a clip rectangle or the page, no two texts overlapping by more
// than `tolerance` logical pixels in both directions.
LayoutReport check_layout(const Figure& figure, const ExportOptions& options,
                          double tolerance = 1.0);

}  // namespace kvscope::views
