// Colour maps and scales shared by every view. The maps are perceptually
// uniform and colour-blind safe (viridis, magma, cividis; grey for print),
// loaded from resources/colormaps/*.csv compiled into the library.
#pragma once

#include <QColor>
#include <QImage>
#include <QString>
#include <QStringList>
#include <array>
#include <vector>

namespace kvscope::views {

enum class ColorMapId { Viridis = 0, Magma = 1, Cividis = 2, Grey = 3 };
QStringList color_map_names();
ColorMapId color_map_from_name(const QString& name);  // unknown names: Viridis
QString color_map_name(ColorMapId id);
const std::array<QRgb, 256>& color_map(ColorMapId id);

// Value -> colour: linear or log10 between lo and hi, clamped.
struct ColorScale {
  ColorMapId map = ColorMapId::Viridis;
  bool log = false;
  float lo = 0.f, hi = 1.f;

  // Position in [0, 1] of a value (NaN for NaN values).
  float position(float v) const;
  QRgb color(float v) const;
  // Picks lo/hi from data: linear 0..max, log from the smallest positive.
  static ColorScale fit(const std::vector<float>& values, ColorMapId map, bool log);
};

// Colour-blind-safe categorical colours (Okabe & Ito, 2008).
namespace palette {
inline const QColor kBlue{0, 114, 178};
inline const QColor kOrange{230, 159, 0};
inline const QColor kSky{86, 180, 233};
inline const QColor kGreen{0, 158, 115};
inline const QColor kVermillion{213, 94, 0};
inline const QColor kPurple{204, 121, 167};
inline const QColor kYellow{240, 228, 66};
inline const QColor kGrey{153, 153, 153};
inline const QColor kLightGrey{225, 225, 225};
// Tier r of a cache: hot, warm, cold, ...
QColor tier(int r);
}  // namespace palette

// A rows x cols image of values through a scale (one pixel per value).
QImage colorize(const std::vector<float>& values, int rows, int cols, const ColorScale& scale);

}  // namespace kvscope::views
