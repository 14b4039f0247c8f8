// Gate files: the safetensors + metadata round trip, the loader's shape
// checks against the model, bad files, and the torch.save reader's refusals.
#include <caffe2/serialize/inline_container.h>

#include <filesystem>
#include <fstream>
#include <iterator>

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
  for (GateKind kind : {GateKind::WriteGate, GateKind::AttentionGate, GateKind::Retention,
                        GateKind::RetentionGlobal}) {
    gates::GateSet set =
        gates::init_gates(kind, gates::default_hyperparameters(kind, shape), shape, 5);
    set.meta["training"] = {{"steps", 12}, {"command", "kvscope train ..."}};
    const std::string path =
        test::save_temp(set, std::string(gates::gate_kind_name(kind)) + ".safetensors");
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
  gates::GateSet set = gates::init_gates(
      GateKind::Retention, gates::default_hyperparameters(GateKind::Retention, shape), shape, 1);
  set.meta["base_model"] = {{"name", "stories260K"}};
  const std::string path = test::save_temp(set, "r.safetensors");
  model::ModelConfig wider = test::gate_config(5, 8, 4, 8, 96, "wider");
  std::string m = error_of([&] { gates::load_gates(path, wider); });
  CHECK(m.find("r.safetensors") != std::string::npos);
  CHECK(m.find("layers.0.self_attn.retention_gate.linear1.weight has shape [512, 64], the model "
               "needs [512, 96]") != std::string::npos);
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
  CHECK(error_of([&] {
          gates::load_gates(dir + "/missing.safetensors", c);
        }).find("no such gate file") != std::string::npos);
  // A safetensors file without our metadata.
  gates::GateSet set = gates::init_gates(
      GateKind::WriteGate, gates::default_hyperparameters(GateKind::WriteGate, shape), shape, 1);
  const std::string path = test::save_temp(set, "w.safetensors");
  {  // a future version
    gates::GateSet v2 = set;
    v2.meta["version"] = 2;
    const std::string p2 = test::save_temp(v2, "v2.safetensors");
    CHECK(error_of([&] {
            gates::load_gates(p2, c);
          }).find("version 2 is not read by this KVScope") != std::string::npos);
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
    CHECK(error_of([&] { gates::load_gates(pk, c); }).find("'wgkx' is not a gate kind") !=
          std::string::npos);
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

TEST_CASE("torch.save reader: dicts of Parameters and OrderedDicts of bf16 tensors, in order",
          "[gates][files]") {
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
  CHECK(error_of([&] {
          gates::read_torch_save(test::gate_fixture("not_tensors.pt"));
        }).find("unsupported pickle global") != std::string::npos);
}

namespace {

// A torch.save-style archive (written by LibTorch's own zip writer) holding
// `pickle` as data.pkl and `storage` as data/0.
std::string write_archive(const std::string& name, const std::string& pickle,
                          const std::string& storage = std::string(64, '\0')) {
  const std::string path = test::temp_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary);
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* p, size_t n) {
    out.write(static_cast<const char*>(p), std::streamsize(n));
    return n;
  });
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  writer.writeRecord("byteorder", "little", 6);
  writer.writeRecord("data/0", storage.data(), storage.size());
  writer.writeEndOfFile();
  return path;
}

std::string u32le(uint32_t v) {
  return std::string(reinterpret_cast<const char*>(&v), 4);
}

// Pickle opcodes for {"w": Tensor(storage 0 (FloatStorage, 16 floats), offset 0, size, stride)}.
std::string tensor_dict_pickle(const std::string& size_tuple, const std::string& stride_tuple) {
  const std::string zero(1, '\0');
  return "\x80\x02}(X" + u32le(1) + "w" + "ctorch._utils\n_rebuild_tensor_v2\n(" + "(X" + u32le(7) +
         "storagectorch\nFloatStorage\nX" + u32le(1) + "0X" + u32le(3) + "cpu" + "K\x10tQK" + zero +
         size_tuple + stride_tuple + "\x89tRu.";
}

}  // namespace

