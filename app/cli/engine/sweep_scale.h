// Scale-out of `kvscope sweep`: a plan's cells split into shards (cell i goes
// to shard i mod N), each shard run by its own kvscope process that loads
// each model once and appends to shards/results.K-of-N.csv. Local workers
// (`--jobs N`) and Slurm job arrays (`--slurm N`) are two ways to start the
// same shard processes; `--collect` merges their tables.
#pragma once

#include <string>
#include <vector>

namespace kvscope::cli {

struct Shard {
  int index = 0, count = 1;  // this process runs cells i with i % count == index
};

// "K/N" with 0 <= K < N; throws InputError naming --shard otherwise.
Shard parse_shard(const std::string& text);

// What every shard process of one sweep is told: the plan, the output
// folder, the device it captures on and whether failed cells run again.
struct ShardWork {
  std::string plan, dir;
  std::string device = "cpu";
  bool retry_failed = false;
};

// The arguments a shard process gets (after the executable).
std::vector<std::string> shard_arguments(const ShardWork& work, const std::string& threads,
                                         const std::string& shard);

// The device local worker `worker` captures on when the sweep asked for
// `device` and this machine has `gpus` CUDA devices: a plain "cuda" spreads
// the workers round-robin over the GPUs (cuda:0, cuda:1, ...), since
// otherwise all of them would share GPU 0 and leave the others idle; "cpu"
// and a pinned "cuda:N" are every worker's as given.
std::string worker_device(const std::string& device, int worker, int gpus);

// Starts `jobs` local shard processes of this executable and waits for all;
// returns how many exited with a failure. `gpus`: CUDA devices visible here
// (worker_device).
int run_local_jobs(const ShardWork& work, int jobs, int threads, int gpus);

struct SlurmSubmission {
  std::string job_id;
  bool waited = false;  // sbatch --wait was given and returned
  int sbatch_exit = 0;
};

// Writes DIR/slurm/sweep.sbatch and submits it as an array of `tasks` shard
// processes with sbatch (from PATH) and the user's sbatch options. Throws
// InputError (exit 2) when sbatch is missing or refuses the job.
SlurmSubmission submit_slurm(const ShardWork& work, int tasks,
                             const std::vector<std::string>& sbatch_options);

}  // namespace kvscope::cli
