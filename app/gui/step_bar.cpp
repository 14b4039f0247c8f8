#include "app/gui/step_bar.h"

#include <QHBoxLayout>
#include <QStyle>

namespace kvscope::gui {

StepBar::StepBar(views::CurrentState* state, QWidget* parent) : QWidget(parent), state_(state) {
  auto* row = new QHBoxLayout(this);
  row->setContentsMargins(4, 0, 4, 0);
  play_ = new QToolButton(this);
  play_->setIcon(style()->standardIcon(QStyle::SP_MediaPlay));
  play_->setToolTip("Play / pause (Space)");
  slider_ = new QSlider(Qt::Horizontal, this);
  slider_->setObjectName("stepSlider");
  slider_->setMinimumWidth(240);
  slider_->setFocusPolicy(Qt::NoFocus);  // arrows belong to the window's shortcuts
  spin_ = new QSpinBox(this);
  spin_->setObjectName("stepSpin");
  spin_->setPrefix("step ");
  label_ = new QLabel(this);
  follow_ = new QCheckBox("follow", this);
  follow_->setToolTip("Jump to new steps while a capture is still writing the trace");
  follow_->setChecked(true);
  row->addWidget(play_);
  row->addWidget(slider_, 1);
  row->addWidget(spin_);
  row->addWidget(label_);
  row->addWidget(follow_);
  timer_.setInterval(120);
  connect(&timer_, &QTimer::timeout, this, [this] {
    const views::Selection& s = state_->selection();
    if (s.step + 1 >= s.n_steps) {
      if (!follow_->isChecked()) set_playing(false);
      return;
    }
    step_by(1);
  });
  connect(play_, &QToolButton::clicked, this, [this] { set_playing(!playing()); });
  connect(slider_, &QSlider::valueChanged, this, [this](int v) {
    if (!syncing_) state_->set_step(v);
  });
  connect(spin_, qOverload<int>(&QSpinBox::valueChanged), this, [this](int v) {
    if (!syncing_) state_->set_step(v);
  });
  state_->attach(this);
  sync(state_->selection());
}

StepBar::~StepBar() {
  state_->detach(this);
}

void StepBar::set_playing(bool on) {
  if (on)
    timer_.start();
  else
    timer_.stop();
  play_->setIcon(style()->standardIcon(on ? QStyle::SP_MediaPause : QStyle::SP_MediaPlay));
}

void StepBar::step_by(int64_t delta) {
  state_->set_step(state_->selection().step + delta);
}

void StepBar::state_changed(const views::Selection& sel, uint32_t changes) {
  if ((changes & views::kTraceGrew) && follow_->isChecked() && sel.n_steps > 0)
    state_->set_step(sel.n_steps - 1);  // announces to everyone, this bar included
  sync(sel);
}

void StepBar::sync(const views::Selection& sel) {
  syncing_ = true;
  int last = int(std::max<int64_t>(0, sel.n_steps - 1));
  slider_->setRange(0, last);
  spin_->setRange(0, last);
  slider_->setValue(int(sel.step));
  spin_->setValue(int(sel.step));
  label_->setText(QString("/ %1").arg(last));
  syncing_ = false;
}

}  // namespace kvscope::gui
