// The stream watchdog's bookkeeping without a GPU (runtime/wait_ledger.hpp): registration, retirement in stream
// order, expiry against the bound on a clock the test drives, re-arming, and the diagnostic's text. The watchdog
// thread, events and signal reads are exercised on the GPU (tests/dist/test_stream_watchdog.cpp).
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "runtime/wait_ledger.hpp"

namespace {

using loom::detail::expired_message;
using loom::detail::PendingCall;
using loom::detail::StreamWait;
using loom::detail::wait_satisfied;
using loom::detail::WaitLedger;
using Clock = WaitLedger::Clock;
using namespace std::chrono_literals;

// A call whose completion handle is its own number (the test's "event").
PendingCall call(const char* op, std::uint64_t n, const void* stream, std::uintptr_t handle) {
    PendingCall c;
    c.op = op;
    c.call = n;
    c.stream = stream;
    c.done = reinterpret_cast<void*>(handle);
    c.waits.push_back(StreamWait{reinterpret_cast<const std::uint64_t*>(0x1000), n, false, 1});
    return c;
}

std::uintptr_t handle(const PendingCall& c) { return reinterpret_cast<std::uintptr_t>(c.done); }

struct Fake {
    std::set<std::uintptr_t> complete;  // handles whose call has completed
    std::vector<std::uintptr_t> asked, retired;
    std::vector<WaitLedger::Expired> sweep(WaitLedger& l, Clock::time_point now) {
        return l.sweep(
            now,
            [&](const PendingCall& c) {
                asked.push_back(handle(c));
                return complete.count(handle(c)) != 0;
            },
            [&](PendingCall&& c) { retired.push_back(handle(c)); });
    }
};

const int kStreams[4] = {};  // streams: only their addresses matter
const void* const kStreamA = &kStreams[0];
const void* const kStreamB = &kStreams[1];

TEST(WaitLedger, ExpiresOnlyAfterTheBound) {
    WaitLedger l(2000ms);
    Fake f;
    const auto t0 = Clock::now();
    l.add(call("all_gather", 2, kStreamA, 1), t0);
    EXPECT_TRUE(f.sweep(l, t0 + 1999ms).empty());
    EXPECT_EQ(l.outstanding(), 1u);
    const auto x = f.sweep(l, t0 + 2001ms);
    ASSERT_EQ(x.size(), 1u);
    EXPECT_EQ(x[0].call->call, 2u);
    EXPECT_STREQ(x[0].call->op, "all_gather");
    EXPECT_EQ(x[0].outstanding, 2001ms);
}

TEST(WaitLedger, CompletedCallsRetireAndHandBackTheirEvent) {
    WaitLedger l(1000ms);
    Fake f;
    const auto t0 = Clock::now();
    l.add(call("all_gather", 1, kStreamA, 1), t0);
    l.add(call("all_gather", 2, kStreamA, 2), t0);
    f.complete = {1, 2};
    EXPECT_TRUE(f.sweep(l, t0 + 5000ms).empty());  // late, but complete: never reported
    EXPECT_EQ(f.retired, (std::vector<std::uintptr_t>{1, 2}));
    EXPECT_EQ(l.outstanding(), 0u);
    EXPECT_TRUE(f.sweep(l, t0 + 6000ms).empty());
    EXPECT_EQ(f.retired.size(), 2u);  // each exactly once
}

TEST(WaitLedger, LaterCallsOfABlockedStreamAreNotAsked) {
    WaitLedger l(1000ms);
    Fake f;
    const auto t0 = Clock::now();
    l.add(call("reduce_scatter", 1, kStreamA, 1), t0);
    l.add(call("reduce_scatter", 2, kStreamA, 2), t0);
    l.add(call("ag_gemm", 1, kStreamB, 3), t0);
    f.complete = {2, 3};  // 2 cannot have completed before 1 on one stream: it is not even asked
    f.sweep(l, t0 + 10ms);
    EXPECT_EQ(f.asked, (std::vector<std::uintptr_t>{1, 3}));
    EXPECT_EQ(f.retired, (std::vector<std::uintptr_t>{3}));
}

TEST(WaitLedger, QueuedCallsStartTheirClockWhenTheCallAheadRetires) {
    WaitLedger l(1000ms);
    Fake f;
    const auto t0 = Clock::now();
    l.add(call("all_gather", 1, kStreamA, 1), t0);
    l.add(call("all_gather", 2, kStreamA, 2), t0);
    l.add(call("gemm_rs", 7, kStreamB, 3), t0);
    f.complete = {1};
    EXPECT_TRUE(f.sweep(l, t0 + 900ms).empty());  // call 1 retires at 900 ms
    const auto x = f.sweep(l, t0 + 1500ms);
    // Call 2 has waited 600 ms behind nothing; the other stream's call 7 has been outstanding 1500 ms.
    ASSERT_EQ(x.size(), 1u);
    EXPECT_EQ(x[0].call->op, std::string("gemm_rs"));
    const auto y = f.sweep(l, t0 + 1901ms);
    ASSERT_EQ(y.size(), 2u);
    EXPECT_EQ(y[0].call->call, 2u);  // oldest first (in order of registration)
    EXPECT_EQ(y[0].outstanding, 1001ms);
}

TEST(WaitLedger, RearmRestartsTheClock) {
    WaitLedger l(1000ms);
    Fake f;
    const auto t0 = Clock::now();
    l.add(call("all_gather", 3, kStreamA, 1), t0);
    const auto x = f.sweep(l, t0 + 1100ms);
    ASSERT_EQ(x.size(), 1u);
    l.rearm(x[0].id, t0 + 1100ms);
    EXPECT_TRUE(f.sweep(l, t0 + 2000ms).empty());
    EXPECT_EQ(f.sweep(l, t0 + 2101ms).size(), 1u);
}

TEST(WaitLedger, DrainRetiresEverything) {
    WaitLedger l(1000ms);
    Fake f;
    const auto t0 = Clock::now();
    l.add(call("all_gather", 1, kStreamA, 1), t0);
    f.sweep(l, t0);
    l.add(call("all_gather", 2, kStreamA, 2), t0);  // added after the last sweep: drained too
    std::vector<std::uintptr_t> drained;
    l.drain([&](PendingCall&& c) { drained.push_back(handle(c)); });
    EXPECT_EQ(drained, (std::vector<std::uintptr_t>{1, 2}));
    EXPECT_EQ(l.outstanding(), 0u);
}

TEST(WaitLedger, ConcurrentAddsAreEachRetiredOnce) {
    WaitLedger l(1h);
    constexpr int kThreads = 4, kEach = 2000;
    std::atomic<int> started{0};
    std::vector<std::thread> adders;
    for (int t = 0; t < kThreads; ++t)
        adders.emplace_back([&, t] {
            ++started;
            for (int i = 0; i < kEach; ++i) l.add(call("all_gather", i, &kStreams[t], 1 + t * kEach + i), Clock::now());
        });
    std::vector<std::uintptr_t> retired;
    auto sweep = [&] {
        l.sweep(
            Clock::now(), [](const PendingCall&) { return true; },
            [&](PendingCall&& c) { retired.push_back(handle(c)); });
    };
    while (started < kThreads) sweep();
    for (int i = 0; i < 100; ++i) sweep();
    for (auto& a : adders) a.join();
    sweep();
    ASSERT_EQ(retired.size(), std::size_t{kThreads * kEach});
    EXPECT_EQ(std::set<std::uintptr_t>(retired.begin(), retired.end()).size(), retired.size());
}

TEST(WaitLedger, CompareMatchesTheStreamWait) {
    const StreamWait ge{nullptr, 5, false, 1}, eq{nullptr, 1, true, 1};
    EXPECT_TRUE(wait_satisfied(ge, 5));
    EXPECT_TRUE(wait_satisfied(ge, 6));
    EXPECT_FALSE(wait_satisfied(ge, 4));
    EXPECT_FALSE(wait_satisfied(ge, 0));
    const StreamWait wrap{nullptr, ~std::uint64_t{0}, false, 1};  // GEQ is wrap-safe
    EXPECT_TRUE(wait_satisfied(wrap, 2));
    EXPECT_FALSE(wait_satisfied(wrap, ~std::uint64_t{0} - 1));
    EXPECT_TRUE(wait_satisfied(eq, 1));
    EXPECT_FALSE(wait_satisfied(eq, 2));
    EXPECT_FALSE(wait_satisfied(eq, 0));
}

TEST(WaitLedger, MessageNamesOpCallPeerAndValues) {
    PendingCall c;
    c.op = "all_gather";
    c.call = 2;
    c.waits = {StreamWait{reinterpret_cast<const std::uint64_t*>(0x7f00), 2, false, 1},
               StreamWait{reinterpret_cast<const std::uint64_t*>(0x7f08), 2, false, 2},
               StreamWait{reinterpret_cast<const std::uint64_t*>(0x7f10), 1, true, 3}};
    const std::string m = expired_message(0, c, 2013ms, {1, 2, 0}, true, 2000ms);
    EXPECT_EQ(m,
              "loom: wait timeout: rank 0: all_gather call 2 (copy-engine stream wait) outstanding for 2013 ms; "
              "missing: the signal of rank 1 at 0x7f00 (expected >= 2, observed 1); the signal of rank 3 at 0x7f10 "
              "(expected == 1, observed 0); ending the process (LOOM_WAIT_TIMEOUT_MS = 2000; 0 disables the bound)");
    const std::string u = expired_message(1, c, 2013ms, {}, false, 2000ms);
    EXPECT_NE(u.find("the signal of rank 2 at 0x7f08 (expected >= 2, observed unreadable)"), std::string::npos) << u;
}

// A count that several ranks raise (peer -1, e.g. moe_rs's landed sums) is named as such.
TEST(WaitLedger, MessageNamesACountOfSeveralRanks) {
    PendingCall c;
    c.op = "moe_rs";
    c.call = 5;
    c.waits = {StreamWait{reinterpret_cast<const std::uint64_t*>(0x7f00), 24, false, -1}};
    const std::string m = expired_message(2, c, 2013ms, {21}, true, 2000ms);
    EXPECT_NE(m.find("moe_rs call 5 (copy-engine stream wait) outstanding for 2013 ms; missing: the ranks' count at "
                     "0x7f00 (expected >= 24, observed 21)"),
              std::string::npos)
        << m;
}

TEST(WaitLedger, MessageListsAFewAndCountsTheRest) {
    PendingCall c;
    c.op = "gemm_rs";
    c.call = 9;
    std::vector<std::uint64_t> seen;
    for (int i = 0; i < 7; ++i) {
        c.waits.push_back(StreamWait{reinterpret_cast<const std::uint64_t*>(0x1000 + 8 * i), 9, false, 0});
        seen.push_back(8);
    }
    const std::string m = expired_message(0, c, 1ms, seen, true, 1ms);
    EXPECT_NE(m.find("; 3 more;"), std::string::npos) << m;
}

}  // namespace
