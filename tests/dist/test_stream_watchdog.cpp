// The host watchdog of copy-engine stream waits (src/runtime/stream_watchdog.hpp) on the GPU: a rank that skips a
// copy-engine collective ends its peer in a named diagnostic within LOOM_WAIT_TIMEOUT_MS + 5 s. The two ranks of
// that job are child processes (loom_test_child ce-skip-collective) of ranks 0 and 1 of this one: the watchdog
// aborts its process, which must not be a rank of this job. They run on rank 0's GPU (so all_gather goes through the
// copy engine alone), as clients of this job's MPS server (the watchdog ends a child by SIGABRT, not by a trap), and
// each is killed if it outlives the bound by 25 s.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <string>

#include "common/child_process.hpp"
#include "common/test_env.hpp"
#include "loom/runtime/settings.hpp"

namespace {

constexpr int kTimeoutMs = 2000;

// A TCP port free on the loopback now (the child job's store binds it a moment later).
int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) ::close(fd);
    return port;
}

long long steady_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

TEST(StreamWatchdog, SkippedCopyEngineCollectiveEndsInNamedDiagnostic) {
    LOOM_REQUIRE_GPU();
    auto& w = loom::test::world();
    if (w.rank() == 0) {
        w.store().set("watchdog-test/port", std::to_string(free_port()));
        w.store().set("watchdog-test/device", std::to_string(w.device()));
    }
    const std::string port = w.store().get_string("watchdog-test/port");
    const std::string gpu = w.store().get_string("watchdog-test/device");  // both children on rank 0's GPU
    EXPECT_NE(port, "-1") << "no free loopback port";
    if (w.rank() < 2 && port != "-1") {
        const std::string r = std::to_string(w.rank());
        const auto [status, output] = loom::test::run_child("ce-skip-collective",
                                                            {{"LOOM_RANK", r},
                                                             {"LOOM_WORLD_SIZE", "2"},
                                                             {"LOOM_LOCAL_RANK", r},
                                                             {"LOOM_LOCAL_WORLD_SIZE", "2"},
                                                             {"LOOM_MASTER_ADDR", "127.0.0.1"},
                                                             {"LOOM_MASTER_PORT", port},
                                                             {"LOOM_DEVICE", gpu},
                                                             {"LOOM_WAIT_TIMEOUT_MS", std::to_string(kTimeoutMs)},
                                                             // Off: with it on, rank 0's call 2 would wait in the
                                                             // store for rank 1's signature, not on the stream.
                                                             {"LOOM_CHECK_AGREEMENT", "0"}},
                                                            kTimeoutMs / 1000 + 25, /*outside_mps=*/false);
        const long long ended = steady_ns();
        if (w.rank() == 1) {
            EXPECT_EQ(status, 0) << output;
            EXPECT_NE(output.find("ce-skip: rank 1 skips call 2"), std::string::npos) << output;
        } else {
            EXPECT_EQ(status, 128 + SIGABRT) << output;
            EXPECT_NE(output.find("loom: wait timeout: rank 0: all_gather call 2 (copy-engine stream wait) "
                                  "outstanding for "),
                      std::string::npos)
                << output;
            EXPECT_NE(output.find("missing: the signal of rank 1 at 0x"), std::string::npos) << output;
            EXPECT_NE(output.find("(expected >= 2, observed 1)"), std::string::npos) << output;
            EXPECT_NE(output.find("ending the process (LOOM_WAIT_TIMEOUT_MS = 2000"), std::string::npos) << output;
            EXPECT_EQ(output.find("ce-skip: call 2 ended"), std::string::npos) << output;
            // From the enqueue of the skipped call to the end of the process: the bound plus at most 5 s.
            const std::string mark = "ce-skip: call 2 enqueued at ";
            const auto at = output.find(mark);
            ASSERT_NE(at, std::string::npos) << output;
            const long long enqueued = std::stoll(output.substr(at + mark.size()));
            const long long elapsed_ms = (ended - enqueued) / 1000000;
            EXPECT_GE(elapsed_ms, kTimeoutMs) << output;
            EXPECT_LT(elapsed_ms, kTimeoutMs + 5000) << output;
        }
    }
    w.barrier("watchdog-test");
}

}  // namespace
