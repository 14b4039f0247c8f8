#include "core/common/check.h"

#include <cstring>

namespace kvscope {

void invariant_failed(const char* condition, const std::string& message, const char* file,
                      int line) {
  // The path from the checkout's root: the same text in every build tree.
  const char* rel = std::strstr(file, "/core/");
  for (const char* root : {"/capture/", "/views/", "/app/", "/kernels/", "/tests/"})
    if (const char* p = std::strstr(file, root); p && (!rel || p < rel)) rel = p;
  const std::string where = std::string(rel ? rel + 1 : file) + ":" + std::to_string(line);
  throw InvariantError(where + ": internal invariant (" + condition + ") broken: " + message);
}

}  // namespace kvscope
