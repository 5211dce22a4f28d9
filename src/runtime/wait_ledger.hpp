// The bookkeeping of the stream watchdog (runtime/stream_watchdog.hpp), free of CUDA so that it is unit-tested on
// the CPU: which op calls with copy-engine stream waits are outstanding, since when, and which of them have been
// outstanding longer than the wait bound.
//
// Threads: add() from any thread (one short lock, one vector push); sweep() and rearm() from the watchdog thread only.
// A call's clock starts when it is added, or, when an earlier call on the same stream retires later than that, at
// that retirement: a call queued behind slow work on its stream is not charged for it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace loom::detail {

// One cuStreamWaitValue64 of a call: the stream waits until *addr >= value (wrap-safe) or *addr == value (eq).
struct StreamWait {
    const std::uint64_t* addr = nullptr;
    std::uint64_t value = 0;
    bool eq = false;
    int peer = -1;  // the rank whose write satisfies it (this rank's own rank: one of its own kernels); -1: a count
                    // that several ranks raise
};

// Whether `observed` satisfies `w` (the compare the stream applies).
bool wait_satisfied(const StreamWait& w, std::uint64_t observed);

// One op call, as registered when its stream operations have been enqueued.
struct PendingCall {
    const char* op = "";           // the op's name (a string literal)
    std::uint64_t call = 0;        // the op's call number on this rank (1, 2, ...)
    const void* stream = nullptr;  // the stream on which `done` was recorded (calls on one stream complete in order)
    std::vector<StreamWait> waits;
    void* done = nullptr;  // completion handle (a cudaEvent_t): recorded on `stream` after the call's last operation
};

class WaitLedger {
  public:
    using Clock = std::chrono::steady_clock;

    struct Expired {
        std::uint64_t id;
        const PendingCall* call;      // valid until the next sweep()
        Clock::duration outstanding;  // since the call's clock started
    };

    explicit WaitLedger(Clock::duration bound) : bound_(bound) {}

    // Any thread. Returns the call's id.
    std::uint64_t add(PendingCall c, Clock::time_point now);

    // The watchdog thread. Takes the calls added since the last sweep, retires (in order) every call for which
    // done(const PendingCall&) returns true, handing it to retire(PendingCall&&), and returns the calls outstanding
    // for longer than the bound, oldest first. Calls on one stream complete in order: after a call found not done,
    // done() is not asked about the later calls on its stream.
    template <class Done, class Retire>
    std::vector<Expired> sweep(Clock::time_point now, Done&& done, Retire&& retire) {
        take_added();
        std::vector<Retired> retired_now;
        std::vector<const void*> blocked;  // streams with a call not done: their later calls are not asked
        for (auto it = watched_.begin(); it != watched_.end();) {
            const void* s = it->call.stream;
            const bool behind = std::find(blocked.begin(), blocked.end(), s) != blocked.end();
            if (!behind && done(static_cast<const PendingCall&>(it->call))) {
                retired_now.push_back({it->call.stream, it->seq});
                retire(std::move(it->call));
                it = watched_.erase(it);
            } else {
                if (!behind) blocked.push_back(s);
                ++it;
            }
        }
        std::vector<Expired> out;
        for (Entry& e : watched_) {
            for (const Retired& r : retired_now)
                if (r.stream == e.call.stream && r.seq < e.seq && e.since < now) e.since = now;
            if (now - e.since > bound_) out.push_back({e.id, &e.call, now - e.since});
        }
        return out;
    }

    // The watchdog thread: restart call `id`'s clock at `now` (it was found waiting on nothing of its own).
    void rearm(std::uint64_t id, Clock::time_point now);

    // The watchdog thread: every call, retired through retire() (teardown; a context that stopped working).
    template <class Retire>
    void drain(Retire&& retire) {
        take_added();
        for (Entry& e : watched_) retire(std::move(e.call));
        watched_.clear();
    }

    // Calls seen by the last sweep and not retired.
    std::size_t outstanding() const { return watched_.size(); }
    Clock::duration bound() const { return bound_; }

  private:
    struct Entry {
        std::uint64_t id;
        std::uint64_t seq;  // add order
        Clock::time_point since;
        PendingCall call;
    };
    struct Retired {
        const void* stream;
        std::uint64_t seq;
    };
    void take_added();

    const Clock::duration bound_;
    std::mutex mu_;
    std::vector<Entry> added_;   // guarded by mu_
    std::uint64_t next_id_ = 1;  // guarded by mu_
    std::deque<Entry> watched_;  // the watchdog thread's own
};

// The diagnostic of an expired call: one line, e.g.
//   loom: wait timeout: rank 0: all_gather call 2 (copy-engine stream wait) outstanding for 2013 ms; missing: the
//   signal of rank 1 at 0x7f00 (expected >= 2, observed 1); ending the process (LOOM_WAIT_TIMEOUT_MS = 2000; ...)
// `observed[i]` is what waits[i]'s address held; the waits it satisfies are left out. `readable` false: the values
// could not be read.
std::string expired_message(int rank, const PendingCall& c, WaitLedger::Clock::duration outstanding,
                            const std::vector<std::uint64_t>& observed, bool readable,
                            WaitLedger::Clock::duration bound);

}  // namespace loom::detail
