// The bootstrap store's admission and bounds, one rule per test: the job token, one connection per rank, the
// bound address, key / value / stored-byte caps, pipelining, and the hello, frame and send timeouts.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "loom/runtime/store.hpp"
#include "runtime/settings_override.hpp"
#include "unit/raw_store_client.hpp"

namespace {

using namespace std::chrono_literals;
using loom::Store;
using loom::StoreLimits;
using loom::StoreServer;
using loom::test::body;
using loom::test::framed;
using loom::test::hello_frame;
using loom::test::Op;
using loom::test::random_bytes;
using loom::test::raw_connect;
using loom::test::read_reply;
using loom::test::read_until_close;
using loom::test::send_bytes;
using loom::test::Status;
namespace auth = loom::store_auth;
namespace net = loom::net;

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// A server for `world` ranks on a free loopback port, with a fresh secret; ranks join as Store clients (rank >= 1:
// a Store of rank 0 hosts its own server) or as raw connections.
struct Server {
    std::string secret = auth::random_secret();
    auth::Token token = auth::derive_token(secret);
    StoreServer server;
    int world;

    explicit Server(int world_size, const StoreLimits& limits = {})
        : server("127.0.0.1", 0, world_size, auth::derive_token(secret), limits), world(world_size) {
        server.start();
    }
    int port() const { return server.port(); }
    Store client(int rank, std::chrono::milliseconds timeout = 5000ms) {
        return Store(rank, world, "127.0.0.1", port(), timeout, secret);
    }
    // A raw connection that has joined as `rank`.
    int joined(int rank) {
        int fd = raw_connect(port());
        EXPECT_GE(fd, 0);
        EXPECT_TRUE(send_bytes(fd, hello_frame(token, rank, world)));
        auto r = read_reply(fd);
        EXPECT_TRUE(r && r->status == Status::Ok) << "rank " << rank << " could not join";
        return fd;
    }
};

// The server's counters once `done(stats)` holds, or after 5 s (the server publishes them at the end of each loop
// pass, just after it has answered or closed).
template <class Pred>
loom::StoreServerStats stats_when(const StoreServer& server, Pred done) {
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    auto st = server.stats();
    while (!done(st) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(2ms);
        st = server.stats();
    }
    return st;
}

std::string set_frame(const std::string& key, const std::string& value) {
    return framed(body(Op::Set, net::Writer().bytes(key).bytes(value)));
}

// ---- the job token ----

TEST(StoreRules, RequestsBeforeTheHelloAreNeverAnswered) {
    Server s(2);
    const std::vector<std::string> requests = {
        set_frame("k", "stranger's value"),
        framed(body(Op::Get, net::Writer().bytes("loom/heap/nonce"))),
        framed(body(Op::Check, net::Writer().bytes("k"))),
        framed(body(Op::Wait, net::Writer().u32(1).bytes("k"))),
        framed(body(Op::Add, net::Writer().bytes("k").i64(1))),
        framed(body(Op::Gather, net::Writer().bytes("barrier//1").i32(1).i32(2).bytes(""))),
    };
    for (const auto& req : requests) {
        int fd = raw_connect(s.port());
        ASSERT_GE(fd, 0);
        ASSERT_TRUE(send_bytes(fd, req));
        auto got = read_until_close(fd, 5000ms);
        EXPECT_TRUE(got.closed) << "op " << int(req[4]) << ": the connection stayed open";
        EXPECT_EQ(got.bytes.size(), 0u) << "op " << int(req[4]) << ": a stranger got a reply";
        ::close(fd);
    }
    // Nothing the strangers sent reached the store.
    Store member = s.client(1);
    EXPECT_FALSE(member.check("k"));
    EXPECT_EQ(s.server.stats().joined, 1u);
}

TEST(StoreRules, WrongTokensAreRefused) {
    Server s(2);
    std::mt19937_64 rng(std::random_device{}());
    std::string flipped(reinterpret_cast<const char*>(s.token.data()), s.token.size());
    flipped[rng() % flipped.size()] ^= static_cast<char>(1u << (rng() % 8));
    const std::vector<std::string> tokens = {random_bytes(32, rng), flipped, flipped.substr(0, 31), "", s.secret};
    for (const auto& t : tokens) {
        int fd = raw_connect(s.port());
        ASSERT_TRUE(send_bytes(fd, hello_frame(t, 1, 2)));
        auto r = read_reply(fd);
        ASSERT_TRUE(r) << "no refusal for a token of " << t.size() << " bytes";
        EXPECT_EQ(r->status, Status::Refused);
        EXPECT_EQ(r->text(), "wrong job token");
        EXPECT_TRUE(read_until_close(fd, 5000ms).closed);
        ::close(fd);
    }
    // A Store given another secret says what to check.
    try {
        Store(1, 2, "127.0.0.1", s.port(), 2000ms, "another secret of the right length");
        FAIL() << "a rank with another secret joined";
    } catch (const loom::Error& e) {
        EXPECT_TRUE(contains(e.what(), "wrong job token")) << e.what();
        EXPECT_TRUE(contains(e.what(), "LOOM_JOB_SECRET")) << e.what();
    }
    auto st = stats_when(s.server, [&](auto& st) { return st.refused == tokens.size() + 1; });
    EXPECT_EQ(st.joined, 0u);
    EXPECT_EQ(st.refused, tokens.size() + 1);
}

TEST(StoreRules, ShortSecretsAreRejected) {
    EXPECT_THROW(Store(0, 1, "127.0.0.1", 0, 1000ms, "short"), loom::Error);
    std::string secret = "hunter2";
    auto env = [&](const std::string& name) -> std::optional<std::string> {
        if (name == "LOOM_JOB_SECRET") return secret;
        return std::nullopt;
    };
    secret = "sixteen chars ok";
    EXPECT_EQ(loom::settings_from(env).job_secret, secret);
    secret = "hunter2";
    try {
        loom::settings_from(env);
        FAIL() << "a 7-character LOOM_JOB_SECRET was accepted";
    } catch (const loom::Error& e) {
        EXPECT_TRUE(contains(e.what(), "LOOM_JOB_SECRET: expected at least 16 characters, given 7")) << e.what();
        EXPECT_FALSE(contains(e.what(), "hunter2")) << "the secret was printed: " << e.what();
    }
}

TEST(StoreRules, SecretFromTheSettingsAdmitsRanks) {
    loom::detail::ScopedSettings scoped([](loom::Settings& st) { st.job_secret = auth::random_secret(); });
    Store s0(0, 2, "127.0.0.1", 0, 5000ms);
    // No token file is written when the ranks share a secret.
    struct stat st {};
    EXPECT_NE(::stat(auth::token_file(s0.port()).c_str(), &st), 0);
    Store s1(1, 2, "127.0.0.1", s0.port(), 5000ms);
    std::thread t([&] { s1.barrier("secret"); });
    s0.barrier("secret");
    t.join();
}

TEST(StoreRules, TokenFileIsPrivateAndRemoved) {
    loom::detail::ScopedSettings scoped([](loom::Settings& st) { st.job_secret.clear(); });
    int port = 0;
    {
        Store s0(0, 2, "127.0.0.1", 0, 5000ms);
        port = s0.port();
        const std::string path = auth::token_file(port);
        struct stat st {};
        ASSERT_EQ(::stat(path.c_str(), &st), 0) << path;
        EXPECT_EQ(st.st_mode & 0777, 0600u);
        EXPECT_EQ(st.st_uid, ::geteuid());
        ASSERT_EQ(::stat(path.substr(0, path.rfind('/')).c_str(), &st), 0);
        EXPECT_EQ(st.st_mode & 0777, 0700u);
        Store s1(1, 2, "127.0.0.1", port, 5000ms);  // reads the file
        EXPECT_EQ(s1.add("n", 1), 1);
    }
    struct stat st {};
    EXPECT_NE(::stat(auth::token_file(port).c_str(), &st), 0) << "rank 0 left its token file behind";
}

TEST(StoreRules, ForeignTokenFileIsNamedInTheRefusal) {
    loom::detail::ScopedSettings scoped([](loom::Settings& st) { st.job_secret.clear(); });
    Store s0(0, 2, "127.0.0.1", 0, 5000ms);
    auth::write_token_file(s0.port(), auth::random_secret());  // another job's secret, as on another host
    try {
        Store s1(1, 2, "127.0.0.1", s0.port(), 2000ms);
        FAIL() << "a rank with another job's secret joined";
    } catch (const loom::Error& e) {
        EXPECT_TRUE(contains(e.what(), "wrong job token")) << e.what();
        EXPECT_TRUE(contains(e.what(), auth::token_file(s0.port()))) << e.what();
    }
}

TEST(StoreRules, TokensCompareWholly) {
    std::mt19937_64 rng(std::random_device{}());
    auth::Token t = auth::derive_token(auth::random_secret());
    std::string same(reinterpret_cast<const char*>(t.data()), t.size());
    EXPECT_TRUE(auth::same_token(same, t));
    for (std::size_t i = 0; i < t.size(); ++i) {
        std::string other = same;
        other[i] ^= static_cast<char>(1u << (rng() % 8));
        EXPECT_FALSE(auth::same_token(other, t)) << "byte " << i;
    }
    EXPECT_FALSE(auth::same_token(same + "x", t));
    EXPECT_NE(auth::derive_token("0123456789abcdef"), auth::derive_token("0123456789abcdeF"));
}

// ---- one connection, one rank ----

TEST(StoreRules, EachRankJoinsOnceAndOnlyInRange) {
    Server s(3);
    Store r1 = s.client(1);
    try {
        Store again = s.client(1, 2000ms);
        FAIL() << "rank 1 joined twice";
    } catch (const loom::Error& e) {
        EXPECT_TRUE(contains(e.what(), "rank 1 has already joined")) << e.what();
    }
    struct Case {
        int rank, world;
        const char* expect;
    };
    for (Case c : {Case{3, 3, "rank 3 out of range [0, 3)"}, Case{-1, 3, "rank -1 out of range"},
                   Case{INT_MAX, 3, "out of range"}, Case{2, 4, "expects world size 4"}}) {
        int fd = raw_connect(s.port());
        ASSERT_TRUE(send_bytes(fd, hello_frame(s.token, c.rank, c.world)));
        auto r = read_reply(fd);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, Status::Refused);
        EXPECT_TRUE(contains(r->text(), c.expect)) << r->text();
        ::close(fd);
    }
    // A second hello on a joined connection is an error, not a second rank.
    int fd = s.joined(2);
    ASSERT_TRUE(send_bytes(fd, hello_frame(s.token, 0, 3)));
    auto r = read_reply(fd);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, Status::Error);
    ::close(fd);
    EXPECT_EQ(s.server.stats().joined, 2u);
}

