#include "runtime/stream_watchdog.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "loom/runtime/world.hpp"

namespace loom::detail {
namespace {

// The poll interval: kMinPoll after a poll that saw calls complete, doubling up to kMaxPoll while none do (idle, or
// a stalled stream). A stalled call is reported at most kMaxPoll + kConfirmGap after its bound.
constexpr std::chrono::milliseconds kMinPoll{10};
constexpr std::chrono::milliseconds kMaxPoll{50};
constexpr std::chrono::milliseconds kConfirmGap{10};
// Reading a call's signals: at most kReadSlots of its waits (the rest count as unreadable), given kReadLimit.
constexpr std::size_t kReadSlots = 4096;
constexpr std::chrono::milliseconds kReadLimit{2000};

}  // namespace

StreamWatchdog::StreamWatchdog(World& world)
    : rank_(world.rank()), device_(world.device()), ledger_(settings().wait_timeout) {}

StreamWatchdog::~StreamWatchdog() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
    ledger_.drain([](PendingCall&&) {});
    for (cudaEvent_t e : all_events_) cudaEventDestroy(e);
}

cudaEvent_t StreamWatchdog::event() {
    {
        std::lock_guard lock(mu_);
        if (!free_events_.empty()) {
            cudaEvent_t e = free_events_.back();
            free_events_.pop_back();
            return e;
        }
    }
    cudaEvent_t e = nullptr;
    LOOM_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    std::lock_guard lock(mu_);
    all_events_.push_back(e);
    return e;
}

void StreamWatchdog::recycle(PendingCall&& c) {
    if (!c.done) return;
    std::lock_guard lock(mu_);
    free_events_.push_back(static_cast<cudaEvent_t>(c.done));
}

void StreamWatchdog::watch(PendingCall c) {
    ledger_.add(std::move(c), WaitLedger::Clock::now());
    std::lock_guard lock(mu_);
    if (!thread_.joinable() && !stop_) thread_ = std::thread([this] { run(); });
}

void StreamWatchdog::run() {
    if (cudaSetDevice(device_) != cudaSuccess ||
        cudaStreamCreateWithFlags(&read_, cudaStreamNonBlocking) != cudaSuccess ||
        cudaHostAlloc(reinterpret_cast<void**>(&read_buf_), kReadSlots * sizeof(std::uint64_t), cudaHostAllocDefault) !=
            cudaSuccess) {
        read_buf_ = nullptr;  // signals unreadable: a timeout is still reported, without the observed values
        cudaGetLastError();
    }
    std::chrono::milliseconds interval = kMinPoll;
    std::unique_lock lock(mu_);
    while (!stop_) {
        wake_.wait_for(lock, interval, [&] { return stop_; });
        if (stop_) break;
        lock.unlock();
        const bool progress = sweep();
        lock.lock();
        interval = progress ? kMinPoll : std::min(interval * 2, kMaxPoll);
    }
    lock.unlock();
    if (read_buf_) cudaFreeHost(read_buf_);  // the World synchronised the device before stopping the thread
    if (read_) cudaStreamDestroy(read_);
}

bool StreamWatchdog::sweep() {
    auto retire = [this](PendingCall&& c) { recycle(std::move(c)); };
    if (broken_) {
        ledger_.drain(retire);
        return false;
    }
    bool completed = false;
    auto done = [&](const PendingCall& c) {
        const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(c.done));
        if (e == cudaErrorNotReady) return false;
        if (e != cudaSuccess) {
            // The context reported an error (a device wait trapped, say): the op's own host calls raise it; the
            // stream waits end with the context. Nothing is watched any more.
            cudaGetLastError();
            broken_ = true;
        }
        completed = true;
        return true;
    };
    const auto expired = ledger_.sweep(WaitLedger::Clock::now(), done, retire);
    if (broken_) {
        ledger_.drain(retire);
        return false;
    }
    for (const WaitLedger::Expired& x : expired) {
        std::vector<std::uint64_t> observed;
        bool readable = false;
        if (!confirm(*x.call, observed, readable)) {
            if (readable) ledger_.rearm(x.id, WaitLedger::Clock::now());
            continue;
        }
        const std::string msg = expired_message(rank_, *x.call, x.outstanding, observed, readable, ledger_.bound());
        std::fprintf(stderr, "%s\n", msg.c_str());
        std::fflush(stderr);
        std::fflush(stdout);
        std::abort();
    }
    return completed;
}

