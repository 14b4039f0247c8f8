// The smaller view widgets: each follows the current state through
// FigureWidget and adds its own interaction (clicks select heads or tokens).
#pragma once

#include "views/budget_figure.h"
#include "views/compare_figure.h"
#include "views/cutoff_figure.h"
#include "views/figure_widget.h"
#include "views/forecast_figure.h"
#include "views/gates_figure.h"
#include "views/needle_figure.h"
#include "views/overview_figure.h"
#include "views/survival_figure.h"
#include "views/tokens_figure.h"

namespace kvscope::views {

class BudgetView : public FigureWidget {
  Q_OBJECT
 public:
  BudgetView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);
  BudgetFigure* budget() const { return static_cast<BudgetFigure*>(figure_.get()); }
  // BudgetFigure::kAutoSeries, kNoSeries, or an index into the trace's /series.
  void set_series(int series);

 protected:
  std::function<std::shared_ptr<Figure>(TraceData&)> loader(const Selection& sel) override;
  void mouseReleaseEvent(QMouseEvent* event) override;

 private:
  int series_ = BudgetFigure::kAutoSeries;
};

class SurvivalView : public FigureWidget {
  Q_OBJECT
 public:
  SurvivalView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);
  void set_horizon(int64_t h);

 protected:
  uint32_t reload_on() const override { return kTraceChanged | kHeadChanged | kTraceGrew; }
  std::function<std::shared_ptr<Figure>(TraceData&)> loader(const Selection& sel) override;

 private:
  int64_t horizon_ = -1;
};

class GatesView : public FigureWidget {
  Q_OBJECT
 public:
  GatesView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);
  void set_gate(int gate);

 protected:
  uint32_t reload_on() const override { return FigureWidget::reload_on() | kTokensChanged; }
  std::function<std::shared_ptr<Figure>(TraceData&)> loader(const Selection& sel) override;

 private:
  int gate_ = 0;
};

// Follows the head; a new step or token selection only moves the step line
// and the highlight (the figure's data does not depend on them).
class CutoffView : public FigureWidget {
  Q_OBJECT
 public:
  CutoffView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);
  CutoffFigure* cutoff() const { return static_cast<CutoffFigure*>(figure_.get()); }
  void set_series(int series);
  // A click on a decision selects its token and step; elsewhere, the step.
  void click_at(const QPointF& point);

 protected:
  uint32_t reload_on() const override { return kTraceChanged | kHeadChanged | kTraceGrew; }
  void state_changed(const Selection& selection, uint32_t changes) override;
  std::function<std::shared_ptr<Figure>(TraceData&)> loader(const Selection& sel) override;
  void adopt(std::shared_ptr<Figure> previous) override;
  void mouseReleaseEvent(QMouseEvent* event) override;

 private:
  void follow(const Selection& sel);
  int series_ = 0;
};

// Follows the head and the selected token; a new step only moves its line.
class ForecastView : public FigureWidget {
  Q_OBJECT
 public:
  ForecastView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);
  ForecastFigure* forecast() const { return static_cast<ForecastFigure*>(figure_.get()); }
  // An index into the trace's gates (-1: the first time-varying one).
  void set_gate(int gate);
  // A click in the plots selects that step.
  void click_at(const QPointF& point);

 protected:
  uint32_t reload_on() const override {
    return kTraceChanged | kHeadChanged | kTokensChanged | kTraceGrew;
  }
  void state_changed(const Selection& selection, uint32_t changes) override;
  std::function<std::shared_ptr<Figure>(TraceData&)> loader(const Selection& sel) override;
  void adopt(std::shared_ptr<Figure> previous) override;
  void mouseReleaseEvent(QMouseEvent* event) override;

 private:
  void follow(const Selection& sel);
  int gate_ = -1;
};

class TokensView : public FigureWidget {
  Q_OBJECT
 public:
  TokensView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);
  TokensFigure* tokens() const { return static_cast<TokensFigure*>(figure_.get()); }
  void set_coloring(TokenColoring coloring);
  void scroll_to_token(int64_t token);

 protected:
  uint32_t reload_on() const override { return FigureWidget::reload_on(); }
  void state_changed(const Selection& selection, uint32_t changes) override;
  std::function<std::shared_ptr<Figure>(TraceData&)> loader(const Selection& sel) override;
  void adopt(std::shared_ptr<Figure> previous) override;
  void wheelEvent(QWheelEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;

 private:
  TokenColoring coloring_ = TokenColoring::AllHeads;
};

class HistoryView : public FigureWidget {
  Q_OBJECT
 public:
  HistoryView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);

 protected:
  uint32_t reload_on() const override { return FigureWidget::reload_on() | kTokensChanged; }
  std::function<std::shared_ptr<Figure>(TraceData&)> loader(const Selection& sel) override;
};

class CompareView : public FigureWidget {
  Q_OBJECT
 public:
  CompareView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);

 protected:
  // Selected tokens are its focus span.
  uint32_t reload_on() const override {
    return FigureWidget::reload_on() | kCompareChanged | kTokensChanged;
  }
  void state_changed(const Selection& selection, uint32_t changes) override;
  std::function<std::shared_ptr<Figure>(TraceData&)> loader(const Selection& sel) override;
  void paintEvent(QPaintEvent* event) override;
};

// The needle view: reloads when the trace or the compared trace changes (the
// mass series read every decode step); a new step or head only repaints.
class NeedleView : public FigureWidget {
  Q_OBJECT
 public:
  NeedleView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);

 protected:
  uint32_t reload_on() const override { return kTraceChanged | kTraceGrew | kCompareChanged; }
  void state_changed(const Selection& selection, uint32_t changes) override;
  std::function<std::shared_ptr<Figure>(TraceData&)> loader(const Selection& sel) override;
};

class OverviewView : public FigureWidget {
  Q_OBJECT
 public:
  OverviewView(CurrentState* state, TraceService* service, QWidget* parent = nullptr);
  OverviewFigure* overview() const { return static_cast<OverviewFigure*>(figure_.get()); }
  void set_metric(OverviewMetric metric);
  // Selects the head under a widget point, as a click does.
  void click_at(const QPointF& point);

 protected:
  uint32_t reload_on() const override;
  void state_changed(const Selection& selection, uint32_t changes) override;
  std::function<std::shared_ptr<Figure>(TraceData&)> loader(const Selection& sel) override;
  void mouseReleaseEvent(QMouseEvent* event) override;

 private:
  OverviewMetric metric_ = OverviewMetric::Head;
};

}  // namespace kvscope::views