// A rank that left its World's store (a restarted rank) is refused, not admitted as a fresh member: within the
// connect timeout it waits as for an earlier World's draining store, then names the refusal.
TEST(StoreRules, ARankThatLeftCannotRejoin) {
    Server s(3);
    { Store r1 = s.client(1); }
    try {
        Store again = s.client(1, 1500ms);
        FAIL() << "rank 1 rejoined the store it left";
    } catch (const loom::Error& e) {
        EXPECT_TRUE(contains(e.what(), "rank 1 was refused")) << e.what();
        EXPECT_TRUE(contains(e.what(), "already joined and left it")) << e.what();
    }
}

TEST(StoreRules, ArrivalsCannotBeForgedForAnotherRank) {
    Server s(3);
    int fd = s.joined(1);
    // Rank 1 claims to be rank 2 at a barrier.
    ASSERT_TRUE(send_bytes(fd, framed(body(Op::Gather, net::Writer().bytes("barrier/x/1").i32(2).i32(3).bytes("")))));
    auto r = read_reply(fd);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, Status::Error);
    EXPECT_TRUE(contains(r->text(), "names rank 2, but this connection is rank 1")) << r->text();
    ::close(fd);
}

// ---- connections ----

TEST(StoreRules, ConnectionsBeyondTheRanksShedTheOldestStranger) {
    StoreLimits limits;
    limits.spare_connections = 4;
    Server s(3, limits);
    Store r1 = s.client(1);
    // 50 silent connections: the server keeps at most world + 4 connections, closing the oldest silent ones.
    std::vector<int> strangers;
    for (int i = 0; i < 50; ++i) strangers.push_back(raw_connect(s.port()));
    stats_when(s.server, [](auto& st) { return st.accepted == 51; });
    int closed = 0;
    for (int fd : strangers) closed += read_until_close(fd, 20ms).closed;
    EXPECT_EQ(closed, 50 - (3 + 4 - 1)) << "rank 1 holds one of the 7 places; 6 strangers may stay";
    EXPECT_TRUE(read_until_close(strangers.front(), 0ms).closed) << "the oldest stranger was kept";
    EXPECT_FALSE(read_until_close(strangers.back(), 0ms).closed) << "the newest stranger was shed first";
    // A rank arriving now still gets in (a stranger makes room), and the rank already in was never shed.
    Store r2 = s.client(2);
    EXPECT_EQ(r2.add("n", 1), 1);
    EXPECT_EQ(r1.add("n", 1), 2);
    EXPECT_EQ(s.server.stats().shed, 45u);  // 44 for the flood, 1 for rank 2
    for (int fd : strangers) ::close(fd);
}

