// Runs a function in several forked child processes (one per simulated rank) with a bounded wait.
// Used by CPU tests that need real processes: descriptor passing, the World over the store.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace loom::test {

inline constexpr int kChildTimedOut = 200;
inline constexpr int kChildThrew = 98;

// Forks n children running fn(i); a child's exit status is fn's return value (kChildThrew when it throws,
// 128 + signal when killed). Children still running after `limit` are killed and get kChildTimedOut.
// Call only from a process without CUDA state or extra threads (fork copies one thread).
inline std::vector<int> run_children(int n, const std::function<int(int)>& fn,
                                     std::chrono::milliseconds limit = std::chrono::seconds(60)) {
    std::fflush(stdout);
    std::fflush(stderr);
    std::vector<pid_t> pids;
    for (int i = 0; i < n; ++i) {
        pid_t pid = ::fork();
        if (pid == 0) {
            int rc = 99;
            try {
                rc = fn(i);
            } catch (const std::exception& e) {
                std::fprintf(stderr, "child %d: %s\n", i, e.what());
                rc = kChildThrew;
            }
            std::fflush(stdout);
            std::fflush(stderr);
            ::_exit(rc);
        }
        pids.push_back(pid);
    }
    std::vector<int> status(n, -1);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (int left = n; left > 0;) {
        for (int i = 0; i < n; ++i) {
            int st = 0;
            if (status[i] == -1 && ::waitpid(pids[i], &st, WNOHANG) == pids[i]) {
                status[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                --left;
            }
        }
        if (left > 0 && std::chrono::steady_clock::now() > deadline) {
            for (int i = 0; i < n; ++i) {
                if (status[i] != -1) continue;
                ::kill(pids[i], SIGKILL);
                ::waitpid(pids[i], nullptr, 0);
                status[i] = kChildTimedOut;
            }
            break;
        }
        if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return status;
}

}  // namespace loom::test
