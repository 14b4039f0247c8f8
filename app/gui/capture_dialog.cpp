#include "app/gui/capture_dialog.h"

#include <QCoreApplication>
#include <QDialogButtonBox>
#include <QDir>
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
  // Defaults: the tiny stories260K model the project ships beside the checkout.
  QString shared = QCoreApplication::applicationDirPath() + "/../../../shared/models/stories260K";
  QString model = QFileInfo(shared + "/stories260K.bin").canonicalFilePath();
  QString tok = QFileInfo(shared + "/tok512.bin").canonicalFilePath();
  model_ = new QLineEdit(model);
  model_->setToolTip("Hugging Face directory, .gguf file or llama2.c .bin checkpoint");
  tokenizer_ = new QLineEdit(tok);
  tokenizer_->setPlaceholderText("default: the model's own tokenizer");
  policy_ = new QLineEdit("h2o:heavy=24,recent=24");
  policy_->setToolTip("NAME[:key=value,...]; `kvscope policies` lists them with their parameters");
  levels_ = new QLineEdit("events+received+pooled:4+topk:8");
  levels_->setToolTip(
      "none | events, received, pooled[:B], dense:L.H[,L.H], topk:K joined with '+'");
  max_new_ = new QLineEdit("200");
  // Editable: cuda:N names one GPU of several; kvscope refuses a device the
  // machine lacks with a message the progress box shows.
  device_ = new QComboBox;
  device_->setEditable(true);
  device_->addItems({"cpu", "cuda"});
  device_->setToolTip("cpu, cuda or cuda:N: where the model runs and the cache lives");
  output_ = new QLineEdit(QDir::current().absoluteFilePath("capture.kvtrace.h5"));
  extra_ = new QLineEdit;
  extra_->setPlaceholderText("other options of `kvscope capture`, e.g. --oracle --chat");
  prompt_ = new QPlainTextEdit("Once upon a time, there was a little girl named Lily.");
  prompt_->setMaximumHeight(90);
  log_ = new QPlainTextEdit;
  log_->setReadOnly(true);
  // Each field is named after its label, so a script or a test can find it.
  auto row = [form](const QString& label, QWidget* field) {
    field->setObjectName(label);
    form->addRow(label, field);
  };
  row("model", model_);
  row("tokenizer", tokenizer_);
  row("policy", policy_);
  row("prompt", prompt_);
  row("capture levels", levels_);
  row("new tokens", max_new_);
  row("device", device_);
  row("output", output_);
  row("more", extra_);
  row("progress", log_);
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
    emit captureFinished(code);
  });
}

QStringList CaptureDialog::arguments() const {
  QStringList a = {"capture",
                   "--model",
                   model_->text(),
                   "--policy",
                   policy_->text(),
                   "--prompt",
                   prompt_->toPlainText(),
                   "--capture",
                   levels_->text(),
                   "--max-new",
                   max_new_->text(),
                   "--device",
                   device_->currentText(),
                   "-o",
                   output_->text()};
  if (!tokenizer_->text().isEmpty()) a << "--tokenizer" << tokenizer_->text();
  a += QProcess::splitCommand(extra_->text());
  return a;
}

void CaptureDialog::start() {
  QString exe = kvscope_executable();
  // As a shell would take it, so the line can be copied into a terminal.
  QStringList shown = {exe};
  for (QString a : arguments())
    shown << (a.contains(QRegularExpression("[^A-Za-z0-9_./:=+,@%-]"))
                  ? "'" + a.replace("'", "'\\''") + "'"
                  : a);
  log_->appendPlainText(shown.join(' '));
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
