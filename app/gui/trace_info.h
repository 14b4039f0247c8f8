// The trace info panel: model, policy and parameters, budgets, seed, capture
// levels, versions, counts — read on the worker like everything else.
#pragma once

#include <QMap>
#include <QTextBrowser>

#include "views/current_state.h"
#include "views/trace_service.h"

namespace kvscope::gui {

class TraceInfoPanel : public QTextBrowser, public views::StateObserver {
  Q_OBJECT
 public:
  TraceInfoPanel(views::CurrentState* state, views::TraceService* service,
                 QWidget* parent = nullptr);
  ~TraceInfoPanel() override;
  void state_changed(const views::Selection& sel, uint32_t changes) override;
  // The level-of-detail cache's state for `trace` (shown while it is current).
  void set_lod_status(const QString& trace, const QString& status);

  // HTML summary of a trace (worker side; also used by tests).
  static QString describe(views::TraceData& data);

 private:
  void reload();
  views::CurrentState* state_;
  views::TraceService* service_;
  void show_body();
  QString body_;
  QMap<QString, QString> lod_status_;  // by trace path
};

}  // namespace kvscope::gui
