// Facts about processes from /proc, for loomrun's clean-up (no CUDA, no privileges).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace loomrun {

// A process over time: its pid and start time (clock ticks after boot, field 22 of /proc/<pid>/stat), so that a
// reused pid is not taken for the process that had it.
struct ProcId {
    pid_t pid = 0;
    unsigned long long start = 0;
};

// The identity of a live process; nullopt when it is gone or a zombie (it has exited, its parent has not reaped it).
std::optional<ProcId> live_process(pid_t pid);

// Whether the process `id` names still runs: the pid is live and has the same start time.
bool still_running(const ProcId& id);

// "pid start" and back, for files that name a process.
std::string to_text(const ProcId& id);
std::optional<ProcId> proc_id_from_text(const std::string& text);

// The children of process `pid` (every thread's /proc/<pid>/task/<tid>/children), zombies included.
std::vector<pid_t> children_of(pid_t pid);

}  // namespace loomrun
