#include "common/child_process.hpp"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>

namespace loom::test {

ChildResult run_test_child(const std::string& filter, const std::vector<std::pair<std::string, std::string>>& env,
                           int timeout_s) {
    ChildResult r;
    int out[2];
    if (pipe(out) != 0) {
        r.output = "(parent: pipe failed)";
        return r;
    }
    const pid_t pid = fork();
    if (pid < 0) {
        r.output = "(parent: fork failed)";
        return r;
    }
    if (pid == 0) {
        dup2(out[1], 1);
        dup2(out[1], 2);
        close(out[0]);
        for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
        setenv("CUDA_MPS_PIPE_DIRECTORY", "/nonexistent/loom-test-child-no-mps", 1);
        const std::string arg = "--gtest_filter=" + filter;
        execl("/proc/self/exe", "loom-test-child", arg.c_str(), nullptr);
        _exit(127);
    }
    close(out[1]);
    char chunk[4096];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    for (;;) {
        pollfd p{out[0], POLLIN, 0};
        if (poll(&p, 1, 200) > 0) {
            const ssize_t n = read(out[0], chunk, sizeof chunk);
            if (n <= 0) break;
            r.output.append(chunk, static_cast<std::size_t>(n));
        }
        if (std::chrono::steady_clock::now() > deadline) {
            kill(pid, SIGKILL);
            r.output += "\n(parent: child killed after " + std::to_string(timeout_s) + " s)";
            break;
        }
    }
    close(out[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return r;
}

}  // namespace loom::test
