#include "runtime/wait_ledger.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace loom::detail {

bool wait_satisfied(const StreamWait& w, std::uint64_t observed) {
    return w.eq ? observed == w.value : static_cast<std::int64_t>(observed - w.value) >= 0;
}

std::uint64_t WaitLedger::add(PendingCall c, Clock::time_point now) {
    std::lock_guard lock(mu_);
    const std::uint64_t id = next_id_++;
    added_.push_back(Entry{id, id, now, std::move(c)});
    return id;
}

void WaitLedger::take_added() {
    std::vector<Entry> added;
    {
        std::lock_guard lock(mu_);
        added.swap(added_);
    }
    for (Entry& e : added) watched_.push_back(std::move(e));
}

void WaitLedger::rearm(std::uint64_t id, Clock::time_point now) {
    for (Entry& e : watched_)
        if (e.id == id) e.since = now;
}

namespace {

long long ms(WaitLedger::Clock::duration d) {
    return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

}  // namespace

std::string expired_message(int rank, const PendingCall& c, WaitLedger::Clock::duration outstanding,
                            const std::vector<std::uint64_t>& observed, bool readable,
                            WaitLedger::Clock::duration bound) {
    std::string missing;
    int shown = 0, unsatisfied = 0;
    for (std::size_t i = 0; i < c.waits.size(); ++i) {
        const StreamWait& w = c.waits[i];
        if (readable && i < observed.size() && wait_satisfied(w, observed[i])) continue;
        ++unsatisfied;
        if (shown == 4) continue;  // the first few are enough to name who is missing
        const std::string seen = readable && i < observed.size() ? fmt::format("{}", observed[i]) : "unreadable";
        const std::string whose = w.peer >= 0 ? fmt::format("the signal of rank {}", w.peer) : "the ranks' count";
        missing += fmt::format("{}{} at {} (expected {} {}, observed {})", shown ? "; " : "", whose,
                               static_cast<const void*>(w.addr), w.eq ? "==" : ">=", w.value, seen);
        ++shown;
    }
    if (unsatisfied > shown) missing += fmt::format("; {} more", unsatisfied - shown);
    const std::string what = unsatisfied == 0
                                 ? std::string("every stream wait of the call is satisfied (the stall is before it)")
                                 : "missing: " + missing;
    return fmt::format(
        "loom: wait timeout: rank {}: {} call {} (copy-engine stream wait) outstanding for {} ms; {}; ending the "
        "process (LOOM_WAIT_TIMEOUT_MS = {}; 0 disables the bound)",
        rank, c.op, c.call, ms(outstanding), what, ms(bound));
}

}  // namespace loom::detail