// ---- the bound address ----

std::string bound_ip(int fd) {
    sockaddr_in sa{};
    socklen_t len = sizeof sa;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
    return ip;
}

// An IPv4 address of this host outside 127/8, if any.
std::optional<std::string> non_loopback_ip() {
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) return std::nullopt;
    std::optional<std::string> found;
    for (ifaddrs* a = list; a && !found; a = a->ifa_next) {
        if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
        auto* sin = reinterpret_cast<sockaddr_in*>(a->ifa_addr);
        if ((ntohl(sin->sin_addr.s_addr) >> 24) == 127) continue;
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof ip);
        found = ip;
    }
    ::freeifaddrs(list);
    return found;
}

TEST(StoreRules, BindsTheGivenAddressOnly) {
    int port = 0;
    for (auto [addr, expect] : {std::pair<std::string, std::string>{"127.0.0.1", "127.0.0.1"},
                                {"127.0.0.2", "127.0.0.2"},
                                {"localhost", "127.0.0.1"},
                                {"0.0.0.0", "0.0.0.0"}}) {
        int fd = net::tcp_bind(addr, 0, &port);
        EXPECT_EQ(bound_ip(fd), expect) << addr;
        ::close(fd);
    }
    if (auto ip = non_loopback_ip()) {
        int fd = net::tcp_bind(*ip, 0, &port);
        EXPECT_EQ(bound_ip(fd), *ip) << "a routable address must not widen to every interface";
        net::tcp_listen(fd, *ip, port);
        EXPECT_EQ(raw_connect(port), -1) << "the store bound to " << *ip << " accepted a loopback connection";
        ::close(fd);
    }
    try {
        net::tcp_bind("192.0.2.1", 0, &port);  // TEST-NET-1: never this host's
        FAIL() << "bound an address of another host";
    } catch (const loom::Error& e) {
        EXPECT_TRUE(contains(e.what(), "not an address of this host")) << e.what();
    }
}

