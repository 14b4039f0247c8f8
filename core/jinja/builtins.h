// The filters, tests and global functions templates can use.
#pragma once

#include <string>

#include "core/jinja/render.h"

namespace kvscope::jinja {

using FilterFn = Value (*)(Renderer&, const Value&, Args&);
using TestFn = bool (*)(Renderer&, const Value&, Args&);

// nullptr when there is no such filter/test.
FilterFn find_filter(const std::string& name);
TestFn find_test(const std::string& name);
// range, namespace, dict: the globals jinja2 defines itself.
void add_builtin_globals(Scope& scope);

}  // namespace kvscope::jinja
