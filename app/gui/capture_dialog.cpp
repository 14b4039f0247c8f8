#include "app/gui/capture_dialog.h"

#include <QCoreApplication>
#include <QDialogButtonBox>
#include <QFileInfo>
#include <QFormLayout>
#include <QPushButton>
#include <QRegularExpression>
#include <QStandardPaths>
#include <QTimer>

namespace kvscope::gui {

QString kvscope_executable() {
  QString beside = QCoreApplication::applicationDirPath() + "/kvscope";
  if (QFileInfo(beside).isExecutable()) return beside;
  QString parent = QCoreApplication::applicationDirPath() + "/../kvscope";
  if (QFileInfo(parent).isExecutable()) return QFileInfo(parent).canonicalFilePath();
  return QStandardPaths::findExecutable("kvscope");
}

bool capture_available(QString* why) {
  QString exe = kvscope_executable();
  if (exe.isEmpty()) {
    *why = "the kvscope command-line tool was not found beside kvscope-gui or on PATH";
    return false;
  }
  QProcess p;
  p.start(exe, {"--help"});
  p.waitForFinished(5000);
  // Subcommands are listed as "  NAME  description" in kvscope --help.
  if (!QString::fromUtf8(p.readAllStandardOutput())
           .contains(QRegularExpression("\\n  capture\\s"))) {
    *why = "this build's kvscope has no `capture` command yet (" + exe +
           "): the capture engine is not part of this build";
    return false;
  }
  return true;
}

CaptureDialog::CaptureDialog(QWidget* parent) : QDialog(parent) {
  setWindowTitle("Capture a trace");
  auto* form = new QFormLayout(this);
  model_ = new QLineEdit("models/stories260K");
  policy_ = new QLineEdit("streaming_llm:sinks=4,window=64");
  levels_ = new QLineEdit("events,received,pooled");
  output_ = new QLineEdit("capture.kvtrace.h5");
  extra_ = new QLineEdit;
  extra_->setPlaceholderText("other options of `kvscope capture`, e.g. --max-new-tokens 64");
  prompt_ = new QPlainTextEdit("Once upon a time");
  prompt_->setMaximumHeight(90);
  log_ = new QPlainTextEdit;
  log_->setReadOnly(true);
  form->addRow("model", model_);
  form->addRow("policy", policy_);
  form->addRow("prompt", prompt_);
  form->addRow("capture levels", levels_);
  form->addRow("output", output_);
  form->addRow("more", extra_);
  form->addRow("progress", log_);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Close);
  QPushButton* run = buttons->addButton("Capture", QDialogButtonBox::AcceptRole);
  form->addRow(buttons);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  connect(run, &QPushButton::clicked, this, &CaptureDialog::start);
  connect(&process_, &QProcess::readyReadStandardOutput, this, [this] {
    log_->appendPlainText(QString::fromUtf8(process_.readAllStandardOutput()).trimmed());
  });
  connect(&process_, &QProcess::readyReadStandardError, this, [this] {
    log_->appendPlainText(QString::fromUtf8(process_.readAllStandardError()).trimmed());
  });
  connect(&process_, &QProcess::finished, this, [this](int code) {
    log_->appendPlainText(QString("capture finished with exit code %1").arg(code));
  });
}

QStringList CaptureDialog::arguments() const {
  QStringList a = {"capture",       "--model",  model_->text(),         "--policy",
                   policy_->text(), "--prompt", prompt_->toPlainText(), "--capture",
                   levels_->text(), "-o",       output_->text()};
  a += QProcess::splitCommand(extra_->text());
  return a;
}

void CaptureDialog::start() {
  QString exe = kvscope_executable();
  log_->appendPlainText(exe + " " + arguments().join(' '));
  process_.start(exe, arguments());
  // Open the trace as soon as the writer has created it: the GUI follows it live.
  auto* poll = new QTimer(this);
  poll->setInterval(250);
  connect(poll, &QTimer::timeout, this, [this, poll] {
    if (QFileInfo::exists(output_->text())) {
      poll->stop();
      emit traceStarted(QFileInfo(output_->text()).absoluteFilePath());
    } else if (process_.state() == QProcess::NotRunning) {
      poll->stop();
    }
  });
  poll->start();
}

}  // namespace kvscope::gui
