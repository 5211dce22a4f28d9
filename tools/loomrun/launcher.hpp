// Starting, watching and stopping the ranks of one loomrun job.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace loomrun {

struct LaunchSpec {
    std::vector<std::string> command;  // program and arguments (execvp)
    int nranks = 1;
    std::vector<std::pair<std::string, std::string>> common;  // variables every rank gets
    std::vector<int> devices;                                 // LOOM_DEVICE round-robin; empty: no GPU
    int port = 0;                                             // LOOM_MASTER_PORT: Loom's store
    int torch_port = 0;                                       // MASTER_PORT: torch.distributed's store
    std::chrono::milliseconds timeout{0};                     // 0: none
    std::chrono::milliseconds grace{3000};                    // SIGTERM -> SIGKILL
    std::function<void(pid_t)> on_start;                      // called with each rank's pid (= its process group)
    std::vector<pid_t> helpers;                               // loomrun's own children that are not ranks
};

// Runs the job to the end and returns loomrun's exit status: 0 when every rank exits 0; the first failing
// rank's status (exit code, or 128 + signal) with a line naming the rank and its exit status or signal; 128 +
// signal when loomrun itself is interrupted (SIGINT, SIGTERM, SIGHUP); 124 when the timeout passes. Stopping is
// SIGTERM to every rank, then SIGKILL after `grace` (or at a second signal to loomrun).
//
// No process of the job outlives it:
//  - every rank runs in its own process group, so stopping a rank also stops the processes it started, and on
//    every exit path the groups are swept with SIGKILL once the ranks have exited;
//  - loomrun is a child subreaper (PR_SET_CHILD_SUBREAPER) from here on, so a process a rank started that left
//    the rank's group (setsid) and outlived the rank becomes loomrun's child: it is stopped with the ranks and
//    reaped (set after the MPS daemon has started, which therefore is not adopted);
//  - each rank has PR_SET_PDEATHSIG = SIGKILL, so ranks die with loomrun even when it is SIGKILLed (a Sweeper
//    then kills what the ranks started).
// Each line a rank writes is forwarded to the same stream of loomrun prefixed with "[rank r] "; a final line
// without a newline is flushed when the rank's stream closes. Besides LOOM_RANK, LOOM_WORLD_SIZE, LOOM_LOCAL_RANK,
// LOOM_LOCAL_WORLD_SIZE, LOOM_MASTER_ADDR and LOOM_MASTER_PORT, each rank gets torchrun's RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (= torch_port), so torch.distributed's env://
// initialisation works in a rank beside Loom's store.
int run_job(const LaunchSpec& spec);

}  // namespace loomrun
