// How many compute threads "--threads 0" means: OMP_NUM_THREADS when it is
// set (what a cluster's job script or a parallel test runner gives each
// process), else the CPUs this process may run on (its affinity mask: taskset
// and cgroup cpusets give fewer than the machine has).
#pragma once

namespace kvscope {

// OMP_NUM_THREADS's first value (OpenMP allows a comma list, one per nesting
// level) when set and not empty, else the CPUs in the affinity mask (at least
// 1). Throws InputError naming OMP_NUM_THREADS when it is not a positive
// whole number.
int default_thread_count();

}  // namespace kvscope
