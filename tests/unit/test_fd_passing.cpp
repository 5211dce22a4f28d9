// Descriptor passing between processes (SCM_RIGHTS over abstract Unix sockets). memfds stand in for the
// cuMemCreate handles: the receiver must see the sender's bytes through the descriptor it was given.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
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

}  // namespace
