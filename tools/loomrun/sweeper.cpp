#include "sweeper.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "mps.hpp"

namespace loomrun {
namespace {

void send(int fd, const std::string& line) {
    if (fd < 0) return;
    // One short write: atomic on a pipe. A helper that has gone away (EPIPE; SIGPIPE is ignored) only costs its
    // clean-up.
    while (::write(fd, line.data(), line.size()) < 0 && errno == EINTR) {
    }
}

// The helper's whole life: read "group <pgid>" / "done" lines until loomrun's end closes the pipe.
[[noreturn]] void helper(int in, pid_t launcher) {
    ::setpgid(0, 0);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGTTIN, SIGTTOU, SIGPIPE}) ::signal(sig, SIG_IGN);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    int devnull = ::open("/dev/null", O_RDWR);
    if (devnull >= 0) {
        ::dup2(devnull, 0);
        ::dup2(devnull, 1);  // loomrun's stdout closes when loomrun ends, not when its helper does
    }
    std::vector<pid_t> groups;
    std::string text;
    bool done = false;
    char buf[512];
    while (true) {
        ssize_t r = ::read(in, buf, sizeof(buf));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        text.append(buf, static_cast<std::size_t>(r));
        for (std::size_t nl; (nl = text.find('\n')) != std::string::npos; text.erase(0, nl + 1)) {
            std::string line = text.substr(0, nl);
            if (line == "done") done = true;
            if (line.rfind("group ", 0) == 0) groups.push_back(static_cast<pid_t>(std::atoll(line.c_str() + 6)));
        }
    }
    if (done) ::_exit(0);
    int killed = 0;
    for (pid_t g : groups)
        if (g > 0 && ::kill(-g, SIGKILL) == 0) ++killed;
    std::fprintf(stderr, "loomrun: the launcher (pid %d) died; killed %d process group(s) of its ranks still alive\n",
                 static_cast<int>(launcher), killed);
    reap_stale_mps_daemons(launcher);
    ::_exit(0);
}

}  // namespace

Sweeper::Sweeper() {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) {
        std::fprintf(stderr, "loomrun: warning: pipe2: %s; a killed loomrun will not clean up after itself\n",
                     std::strerror(errno));
        return;
    }
    const pid_t launcher = ::getpid();
    std::fflush(nullptr);
    pid_t pid = ::fork();
    if (pid == 0) {
        ::close(p[1]);
        helper(p[0], launcher);
    }
    ::close(p[0]);
    if (pid < 0) {
        std::fprintf(stderr, "loomrun: warning: fork: %s; a killed loomrun will not clean up after itself\n",
                     std::strerror(errno));
        ::close(p[1]);
        return;
    }
    pid_ = pid;
    fd_ = p[1];
}

Sweeper::~Sweeper() { release(); }

void Sweeper::watch_group(pid_t pgid) { send(fd_, "group " + std::to_string(pgid) + "\n"); }

void Sweeper::release() {
    if (fd_ < 0) return;
    send(fd_, "done\n");
    ::close(fd_);
    fd_ = -1;
    // The helper exits at once; reap it, so that it is not left a zombie where nothing reaps orphans (a container
    // whose init does not). Bounded: a helper that does not exit is left to whoever adopts it.
    for (int i = 0; i < 200 && pid_ > 0; ++i) {
        pid_t r = ::waitpid(pid_, nullptr, WNOHANG);
        if (r == pid_ || (r < 0 && errno != EINTR)) break;
        ::usleep(5000);
    }
}

}  // namespace loomrun
