#include "common/child_process.hpp"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>

namespace loom::test {

std::string child_helper_path() {
    std::error_code ec;
    return (std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "loom_test_child").string();
}

ChildResult run_child(const std::string& which, const std::vector<std::pair<std::string, std::string>>& env,
                      int timeout_s, bool outside_mps) {
    ChildResult r;
    const std::string helper = child_helper_path();
    const std::string exec_failed = "(child: cannot run " + helper + ")\n";  // formatted before fork
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
        if (outside_mps) setenv("CUDA_MPS_PIPE_DIRECTORY", "/nonexistent/loom-test-child-no-mps", 1);
        execl(helper.c_str(), "loom_test_child", which.c_str(), nullptr);
        (void)!write(2, exec_failed.data(), exec_failed.size());
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
