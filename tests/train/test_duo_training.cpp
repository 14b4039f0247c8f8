// `kvscope train --policy duo-attention` on stories260K: the passkey samples
// hold what they claim, the trained head pattern ranks heads so that the
// heads it keeps matter (held-out loss far below the reversed ranking), and
// the directory it writes drives the duo_attention policy.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "capture/generate/engine.h"
#include "capture/train/duo_attention_training.h"
#include "core/common/input_error.h"
#include "tests/gates/gate_test_util.h"
#include "tests/support/paths.h"

using namespace kvscope;

namespace {

gates::TrainOptions duo_options(const std::string& out, int64_t steps) {
  gates::TrainOptions o;
  o.model.model = test::stories_model_path();
  o.model.tokenizer = test::stories_tokenizer_path();
  o.model.threads = 1;
  o.data.generate_tokens = 6000;
  o.seq_len = 512;
  o.steps = steps;
  o.lr = 0.02;
  o.seed = 1;
  o.eval_windows = 3;
  o.quiet = true;
  o.output = out;
  o.hyper_given = {{"sinks", 4}, {"recent", 32}, {"passkeys", 2}, {"words", 3}};
  return o;
}

std::vector<std::vector<double>> read_tsv(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::vector<double>> rows;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream cells(line);
    rows.emplace_back();
    for (double v; cells >> v;) rows.back().push_back(v);
  }
  return rows;
}

}  // namespace

TEST_CASE("duo-attention passkey samples: the asked passkeys are the hidden ones, at seq_len",
          "[gates][train][duo]") {
  generate::ModelOptions mo;
  mo.model = test::stories_model_path();
  mo.tokenizer = test::stories_tokenizer_path();
  generate::Engine e = generate::open_engine(mo);
  const std::vector<int32_t> text = e.tokenizer->encode(std::string(4000, 'a'), false);
  const gates::DuoSample s = gates::duo_passkey_sample(*e.tokenizer, text, 0, 512, 2, 4, 7);
  REQUIRE(s.ids.size() == 512);
  const std::string context =
      e.tokenizer->decode(std::vector<int32_t>(s.ids.begin(), s.ids.begin() + s.answer_from), true);
  const std::string answer =
      e.tokenizer->decode(std::vector<int32_t>(s.ids.begin() + s.answer_from, s.ids.end()), true);
  for (const char* ord : {"first", "second"}) {
    const std::string asked =
        std::string("what is the ") + ord + " passkey to the vault?\nPasskey: ";
    const size_t q = answer.find(asked);
    REQUIRE(q != std::string::npos);
    const size_t from = q + asked.size(), to = answer.find("\n\n", from);
    const std::string key = answer.substr(from, to - from);
    std::istringstream words(key);
    CHECK(std::distance(std::istream_iterator<std::string>(words),
                        std::istream_iterator<std::string>()) == 4);
    CHECK(context.find(std::string("it's the ") + ord + " passkey to the vault: " + key) !=
          std::string::npos);
  }
  // Same seed, same sample; another seed, other passkeys.
  CHECK(gates::duo_passkey_sample(*e.tokenizer, text, 0, 512, 2, 4, 7).ids == s.ids);
  CHECK(gates::duo_passkey_sample(*e.tokenizer, text, 0, 512, 2, 4, 8).ids != s.ids);
  CHECK_THROWS_AS(gates::duo_passkey_sample(*e.tokenizer, text, 0, 200, 2, 4, 7), InputError);
}

TEST_CASE(
    "duo-attention training: the trained ranking beats its reverse on held-out samples, and "
    "its pattern directory drives duo_attention",
    "[gates][train][duo]") {
  const std::string out = test::temp_dir() + "/duo-pattern";
  const gates::TrainResult r = gates::train_duo_attention(duo_options(out, 40));
  // Measured: 0.008 vs 0.81 (60 steps); the L1 term pulls the mean gate
  // below 1 while the heads that carry the passkeys stay.
  CHECK(r.summary.at("heldout_distill_sparsity_0.5").get<double>() <
        0.25 * r.summary.at("heldout_distill_sparsity_0.5_reversed").get<double>());
  const std::vector<double> mean_alpha = r.summary.at("mean_alpha").get<std::vector<double>>();
  REQUIRE(mean_alpha.size() == 40);
  CHECK(mean_alpha.front() == Approx(1.0));
  CHECK(mean_alpha.back() < 0.9);

  const std::vector<std::vector<double>> alpha = read_tsv(out + "/full_attention_heads.tsv");
  REQUIRE(alpha.size() == 5);
  for (const auto& row : alpha) {
    REQUIRE(row.size() == 4);
    for (double a : row) CHECK((a >= 0 && a <= 1));
  }
  std::ifstream cfg(out + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(cfg);
  CHECK(config.at("sink_size") == 4);
  CHECK(config.at("recent_size") == 32);

  // The policy reads the directory: half the heads stream and hold the sinks
  // and the recent window (4 + 32 of 64), the rest keep all.
  const test::Prefilled p =
      test::prefill_policy(test::stories_shape(), "duo_attention:pattern=" + out, 64, 5);
  int full = 0, streaming = 0;
  for (const auto& layer : p.held)
    for (const auto& held : layer) {
      full += held.size() == 64;
      streaming += held.size() == 36;
    }
  CHECK(full == 10);
  CHECK(streaming == 10);
}

TEST_CASE("duo-attention training refuses bad settings with the option named",
          "[gates][train][duo]") {
  const std::string dir = test::temp_dir();
  gates::TrainOptions o = duo_options(dir + "/duo-bad", 2);
  o.hyper_given = {{"sink", 4}};
  CHECK_THROWS_WITH(gates::duo_train_settings(o),
                    Catch::Contains("--gate sink") && Catch::Contains("sinks, recent"));
  o.hyper_given = {{"passkeys", 21}};
  CHECK_THROWS_WITH(gates::duo_train_settings(o), Catch::Contains("[1, 20]"));
  o.hyper_given = {{"reg", -1}};
  CHECK_THROWS_WITH(gates::duo_train_settings(o), Catch::Contains("--gate reg"));
  std::ofstream(dir + "/duo-file") << "x";
  o = duo_options(dir + "/duo-file", 2);
  CHECK_THROWS_WITH(gates::train_duo_attention(o), Catch::Contains("not a directory"));
}
