// The bootstrap store across processes on loopback: each rank is a forked child with its own Store.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "loom/runtime/error.hpp"
#include "loom/runtime/store.hpp"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct RankResult {
    int status = -1;    // waitpid status
    std::string error;  // what the rank's function threw, if anything
    bool ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
};

// A failed check inside a child: thrown, reported to the parent through the result pipe.
void require(bool cond, const std::string& what) {
    if (!cond) throw std::runtime_error("check failed: " + what);
}

std::string as_string(const loom::Bytes& b) { return std::string(b.begin(), b.end()); }
loom::Bytes as_bytes(const std::string& s) { return loom::Bytes(s.begin(), s.end()); }

// A port that was free a moment ago (for tests that need a fixed port before rank 0 exists).
int free_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    socklen_t len = sizeof(sa);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
    ::close(fd);
    return ntohs(sa.sin_port);
}

struct RunOptions {
    std::chrono::milliseconds timeout = 10000ms;
    int fixed_port = 0;                           // 0: rank 0 binds a free port and hands it to the others
    std::chrono::milliseconds rank0_delay = 0ms;  // rank 0 constructs its Store this late
};

// Runs `fn(store)` on `n` forked ranks and returns each rank's outcome. Children that outlive 20 s are killed.
std::vector<RankResult> run_ranks(int n, const RunOptions& opt, const std::function<void(loom::Store&)>& fn) {
    std::vector<std::array<int, 2>> port_pipes(n), result_pipes(n);
    for (int r = 0; r < n; ++r) {
        if (::pipe(port_pipes[r].data()) != 0 || ::pipe(result_pipes[r].data()) != 0) throw std::runtime_error("pipe");
    }
    std::vector<pid_t> pids(n);
    for (int r = 0; r < n; ++r) {
        pid_t pid = ::fork();
        if (pid == 0) {
            int code = 0;
            std::string msg;
            try {
                int port = opt.fixed_port;
                if (r == 0) {
                    std::this_thread::sleep_for(opt.rank0_delay);
                    loom::Store store(0, n, "127.0.0.1", port, opt.timeout);
                    for (int p = 1; p < n; ++p) {
                        int bound = store.port();
                        [[maybe_unused]] auto w = ::write(port_pipes[p][1], &bound, sizeof(bound));
                    }
                    fn(store);
                } else {
                    if (port == 0) {
                        pollfd pfd{port_pipes[r][0], POLLIN, 0};
                        require(::poll(&pfd, 1, 10000) == 1, "rank 0 published its port");
                        require(::read(port_pipes[r][0], &port, sizeof(port)) == sizeof(port), "read port");
                    }
                    loom::Store store(r, n, "127.0.0.1", port, opt.timeout);
                    fn(store);
                }
            } catch (const std::exception& e) {
                msg = e.what();
                code = 1;
            }
            [[maybe_unused]] auto w = ::write(result_pipes[r][1], msg.data(), msg.size());
            ::_exit(code);
        }
        pids[r] = pid;
    }
    for (int r = 0; r < n; ++r) {
        ::close(port_pipes[r][0]);
        ::close(port_pipes[r][1]);
        ::close(result_pipes[r][1]);
    }
    std::vector<RankResult> results(n);
    auto deadline = Clock::now() + 20s;
    for (int r = 0; r < n; ++r) {
        while (::waitpid(pids[r], &results[r].status, WNOHANG) == 0) {
            if (Clock::now() > deadline) {
                ::kill(pids[r], SIGKILL);
                ::waitpid(pids[r], &results[r].status, 0);
                results[r].error = "killed after 20 s";
                break;
            }
            std::this_thread::sleep_for(5ms);
        }
        char buf[4096];
        ssize_t k;
        while ((k = ::read(result_pipes[r][0], buf, sizeof(buf))) > 0) results[r].error.append(buf, k);
        ::close(result_pipes[r][0]);
    }
    return results;
}

void expect_all_ok(const std::vector<RankResult>& results) {
    for (std::size_t r = 0; r < results.size(); ++r)
        EXPECT_TRUE(results[r].ok()) << "rank " << r << " status " << results[r].status << ": " << results[r].error;
}

TEST(Store, SetGetCheckWaitAcrossProcesses) {
    constexpr int n = 4;
    auto results = run_ranks(n, {}, [](loom::Store& s) {
        const int r = s.rank();
        s.set("key/" + std::to_string(r), "value " + std::to_string(r));
        std::vector<std::string> keys;
        for (int p = 0; p < n; ++p) keys.push_back("key/" + std::to_string(p));
        s.wait(keys);
        for (int p = 0; p < n; ++p) {
            require(s.check(keys[p]), "check " + keys[p]);
            require(s.get_string(keys[p]) == "value " + std::to_string(p), "value of " + keys[p]);
        }
        require(!s.check("absent"), "absent key reported present");
        // get() waits for a key that another rank sets later; binary values survive untouched.
        if (r == 1) {
            std::this_thread::sleep_for(100ms);
            s.set("late", loom::Bytes{0, 255, 7, 0});
        }
        require(s.get("late") == loom::Bytes{0, 255, 7, 0}, "late binary value");
        s.barrier();
    });
    expect_all_ok(results);
}

