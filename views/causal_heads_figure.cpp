#include "views/causal_heads_figure.h"

#include <QTextStream>
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "core/analysis/causal_search.h"
#include "views/colormap.h"

namespace kvscope::views {

namespace {

// "L.H" items of a causal_set as head indices l * K + h.
std::vector<int64_t> set_heads(const std::string& set, int64_t K) {
  std::vector<int64_t> out;
  std::istringstream in(set);
  std::string item;
  int64_t layer = 0, kv_head = 0;
  while (in >> item)  // a damaged table's item counts for no head
    if (analysis::parse_head_name(item, &layer, &kv_head)) out.push_back(layer * K + kv_head);
  return out;
}

const QColor kEmpty{236, 236, 236};

}  // namespace

CausalHeadsFigure::CausalHeadsFigure(QString name, std::vector<sweep::ResultRow> rows,
                                     SweepMetric metric)
    : SweepResultsFigure(std::move(name), std::move(rows), metric) {
  for (const sweep::ResultRow& r : rows_)
    if (r.causal_set_size && r.n_kv_heads && r.n_heads && *r.n_kv_heads > 0) {
      K_ = *r.n_kv_heads;
      L_ = *r.n_heads / K_;
      break;
    }
  if (K_ == 0) return;
  std::set<std::string> models;
  for (const sweep::ResultRow& r : rows_) models.insert(r.model);
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < rows_.size(); ++i) {
    const sweep::ResultRow& r = rows_[i];
    if (!r.causal_set_size || r.n_kv_heads.value_or(0) != K_ || r.n_heads.value_or(0) != L_ * K_)
      continue;
    std::string policy = sweep::press_of(r);
    if (models.size() > 1) policy = r.model.substr(r.model.find_last_of('/') + 1) + " · " + policy;
    auto [it, fresh] = index.emplace(policy, panels_.size());
    if (fresh) panels_.push_back({policy, {}, 0, 0, std::vector<int32_t>(size_t(L_ * K_), 0)});
    Panel& p = panels_[it->second];
    if (*r.causal_set_size < 0) {
      ++p.unrecoverable;
      continue;
    }
    p.searched.push_back(i);
    p.minimal += r.causal_minimal.value_or(0) == 1;
    for (int64_t h : set_heads(r.causal_set, K_))
      if (h >= 0 && h < L_ * K_) ++p.count[size_t(h)];
  }
}

QString CausalHeadsFigure::title() const {
  return QString("Sweep %1: heads whose losses cost the answer (causal search)").arg(name_);
}

QString CausalHeadsFigure::missing_data() const {
  return panels_.empty() ? "no cell of this table ran the causal search: add causal = true to the "
                           "plan (docs/causal.md)"
                         : QString();
}

CausalHeadsFigure::Layout CausalHeadsFigure::layout(const QRectF& area) const {
  Layout l;
  const size_t n = std::max<size_t>(1, panels_.size());
  const QRectF inner = area.adjusted(8, 40, -92, -8);
  // header: the policy and its counts; then the kv head ticks above the grid.
  const double gap = 56, header = 54, bottom = 40, left = 64;
  const double pw = (inner.width() - gap * double(n - 1) - left) / double(n);
  const double ph = inner.height() - header - bottom;
  l.cw = std::min(pw / double(std::max<int64_t>(1, K_)), 48.0);
  l.ch = std::max(1.0, ph / double(std::max<int64_t>(1, L_)));
  l.bar = QRectF(area.right() - 84, inner.top() + header, 10, std::max(40.0, ph));
  for (size_t i = 0; i < n; ++i) {
    const double x = inner.left() + left + double(i) * (pw + gap);
    // A header may run to the next panel's header (the last one to the colour bar).
    const double right = i + 1 < n ? x + pw + gap - 48 : l.bar.left() - 8;
    l.headers.push_back(QRectF(x - 40, inner.top(), right - (x - 40), 32));
    l.grids.push_back(QRectF(x, inner.top() + header, l.cw * double(K_), l.ch * double(L_)));
  }
  return l;
}

