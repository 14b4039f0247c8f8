// Runs a trainer by the gate kind it writes, as `kvscope train` would
// (kvpop-mlp: --policy kvpop --scorer mlp; sfc-gru: --policy sfc).
#pragma once

#include <map>
#include <string>

#include "capture/train/registry.h"

namespace kvscope::test {

inline gates::TrainResult train_kind(const gates::TrainOptions& o,
                                     std::map<std::string, std::string> options = {}) {
  std::string name = gates::gate_kind_name(o.kind);
  if (o.kind == gates::GateKind::KvpopMlp || o.kind == gates::GateKind::KvpopMlstm) {
    options.emplace("scorer", name.substr(std::string("kvpop-").size()));
    name = "kvpop";
  }
  if (o.kind == gates::GateKind::SfcGru) name = "sfc";
  return gates::run_trainer(name, o, options);
}

}  // namespace kvscope::test
