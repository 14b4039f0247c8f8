#include <QtGlobal>

namespace kvscope::views {

const char* qt_version() {
  return qVersion();
}

}  // namespace kvscope::views