// Whether an expired call is stuck on one of its own waits: some wait unsatisfied in two reads kConfirmGap apart,
// and the call still not complete after the second (a call that completes meanwhile may have reset its signals).
// `readable`: the values were read; a call whose values cannot be read counts as stuck (reported "unreadable").
bool StreamWatchdog::confirm(const PendingCall& c, std::vector<std::uint64_t>& observed, bool& readable) {
    auto stuck = [&] {
        for (std::size_t i = 0; i < c.waits.size(); ++i)
            if (!wait_satisfied(c.waits[i], observed[i])) return true;
        return false;
    };
    auto outstanding = [&] {
        const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(c.done));
        if (e != cudaErrorNotReady && e != cudaSuccess) cudaGetLastError();  // the next sweep sees it again
        return e == cudaErrorNotReady;
    };
    readable = read_signals(c, observed);
    if (readable && !stuck()) return false;
    std::this_thread::sleep_for(kConfirmGap);
    if (!outstanding()) {
        readable = false;  // completed meanwhile: the next sweep retires it
        return false;
    }
    readable = read_signals(c, observed);
    if (readable && !stuck()) return false;
    return outstanding();
}

// One 8-byte copy per wait into pinned memory on a non-blocking stream of the watchdog's own (it never waits for the
// stalled streams), then a bounded wait for the copies.
bool StreamWatchdog::read_signals(const PendingCall& c, std::vector<std::uint64_t>& observed) {
    observed.assign(c.waits.size(), 0);
    if (!read_buf_ || c.waits.size() > kReadSlots) return false;
    for (std::size_t i = 0; i < c.waits.size(); ++i) {
        if (cudaMemcpyAsync(&read_buf_[i], c.waits[i].addr, sizeof(std::uint64_t), cudaMemcpyDeviceToHost, read_) !=
            cudaSuccess) {
            cudaGetLastError();
            return false;
        }
    }
    const auto deadline = std::chrono::steady_clock::now() + kReadLimit;
    for (;;) {
        const cudaError_t e = cudaStreamQuery(read_);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady || std::chrono::steady_clock::now() > deadline) {
            cudaGetLastError();
            return false;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    for (std::size_t i = 0; i < c.waits.size(); ++i) observed[i] = read_buf_[i];
    return true;
}

WatchedWaits::WatchedWaits(World& world, const char* op, std::uint64_t call, cudaStream_t stream) : stream_(stream) {
    if (settings().wait_timeout.count() <= 0 || stream_ops::capturing(stream)) return;
    dog_ = &world.state<StreamWatchdog>();
    call_.op = op;
    call_.call = call;
    call_.stream = stream;
}

WatchedWaits::~WatchedWaits() {
    try {
        enqueued();
    } catch (...) {
        // The call's own error is the one that matters; this one call goes unwatched.
    }
}

void WatchedWaits::wait_value(cudaStream_t s, const std::uint64_t* addr, std::uint64_t value, int peer,
                              stream_ops::WaitCmp cmp) {
    stream_ops::wait_value(s, addr, value, cmp);
    if (dog_) call_.waits.push_back(StreamWait{addr, value, cmp == stream_ops::WaitCmp::EQ, peer});
}

void WatchedWaits::enqueued() {
    StreamWatchdog* dog = std::exchange(dog_, nullptr);
    if (!dog || call_.waits.empty()) return;
    cudaEvent_t e = dog->event();
    LOOM_CHECK_CUDA(cudaEventRecord(e, stream_));  // on failure the event stays in the pool's list, unused
    call_.done = e;
    dog->watch(std::move(call_));
}

}  // namespace loom::detail
