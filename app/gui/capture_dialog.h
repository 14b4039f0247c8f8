// Capture from the GUI: a dialog (model, policy and parameters, prompt,
// capture levels, output) that runs `kvscope capture` as a child process —
// the capture engine stays out of the GUI's address space, so a crash in a
// capture cannot take the viewer down — shows its progress, and opens the
// trace while it is still being written (live follow).
#pragma once

#include <QComboBox>
#include <QDialog>
#include <QLineEdit>
#include <QPlainTextEdit>
#include <QProcess>

namespace kvscope::gui {

// The kvscope executable beside kvscope-gui (or on PATH), and whether it has
// the `capture` command; `why` says what is missing when it does not.
QString kvscope_executable();
bool capture_available(QString* why);

class CaptureDialog : public QDialog {
  Q_OBJECT
 public:
  explicit CaptureDialog(QWidget* parent = nullptr);
  QStringList arguments() const;
  // Starts the capture (the dialog's Capture button).
  void start();

 signals:
  void traceStarted(QString path);
  void captureFinished(int exit_code);

 private:
  QLineEdit *model_, *tokenizer_, *policy_, *levels_, *max_new_, *output_, *extra_;
  QComboBox* device_;
  QPlainTextEdit *prompt_, *log_;
  QProcess process_;
};

}  // namespace kvscope::gui
