// The bootstrap store against hostile clients: random and oversized frames, truncated frames, requests before the
// hello, wrong tokens, forged and duplicate ranks, connection floods at the descriptor limit and pipelined floods.
// The server must stay up, keep its memory bounded, never spin, and still let the real ranks join and meet at a
// barrier. Each run draws a fresh seed (printed, with the measured numbers that docs/reliability.md quotes).
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "loom/runtime/error.hpp"
#include "loom/runtime/store.hpp"
#include "unit/raw_store_client.hpp"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using loom::Store;
using loom::test::body;
using loom::test::framed;
using loom::test::hello_frame;
using loom::test::Op;
using loom::test::random_bytes;
using loom::test::raw_connect;
using loom::test::read_reply;
using loom::test::send_bytes;
using loom::test::Status;
namespace auth = loom::store_auth;
namespace net = loom::net;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// ---- the process hosting rank 0 ----

// A field of /proc/<pid>/status in KiB ("VmRSS", "VmHWM").
long status_kib(pid_t pid, const std::string& field) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(f, line);)
        if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
    return -1;
}

// User + system CPU seconds of a process (all its threads).
double cpu_seconds(pid_t pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::istringstream rest(text.substr(text.rfind(')') + 2));  // fields from 3 on; utime and stime are 14, 15
    std::string skip;
    for (int i = 3; i < 14; ++i) rest >> skip;
    double utime = 0, stime = 0;
    rest >> utime >> stime;
    return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

int open_fds() {
    int n = 0;
    if (DIR* d = ::opendir("/proc/self/fd")) {
        while (::readdir(d)) ++n;
        ::closedir(d);
    }
    return n - 3;  // ".", "..", and the directory's own descriptor
}

// Rank 0 in a child process with a low descriptor limit, driven by one-byte commands.
class RankZero {
  public:
    static constexpr int kWorld = 3;
    static constexpr int kFdHeadroom = 20;  // descriptors left above those open when the store starts

    explicit RankZero(const std::string& secret) {
        int cmd[2], evt[2];
        if (::pipe(cmd) != 0 || ::pipe(evt) != 0) throw std::runtime_error("pipe");
        std::fflush(stdout);
        std::fflush(stderr);
        pid_ = ::fork();
        if (pid_ == 0) {
            ::close(cmd[1]);
            ::close(evt[0]);
            ::_exit(child(secret, cmd[0], evt[1]));
        }
        ::close(cmd[0]);
        ::close(evt[1]);
        cmd_ = cmd[1];
        evt_ = evt[0];
        port_ = static_cast<int>(wait_event(15s));
    }
    ~RankZero() {
        if (pid_ > 0) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, nullptr, 0);
        }
        ::close(cmd_);
        ::close(evt_);
    }

    int port() const { return port_; }
    pid_t pid() const { return pid_; }
    bool alive() const {
        int st;
        return ::waitpid(pid_, &st, WNOHANG) == 0;
    }
    // Sends a command and returns the child's answer (-1: none within `limit`).
    long command(char c, std::chrono::milliseconds limit) {
        if (::write(cmd_, &c, 1) != 1) return -1;
        return wait_event(limit);
    }
    // Exit status once it has exited (after 'X').
    int join() {
        int st = 0;
        ::waitpid(pid_, &st, 0);
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }

  private:
    long wait_event(std::chrono::milliseconds limit) {
        pollfd p{evt_, POLLIN, 0};
        long v = -1;
        if (::poll(&p, 1, static_cast<int>(limit.count())) == 1 && ::read(evt_, &v, sizeof v) == sizeof v) return v;
        return -1;
    }

    static void answer(int fd, long v) { [[maybe_unused]] auto w = ::write(fd, &v, sizeof v); }

    static int child(const std::string& secret, int cmd, int evt) {
        try {
            rlimit lim{};
            ::getrlimit(RLIMIT_NOFILE, &lim);
            lim.rlim_cur = static_cast<rlim_t>(open_fds() + kFdHeadroom);
            ::setrlimit(RLIMIT_NOFILE, &lim);
            Store store(0, kWorld, "127.0.0.1", 0, 60000ms, secret);
            answer(evt, store.port());
            std::vector<int> fillers;
            for (char c; ::read(cmd, &c, 1) == 1;) {
                if (c == 'F') {  // take every free descriptor
                    for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) fillers.push_back(fd);
                    answer(evt, static_cast<long>(fillers.size()));
                } else if (c == 'R') {
                    for (int fd : fillers) ::close(fd);
                    fillers.clear();
                    answer(evt, 0);
                } else if (c == 'B') {  // meet the real ranks
                    store.barrier("after the fuzz");
                    auto all = store.all_gather("ids", loom::Bytes{'r', '0'});
                    bool ok = all.size() == std::size_t{kWorld};
                    for (int r = 0; ok && r < kWorld; ++r)
                        ok = all[r] == loom::Bytes{'r', static_cast<std::uint8_t>('0' + r)};
                    answer(evt, ok ? 1 : 0);
                } else if (c == 'X') {
                    return 0;
                }
            }
            return 2;
        } catch (const std::exception& e) {
            std::fprintf(stderr, "rank 0: %s\n", e.what());
            return 1;
        }
    }

    pid_t pid_ = -1;
    int cmd_ = -1, evt_ = -1, port_ = -1;
};

