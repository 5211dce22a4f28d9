// Runs a compiler tool (nvcc, ptxas, cuobjdump) as a child process with its output captured.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace loom::jit::detail {

struct ProcessResult {
    int exit_code = -1;  // the child's exit status; 128 + signal when killed by a signal
    bool timed_out = false;
    std::string output;  // stdout and stderr interleaved
};

// Runs argv[0] (looked up in PATH when it has no '/') with argv; never throws for the child's failure (the
// caller reads exit_code), raises loom::Error when the process cannot be started. The child is killed
// (SIGKILL) when it runs past `timeout`. Thread-safe (posix_spawn).
ProcessResult run_process(const std::vector<std::string>& argv, std::chrono::seconds timeout);

// argv joined with shell quoting, for messages.
std::string shell_join(const std::vector<std::string>& argv);

}  // namespace loom::jit::detail