void CausalHeadsFigure::paint(QPainter& p, const QRectF& area) const {
  plot::title(p, QRectF(area.left(), area.top(), area.width(), 30), title());
  if (!missing_data().isEmpty())
    return plot::message(p, area.adjusted(8, 36, -8, -8), missing_data());
  const Layout l = layout(area);
  ColorScale cs;
  cs.map = ColorMapId::Magma;
  for (size_t i = 0; i < panels_.size(); ++i) {
    const Panel& panel = panels_[i];
    const QRectF& g = l.grids[i];
    const double n = double(panel.searched.size());
    for (int64_t h = 0; h < L_ * K_; ++h) {
      const QRectF cell(g.left() + double(h % K_) * l.cw, g.top() + double(h / K_) * l.ch, l.cw,
                        l.ch);
      const int32_t c = panel.count[size_t(h)];
      p.fillRect(cell.adjusted(0, 0, 0.3, 0.3), c == 0 ? kEmpty : QColor(cs.color(float(c / n))));
    }
    plot::axes(p, g, 0, double(K_), 0, double(L_), "kv head", i == 0 ? "layer" : "", true);
    p.setPen(Qt::black);
    p.setFont(plot::font(8.5, true));
    const QFontMetricsF fm(p.font());
    const QString head =
        fm.elidedText(QString::fromStdString(panel.policy), Qt::ElideMiddle, l.headers[i].width());
    p.drawText(l.headers[i], Qt::AlignLeft | Qt::AlignTop, head);
    p.setFont(plot::font(8));
    p.drawText(l.headers[i], Qt::AlignLeft | Qt::AlignBottom,
               fm.elidedText(QString("%1 misses searched, %2 minimal%3")
                                 .arg(panel.searched.size())
                                 .arg(panel.minimal)
                                 .arg(panel.unrecoverable
                                          ? QString(", %1 unrecoverable").arg(panel.unrecoverable)
                                          : QString()),
                             Qt::ElideRight, l.headers[i].width()));
  }
  plot::colorbar(p, l.bar, cs, "share of the sets");
}

bool CausalHeadsFigure::head_at(const QRectF& area, const QPointF& pt, size_t* panel,
                                int64_t* head) const {
  if (panels_.empty()) return false;
  const Layout l = layout(area);
  for (size_t i = 0; i < l.grids.size() && i < panels_.size(); ++i)
    if (l.grids[i].contains(pt)) {
      const int64_t k = std::min<int64_t>(K_ - 1, int64_t((pt.x() - l.grids[i].left()) / l.cw));
      const int64_t layer = std::min<int64_t>(L_ - 1, int64_t((pt.y() - l.grids[i].top()) / l.ch));
      *panel = i;
      *head = layer * K_ + k;
      return true;
    }
  return false;
}

bool CausalHeadsFigure::holds(const sweep::ResultRow& row, int64_t head) const {
  const std::vector<int64_t> heads = set_heads(row.causal_set, K_);
  return std::find(heads.begin(), heads.end(), head) != heads.end();
}

std::vector<const sweep::ResultRow*> CausalHeadsFigure::cell_at(const QRectF& area,
                                                                const QPointF& pt) const {
  size_t panel = 0;
  int64_t head = 0;
  std::vector<const sweep::ResultRow*> out;
  if (!head_at(area, pt, &panel, &head)) return out;
  for (size_t i : panels_[panel].searched)
    if (holds(rows_[i], head)) out.push_back(&rows_[i]);
  return out;
}

QRectF CausalHeadsFigure::cell_area(const QRectF& area, const std::string& cell_id) const {
  const Layout l = layout(area);
  for (size_t i = 0; i < panels_.size(); ++i)
    for (size_t r : panels_[i].searched)
      if (rows_[r].cell_id == cell_id) return l.grids[i];
  return {};
}

QString CausalHeadsFigure::tooltip(const QRectF& area, const QPointF& pt) const {
  size_t panel = 0;
  int64_t head = 0;
  if (!head_at(area, pt, &panel, &head)) return {};
  const Panel& p = panels_[panel];
  const std::vector<const sweep::ResultRow*> cells = cell_at(area, pt);
  return QString("%1\nlayer %2 kv head %3: in %4 of %5 minimal sets")
             .arg(QString::fromStdString(p.policy))
             .arg(head / K_)
             .arg(head % K_)
             .arg(p.count[size_t(head)])
             .arg(p.searched.size()) +
         describe_cells(cells, 4);
}

void CausalHeadsFigure::write_csv(QTextStream& out) const {
  out << "policy,layer,kv_head,in_sets,searched,share\n";
  for (const Panel& p : panels_)
    for (int64_t h = 0; h < L_ * K_; ++h) {
      const double n = double(p.searched.size());
      out << '"' << QString::fromStdString(p.policy) << "\"," << h / K_ << "," << h % K_ << ","
          << p.count[size_t(h)] << "," << p.searched.size() << ","
          << (n > 0 ? QString::number(p.count[size_t(h)] / n, 'g', 6) : QString()) << "\n";
    }
}

}  // namespace kvscope::views
