#include "views/colormap.h"

#include <QFile>
#include <QTextStream>
#include <algorithm>
#include <cmath>
#include <stdexcept>

static void kvscope_init_resources() {
  Q_INIT_RESOURCE(kvscope_views);
}

namespace kvscope::views {

namespace {

const char* kFiles[] = {"viridis", "magma", "cividis", "grey"};

std::array<QRgb, 256> load_map(const char* name) {
  kvscope_init_resources();
  QFile f(QString(":/kvscope/colormaps/%1.csv").arg(name));
  if (!f.open(QIODevice::ReadOnly))
    throw std::runtime_error(std::string("colour map resource missing: ") + name);
  std::array<QRgb, 256> lut{};
  QTextStream in(&f);
  int i = 0;
  while (!in.atEnd() && i < 256) {
    QString line = in.readLine().trimmed();
    if (line.isEmpty() || line.startsWith('#')) continue;
    QStringList rgb = line.split(',');
    if (rgb.size() != 3) throw std::runtime_error(std::string("bad colour map row in ") + name);
    lut[size_t(i++)] = qRgb(rgb[0].toInt(), rgb[1].toInt(), rgb[2].toInt());
  }
  if (i != 256) throw std::runtime_error(std::string("colour map needs 256 rows: ") + name);
  return lut;
}

}  // namespace

QStringList color_map_names() {
  return {"viridis", "magma", "cividis", "grey"};
}

ColorMapId color_map_from_name(const QString& name) {
  int i = color_map_names().indexOf(name.toLower());
  return i < 0 ? ColorMapId::Viridis : static_cast<ColorMapId>(i);
}

QString color_map_name(ColorMapId id) {
  return color_map_names()[int(id)];
}

const std::array<QRgb, 256>& color_map(ColorMapId id) {
  static const std::array<std::array<QRgb, 256>, 4> maps = {
      load_map(kFiles[0]), load_map(kFiles[1]), load_map(kFiles[2]), load_map(kFiles[3])};
  return maps[size_t(id)];
}

float ColorScale::position(float v) const {
  if (std::isnan(v)) return NAN;
  if (log) {
    float a = std::log10(std::max(lo, 1e-12f)), b = std::log10(std::max(hi, 1e-12f));
    float x = std::log10(std::max(v, 1e-12f));
    return b > a ? std::clamp((x - a) / (b - a), 0.f, 1.f) : 0.f;
  }
  return hi > lo ? std::clamp((v - lo) / (hi - lo), 0.f, 1.f) : 0.f;
}

QRgb ColorScale::color(float v) const {
  float x = position(v);
  if (std::isnan(x)) return qRgba(0, 0, 0, 0);
  return color_map(map)[size_t(std::lround(x * 255.f))];
}

ColorScale ColorScale::fit(const std::vector<float>& values, ColorMapId map, bool log) {
  ColorScale s;
  s.map = map;
  s.log = log;
  float hi = 0.f, lo_pos = INFINITY;
  for (float v : values) {
    if (!(v == v)) continue;
    hi = std::max(hi, v);
    if (v > 0) lo_pos = std::min(lo_pos, v);
  }
  s.hi = hi > 0 ? hi : 1.f;
  s.lo = log ? (std::isfinite(lo_pos) ? std::max(lo_pos, s.hi * 1e-4f) : s.hi * 1e-4f) : 0.f;
  return s;
}

QColor palette::tier(int r) {
  static const QColor tiers[] = {kBlue, kSky, kPurple, kGreen};
  return tiers[std::clamp(r, 0, 3)];
}

QImage colorize(const std::vector<float>& values, int rows, int cols, const ColorScale& scale) {
  QImage img(std::max(1, cols), std::max(1, rows), QImage::Format_ARGB32);
  img.fill(Qt::transparent);
  if (int64_t(values.size()) < int64_t(rows) * cols) return img;
  const auto& lut = color_map(scale.map);
  // Hoist the scale's constants out of the per-pixel loop.
  const bool log = scale.log;
  const float a = log ? std::log10(std::max(scale.lo, 1e-12f)) : scale.lo;
  const float b = log ? std::log10(std::max(scale.hi, 1e-12f)) : scale.hi;
  const float inv = b > a ? 255.f / (b - a) : 0.f;
  for (int r = 0; r < rows; ++r) {
    QRgb* line = reinterpret_cast<QRgb*>(img.scanLine(r));
    const float* v = values.data() + int64_t(r) * cols;
    for (int c = 0; c < cols; ++c) {
      float x = v[c];
      if (x != x) continue;
      // Log scale: zero means "no attention here" (e.g. above the causal
      // diagonal) and stays transparent instead of the darkest colour.
      if (log) {
        if (x <= 0.f) continue;
        x = std::log10(x);
      }
      float p = std::clamp((x - a) * inv, 0.f, 255.f);
      line[c] = lut[size_t(p + 0.5f)];
    }
  }
  return img;
}

}  // namespace kvscope::views
