#include "launcher.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <thread>

#include "procs.hpp"

namespace loomrun {
namespace {

using Clock = std::chrono::steady_clock;

// How long the final sweep waits for killed leftovers to be reaped (a process tearing down a GPU context can take
// seconds to die after SIGKILL).
constexpr auto kReapBound = std::chrono::seconds(5);

int g_signal_pipe = -1;  // write end of the self-pipe; the handler's only state

void on_signal(int sig) {
    int saved = errno;
    unsigned char b = static_cast<unsigned char>(sig);
    [[maybe_unused]] auto w = ::write(g_signal_pipe, &b, 1);
    errno = saved;
}

void write_all(int fd, const std::string& s) {
    std::size_t off = 0;
    while (off < s.size()) {
        ssize_t w = ::write(fd, s.data() + off, s.size() - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;  // e.g. our reader went away (EPIPE): the ranks' output is dropped, the job goes on
        off += static_cast<std::size_t>(w);
    }
}

// One rank's stdout or stderr, forwarded line by line with the rank prefix.
struct Stream {
    int fd = -1;
    int target = 1;  // loomrun's fd it goes to
    std::string prefix, partial;

    void forward(const char* data, std::size_t n) {
        partial.append(data, n);
        std::size_t last = partial.rfind('\n');
        if (last == std::string::npos && partial.size() < (1u << 20)) return;
        std::size_t end = last == std::string::npos ? partial.size() : last + 1;
        std::string out;
        for (std::size_t pos = 0; pos < end;) {
            std::size_t nl = partial.find('\n', pos);
            std::size_t stop = nl == std::string::npos || nl >= end ? end : nl + 1;
            out += prefix;
            out.append(partial, pos, stop - pos);
            if (out.back() != '\n') out += '\n';
            pos = stop;
        }
        partial.erase(0, end);
        write_all(target, out);
    }

    void close_stream() {
        if (!partial.empty()) write_all(target, prefix + partial + "\n");
        partial.clear();
        if (fd >= 0) ::close(fd);
        fd = -1;
    }

    void read_some() {
        char buf[65536];
        ssize_t r = ::read(fd, buf, sizeof(buf));
        if (r > 0) {
            forward(buf, static_cast<std::size_t>(r));
        } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
            close_stream();
        }
    }
};

struct Rank {
    pid_t pid = -1;
    bool running = false;
    int status = 0;
};

std::string describe(int status) {
    if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
    const char* name = ::sigabbrev_np(WTERMSIG(status));
    return fmt::format("was killed by SIG{} (signal {})", name ? name : "?", WTERMSIG(status));
}

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

pid_t spawn(const LaunchSpec& spec, int r, Stream& out, Stream& err) {
    int o[2], e[2];
    if (::pipe2(o, O_CLOEXEC) != 0 || ::pipe2(e, O_CLOEXEC) != 0)
        throw std::runtime_error(fmt::format("pipe2: {}", std::strerror(errno)));
    const pid_t launcher = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
    if (pid == 0) {
        ::setpgid(0, 0);
        // Die with loomrun however it ends (kept across exec). A loomrun that died before the prctl shows in
        // getppid(): the rank has already been adopted by another process.
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != launcher) ::_exit(128 + SIGKILL);
        for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) ::signal(sig, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        ::sigprocmask(SIG_SETMASK, &none, nullptr);
        int devnull = ::open("/dev/null", O_RDONLY);
        if (devnull >= 0) ::dup2(devnull, 0);
        ::dup2(o[1], 1);
        ::dup2(e[1], 2);
        for (auto& [k, v] : spec.common) ::setenv(k.c_str(), v.c_str(), 1);
        const std::string rank = std::to_string(r), world = std::to_string(spec.nranks);
        for (const char* var : {"LOOM_RANK", "LOOM_LOCAL_RANK", "RANK", "LOCAL_RANK"}) ::setenv(var, rank.c_str(), 1);
        for (const char* var : {"LOOM_WORLD_SIZE", "LOOM_LOCAL_WORLD_SIZE", "WORLD_SIZE", "LOCAL_WORLD_SIZE"})
            ::setenv(var, world.c_str(), 1);
        for (const char* var : {"LOOM_MASTER_ADDR", "MASTER_ADDR"}) ::setenv(var, "127.0.0.1", 1);
        ::setenv("LOOM_MASTER_PORT", std::to_string(spec.port).c_str(), 1);
        if (spec.torch_port > 0) ::setenv("MASTER_PORT", std::to_string(spec.torch_port).c_str(), 1);
        if (!spec.devices.empty())
            ::setenv("LOOM_DEVICE", std::to_string(spec.devices[r % spec.devices.size()]).c_str(), 1);
        else
            ::unsetenv("LOOM_DEVICE");
        std::vector<char*> argv;
        for (auto& a : spec.command) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        ::execvp(argv[0], argv.data());
        std::fprintf(stderr, "loomrun: cannot execute '%s': %s\n", argv[0], std::strerror(errno));
        ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here, so that a kill right after fork reaches the group
    ::close(o[1]);
    ::close(e[1]);
    out.fd = o[0];
    err.fd = e[0];
    out.target = 1;
    err.target = 2;
    out.prefix = err.prefix = fmt::format("[rank {}] ", r);
    return pid;
}

// Processes the ranks started that left their process group and outlived their parent: loomrun, a subreaper,
// adopted them.
std::vector<pid_t> adopted(const std::vector<Rank>& ranks, const std::vector<pid_t>& helpers) {
    std::vector<pid_t> out;
    for (pid_t c : children_of(::getpid())) {
        bool ours = std::find(helpers.begin(), helpers.end(), c) != helpers.end();
        for (const Rank& rk : ranks) ours |= rk.pid == c;
        if (!ours) out.push_back(c);
    }
    return out;
}

// Reaps the children that have exited, recording the ranks' statuses; returns the ranks reaped, in order.
std::vector<int> reap(std::vector<Rank>& ranks) {
    std::vector<int> done;
    int status = 0;
    for (pid_t pid; (pid = ::waitpid(-1, &status, WNOHANG)) > 0;)
        for (int r = 0; r < static_cast<int>(ranks.size()); ++r)
            if (ranks[r].pid == pid && ranks[r].running) {
                ranks[r].running = false;
                ranks[r].status = status;
                done.push_back(r);
            }
    return done;
}

// Once every rank has exited: SIGKILLs what the ranks left running (members of their process groups, adopted
// processes) and reaps the adopted ones, waiting at most kReapBound.
void sweep_leftovers(std::vector<Rank>& ranks, const std::vector<pid_t>& helpers) {
    reap(ranks);
    int groups = 0, others = 0;
    for (const Rank& rk : ranks)
        if (rk.pid > 0 && ::kill(-rk.pid, 0) == 0 && ::kill(-rk.pid, SIGKILL) == 0) ++groups;
    for (pid_t c : adopted(ranks, helpers))
        if (live_process(c) && ::kill(c, SIGKILL) == 0) ++others;
    if (groups + others > 0)
        std::fprintf(
            stderr,
            "loomrun: killed what the ranks left running (in %d rank process group(s); %d adopted by loomrun)\n",
            groups, others);
    const auto deadline = Clock::now() + kReapBound;
    while (!adopted(ranks, helpers).empty() && Clock::now() < deadline) {
        reap(ranks);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
}

}  // namespace

int run_job(const LaunchSpec& spec) {
    int sp[2];
    if (::pipe2(sp, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error("pipe2 for signals failed");
    g_signal_pipe = sp[1];
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) ::sigaction(sig, &sa, nullptr);
    ::signal(SIGPIPE, SIG_IGN);
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);

    const int n = spec.nranks;
    std::vector<Rank> ranks(n);
    std::vector<Stream> streams(2 * n);
    auto start = Clock::now();
    bool terminating = false, killed = false;
    Clock::time_point kill_at{};
    std::optional<int> code;
    std::string reason;

    auto terminate_all = [&](int sig) {
        for (auto& rk : ranks)
            if (rk.pid > 0) ::kill(-rk.pid, sig);  // the whole group: the rank and what it started
        for (pid_t c : adopted(ranks, spec.helpers)) ::kill(c, sig);
    };
    auto begin_termination = [&](int result, const std::string& why) {
        if (terminating) return;
        terminating = true;
        code = result;
        reason = why;
        std::fprintf(stderr, "loomrun: %s; stopping all ranks\n", why.c_str());
        terminate_all(SIGTERM);
        kill_at = Clock::now() + spec.grace;
    };

    int running = 0;
    try {
        for (int r = 0; r < n; ++r) {
            ranks[r].pid = spawn(spec, r, streams[2 * r], streams[2 * r + 1]);
            ranks[r].running = true;
            ++running;
            if (spec.on_start) spec.on_start(ranks[r].pid);
        }
    } catch (const std::exception& e) {
        begin_termination(1, fmt::format("cannot start the ranks ({})", e.what()));
    }

    std::optional<Clock::time_point> drain_until;
    std::vector<pollfd> fds;
    std::vector<Stream*> polled;
    while (true) {
        if (running == 0) {
            // Every rank has exited; wait briefly for output still in flight (or held by leftover children).
            if (!drain_until) drain_until = Clock::now() + std::chrono::seconds(1);
            bool open = false;
            for (auto& s : streams) open |= s.fd >= 0;
            if (!open || Clock::now() >= *drain_until) break;
        }
        fds.assign(1, pollfd{sp[0], POLLIN, 0});
        polled.clear();
        for (auto& s : streams)
            if (s.fd >= 0) {
                fds.push_back({s.fd, POLLIN, 0});
                polled.push_back(&s);
            }
        int rc = ::poll(fds.data(), fds.size(), 100);
        if (rc > 0) {
            if (fds[0].revents & POLLIN) {
                unsigned char sigs[64];
                ssize_t k;
                while ((k = ::read(sp[0], sigs, sizeof(sigs))) > 0)
                    for (ssize_t i = 0; i < k; ++i) {
                        int sig = sigs[i];
                        if (sig == SIGCHLD) continue;  // reaped below
                        if (!terminating) {
                            begin_termination(128 + sig, fmt::format("caught {}", ::sigabbrev_np(sig)));
                        } else if (!killed) {  // asked again: stop waiting for the grace period
                            killed = true;
                            terminate_all(SIGKILL);
                        }
                    }
            }
            for (std::size_t i = 1; i < fds.size(); ++i)
                if (fds[i].revents) polled[i - 1]->read_some();
        }
        for (int r : reap(ranks)) {  // also reaps adopted processes that have exited
            const int status = ranks[r].status;
            --running;
            if (!terminating && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
                begin_termination(exit_code(status), fmt::format("rank {} {}", r, describe(status)));
        }
        auto now = Clock::now();
        if (!terminating && spec.timeout.count() > 0 && now - start > spec.timeout)
            begin_termination(124, fmt::format("timeout of {:.3g} s exceeded", spec.timeout.count() / 1000.0));
        if (terminating && !killed && running > 0 && now >= kill_at) {
            killed = true;
            std::fprintf(stderr, "loomrun: ranks still running %.3g s after SIGTERM; sending SIGKILL\n",
                         spec.grace.count() / 1000.0);
            terminate_all(SIGKILL);
        }
    }
    for (auto& s : streams) s.close_stream();
    sweep_leftovers(ranks, spec.helpers);
    if (code.value_or(0) != 0) std::fprintf(stderr, "loomrun: exit status %d: %s\n", *code, reason.c_str());
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) ::signal(sig, SIG_DFL);
    ::close(sp[0]);
    ::close(sp[1]);
    g_signal_pipe = -1;
    return code.value_or(0);
}

}  // namespace loomrun
