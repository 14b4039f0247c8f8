#include "app/cli/engine/sweep_scale.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "core/common/input_error.h"
#include "core/common/thread_count.h"

extern char** environ;

namespace kvscope::cli {

namespace {

namespace fs = std::filesystem;

std::string own_executable() {
  return fs::read_symlink("/proc/self/exe").string();
}

// Starts argv[0] (searched on PATH) with argv; stdout to a pipe when
// capture_fd is given. Returns the child's pid, or -1 with errno set.
pid_t spawn(const std::vector<std::string>& args, int* capture_fd = nullptr) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int pipe_fds[2] = {-1, -1};
  if (capture_fd && pipe(pipe_fds) != 0) return -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (capture_fd) {
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
    posix_spawn_file_actions_addclose(&actions, pipe_fds[1]);
  }
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (capture_fd) {
    close(pipe_fds[1]);
    *capture_fd = pipe_fds[0];
  }
  if (rc != 0) {
    if (capture_fd) close(pipe_fds[0]);
    errno = rc;
    return -1;
  }
  return pid;
}

// Waits for pid; the exit status, or 128 + signal for a killed child.
int wait_exit(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
    if (n > 0) out.append(buf, size_t(n));
  close(fd);
  return out;
}

// sh single quotes: 'it'\''s'.
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// An executable named name on PATH, or "".
std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const fs::path candidate = fs::path(dirs.substr(start, end - start)) / name;
    if (end > start && access(candidate.c_str(), X_OK) == 0) return candidate.string();
    start = end + 1;
  }
  return "";
}

std::string write_sbatch_script(const ShardWork& work, int tasks) {
  const fs::path folder = fs::path(work.dir) / "slurm";
  fs::create_directories(folder);
  const fs::path script = folder / "sweep.sbatch";
  std::ofstream out(script);
  out << "#!/bin/bash\n"
      << "# Written by kvscope sweep --slurm: array task K runs shard K/" << tasks
      << " of the plan\n# (cells i with i % " << tasks
      << " == K); every task needs the plan, the models and this\n# folder on a shared "
         "filesystem. Merge with: kvscope sweep PLAN -o DIR --collect\n"
      << "#SBATCH --job-name=kvscope-sweep\n"
      << "#SBATCH --output=" << (fs::absolute(folder) / "task-%A_%a.out").string() << "\n"
      << "set -eu\n"
      << "exec " << shell_quote(own_executable());
  ShardWork absolute = work;
  absolute.plan = fs::absolute(work.plan).string();
  absolute.dir = fs::absolute(work.dir).string();
  std::vector<std::string> args = shard_arguments(
      absolute, "${SLURM_CPUS_PER_TASK:-0}", "${SLURM_ARRAY_TASK_ID}/" + std::to_string(tasks));
  // Slurm's variables expand in double quotes; everything else is literal.
  for (const std::string& a : args)
    out << ' ' << (a.rfind("${SLURM", 0) == 0 ? "\"" + a + "\"" : shell_quote(a));
  out << "\n";
  if (!out) throw InputError(script.string(), "", "cannot write the Slurm batch script");
  fs::permissions(script, fs::perms::owner_exec, fs::perm_options::add);
  return script.string();
}

}  // namespace

Shard parse_shard(const std::string& text) {
  Shard s;
  char slash = 0;
  char rest = 0;
  const int n = std::sscanf(text.c_str(), "%d%c%d%c", &s.index, &slash, &s.count, &rest);
  if (n != 3 || slash != '/' || s.count < 1 || s.index < 0 || s.index >= s.count)
    throw InputError("", "--shard", "expected K/N with 0 <= K < N (e.g. 0/4), got '" + text + "'");
  return s;
}

std::vector<std::string> shard_arguments(const ShardWork& work, const std::string& threads,
                                         const std::string& shard) {
  std::vector<std::string> args = {"sweep", work.plan,   "-o",    work.dir,   "--shard",
                                   shard,   "--threads", threads, "--device", work.device};
  if (work.retry_failed) args.push_back("--retry-failed");
  return args;
}

std::string worker_device(const std::string& device, int worker, int gpus) {
  if (device != "cuda" || gpus < 2) return device;
  return "cuda:" + std::to_string(worker % gpus);
}

int run_local_jobs(const ShardWork& work, int jobs, int threads, int gpus) {
  const int cores = threads > 0 ? threads : default_thread_count();
  const int per_job = std::max(1, cores / jobs);
  std::vector<pid_t> pids;
  for (int k = 0; k < jobs; ++k) {
    ShardWork mine = work;
    mine.device = worker_device(work.device, k, gpus);
    if (mine.device != work.device)
      std::cerr << "sweep worker " << k << "/" << jobs << " captures on " << mine.device << "\n";
    std::vector<std::string> args = {own_executable()};
    for (const std::string& a : shard_arguments(mine, std::to_string(per_job),
                                                std::to_string(k) + "/" + std::to_string(jobs)))
      args.push_back(a);
    const pid_t pid = spawn(args);
    if (pid < 0) {
      const std::string why = strerror(errno);
      for (pid_t started : pids) wait_exit(started);  // no worker is left running unwatched
      throw std::runtime_error("cannot start a sweep worker: " + why);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (size_t k = 0; k < pids.size(); ++k) {
    const int rc = wait_exit(pids[k]);
    if (rc != 0) {
      std::cerr << "sweep worker " << k << "/" << jobs << " exited with " << rc << "\n";
      ++failed;
    }
  }
  return failed;
}

SlurmSubmission submit_slurm(const ShardWork& work, int tasks,
                             const std::vector<std::string>& sbatch_options) {
  const std::string sbatch = find_on_path("sbatch");
  if (sbatch.empty())
    throw InputError("sbatch", "--slurm",
                     "Slurm not reachable: sbatch is not on PATH (run on a cluster's login node, "
                     "or install slurm-client)");
  const std::string script = write_sbatch_script(work, tasks);
  std::vector<std::string> args = {sbatch, "--parsable", "--array=0-" + std::to_string(tasks - 1)};
  args.insert(args.end(), sbatch_options.begin(), sbatch_options.end());
  args.push_back(script);
  int out_fd = -1;
  const pid_t pid = spawn(args, &out_fd);
  if (pid < 0)
    throw InputError(sbatch, "--slurm", "cannot run sbatch: " + std::string(strerror(errno)));
  const std::string out = read_all(out_fd);
  SlurmSubmission s;
  s.sbatch_exit = wait_exit(pid);
  s.job_id = out.substr(0, out.find_first_of(";\n"));
  s.waited =
      std::find(sbatch_options.begin(), sbatch_options.end(), "--wait") != sbatch_options.end() ||
      std::find(sbatch_options.begin(), sbatch_options.end(), "-W") != sbatch_options.end();
  // Without --wait a non-zero exit means the job was not submitted; with
  // --wait it may also mean a task failed after submission (its job id is
  // then printed), which --collect reports per cell.
  if (s.sbatch_exit != 0 && s.job_id.empty())
    throw InputError(sbatch, "--slurm",
                     "Slurm not reachable or the job was refused: sbatch exited with " +
                         std::to_string(s.sbatch_exit) + " (its message is above)");
  return s;
}

}  // namespace kvscope::cli