// Fuzzing findings (tests/fuzz/regressions/torch_pickle): each of these used
// to crash, leak a cycle, allocate without bound or escape as c10::Error.
TEST_CASE("torch.save archives that would crash or exhaust memory are InputErrors",
          "[gates][files]") {
  const std::string ok =
      write_archive("ok.pt", tensor_dict_pickle("K\x02K\x02\x86", "K\x02K\x01\x86"));
  auto t = gates::read_torch_save(ok);
  REQUIRE(t.size() == 1);
  CHECK(t[0].second.sizes() == torch::IntArrayRef({2, 2}));

  // A memo id of 2^32 - 1: the memo table was resized to it (64 GB).
  CHECK_THAT(error_of([&] {
               gates::read_torch_save(write_archive("memo.pt", "\x80\x02}r\xff\xff\xff\xff."));
             }),
             Catch::Contains("data.pkl") && Catch::Contains("memo id 4294967295"));
  // 100 nested tuples: freeing them recursed once per level.
  CHECK_THAT(error_of([&] {
               gates::read_torch_save(
                   write_archive("deep.pt", "\x80\x02)" + std::string(100, '\x85') + "."));
             }),
             Catch::Contains("nested deeper than 32"));
  // A list appended to itself: a reference cycle.
  CHECK_THAT(error_of([&] {
               gates::read_torch_save(write_archive("cycle.pt", std::string("\x80\x02]q\x00h\x00"
                                                                            "a.",
                                                                            9)));
             }),
             Catch::Contains("inside itself"));
  // A stride whose product with the size overflows int64 wrapped past the check.
  CHECK_THAT(
      error_of([&] {
        gates::read_torch_save(write_archive(
            "stride.pt", tensor_dict_pickle("K\x02K\x02\x86",
                                            "\x8a\x08" + std::string(7, '\0') + "\x40K\x01\x86")));
      }),
      Catch::Contains("outside its storage"));
  // A damaged archive: LibTorch's c10::Error, now an InputError naming the file.
  std::string bytes;
  {
    std::ifstream in(ok, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string damaged = test::temp_dir() + "/damaged.pt";
  std::ofstream(damaged, std::ios::binary) << bytes.substr(0, bytes.size() - 30);
  CHECK_THAT(error_of([&] { gates::read_torch_save(damaged); }), Catch::Contains("damaged.pt"));
  // The zip directory declaring a 4 GB data.pkl: refused before LibTorch
  // allocates it.
  const size_t dir = bytes.find("PK\x01\x02");
  REQUIRE(dir != std::string::npos);
  std::string huge = bytes;
  huge.replace(dir + 24, 4, u32le(0xFFFFFFF0u));
  const std::string huge_path = test::temp_dir() + "/huge.pt";
  std::ofstream(huge_path, std::ios::binary) << huge;
  CHECK_THAT(error_of([&] { gates::read_torch_save(huge_path); }),
             Catch::Contains("huge.pt") && Catch::Contains("declares 4294967280 bytes"));
}

TEST_CASE("gate file metadata of the wrong type and odd tensor names are InputErrors",
          "[gates][files]") {
  model::ModelConfig c = test::stories_shape();
  auto shape = gates::GateShape::of(c);
  gates::GateSet set = gates::init_gates(
      GateKind::Retention,
      gates::resolve_hyperparameters(GateKind::Retention, shape, {{"hidden", 4}}, ""), shape, 1);
  {  // "layers.x.": std::stoll threw std::invalid_argument
    gates::GateSet odd = set;
    odd.params["layers.x.bias"] = torch::zeros({1});
    const std::string p = test::save_temp(odd, "odd.safetensors");
    CHECK_THAT(error_of([&] { gates::load_gates(p, c); }),
               Catch::Contains("layers.x.bias is not a parameter"));
  }
  // The metadata with `from` replaced by `to`, padded with JSON whitespace
  // so the header keeps its length.
  auto with_meta = [&](const std::string& from, const std::string& to) {
    const std::string p = test::save_temp(set, "meta.safetensors");
    std::ifstream in(p, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = bytes.find(from);
    REQUIRE(at != std::string::npos);
    REQUIRE(to.size() <= from.size());
    bytes.replace(at, from.size(), to + std::string(from.size() - to.size(), ' '));
    std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
    return error_of([&] { gates::load_gates(p, c); });
  };
  // nlohmann's type_error escaped for a number where a string belongs.
  CHECK_THAT(with_meta("\\\"format\\\":\\\"kvscope-gates\\\"", "\\\"format\\\":12"),
             Catch::Contains("meta.safetensors") && Catch::Contains("format"));
  // Sizes become tensor shapes: whole, positive and bounded.
  CHECK_THAT(with_meta("\\\"hidden\\\":4", "\\\"hidden\\\":9"), Catch::Contains("do not fit"));
  CHECK_THAT(with_meta("\\\"hidden\\\":4", "\\\"hidden\\\":0"),
             Catch::Contains("hyperparameters.hidden") &&
                 Catch::Contains("is 0 (expected an integer in [1, 65536])"));
  CHECK_THAT(with_meta("\\\"bias_init\\\":10.0,\\\"hidden\\\":4", "\\\"hidden\\\":[4]"),
             Catch::Contains("hyperparameters.hidden") &&
                 Catch::Contains("is [4] (expected an integer in [1, 65536])"));
}
