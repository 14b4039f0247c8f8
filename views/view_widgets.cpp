#include "views/view_widgets.h"

#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>
#include <QWheelEvent>
#include <algorithm>
#include <cmath>

namespace kvscope::views {

BudgetView::BudgetView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("budget", state, service, parent) {}

void BudgetView::set_series(int series) {
  series_ = series;
  reload();
}

std::function<std::shared_ptr<Figure>(TraceData&)> BudgetView::loader(const Selection& sel) {
  int s = series_;
  return [sel, s](TraceData& data) -> std::shared_ptr<Figure> {
    return BudgetFigure::load(data, sel, s);
  };
}

void BudgetView::mouseReleaseEvent(QMouseEvent* e) {
  auto* f = static_cast<BudgetFigure*>(figure_.get());
  if (!f) return;
  for (int l = 0; l < f->layers; ++l)
    for (int k = 0; k < f->kv_heads; ++k)
      if (f->grid_cell(area(), l, k).contains(e->position())) {
        const Selection& s = state_->selection();
        int group = int(std::max<int64_t>(1, s.n_heads / std::max<int64_t>(1, s.n_kv_heads)));
        state_->set_head(l, k * group, nullptr);
        return;
      }
}

SurvivalView::SurvivalView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("survival", state, service, parent) {}

void SurvivalView::set_horizon(int64_t h) {
  horizon_ = h;
  reload();
}

std::function<std::shared_ptr<Figure>(TraceData&)> SurvivalView::loader(const Selection& sel) {
  int64_t h = horizon_;
  return [sel, h](TraceData& data) -> std::shared_ptr<Figure> {
    return SurvivalFigure::load(data, sel, h);
  };
}

GatesView::GatesView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("gates", state, service, parent) {}

void GatesView::set_gate(int gate) {
  gate_ = gate;
  reload();
}

std::function<std::shared_ptr<Figure>(TraceData&)> GatesView::loader(const Selection& sel) {
  int g = gate_;
  return [sel, g](TraceData& data) -> std::shared_ptr<Figure> {
    return GatesFigure::load(data, sel, g);
  };
}

CutoffView::CutoffView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("cutoff", state, service, parent) {}

void CutoffView::set_series(int series) {
  series_ = series;
  reload();
}

void CutoffView::follow(const Selection& sel) {
  if (CutoffFigure* f = cutoff()) {
    f->step = std::clamp<int64_t>(sel.step, 0, std::max<int64_t>(0, f->n_steps - 1));
    f->selected_token = sel.token();
    update();
  }
}

void CutoffView::state_changed(const Selection& sel, uint32_t changes) {
  if (changes & (kStepChanged | kTokensChanged)) follow(sel);
  FigureWidget::state_changed(sel, changes);
}

void CutoffView::adopt(std::shared_ptr<Figure>) {
  // The step may have moved while the figure loaded (no reload for that).
  follow(state_->selection());
}

std::function<std::shared_ptr<Figure>(TraceData&)> CutoffView::loader(const Selection& sel) {
  int s = series_;
  return [sel, s](TraceData& data) -> std::shared_ptr<Figure> {
    return CutoffFigure::load(data, sel, s);
  };
}

void CutoffView::click_at(const QPointF& point) {
  CutoffFigure* f = cutoff();
  if (!f || f->series < 0) return;
  int64_t i = f->decision_at(area(), point);
  if (i >= 0) {
    const CutoffFigure::Decision& d = f->decisions[size_t(i)];
    f->selected_token = d.token;
    f->step = d.step;
    update();
    state_->set_tokens({int64_t(d.token)}, this);
    state_->set_step(d.step, this);
    return;
  }
  QRectF plot = f->layout(area()).plot;
  if (!plot.contains(point) || f->n_steps == 0) return;
  f->step = std::clamp<int64_t>(std::llround(f->x_map(plot).inverse(point.x())), 0, f->n_steps - 1);
  update();
  state_->set_step(f->step, this);
}

void CutoffView::mouseReleaseEvent(QMouseEvent* e) {
  click_at(e->position());
}

ForecastView::ForecastView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("forecast", state, service, parent) {}

void ForecastView::set_gate(int gate) {
  gate_ = gate;
  reload();
}

void ForecastView::follow(const Selection& sel) {
  if (ForecastFigure* f = forecast()) {
    f->step = std::clamp<int64_t>(sel.step, 0, std::max<int64_t>(0, f->n_steps - 1));
    update();
  }
}

void ForecastView::state_changed(const Selection& sel, uint32_t changes) {
  if (changes & kStepChanged) follow(sel);
  FigureWidget::state_changed(sel, changes);
}

void ForecastView::adopt(std::shared_ptr<Figure>) {
  // The step may have moved while the figure loaded (no reload for that).
  follow(state_->selection());
}

std::function<std::shared_ptr<Figure>(TraceData&)> ForecastView::loader(const Selection& sel) {
  int g = gate_;
  return [sel, g](TraceData& data) -> std::shared_ptr<Figure> {
    return ForecastFigure::load(data, sel, g);
  };
}

void ForecastView::click_at(const QPointF& point) {
  ForecastFigure* f = forecast();
  if (!f || f->token < 0) return;
  int64_t s = f->step_at(area(), point);
  if (s < 0) return;
  f->step = s;
  update();
  state_->set_step(s, this);
}

void ForecastView::mouseReleaseEvent(QMouseEvent* e) {
  click_at(e->position());
}

TokensView::TokensView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("tokens", state, service, parent) {
  setMouseTracking(true);
}

void TokensView::set_coloring(TokenColoring c) {
  coloring_ = c;
  reload();
}

void TokensView::state_changed(const Selection& sel, uint32_t changes) {
  // A selection made elsewhere only moves the highlight: no reload.
  if ((changes & kTokensChanged) && tokens()) {
    tokens()->selected = sel.tokens;
    if (!sel.tokens.empty()) scroll_to_token(sel.tokens.front());
    update();
  }
  FigureWidget::state_changed(sel, changes);
}

std::function<std::shared_ptr<Figure>(TraceData&)> TokensView::loader(const Selection& sel) {
  TokenColoring c = coloring_;
  return [sel, c](TraceData& data) -> std::shared_ptr<Figure> {
    return TokensFigure::load(data, sel, c);
  };
}

void TokensView::adopt(std::shared_ptr<Figure> previous) {
  auto* old = dynamic_cast<TokensFigure*>(previous.get());
  if (!tokens()) return;
  if (old) {
    tokens()->scroll = old->scroll;
  } else if (!state_->selection().tokens.empty()) {
    // Tokens selected before the first figure arrived (Go to needle as a
    // trace opens): show them.
    scroll_to_token(state_->selection().tokens.front());
  }
}

void TokensView::scroll_to_token(int64_t token) {
  TokensFigure* f = tokens();
  if (!f || token < 0) return;
  double h = f->content_height(width());
  // Binary search is inside token_at; here a coarse estimate by proportion
  // is refined by scanning the layout through token_at from the top.
  double visible = f->body(area()).height();
  double y = h * double(token) / double(std::max<size_t>(1, f->text.size()));
  if (y < f->scroll || y > f->scroll + visible) f->scroll = std::max(0.0, y - visible / 2);
  update();
}

void TokensView::wheelEvent(QWheelEvent* e) {
  TokensFigure* f = tokens();
  if (!f) return;
  double max_scroll = std::max(0.0, f->content_height(width()) - f->body(area()).height());
  f->scroll = std::clamp(f->scroll - e->angleDelta().y() / 120.0 * 54, 0.0, max_scroll);
  update();
}

void TokensView::mouseMoveEvent(QMouseEvent* e) {
  TokensFigure* f = tokens();
  if (!f) return;
  int64_t t = f->token_at(area(), e->position());
  if (t >= 0) QToolTip::showText(e->globalPosition().toPoint(), f->tooltip(t), this);
}

void TokensView::mouseReleaseEvent(QMouseEvent* e) {
  TokensFigure* f = tokens();
  if (!f) return;
  int64_t t = f->token_at(area(), e->position());
  if (t < 0) return;
  std::vector<int64_t> sel = {t};
  if (e->modifiers() & Qt::ControlModifier) {  // extend the selection
    sel = f->selected;
    sel.push_back(t);
  }
  f->selected = sel;
  std::sort(f->selected.begin(), f->selected.end());
  update();
  state_->set_tokens(sel, this);
}

HistoryView::HistoryView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("history", state, service, parent) {}

std::function<std::shared_ptr<Figure>(TraceData&)> HistoryView::loader(const Selection& sel) {
  return [sel](TraceData& data) -> std::shared_ptr<Figure> {
    return TokenHistoryFigure::load(data, sel);
  };
}

NeedleView::NeedleView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("needle", state, service, parent) {}

void NeedleView::state_changed(const Selection& sel, uint32_t changes) {
  FigureWidget::state_changed(sel, changes);
  auto* f = dynamic_cast<NeedleFigure*>(figure_.get());
  if (f && (changes & (kStepChanged | kHeadChanged))) {
    f->step = std::clamp<int64_t>(sel.step, 0, std::max<int64_t>(0, f->n_steps - 1));
    f->layer = sel.layer;
    f->kv_head = sel.kv_head();
    update();
  }
}

std::function<std::shared_ptr<Figure>(TraceData&)> NeedleView::loader(const Selection& sel) {
  return [sel](TraceData& data) -> std::shared_ptr<Figure> {
    TraceData* compare = sel.compare.empty() ? nullptr : &data.peer(sel.compare);
    return NeedleFigure::load(data, compare, sel);
  };
}

CompareView::CompareView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("compare", state, service, parent) {}

void CompareView::state_changed(const Selection& sel, uint32_t changes) {
  if (sel.compare.empty()) {
    figure_.reset();
    update();
    return;
  }
  FigureWidget::state_changed(sel, changes);
}

std::function<std::shared_ptr<Figure>(TraceData&)> CompareView::loader(const Selection& sel) {
  return [sel](TraceData& data) -> std::shared_ptr<Figure> {
    if (sel.compare.empty()) throw std::runtime_error("choose a trace to compare with");
    return CompareFigure::load(data, data.peer(sel.compare), sel);
  };
}

void CompareView::paintEvent(QPaintEvent* e) {
  if (state_->selection().compare.empty()) {
    QPainter p(this);
    p.fillRect(rect(), Qt::white);
    plot::message(p, area(),
                  "Compare: open a second trace of the same prompt and choose it in the toolbar's "
                  "“compare with” box");
    return;
  }
  FigureWidget::paintEvent(e);
}

OverviewView::OverviewView(CurrentState* state, TraceService* service, QWidget* parent)
    : FigureWidget("overview", state, service, parent) {}

uint32_t OverviewView::reload_on() const {
  uint32_t base = kTraceChanged | kTraceGrew;
  bool per_step = metric_ == OverviewMetric::Occupancy || metric_ == OverviewMetric::LostMass;
  return per_step ? base | kStepChanged : base;
}

void OverviewView::state_changed(const Selection& sel, uint32_t changes) {
  if ((changes & kHeadChanged) && overview()) {  // just move the highlight
    overview()->layer = sel.layer;
    overview()->head = sel.head;
    update();
  }
  FigureWidget::state_changed(sel, changes);
}

void OverviewView::set_metric(OverviewMetric m) {
  metric_ = m;
  reload();
}

std::function<std::shared_ptr<Figure>(TraceData&)> OverviewView::loader(const Selection& sel) {
  OverviewMetric m = metric_;
  return [sel, m](TraceData& data) -> std::shared_ptr<Figure> {
    return OverviewFigure::load(data, sel, m);
  };
}

void OverviewView::click_at(const QPointF& point) {
  OverviewFigure* f = overview();
  if (!f) return;
  auto [l, h] = f->head_at(area(), point);
  if (l < 0) return;
  f->layer = l;
  f->head = h;
  update();
  state_->set_head(l, h, this);
}

void OverviewView::mouseReleaseEvent(QMouseEvent* e) {
  click_at(e->position());
}

}  // namespace kvscope::views
