// One function per built-in policy, each defined in its own file under
// capture/policy/policies/ and listed in builtin.cpp.
#pragma once

#include "capture/policy/registry.h"

namespace kvscope::policy {

PolicyDescriptor full_descriptor();
PolicyDescriptor window_descriptor();
PolicyDescriptor streaming_llm_descriptor();
PolicyDescriptor h2o_descriptor();

}  // namespace kvscope::policy
