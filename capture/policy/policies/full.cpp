// full: every token stays; the reference every policy is compared with.
#include "capture/policy/policies/descriptors.h"

namespace kvscope::policy {

namespace {
class FullPolicy : public Policy {};
}  // namespace

PolicyDescriptor full_descriptor() {
  return {"full",
          "keep every key and value (no compression)",
          "baseline",
          "docs/policies/full.md",
          {},
          [](const Params&) { return std::make_unique<FullPolicy>(); }};
}

}  // namespace kvscope::policy