// ---- sizes ----

TEST(StoreRules, KeyAndValueSizesAreCapped) {
    Server s(2);
    Store c = s.client(1);
    std::mt19937_64 rng(std::random_device{}());
    // Exactly at the caps: stored and read back whole.
    const std::string key(Store::kMaxKeyBytes, 'k');
    const std::string value = random_bytes(Store::kMaxValueBytes, rng);
    c.set(key, value);
    EXPECT_EQ(c.get_string(key), value);
    // One byte over: raised before sending, and the Store stays usable.
    try {
        c.set(std::string(Store::kMaxKeyBytes + 1, 'k'), "v");
        FAIL();
    } catch (const loom::Error& e) {
        EXPECT_TRUE(contains(e.what(), "key of 8193 bytes; expected at most 8192")) << e.what();
    }
    try {
        c.set("big", std::string(Store::kMaxValueBytes + 1, 'v'));
        FAIL();
    } catch (const loom::Error& e) {
        EXPECT_TRUE(contains(e.what(), "value of 8388609 bytes; expected at most 8388608")) << e.what();
    }
    EXPECT_THROW(c.all_gather("t", loom::Bytes(Store::kMaxValueBytes + 1)), loom::Error);
    EXPECT_THROW(c.get(std::string(Store::kMaxKeyBytes + 1, 'k')), loom::Error);
    EXPECT_EQ(c.add("after", 1), 1);
    // The server enforces the same caps on a client that skips the checks; the connection stays in step.
    int fd = s.joined(0);
    for (auto& frame : {set_frame(std::string(Store::kMaxKeyBytes + 1, 'k'), "v"),
                        set_frame("big", std::string(Store::kMaxValueBytes + 1, 'v'))}) {
        ASSERT_TRUE(send_bytes(fd, frame));
        auto r = read_reply(fd);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, Status::Error);
        EXPECT_TRUE(contains(r->text(), "expected at most")) << r->text();
    }
    ASSERT_TRUE(send_bytes(fd, framed(body(Op::Check, net::Writer().bytes("big")))));
    auto r = read_reply(fd);
    ASSERT_TRUE(r && r->status == Status::Ok);
    EXPECT_EQ(r->payload, std::string(1, '\0'));
    ::close(fd);
}

TEST(StoreRules, StoredBytesAreCapped) {
    StoreLimits limits;
    limits.max_stored = 1 << 20;
    Server s(3, limits);
    Store c = s.client(1);
    const std::string value(100 << 10, 'v');
    int stored = 0;
    try {
        for (; stored < 100; ++stored) c.set("k" + std::to_string(stored), value);
        FAIL() << "stored 100 x 100 KiB under a 1 MiB cap";
    } catch (const loom::Error& e) {
        EXPECT_TRUE(contains(e.what(), "the store is full")) << e.what();
    }
    EXPECT_EQ(stored, 10);  // 10 x (100 KiB + key) fit in 1 MiB, the 11th does not
    EXPECT_LE(s.server.stats().peak_stored, limits.max_stored);
    // The refusal was an answer: a fresh client sees every earlier value, and rewriting one in place fits.
    Store d = s.client(2);
    for (int i = 0; i < stored; ++i) EXPECT_EQ(d.get_string("k" + std::to_string(i)), value);
    d.set("k0", std::string(value.size(), 'w'));
    EXPECT_EQ(d.get_string("k0"), std::string(value.size(), 'w'));
}

