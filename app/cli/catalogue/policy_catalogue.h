// The policy catalogue as kvscope-engine prints it (`policies`, `--json`,
// `--markdown`), embedded into kvscope at build time by embed_policies.cmake.
#pragma once

namespace kvscope::cli {

extern const char* const kPolicyCatalogueText;
extern const char* const kPolicyCatalogueJson;
extern const char* const kPolicyCatalogueMarkdown;

}  // namespace kvscope::cli
