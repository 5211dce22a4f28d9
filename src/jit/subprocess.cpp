#include "jit/subprocess.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "loom/runtime/error.hpp"

extern char** environ;

namespace loom::jit::detail {

std::string shell_join(const std::vector<std::string>& argv) {
    std::string s;
    for (const auto& a : argv) {
        if (!s.empty()) s += ' ';
        bool plain = !a.empty() && a.find_first_of(" \t\n'\"\\$`*?&;|<>()") == std::string::npos;
        if (plain) {
            s += a;
        } else {
            s += '\'';
            for (char c : a) s += c == '\'' ? std::string("'\\''") : std::string(1, c);
            s += '\'';
        }
    }
    return s;
}

ProcessResult run_process(const std::vector<std::string>& argv, std::chrono::seconds timeout) {
    LOOM_CHECK(!argv.empty(), "run_process: expected a command, given an empty argv");
    int fds[2];
    LOOM_CHECK_ERRNO(pipe2(fds, O_CLOEXEC));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = -1;
    int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        throw Error("posix_spawnp", fmt::format("cannot start {}: {}", shell_join(argv), std::strerror(rc)), __FILE__,
                    __LINE__);
    }
    ProcessResult res;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    char buf[4096];
    for (;;) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
            res.timed_out = true;
            kill(pid, SIGKILL);
            break;
        }
        pollfd p{fds[0], POLLIN, 0};
        int n = poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) continue;
        ssize_t got = read(fds[0], buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;  // EOF: the child closed its output (exited)
        res.output.append(buf, static_cast<std::size_t>(got));
    }
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status)) res.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) res.exit_code = 128 + WTERMSIG(status);
    if (res.timed_out) res.output += fmt::format("\n[loom] killed after {} s\n", timeout.count());
    return res;
}

}  // namespace loom::jit::detail
