// One QApplication for a whole test executable (fonts, painting, widgets).
// View tests render offscreen (QT_QPA_PLATFORM=offscreen); GUI tests use
// the X server when DISPLAY is set (xvfb-run in scripts/test).
#pragma once

#include <sys/stat.h>
#include <unistd.h>
#include <QApplication>
#include <cstdlib>
#include <string>

namespace kvscope::test {

inline QApplication* qt_app(bool force_offscreen) {
  if (auto* app = qobject_cast<QApplication*>(QCoreApplication::instance())) return app;
  const char* display = std::getenv("DISPLAY");
  if (force_offscreen || !display || !*display) setenv("QT_QPA_PLATFORM", "offscreen", 1);
  if (!std::getenv("XDG_RUNTIME_DIR")) {
    std::string dir = "/tmp/kvscope-runtime-" + std::to_string(getuid());
    mkdir(dir.c_str(), 0700);
    setenv("XDG_RUNTIME_DIR", dir.c_str(), 1);
  }
  static int argc = 1;
  static char name[] = "kvscope-tests";
  static char* argv[] = {name, nullptr};
  return new QApplication(argc, argv);  // lives until exit
}

}  // namespace kvscope::test