TEST(Store, AddIsAtomicUnderContention) {
    constexpr int n = 4, per_rank = 250;
    auto results = run_ranks(n, {}, [](loom::Store& s) {
        std::string seen;
        for (int i = 0; i < per_rank; ++i) seen += std::to_string(s.add("counter", 1)) + ",";
        auto all = s.all_gather("adds", as_bytes(seen));
        if (s.rank() == 0) {
            std::set<long> values;
            std::size_t count = 0;
            for (auto& b : all) {
                std::string text = as_string(b);
                for (std::size_t pos = 0, c; (c = text.find(',', pos)) != std::string::npos; pos = c + 1, ++count)
                    values.insert(std::stol(text.substr(pos, c - pos)));
            }
            // Every add returned a distinct value, and together they are exactly 1..n*per_rank.
            require(count == n * per_rank && values.size() == count, "distinct add results");
            require(*values.begin() == 1 && *values.rbegin() == n * per_rank, "add results cover 1..N");
        }
        s.barrier("after adds");
        require(s.add("counter", 0) == n * per_rank, "final counter");
        require(s.get_string("counter") == std::to_string(n * per_rank), "counter readable as a string");
        s.barrier("after reads");
        if (s.rank() == 0) require(s.add("counter", -5) == n * per_rank - 5, "negative delta");
    });
    expect_all_ok(results);
}

TEST(Store, RepeatedAllGatherAndBarrierWithTheSameTag) {
    constexpr int n = 3;
    auto results = run_ranks(n, {}, [](loom::Store& s) {
        for (int round = 0; round < 20; ++round) {
            // Sizes differ per rank and round (rank 0's value is empty on even rounds).
            std::string mine(static_cast<std::size_t>((s.rank() * 7 + round) % 5) * (round % 2 ? 1000 : 1),
                             static_cast<char>('a' + s.rank()));
            if (s.rank() == 0 && round % 2 == 0) mine.clear();
            auto all = s.all_gather("round", as_bytes(mine + "#" + std::to_string(round)));
            require(static_cast<int>(all.size()) == n, "all_gather size");
            for (int p = 0; p < n; ++p) {
                std::string expect(static_cast<std::size_t>((p * 7 + round) % 5) * (round % 2 ? 1000 : 1),
                                   static_cast<char>('a' + p));
                if (p == 0 && round % 2 == 0) expect.clear();
                require(as_string(all[p]) == expect + "#" + std::to_string(round),
                        "all_gather contents of rank " + std::to_string(p) + " in round " + std::to_string(round));
            }
            s.barrier("same tag");
        }
    });
    expect_all_ok(results);
}

TEST(Store, BarrierTimeoutNamesTheMissingRank) {
    RunOptions opt;
    opt.timeout = 400ms;
    auto start = Clock::now();
    auto results = run_ranks(3, opt, [](loom::Store& s) {
        if (s.rank() == 2) return;  // never arrives
        s.barrier("step");
    });
    EXPECT_LT(Clock::now() - start, 8s);
    EXPECT_TRUE(results[2].ok()) << results[2].error;
    for (int r = 0; r < 2; ++r) {
        EXPECT_FALSE(results[r].ok()) << "rank " << r << " passed a barrier that rank 2 never reached";
        EXPECT_NE(results[r].error.find("barrier(\"step\")"), std::string::npos) << results[r].error;
        EXPECT_NE(results[r].error.find("ranks [2] never arrived"), std::string::npos) << results[r].error;
        EXPECT_NE(results[r].error.find("arrived: [0, 1]"), std::string::npos) << results[r].error;
    }
}

TEST(Store, AllGatherTimeoutNamesEveryMissingRank) {
    RunOptions opt;
    opt.timeout = 400ms;
    auto results = run_ranks(4, opt, [](loom::Store& s) {
        if (s.rank() == 1 || s.rank() == 3) return;
        s.all_gather("ids", as_bytes("x"));
    });
    for (int r : {0, 2}) {
        EXPECT_NE(results[r].error.find("all_gather(\"ids\")"), std::string::npos) << results[r].error;
        EXPECT_NE(results[r].error.find("ranks [1, 3] never arrived"), std::string::npos) << results[r].error;
    }
}

TEST(Store, ClientsRetryUntilRankZeroStarts) {
    RunOptions opt;
    opt.fixed_port = free_port();
    opt.rank0_delay = 400ms;
    auto results = run_ranks(3, opt, [](loom::Store& s) {
        auto all = s.all_gather("hello", as_bytes(std::to_string(s.rank())));
        for (int p = 0; p < 3; ++p) require(as_string(all[p]) == std::to_string(p), "all_gather after late start");
    });
    expect_all_ok(results);
}

