// LU-KV (`lukv`, kvpress LUKVPress): the curve row and the per-head counts
// (kvpress's rounding), the .npy reader it loads curves with (versions,
// dtypes and every refusal), and on stories260K the kept counts per head
// against the curve, with the sinks and window kept.
#include <cstdio>
#include <cstring>
#include <fstream>

#include "capture/policy/policies/descriptors.h"
#include "core/common/input_error.h"
#include "core/common/npy_reader.h"
#include "tests/policies/policy_test_util.h"
#include "tests/support/paths.h"

namespace kvscope::test {

namespace {

// A .npy file as NumPy writes it: magic, version, header length, the dict
// padded with spaces to a 64-byte boundary, the data.
std::string npy_bytes(const std::string& descr, const std::vector<int64_t>& shape,
                      const std::string& data, int major = 1, const std::string& order = "False") {
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ", ";
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': " + order + ", 'shape': (" + dims + "), }";
  const size_t lead = major == 1 ? 10 : 12;
  while ((lead + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += char(major);
  out += char(0);
  const uint32_t n = uint32_t(header.size());
  out += char(n & 0xff);
  out += char((n >> 8) & 0xff);
  if (major > 1) out += std::string(2, '\0');
  return out + header + data;
}

template <typename T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::string write_temp(const std::string& name, const std::string& bytes) {
  const std::string path = temp_dir() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string npy_error(const std::string& path) {
  try {
    read_npy(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("lukv: the curve row and kvpress's per-head counts", "[policies][lukv]") {
  CHECK(policy::lukv_curve_row(0.125) == 11);  // 12.5 rounds to the even 12
  CHECK(policy::lukv_curve_row(0.375) == 37);  // 37.5 rounds to 38
  CHECK(policy::lukv_curve_row(0.0) == 0);
  CHECK(policy::lukv_curve_row(0.999) == 98);
  // ideal 5, 7.5, 1: total round(13.5) = 14, floors 13, the remainder to 7.5.
  CHECK(policy::lukv_head_counts({0.5, 0.25, 0.9}, 10) == std::vector<int64_t>{5, 8, 1});
  // Everything pruned: at least one per head.
  CHECK(policy::lukv_head_counts({1.0, 1.0}, 10) == std::vector<int64_t>{1, 1});
  // Ratios outside [0, 1] are clamped.
  CHECK(policy::lukv_head_counts({-0.5, 0.0}, 10) == std::vector<int64_t>{10, 10});
}

TEST_CASE("lukv: .npy curves are read in float32 and float64, versions 1 and 2",
          "[policies][lukv][npy]") {
  const std::string f4 =
      write_temp("lukv-f4.npy", npy_bytes("<f4", {2, 3}, raw<float>({1, 2, 3, 4, 5, 6.5f})));
  NpyArray a = read_npy(f4);
  CHECK(a.shape == std::vector<int64_t>{2, 3});
  CHECK(a.data == std::vector<double>{1, 2, 3, 4, 5, 6.5});
  const std::string f8 =
      write_temp("lukv-f8.npy", npy_bytes("<f8", {3}, raw<double>({0.25, -1, 1e-300}), 2));
  a = read_npy(f8);
  CHECK(a.shape == std::vector<int64_t>{3});
  CHECK(a.data == std::vector<double>{0.25, -1, 1e-300});
  // Refusals: each names the file and the field.
  CHECK_THAT(npy_error(write_temp("lukv-magic.npy", "PK\x03\x04 not npy")),
             Catch::Contains("lukv-magic.npy") && Catch::Contains("magic"));
  CHECK_THAT(npy_error(write_temp("lukv-be.npy", npy_bytes(">f8", {1}, raw<double>({1})))),
             Catch::Contains("'descr'") && Catch::Contains("'<f4' or '<f8' expected"));
  CHECK_THAT(npy_error(write_temp("lukv-int.npy", npy_bytes("<i8", {1}, raw<int64_t>({1})))),
             Catch::Contains("'descr'"));
  CHECK_THAT(
      npy_error(write_temp("lukv-fortran.npy", npy_bytes("<f8", {1}, raw<double>({1}), 1, "True"))),
      Catch::Contains("'fortran_order'"));
  CHECK_THAT(npy_error(write_temp("lukv-short.npy", npy_bytes("<f8", {4}, raw<double>({1, 2})))),
             Catch::Contains("data") && Catch::Contains("ends after 2"));
  CHECK_THAT(npy_error(write_temp("lukv-version.npy", npy_bytes("<f8", {1}, raw<double>({1}), 9))),
             Catch::Contains("version"));
  CHECK_THAT(npy_error(write_temp("lukv-huge.npy",
                                  npy_bytes("<f8", {1000000, 1000000}, raw<double>({1})))),
             Catch::Contains("'shape'"));
  CHECK_THAT(npy_error(temp_dir() + "/lukv-missing.npy"), Catch::Contains("cannot open"));
}

TEST_CASE("lukv: each head keeps the curve's count of its best entries on stories260K",
          "[policies][lukv]") {
  std::unique_ptr<model::Transformer> model = load_stories();
  const model::ModelConfig& c = model->config();
  const int64_t L = c.n_layers, K = c.n_kv_heads;
  // A curve whose rows differ by head: prune ratio (l + h + t / 99) / (L + K).
  std::vector<double> curve;
  for (int64_t t = 0; t < 99; ++t)
    for (int64_t l = 0; l < L; ++l)
      for (int64_t h = 0; h < K; ++h)
        curve.push_back((double(l + h) + double(t) / 99.0) / double(L + K));
  const std::string path = write_temp("lukv-curve.npy", npy_bytes("<f8", {99, L, K}, raw(curve)));
  const std::vector<int64_t> prompt = story_prompt_ids();
  const int64_t T = int64_t(prompt.size()), budget = T / 4;
  PolicyRun run(*model,
                "lukv:scorer=keydiff,curve=" + path + ",budget=" + std::to_string(budget) +
                    ",keep_first=4,keep_last=1",
                T + 1, T);
  run.feed(*model, prompt, 0);
  const int64_t row = policy::lukv_curve_row(1.0 - double(budget) / double(T));
  for (int64_t l = 0; l < L; ++l) {
    const std::vector<double> prune(curve.begin() + (row * L + l) * K,
                                    curve.begin() + (row * L + l + 1) * K);
    const std::vector<int64_t> n = policy::lukv_head_counts(prune, T);
    for (int64_t h = 0; h < K; ++h) {
      INFO("layer " << l << " head " << h);
      const std::set<int64_t> held = run.held(l, h);
      CHECK(int64_t(held.size()) == n[size_t(h)]);
      for (int64_t p : {int64_t(0), int64_t(1), int64_t(2), int64_t(3), T - 1})
        CHECK(held.count(p) == 1);
    }
  }
  // The counts differ across heads (the point of LU-KV).
  CHECK(run.held(0, 0).size() != run.held(L - 1, K - 1).size());
  // A budget of the whole prompt compresses nothing.
  PolicyRun all(*model, "lukv:scorer=keydiff,curve=" + path + ",budget=" + std::to_string(T), T + 1,
                T);
  all.feed(*model, prompt, 0);
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < K; ++h) CHECK(int64_t(all.held(l, h).size()) == T);
}

TEST_CASE("lukv: a missing or misshapen curve is refused with what was expected",
          "[policies][lukv]") {
  std::unique_ptr<model::Transformer> model = load_stories();
  CHECK_THROWS_WITH(policy::make_policy("lukv:scorer=keydiff"),
                    Catch::Contains("lukv:curve") && Catch::Contains("required"));
  const std::string bad =
      write_temp("lukv-shape.npy", npy_bytes("<f8", {2, 2}, raw<double>({0, 0, 0, 0})));
  try {
    PolicyRun run(*model, "lukv:scorer=keydiff,budget=8,curve=" + bad, 64, 32);
    FAIL("a [2, 2] curve was accepted");
  } catch (const InputError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("lukv-shape.npy") &&
                                          Catch::Contains("[99, 5, 4] expected") &&
                                          Catch::Contains("got [2, 2]"));
  }
}

}  // namespace kvscope::test