// ---- hostile connections ----

// Connections that must be closed by the server without a byte of reply.
struct Strangers {
    std::vector<int> fds;
    Strangers() = default;
    Strangers(const Strangers&) = delete;
    Strangers& operator=(const Strangers&) = delete;
    ~Strangers() { close_all(); }
    void close_all() {
        for (int fd : fds) ::close(fd);
        fds.clear();
    }
    // Waits until every connection is closed; returns how many were not, or sent something back.
    int unclosed_or_answered(std::chrono::milliseconds limit) {
        int bad = 0;
        for (int fd : fds) {
            auto got = loom::test::read_until_close(fd, limit);
            if (!got.closed || !got.bytes.empty()) ++bad;
        }
        return bad;
    }
};

// A random blob whose first four bytes announce a length no hello may have.
std::string garbage(std::mt19937_64& rng) {
    while (true) {
        std::string g = random_bytes(4 + rng() % 2048, rng);
        std::uint32_t len = net::Reader(std::string_view(g).substr(0, 4)).u32();
        if (len == 0 || len > loom::store_wire::kMaxHelloFrame) return g;
    }
}

TEST(StoreFuzz, StrangersNeitherCrashNorBloatNorLockOutRanks) {
    const auto start = Clock::now();
    const std::uint64_t seed = std::random_device{}();
    std::mt19937_64 rng(seed);
    std::printf("[store fuzz] seed %llu\n", static_cast<unsigned long long>(seed));
    const std::string secret = auth::random_secret();
    const auth::Token token = auth::derive_token(secret);
    RankZero zero(secret);
    ASSERT_GT(zero.port(), 0) << "rank 0 did not start";
    const int port = zero.port();
    {
        std::ofstream(("/proc/" + std::to_string(zero.pid()) + "/clear_refs").c_str()) << "5";  // peak RSS := now
    }
    const long base_kib = status_kib(zero.pid(), "VmRSS");

    // Random frames, then announced lengths no hello may have: closed, unanswered.
    {
        Strangers s;
        for (int i = 0; i < 200; ++i) {
            s.fds.push_back(raw_connect(port));
            send_bytes(s.fds.back(), garbage(rng), 1000ms);
        }
        for (std::uint32_t len : {0xffffffffu, 1u << 30, (8u << 20) + 1, loom::store_wire::kMaxHelloFrame + 1, 0u}) {
            s.fds.push_back(raw_connect(port));
            send_bytes(s.fds.back(), net::Writer().u32(len).data() + random_bytes(rng() % 64, rng));
        }
        EXPECT_EQ(s.unclosed_or_answered(5000ms), 0) << "random or oversized frames";
    }
    ASSERT_TRUE(zero.alive());

    // Well-formed requests without a hello, one per op, and 1 MiB of pipelined gets: closed, unanswered.
    {
        Strangers s;
        for (auto& req : {framed(body(Op::Set, net::Writer().bytes("loom/heap/nonce").bytes("forged"))),
                          framed(body(Op::Get, net::Writer().bytes("loom/heap/nonce"))),
                          framed(body(Op::Check, net::Writer().bytes("k"))),
                          framed(body(Op::Wait, net::Writer().u32(1).bytes("k"))),
                          framed(body(Op::Add, net::Writer().bytes("k").i64(1))),
                          framed(body(Op::Gather, net::Writer().bytes("barrier/x/1").i32(1).i32(3).bytes(""))),
                          framed(body(static_cast<Op>(99), net::Writer()))}) {
            s.fds.push_back(raw_connect(port));
            send_bytes(s.fds.back(), req);
        }
        std::string pipelined;
        while (pipelined.size() < (1u << 20)) pipelined += framed(body(Op::Get, net::Writer().bytes("k")));
        s.fds.push_back(raw_connect(port));
        send_bytes(s.fds.back(), pipelined, 2000ms);
        EXPECT_EQ(s.unclosed_or_answered(5000ms), 0) << "requests before the hello";
    }

    // Wrong tokens: refused with an answer, then closed.
    int refused = 0;
    for (int i = 0; i < 100; ++i) {
        std::size_t len = rng() % 4 ? auth::kTokenBytes : rng() % 64;
        int fd = raw_connect(port);
        send_bytes(fd, hello_frame(random_bytes(len, rng), 1, RankZero::kWorld));
        auto r = read_reply(fd);
        refused += r && r->status == Status::Refused && loom::test::read_until_close(fd, 5000ms).closed;
        ::close(fd);
    }
    EXPECT_EQ(refused, 100) << "wrong tokens";

    // The right token with a duplicate, out-of-range or forged rank, or another world size: refused.
    refused = 0;
    const std::pair<int, int> claims[] = {{0, 3}, {3, 3}, {-1, 3}, {INT_MIN, 3}, {INT_MAX, 3}, {1, 2}, {1, 4}, {1, 0}};
    for (auto [rank, world] : claims) {
        int fd = raw_connect(port);
        send_bytes(fd, hello_frame(token, rank, world));
        auto r = read_reply(fd);
        refused += r && r->status == Status::Refused;
        ::close(fd);
    }
    EXPECT_EQ(refused, static_cast<int>(std::size(claims))) << "duplicate, out-of-range or forged ranks";

    // Truncated hellos: some closed at once, some left hanging (the flood below sheds them).
    Strangers hanging;
    for (int i = 0; i < 50; ++i) {
        std::string h = hello_frame(token, 1, RankZero::kWorld);
        int fd = raw_connect(port);
        send_bytes(fd, h.substr(0, 1 + rng() % (h.size() - 1)));
        if (i % 5)
            ::close(fd);
        else
            hanging.fds.push_back(fd);
    }
    ASSERT_TRUE(zero.alive());

    // Descriptors exhausted by rank 0's own process: the server can shed nothing and must back off, not spin.
    ASSERT_GT(zero.command('F', 5000ms), 0);
    Strangers backlog;
    for (int i = 0; i < 100; ++i) backlog.fds.push_back(raw_connect(port));
    const double cpu0 = cpu_seconds(zero.pid());
    std::this_thread::sleep_for(1500ms);
    const double spin_cpu = cpu_seconds(zero.pid()) - cpu0;
    EXPECT_LT(spin_cpu, 0.75) << "rank 0 used " << spin_cpu << " s of CPU in 1.5 s at the descriptor limit";
    ASSERT_EQ(zero.command('R', 5000ms), 0);
    backlog.close_all();
    ASSERT_TRUE(zero.alive());

    // A sustained flood of silent connections (400 held open at any time, at a descriptor limit of 20 above what
    // rank 0 had open) while the real ranks join: they must get in and meet rank 0.
    std::atomic<bool> joined{false};
    std::atomic<int> flood_total{0};
    std::thread flood([&] {
        std::vector<int> held;
        while (!joined) {
            int fd = raw_connect(port);
            if (fd >= 0) held.push_back(fd);
            ++flood_total;
            if (held.size() > 400) {
                ::close(held.front());
                held.erase(held.begin());
            }
        }
        for (int fd : held) ::close(fd);
    });
    std::this_thread::sleep_for(300ms);  // the flood is at full strength before the ranks come
    const auto join_start = Clock::now();
    std::vector<std::string> errors(RankZero::kWorld);
    std::vector<std::thread> ranks;
    for (int r = 1; r < RankZero::kWorld; ++r)
        ranks.emplace_back([&, r] {
            try {
                Store s(r, RankZero::kWorld, "127.0.0.1", port, 30000ms, secret);
                s.barrier("after the fuzz");
                auto all = s.all_gather("ids", loom::Bytes{'r', static_cast<std::uint8_t>('0' + r)});
                if (all.size() != std::size_t{RankZero::kWorld} || all[0] != loom::Bytes{'r', '0'})
                    errors[r] = "wrong all_gather";
            } catch (const std::exception& e) {
                errors[r] = e.what();
            }
        });
    const long zero_ok = zero.command('B', 40000ms);
    for (auto& t : ranks) t.join();
    const double join_s = seconds_since(join_start);
    joined = true;
    flood.join();
    EXPECT_EQ(zero_ok, 1) << "rank 0 did not complete the barrier and all-gather";
    for (int r = 1; r < RankZero::kWorld; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;

    const long peak_kib = status_kib(zero.pid(), "VmHWM");
    EXPECT_LT(peak_kib - base_kib, 32 * 1024) << "rank 0's peak RSS grew by " << (peak_kib - base_kib) << " KiB";
    ASSERT_EQ(zero.command('X', 0ms), -1);
    EXPECT_EQ(zero.join(), 0);
    std::printf(
        "[store fuzz] rank 0 RSS %ld KiB at start, peak +%ld KiB; CPU %.3f s in 1.5 s at the descriptor limit; "
        "%d flood connections, ranks joined and met in %.2f s; whole test %.1f s\n",
        base_kib, peak_kib - base_kib, spin_cpu, flood_total.load(), join_s, seconds_since(start));
}

// ---- members sending random frames ----

// One member's burst: valid requests, mutated ones, truncated ones, huge inner lengths, unknown ops and garbage,
// pipelined in one send.
std::string member_burst(std::mt19937_64& rng, int rank, int world) {
    std::string out;
    const int n = 1 + static_cast<int>(rng() % 40);
    auto key = [&] { return "k" + std::to_string(rng() % 64); };
    for (int i = 0; i < n; ++i) {
        const auto timeout = static_cast<std::uint32_t>(rng() % 30);
        std::string b;
        switch (rng() % 9) {
            case 0:
                b = body(Op::Set, net::Writer().bytes(key()).bytes(random_bytes(rng() % 4096, rng)), timeout);
                break;
            case 1:
                b = body(Op::Get, net::Writer().bytes(key()), timeout);
                break;
            case 2:
                b = body(Op::Wait, net::Writer().u32(2).bytes(key()).bytes(key()), timeout);
                break;
            case 3:
                b = body(Op::Add, net::Writer().bytes(key()).i64(static_cast<std::int64_t>(rng())), timeout);
                break;
            case 4:  // an arrival, sometimes under another rank's name or world size
                b = body(Op::Gather,
                         net::Writer()
                             .bytes("g" + std::to_string(rng() % 4))
                             .i32(rng() % 2 ? rank : static_cast<int>(rng() % world))
                             .i32(rng() % 4 ? world : static_cast<int>(rng()))
                             .bytes(random_bytes(rng() % 256, rng)),
                         timeout);
                break;
            case 5:  // a huge inner length
                b = body(Op::Set, net::Writer().u32(0xfffffff0u - static_cast<std::uint32_t>(rng() % 16)).u32(1),
                         timeout);
                break;
            case 6:  // truncated fields
                b = body(Op::Set, net::Writer().bytes(key()).bytes("value"), timeout);
                b.resize(rng() % b.size());
                break;
            case 7:  // an unknown op, or random bytes
                b = rng() % 2 ? std::string(1, static_cast<char>(8 + rng() % 240)) + random_bytes(rng() % 64, rng)
                              : random_bytes(1 + rng() % 256, rng);
                break;
            default:  // a valid request with a flipped byte
                b = body(Op::Set, net::Writer().bytes(key()).bytes(random_bytes(rng() % 64, rng)), timeout);
                b[rng() % b.size()] ^= static_cast<char>(1 + rng() % 255);
                break;
        }
        out += b.empty() ? std::string() : framed(b);
    }
    if (rng() % 8 == 0) out += net::Writer().u32(64u << 20).data();         // an oversized announcement
    if (rng() % 8 == 0) out += net::Writer().u32(1000).data() + "partial";  // a frame left incomplete
    return out;
}

TEST(StoreFuzz, MembersSendingRandomFramesCannotBreakTheServer) {
    const std::uint64_t seed = std::random_device{}();
    std::mt19937_64 rng(seed);
    std::printf("[store fuzz] members seed %llu\n", static_cast<unsigned long long>(seed));
    constexpr int kWorld = 1024, kMembers = 1000, kConcurrent = 16;
    loom::StoreLimits limits;
    limits.frame_timeout = 300ms;
    limits.hello_timeout = 300ms;
    const std::string secret = auth::random_secret();
    loom::StoreServer server("127.0.0.1", 0, kWorld, auth::derive_token(secret), limits);
    server.start();
    const auto start = Clock::now();
    int answered = 0;
    for (int first = 0; first < kMembers; first += kConcurrent) {
        std::vector<int> fds;
        for (int r = first; r < first + kConcurrent && r < kMembers; ++r) {
            int fd = raw_connect(server.port());
            send_bytes(fd, hello_frame(auth::derive_token(secret), r, kWorld));
            if (auto rep = read_reply(fd); rep && rep->status == Status::Ok) ++answered;
            send_bytes(fd, member_burst(rng, r, kWorld), 1000ms);
            fds.push_back(fd);
        }
        for (int fd : fds) {
            if (rng() % 2) loom::test::read_until_close(fd, 2ms);  // read some replies, or none
            ::close(fd);
        }
    }
    EXPECT_EQ(answered, kMembers);
    // The server still serves: a fresh rank stores and reads back a value byte for byte.
    Store last(kWorld - 1, kWorld, "127.0.0.1", server.port(), 5000ms, secret);
    const std::string value = random_bytes(1 << 20, rng);
    last.set("after", value);
    EXPECT_EQ(last.get_string("after"), value);
    auto st = server.stats();
    EXPECT_EQ(st.joined, static_cast<std::uint64_t>(kMembers + 1));
    EXPECT_LT(st.peak_buffered, std::size_t{64} << 20);
    EXPECT_LE(st.peak_stored, limits.max_stored);
    std::printf(
        "[store fuzz] %d members, random frames: peak buffered %zu KiB, peak stored %zu KiB, %llu connections "
        "dropped, %.1f s\n",
        kMembers, st.peak_buffered >> 10, st.peak_stored >> 10, static_cast<unsigned long long>(st.dropped),
        seconds_since(start));
}

}  // namespace
