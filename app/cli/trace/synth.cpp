// kvscope synth -o FILE [sizes...]: a synthetic trace with known content, for
// trying the GUI and the tools without a model, and for benchmarks.
#include <iostream>
#include <memory>

#include "app/cli/command.h"
#include "core/common/cli_checks.h"
#include "core/common/input_error.h"
#include "core/trace/synthetic.h"

namespace kvscope::cli {

namespace {

struct SynthOptions {
  std::string out;
  trace::SyntheticSpec spec;
  int compression = 1;
};

int run_synth(const SynthOptions& opt) {
  check_output_path(opt.out, "-o");
  trace::TraceWriter::Options wopt;
  wopt.compression_level = opt.compression;
  int64_t steps = trace::write_synthetic_trace(opt.out, opt.spec, wopt);
  std::cout << "wrote " << opt.out << ": " << steps << " steps, "
            << opt.spec.prompt_tokens + opt.spec.decode_steps << " tokens\n";
  return kExitOk;
}

}  // namespace

namespace {
Command add_synth_command(CLI::App& app) {
  auto opt = std::make_shared<SynthOptions>();
  trace::SyntheticSpec& s = opt->spec;
  CLI::App* sub = app.add_subcommand("synth", "Write a synthetic trace with known content");
  sub->add_option("-o,--output", opt->out, "output trace file")->required();
  sub->add_option("--layers", s.layers, "layers")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  sub->add_option("--heads", s.heads, "query heads")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  sub->add_option("--kv-heads", s.kv_heads, "key/value heads")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  sub->add_option("--prompt-tokens", s.prompt_tokens, "prompt length")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  sub->add_option("--decode-steps", s.decode_steps, "decode steps")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  sub->add_option("--prefill-chunk", s.prefill_chunk, "prefill chunk (0: whole prompt)")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  sub->add_option("--sinks", s.sinks, "sink tokens per head")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  sub->add_option("--window", s.window, "base recent window per head")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  sub->add_option("--tiers", s.tiers, "1 or 2 tiers")
      ->check(CLI::Range(1, 2))
      ->capture_default_str();
  sub->add_option("--pooled-block", s.pooled_block, "pooled attention block (0: none)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  sub->add_option("--topk", s.topk, "top-k per query (0: none)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  sub->add_flag("!--no-received", s.received, "omit /attention/received");
  sub->add_flag("!--no-oracle", s.oracle, "omit /oracle");
  sub->add_flag("!--no-dense", s.dense, "omit /attention/dense");
  sub->add_flag("!--no-gates", s.gates, "omit /gates");
  sub->add_flag("!--no-series", s.series, "omit /series");
  sub->add_flag("!--cold-unattended", s.cold_attended,
                "tier 1 is not attended (offloaded): attention skips it and some decode steps "
                "stall on its tokens (/stalls); needs --tiers 2");
  sub->add_option("--seed", s.seed, "seed")->capture_default_str();
  sub->add_option("--needle-begin", s.needle_begin,
                  "first prompt token marked as a retrieval needle (-1: none)")
      ->check(CLI::Range(int64_t(-1), int64_t(1) << 24));
  sub->add_option("--needle-tokens", s.needle_tokens, "needle length in tokens")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 24));
  sub->add_option("--question-tokens", s.question_tokens,
                  "last prompt tokens marked as the task's question")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 24));
  sub->add_option("--compression", opt->compression, "deflate level 0-9")
      ->check(CLI::Range(0, 9))
      ->capture_default_str();
  return {sub, [opt] {
            if (opt->spec.heads % opt->spec.kv_heads != 0)
              throw InputError("", "--heads",
                               std::to_string(opt->spec.heads) +
                                   " is not a multiple of --kv-heads " +
                                   std::to_string(opt->spec.kv_heads));
            if (!opt->spec.cold_attended && opt->spec.tiers < 2)
              throw InputError("", "--cold-unattended",
                               "needs a cold tier to leave unread (expected --tiers 2)");
            return run_synth(*opt);
          }};
}
}  // namespace

KVSCOPE_REGISTER_COMMAND("synth", add_synth_command);

}  // namespace kvscope::cli
