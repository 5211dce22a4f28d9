// Starting, watching and stopping the ranks of one loomrun job.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace loomrun {

struct LaunchSpec {
    std::vector<std::string> command;  // program and arguments (execvp)
    int nranks = 1;
    std::vector<std::pair<std::string, std::string>> common;  // variables every rank gets
    std::vector<int> devices;                                 // LOOM_DEVICE round-robin; empty: no GPU
    int port = 0;                                             // LOOM_MASTER_PORT
    std::chrono::milliseconds timeout{0};                     // 0: none
    std::chrono::milliseconds grace{3000};                    // SIGTERM -> SIGKILL
};

// Runs the job to the end and returns loomrun's exit status: 0 when every rank exits 0; the first failing
// rank's status (exit code, or 128 + signal); 128 + signal when loomrun itself is interrupted (SIGINT,
// SIGTERM, SIGHUP); 124 when the timeout passes. Every rank runs in its own process group, so stopping a rank
// also stops the processes it started. Each line a rank writes is forwarded to the same stream of loomrun
// prefixed with "[rank r] "; a final line without a newline is flushed when the rank's stream closes.
int run_job(const LaunchSpec& spec);

}  // namespace loomrun
