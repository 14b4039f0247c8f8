// Each dock's content: a row of the view's own options above the view.
#pragma once

#include <QWidget>

#include "views/heatmap_view.h"
#include "views/timeline_view.h"
#include "views/view_widgets.h"

namespace kvscope::gui {

// Wraps `view` with `controls` (may be null) in one widget.
QWidget* panel(QWidget* controls, QWidget* view);

QWidget* heatmap_controls(views::HeatmapView* view);
QWidget* overview_controls(views::OverviewView* view);
QWidget* tokens_controls(views::TokensView* view);
QWidget* survival_controls(views::SurvivalView* view);
QWidget* gates_controls(views::GatesView* view, const QStringList& gates);
QWidget* cutoff_controls(views::CutoffView* view);
QWidget* budget_controls(views::BudgetView* view);
QWidget* forecast_controls(views::ForecastView* view);
// The options row of a registered view by name (null: it has none).
QWidget* controls_for(const QString& name, views::FigureWidget* view);

}  // namespace kvscope::gui
