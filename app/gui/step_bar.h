// The step scrubber: slider and spin box over the committed steps,
// play/pause, and "follow" for live traces (jump to each new step).
#pragma once

#include <QCheckBox>
#include <QLabel>
#include <QSlider>
#include <QSpinBox>
#include <QTimer>
#include <QToolButton>
#include <QWidget>

#include "views/current_state.h"

namespace kvscope::gui {

class StepBar : public QWidget, public views::StateObserver {
  Q_OBJECT
 public:
  StepBar(views::CurrentState* state, QWidget* parent = nullptr);
  ~StepBar() override;
  void state_changed(const views::Selection& sel, uint32_t changes) override;
  bool playing() const { return timer_.isActive(); }
  bool following() const { return follow_->isChecked(); }
  void set_playing(bool on);
  void step_by(int64_t delta);
  QSlider* slider() const { return slider_; }

 private:
  void sync(const views::Selection& sel);
  views::CurrentState* state_;
  QSlider* slider_;
  QSpinBox* spin_;
  QToolButton* play_;
  QCheckBox* follow_;
  QLabel* label_;
  QTimer timer_;
  bool syncing_ = false;
};

}  // namespace kvscope::gui
