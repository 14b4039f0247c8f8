// Gate files: the safetensors + metadata round trip, the loader's shape
// checks against the model, bad files, and the torch.save reader's refusals.
#include <filesystem>
#include <fstream>

#include "capture/gates/gate_nets.h"
#include "capture/gates/torch_pickle.h"
#include "core/common/input_error.h"
#include "tests/gates/gate_test_util.h"
#include "tests/support/paths.h"

using namespace kvscope;
using gates::GateKind;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a gate file round-trips its tensors bit for bit and its metadata", "[gates][files]") {
  model::ModelConfig c = test::stories_shape();
  auto shape = gates::GateShape::of(c);
  for (GateKind kind : {GateKind::WriteGate, GateKind::AttentionGate, GateKind::Retention, GateKind::RetentionGlobal}) {
    gates::GateSet set = gates::init_gates(kind, gates::default_hyperparameters(kind, shape), shape, 5);
    set.meta["training"] = {{"steps", 12}, {"command", "kvscope train ..."}};
    const std::string path = test::save_temp(set, std::string(gates::gate_kind_name(kind)) + ".safetensors");
    gates::GateSet back = gates::load_gates(path, c);
    CHECK(back.kind == kind);
    CHECK(back.meta["training"]["steps"] == 12);
    CHECK(back.meta["hyperparameters"] == set.meta["hyperparameters"]);
    REQUIRE(back.params.size() == set.params.size());
    for (const auto& [name, t] : set.params) CHECK(torch::equal(back.param(name), t));
  }
}

TEST_CASE("the loader says which tensors do not fit the model", "[gates][files]") {
  model::ModelConfig c = test::stories_shape();
  auto shape = gates::GateShape::of(c);
  gates::GateSet set = gates::init_gates(GateKind::Retention, gates::default_hyperparameters(GateKind::Retention, shape), shape, 1);
  set.meta["base_model"] = {{"name", "stories260K"}};
  const std::string path = test::save_temp(set, "r.safetensors");
  model::ModelConfig wider = test::gate_config(5, 8, 4, 8, 96, "wider");
  std::string m = error_of([&] { gates::load_gates(path, wider); });
  CHECK(m.find("r.safetensors") != std::string::npos);
  CHECK(m.find("layers.0.self_attn.retention_gate.linear1.weight has shape [512, 64], the model needs [512, 96]") !=
        std::string::npos);
  CHECK(m.find("trained for stories260K") != std::string::npos);
  model::ModelConfig fewer = test::gate_config(4, 8, 4, 8, 64, "fewer");
  m = error_of([&] { gates::load_gates(path, fewer); });
  CHECK(m.find("the file has gates for 5 layers, the model has 4") != std::string::npos);
  CHECK(m.find("layers.4.self_attn.retention_gate.bias is not a parameter") != std::string::npos);
}

TEST_CASE("bad gate files are refused with the file and field", "[gates][files]") {
  model::ModelConfig c = test::stories_shape();
  auto shape = gates::GateShape::of(c);
  const std::string dir = test::temp_dir();
  CHECK(error_of([&] { gates::load_gates(dir + "/missing.safetensors", c); }).find("no such gate file") !=
        std::string::npos);
  // A safetensors file without our metadata.
  gates::GateSet set = gates::init_gates(GateKind::WriteGate, gates::default_hyperparameters(GateKind::WriteGate, shape), shape, 1);
  const std::string path = test::save_temp(set, "w.safetensors");
  {  // a future version
    gates::GateSet v2 = set;
    v2.meta["version"] = 2;
    const std::string p2 = test::save_temp(v2, "v2.safetensors");
    CHECK(error_of([&] { gates::load_gates(p2, c); }).find("version 2 is not read by this KVScope") != std::string::npos);
  }
  {  // an unknown kind
    gates::GateSet k = set;
    k.meta["policy"] = "snapkv";
    const std::string pk = test::save_temp(k, "k.safetensors");
    // save_gates writes the kind from set.kind: rewrite the metadata by hand.
    std::ifstream in(pk, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = bytes.find("\\\"policy\\\":\\\"wgkv\\\"");
    REQUIRE(at != std::string::npos);
    bytes.replace(at, 19, "\\\"policy\\\":\\\"wgkx\\\"");
    std::ofstream(pk, std::ios::binary | std::ios::trunc) << bytes;
    CHECK(error_of([&] { gates::load_gates(pk, c); }).find("'wgkx' is not a gate kind") != std::string::npos);
  }
  {  // not a gate file at all
    const std::string junk = dir + "/junk.safetensors";
    std::ofstream(junk) << "hello";
    CHECK_FALSE(error_of([&] { gates::load_gates(junk, c); }).empty());
  }
  {  // a zip that is no torch.save archive
    const std::string z = dir + "/z.pt";
    std::ofstream(z, std::ios::binary) << std::string("PK\x03\x04", 4) << "garbage";
    CHECK(error_of([&] { gates::load_gates(z, c); }).find("z.pt") != std::string::npos);
  }
}

TEST_CASE("torch.save reader: dicts of Parameters and OrderedDicts of bf16 tensors, in order", "[gates][files]") {
  auto w = gates::read_torch_save(test::gate_fixture("wgkv_official.pt"));
  REQUIRE(w.size() == 5 * 6);
  CHECK(w[0].first == "model.layers.0.self_attn.g_predictors.pre_key_norm.weight");
  CHECK(w[2].first == "model.layers.0.self_attn.g_predictors.conv1.weight");
  CHECK(w[2].second.sizes() == torch::IntArrayRef({128, 16, 1}));
  auto t = gates::read_torch_save(test::gate_fixture("trimkv/trimkv_weights.pth"));
  REQUIRE(t.size() == 5 * 4);
  CHECK(t[0].second.scalar_type() == torch::kFloat32);  // bf16 storage converted
  CHECK(gates::looks_like_torch_save(test::gate_fixture("wgkv_official.pt")));
  CHECK_FALSE(gates::looks_like_torch_save(test::gate_fixture("expected.safetensors")));
  CHECK(error_of([&] { gates::read_torch_save(test::gate_fixture("not_tensors.pt")); })
            .find("unsupported pickle global") != std::string::npos);
}