// ---- pipelining and timeouts ----

TEST(StoreRules, PipelinedRequestsStayBounded) {
    StoreLimits limits;
    limits.frame_timeout = 500ms;
    Server s(3, limits);
    Store c = s.client(1);
    c.set("big", std::string(4 << 20, 'v'));
    // 600 000 pipelined gets of a 4 MiB value (12 MB of requests, more than one frame's worth), never reading a
    // reply: unbounded buffering would queue 2.4 TB of replies.
    int fd = s.joined(2);
    std::string get = framed(body(Op::Get, net::Writer().bytes("big")));
    std::string burst;
    for (int i = 0; i < 600000; ++i) burst += get;
    send_bytes(fd, burst, 1500ms);        // stalls once the server stops reading
    std::this_thread::sleep_for(1500ms);  // past the send-stall timeout
    auto st = s.server.stats();
    // Of the order of one frame's worth of requests (8 MiB + 8 KiB) and one 4 MiB reply: bounded, not 2.4 TB.
    EXPECT_LT(st.peak_buffered, std::size_t{24} << 20) << "bytes buffered for one pipelining client";
    EXPECT_GE(st.dropped, 1u) << "a client that never reads its replies was not dropped";
    std::printf("[store rules] 12 MB of pipelined gets of a 4 MiB value: peak buffered %zu KiB\n",
                st.peak_buffered >> 10);
    // Rank 1 was served all along.
    EXPECT_EQ(c.add("still", 1), 1);
    ::close(fd);
}

TEST(StoreRules, HalfSentFramesTimeOut) {
    StoreLimits limits;
    limits.hello_timeout = 300ms;
    limits.frame_timeout = 300ms;
    Server s(3, limits);
    // Before the hello: a third of a hello, then silence.
    int stranger = raw_connect(s.port());
    ASSERT_TRUE(send_bytes(stranger, hello_frame(s.token, 1, 3).substr(0, 20)));
    // After it: three frames announcing 8 MiB with half of it sent.
    std::vector<int> members;
    for (int r = 0; r < 3; ++r) {
        members.push_back(s.joined(r));
        std::string f = set_frame("half", std::string(Store::kMaxValueBytes, 'v'));
        ASSERT_TRUE(send_bytes(members.back(), f.substr(0, f.size() / 2)));
    }
    auto t0 = std::chrono::steady_clock::now();
    for (int fd : {stranger, members[0], members[1], members[2]}) {
        auto got = read_until_close(fd, 10000ms);
        EXPECT_TRUE(got.closed);
        ::close(fd);
    }
    const auto closed_after = std::chrono::steady_clock::now() - t0;
    EXPECT_LT(closed_after, 10s);
    auto st = stats_when(s.server, [](auto& st) { return st.dropped == 4; });
    EXPECT_EQ(st.dropped, 4u);
    EXPECT_LT(st.peak_buffered, std::size_t{3 * 9} << 20) << "three half frames";
    std::printf("[store rules] three half-sent 8 MiB frames: peak buffered %zu KiB, closed after %.2f s\n",
                st.peak_buffered >> 10, std::chrono::duration<double>(closed_after).count());
    // Oversized announcements close at once, before and after the hello, with no reply.
    for (std::uint32_t len : {0xffffffffu, 1u << 30, loom::store_wire::kMaxHelloFrame + 1, 0u}) {
        int fd = raw_connect(s.port());
        ASSERT_TRUE(send_bytes(fd, net::Writer().u32(len).data()));
        auto got = read_until_close(fd, 5000ms);
        EXPECT_TRUE(got.closed && got.bytes.empty()) << "length " << len;
        ::close(fd);
    }
}

TEST(StoreRules, OversizedFrameFromAMemberClosesItsConnection) {
    Server s(2);
    int fd = s.joined(1);
    ASSERT_TRUE(send_bytes(fd, net::Writer().u32(64u << 20).data() + std::string(1000, 'x')));
    auto got = read_until_close(fd, 5000ms);
    EXPECT_TRUE(got.closed);
    EXPECT_TRUE(got.bytes.empty());
    ::close(fd);
}

}  // namespace
