// Fast KVzip's training (`kvscope train --policy fastkvzip`): it lowers the
// BCE against the KVzip targets. The gate: tests/gates/test_fastkvzip_gate.cpp.
#include "capture/train/train_options.h"
#include "tests/gates/gate_test_util.h"
#include "tests/support/paths.h"
#include "tests/train/train_runner.h"

namespace kvscope::test {

namespace {

using gates::GateKind;

}  // namespace

TEST_CASE("fastkvzip: training lowers the BCE against the KVzip targets", "[gates][fastkvzip]") {
  const std::string text = write_story_text("fastkvzip-text.txt", 4);
  gates::TrainOptions o;
  o.kind = GateKind::FastKvzip;
  o.model.model = stories_model_path();
  o.model.tokenizer = stories_tokenizer_path();
  o.model.threads = 1;
  o.data.paths = {text};
  o.data.holdout = 0.1;
  o.seq_len = 24;
  o.steps = 3;
  o.quiet = true;
  o.hyper_given = {{"iters", 150}, {"batch", 32}};
  o.output = temp_dir() + "/stories-fastkvzip.safetensors";
  const gates::TrainResult r = test::train_kind(o);
  generate::Engine engine = generate::open_engine(o.model);
  const gates::GateSet g = gates::load_gates(o.output, engine.model->config());
  CHECK(g.kind == GateKind::FastKvzip);
  CHECK(g.meta["training"]["samples"] == 3 * 24);
  CHECK(g.meta["training"]["heldout_bce"].size() == size_t(engine.model->config().n_layers));
  const double first = r.summary["first_train_bce_per_layer"],
               last = r.summary["final_train_bce_per_layer"];
  CHECK(last < 0.8 * first);
}

}  // namespace kvscope::test
