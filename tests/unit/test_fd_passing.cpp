// Descriptor passing between processes (SCM_RIGHTS over abstract Unix sockets). memfds stand in for the
// cuMemCreate handles: the receiver must see the sender's bytes through the descriptor it was given.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "loom/runtime/error.hpp"
#include "runtime/fd_passing.hpp"
#include "unit/forked.hpp"

namespace {

using namespace std::chrono_literals;
using loom::detail::UniqueFd;

std::string unique_prefix(const char* what) {
    std::random_device rd;
    return "loom-test-" + std::string(what) + "-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
}

UniqueFd memfd_with(const std::string& text) {
    UniqueFd fd(::memfd_create("loom-test", MFD_CLOEXEC));
    EXPECT_GE(fd.get(), 0);
    EXPECT_EQ(::write(fd.get(), text.data(), text.size()), static_cast<ssize_t>(text.size()));
    return fd;
}

std::string read_all(int fd, std::size_t n) {
    std::string s(n, '\0');
    ssize_t got = ::pread(fd, s.data(), n, 0);
    s.resize(got < 0 ? 0 : static_cast<std::size_t>(got));
    return s;
}

std::string payload(int who) { return "descriptor of process " + std::to_string(who) + std::string(1000 + who, 'x'); }

using loom::test::run_children;

TEST(FdPassing, SendAndReceiveInOneProcessShareTheFile) {
    const std::string name = unique_prefix("single");
    loom::detail::FdListener listener(name);
    UniqueFd original = memfd_with("hello through SCM_RIGHTS");
    auto deadline = std::chrono::steady_clock::now() + 5s;
    loom::detail::send_fd(name, original.get(), 42, deadline);
    auto got = listener.receive(deadline);
    EXPECT_EQ(got.tag, 42u);
    ASSERT_TRUE(got.fd);
    EXPECT_NE(got.fd.get(), original.get());
    EXPECT_EQ(read_all(got.fd.get(), 25), "hello through SCM_RIGHTS");
    // The same file, not a copy: a write through one descriptor is seen through the other.
    ASSERT_EQ(::pwrite(got.fd.get(), "HELLO", 5, 0), 5);
    EXPECT_EQ(read_all(original.get(), 5), "HELLO");
}

TEST(FdPassing, ExchangeAmongForkedProcesses) {
    for (int n : {2, 4, 8}) {
        const std::string prefix = unique_prefix("exchange");
        auto status = run_children(n, [&](int me) {
            UniqueFd mine = memfd_with(payload(me));
            auto fds = loom::detail::exchange_fds(prefix, me, n, mine.get(), nullptr, 10000ms);
            int bad = 0;
            for (int p = 0; p < n; ++p) {
                if (p == me) {
                    bad += fds[p] ? 1 : 0;
                    continue;
                }
                std::string want = payload(p);
                if (!fds[p] || read_all(fds[p].get(), want.size() + 10) != want) {
                    std::fprintf(stderr, "process %d: wrong or missing descriptor from %d\n", me, p);
                    ++bad;
                }
            }
            return bad;
        });
        for (int i = 0; i < n; ++i) EXPECT_EQ(status[i], 0) << "n=" << n << " process " << i;
    }
}

TEST(FdPassing, SenderMayExitBeforeTheReceiverReads) {
    const std::string name = unique_prefix("early-exit");
    loom::detail::FdListener listener(name);
    auto status = run_children(1, [&](int) {
        UniqueFd fd = memfd_with("left behind");
        loom::detail::send_fd(name, fd.get(), 7, std::chrono::steady_clock::now() + 5s);
        return 0;  // exits with the descriptor still in flight
    });
    ASSERT_EQ(status[0], 0);
    auto got = listener.receive(std::chrono::steady_clock::now() + 5s);
    EXPECT_EQ(got.tag, 7u);
    EXPECT_EQ(read_all(got.fd.get(), 11), "left behind");
}

TEST(FdPassing, MissingPeerTimesOutNamingIt) {
    const std::string prefix = unique_prefix("missing");
    // Process 0 of 3 runs alone, with a fake listener for 1 so its send succeeds; 1 and 2 never send.
    loom::detail::FdListener fake1(prefix + "-1");
    loom::detail::FdListener fake2(prefix + "-2");
    UniqueFd mine = memfd_with("alone");
    auto t0 = std::chrono::steady_clock::now();
    try {
        loom::detail::exchange_fds(prefix, 0, 3, mine.get(), nullptr, 300ms);
        FAIL() << "exchange without peers did not raise";
    } catch (const loom::Error& e) {
        EXPECT_NE(std::string(e.what()).find("process(es) 1, 2"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

TEST(FdPassing, ConnectingToNobodyTimesOut) {
    UniqueFd fd = memfd_with("x");
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_THROW(loom::detail::send_fd(unique_prefix("nobody"), fd.get(), 0, t0 + 200ms), loom::Error);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

TEST(FdPassing, DuplicateListenerNameIsAClearError) {
    const std::string name = unique_prefix("dup");
    loom::detail::FdListener first(name);
    try {
        loom::detail::FdListener second(name);
        FAIL() << "a second listener on the same name did not raise";
    } catch (const loom::Error& e) {
        EXPECT_NE(std::string(e.what()).find("already in use"), std::string::npos) << e.what();
    }
}

// A process of another user: runs `fn` after setuid(kNobody) in a forked child; the parent gets its pid and a pipe
// end that becomes readable when the child writes to `ready`. Needs root (skipped otherwise).
constexpr uid_t kNobody = 65534;

struct OtherUser {
    pid_t pid = -1;
    int ready = -1;  // read end
    ~OtherUser() {
        if (pid > 0) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
        }
        if (ready >= 0) ::close(ready);
    }
    bool wait_ready() const {
        pollfd p{ready, POLLIN, 0};
        char b;
        return ::poll(&p, 1, 5000) == 1 && ::read(ready, &b, 1) == 1;
    }
};

template <class Fn>
void start_other_user(OtherUser& other, Fn&& fn) {
    int p[2];
    ASSERT_EQ(::pipe(p), 0);
    std::fflush(stdout);
    std::fflush(stderr);
    pid_t pid = ::fork();
    if (pid == 0) {
        ::close(p[0]);
        if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) ::_exit(3);
        fn(p[1]);
        ::_exit(0);
    }
    ::close(p[1]);
    other.pid = pid;
    other.ready = p[0];
}

TEST(FdPassing, SenderRefusesAListenerOfAnotherUser) {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a listener as another user";
    const std::string name = unique_prefix("squatter");
    OtherUser squatter;
    // Another user binds the name first and would receive whatever is sent to it.
    start_other_user(squatter, [&](int ready) {
        loom::detail::FdListener listener(name);
        [[maybe_unused]] auto w = ::write(ready, "r", 1);
        ::pause();
    });
    ASSERT_TRUE(squatter.wait_ready());
    UniqueFd fd = memfd_with("GPU memory of this rank");
    try {
        loom::detail::send_fd(name, fd.get(), 0, std::chrono::steady_clock::now() + 5s);
        FAIL() << "sent a descriptor to another user's listener";
    } catch (const loom::Error& e) {
        EXPECT_NE(std::string(e.what()).find("belongs to uid 65534"), std::string::npos) << e.what();
    }
}

TEST(FdPassing, ListenerDropsASenderOfAnotherUser) {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a sender as another user";
    const std::string name = unique_prefix("intruder");
    loom::detail::FdListener listener(name);
    OtherUser intruder;
    // Another user sends a well-formed message (magic and a descriptor) with a forged tag, bypassing send_fd.
    start_other_user(intruder, [&](int ready) {
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::memcpy(addr.sun_path + 1, name.data(), name.size());
        int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
        auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
        if (::connect(s, reinterpret_cast<sockaddr*>(&addr), len) != 0) ::_exit(4);
        std::uint64_t msg[2] = {0x6c6f6f6d66647631ull, 1};  // "loomfdv1", tag 1
        int forged = ::memfd_create("forged", 0);
        iovec iov{msg, sizeof msg};
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
        msghdr hdr{};
        hdr.msg_iov = &iov;
        hdr.msg_iovlen = 1;
        hdr.msg_control = control;
        hdr.msg_controllen = sizeof control;
        cmsghdr* c = CMSG_FIRSTHDR(&hdr);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        std::memcpy(CMSG_DATA(c), &forged, sizeof forged);
        if (::sendmsg(s, &hdr, 0) != static_cast<ssize_t>(sizeof msg)) ::_exit(5);
        [[maybe_unused]] auto w = ::write(ready, "r", 1);
        ::pause();
    });
    ASSERT_TRUE(intruder.wait_ready());
    // The intruder's message is queued first; the listener must skip it and take the real one.
    UniqueFd real = memfd_with("from this user");
    auto deadline = std::chrono::steady_clock::now() + 5s;
    loom::detail::send_fd(name, real.get(), 2, deadline);
    auto got = listener.receive(deadline);
    EXPECT_EQ(got.tag, 2u);
    EXPECT_EQ(read_all(got.fd.get(), 14), "from this user");
}

}  // namespace