TEST(Store, ServerGoingAwayRaisesInsteadOfHanging) {
    RunOptions opt;
    opt.timeout = 15000ms;
    auto start = Clock::now();
    auto results = run_ranks(2, opt, [](loom::Store& s) {
        s.barrier();
        if (s.rank() == 0) {
            std::this_thread::sleep_for(200ms);
            ::raise(SIGKILL);  // rank 0 dies without any clean-up
        }
        s.get("never set");
    });
    EXPECT_LT(Clock::now() - start, 5s) << "the client waited for its timeout instead of noticing the lost server";
    EXPECT_TRUE(WIFSIGNALED(results[0].status));
    EXPECT_FALSE(results[1].ok());
    EXPECT_NE(results[1].error.find("closed the connection"), std::string::npos) << results[1].error;
    EXPECT_NE(results[1].error.find("never set"), std::string::npos) << results[1].error;
}

TEST(Store, GetTimeoutNamesTheKey) {
    loom::Store s(0, 1, "127.0.0.1", 0, 300ms);
    auto start = Clock::now();
    try {
        s.get("weights/ready");
        FAIL() << "get of a key nobody sets returned";
    } catch (const loom::Error& e) {
        EXPECT_NE(std::string(e.what()).find("\"weights/ready\""), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("timed out after 300 ms"), std::string::npos) << e.what();
    }
    EXPECT_LT(Clock::now() - start, 3s);
    // A server-side timeout leaves the connection in step: the store still works.
    s.set("a", "1");
    EXPECT_EQ(s.get_string("a"), "1");
    try {
        s.wait({"a", "b"});
        FAIL();
    } catch (const loom::Error& e) {
        EXPECT_NE(std::string(e.what()).find("\"b\""), std::string::npos) << e.what();
        EXPECT_EQ(std::string(e.detail()).find("\"a\" "), std::string::npos) << e.what();
    }
}

TEST(Store, ConnectingWithNoServerTimesOut) {
    int port = free_port();
    auto start = Clock::now();
    try {
        loom::Store s(1, 2, "127.0.0.1", port, 300ms);
        FAIL() << "connected to a port with no server";
    } catch (const loom::Error& e) {
        EXPECT_NE(std::string(e.what()).find("could not connect"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
    }
    EXPECT_LT(Clock::now() - start, 3s);
    EXPECT_GE(Clock::now() - start, 250ms) << "gave up before the timeout";
}

TEST(Store, BusyPortIsAClearError) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
    ASSERT_EQ(::listen(fd, 4), 0);
    socklen_t len = sizeof(sa);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
    int port = ntohs(sa.sin_port);
    try {
        loom::Store s(0, 2, "127.0.0.1", port, 300ms);
        FAIL() << "rank 0 bound a busy port";
    } catch (const loom::Error& e) {
        EXPECT_NE(std::string(e.what()).find(fmt::format("127.0.0.1:{} is in use; set LOOM_MASTER_PORT", port)),
                  std::string::npos)
            << e.what();
    }
    ::close(fd);
}

TEST(Store, WorldSizeMismatchIsRejected) {
    loom::Store s0(0, 2, "127.0.0.1", 0, 2000ms);
    try {
        loom::Store s1(1, 3, "127.0.0.1", s0.port(), 2000ms);
        FAIL() << "a rank with another world size joined";
    } catch (const loom::Error& e) {
        EXPECT_NE(std::string(e.what()).find("expects world size 3"), std::string::npos) << e.what();
    }
}

TEST(Store, SharedByThreadsAndRanksInOneProcess) {
    loom::Store s0(0, 2, "127.0.0.1", 0, 5000ms);
    loom::Store s1(1, 2, "127.0.0.1", s0.port(), 5000ms);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            loom::Store& s = t % 2 ? s1 : s0;
            for (int i = 0; i < 100; ++i) s.add("hits", 1);
        });
    for (auto& t : threads) t.join();
    EXPECT_EQ(s0.add("hits", 0), 400);
    // Two ranks in two threads meet at barriers and gathers.
    std::thread other([&] {
        for (int i = 0; i < 10; ++i) s1.all_gather("t", as_bytes("one"));
    });
    for (int i = 0; i < 10; ++i) {
        auto all = s0.all_gather("t", as_bytes("zero"));
        EXPECT_EQ(as_string(all[0]), "zero");
        EXPECT_EQ(as_string(all[1]), "one");
    }
    other.join();
}

TEST(Store, RejectsBadArguments) {
    EXPECT_THROW(loom::Store(2, 2, "127.0.0.1", 0, 100ms), loom::Error);
    EXPECT_THROW(loom::Store(0, 0, "127.0.0.1", 0, 100ms), loom::Error);
    EXPECT_THROW(loom::Store(1, 2, "127.0.0.1", 0, 100ms), loom::Error);      // port 0 needs rank 0
    EXPECT_THROW(loom::Store(0, 1, "127.0.0.1", 70000, 100ms), loom::Error);  // not a port
}

}  // namespace
