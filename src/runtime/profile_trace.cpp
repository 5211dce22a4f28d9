// The profiler's trace, built on the host from the ranks' records (profile_trace.hpp).
#include "runtime/profile_trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <mutex>
#include <tuple>

namespace loom::profile {
namespace {

struct TagNames {
    std::mutex mu;
    std::map<uint16_t, std::string> user;
};
TagNames& tag_names() {
    static TagNames* t = new TagNames;
    return *t;
}

const char* builtin_name(uint16_t tag) {
    switch (tag) {
        case lang::kTagGemmTile:
            return "gemm.tile";
        case lang::kTagAgChunkWait:
            return "ag_gemm.chunk_wait";
        case lang::kTagAgPush:
            return "ag_gemm.push";
        case lang::kTagAgStage:
            return "ag_gemm.stage";
        case lang::kTagRsPushTile:
            return "gemm_rs.push_tile";
        case lang::kTagRsRingWait:
            return "gemm_rs.peer_wait";
        case lang::kTagRsScatterWait:
            return "gemm_rs.tile_wait";
        case lang::kTagRsScatterPush:
            return "gemm_rs.scatter_push";
        case lang::kTagRsScatterReduce:
            return "gemm_rs.scatter_reduce";
        case lang::kTagArPushTile:
            return "gemm_ar.push_tile";
        case lang::kTagArPeerWait:
            return "gemm_ar.peer_wait";
        case lang::kTagArReduceTile:
            return "gemm_ar.reduce_tile";
        case lang::kTagCollKernel:
            return "coll.kernel";
        case lang::kTagCollBarrier:
            return "coll.barrier";
        case lang::kTagEpLlPhase:
            return "ep_ll.phase";
        case lang::kTagEpKernel:
            return "ep.kernel";
        default:
            return nullptr;
    }
}

const char* coll_name(uint32_t v) {
    switch (v) {
        case lang::kCollAllGather:
            return "all_gather";
        case lang::kCollAllReduce:
            return "all_reduce";
        case lang::kCollReduceScatter:
            return "reduce_scatter";
        case lang::kCollAllToAll:
            return "all_to_all";
        case lang::kCollLowLatency:
            return "ll";
        default:
            return "?";
    }
}

// The EP spans' values, in their enums' order (lang/profile_event.hpp): "<prefix>.<name>", "<prefix>.?" beyond.
constexpr const char* kEpLlPhaseNames[] = {"dispatch_send", "dispatch_recv", "combine_send", "combine_recv"};
constexpr const char* kEpKernelNames[] = {"layout_count",    "layout_scan",  "layout_index",  "dispatch_push",
                                          "dispatch_arrive", "combine_send", "combine_reduce"};
static_assert(std::size(kEpLlPhaseNames) == lang::kEpLlCombineRecv + 1);
static_assert(std::size(kEpKernelNames) == lang::kEpCombineReduce + 1);

template <std::size_t N>
std::string value_name(const char* prefix, const char* const (&names)[N], uint32_t v) {
    return fmt::format("{}.{}", prefix, v < N ? names[v] : "?");
}

// The span's display name: the tag's, with the collective's kernel named for coll.kernel, the phase for ep_ll.phase
// and the kernel for ep.kernel.
std::string span_name(const lang::ProfileEvent& e) {
    if (e.tag == lang::kTagCollKernel) return fmt::format("coll.{}", coll_name(e.value));
    if (e.tag == lang::kTagEpLlPhase) return value_name("ep_ll", kEpLlPhaseNames, e.value);
    if (e.tag == lang::kTagEpKernel) return value_name("ep", kEpKernelNames, e.value);
    return tag_name(e.tag);
}

nlohmann::json span_args(const lang::ProfileEvent& e) {
    nlohmann::json a = {{"value", e.value}, {"block", e.block}};
    if (e.tag == lang::kTagGemmTile || e.tag == lang::kTagRsPushTile || e.tag == lang::kTagRsRingWait) {
        a["m_block"] = e.value >> 16;
        a["n_block"] = e.value & 0xffffu;
    }
    return a;
}

// A (SM, block, warp) of one rank: one thread's records in program order.
using ThreadKey = std::tuple<uint32_t, uint32_t, uint32_t>;

struct Span {
    std::size_t begin, end;  // indices into the rank's events; end == begin for an instant
};

struct ThreadRecords {
    std::vector<Span> spans;
    int64_t first = INT64_MAX, last = INT64_MIN;  // aligned time range of the thread's records
};

// Pair each End with the latest open Begin of its tag (ring order is the thread's program order: one thread's
// atomicAdds on one counter are ordered). Begins or Ends left over count as unmatched.
void pair_records(const RankRecords& rr, int64_t offset, std::map<ThreadKey, ThreadRecords>& out, TraceStats& st) {
    std::map<ThreadKey, std::vector<std::size_t>> open;
    for (std::size_t i = 0; i < rr.events.size(); ++i) {
        const lang::ProfileEvent& e = rr.events[i];
        const ThreadKey key{e.sm, e.block, e.warp};
        ThreadRecords& tr = out[key];
        const int64_t t = static_cast<int64_t>(e.t_ns) - offset;
        tr.first = std::min(tr.first, t);
        tr.last = std::max(tr.last, t);
        auto& stack = open[key];
        if (e.kind == lang::kProfileBegin) {
            stack.push_back(i);
        } else if (e.kind == lang::kProfileEnd) {
            auto it =
                std::find_if(stack.rbegin(), stack.rend(), [&](std::size_t b) { return rr.events[b].tag == e.tag; });
            if (it == stack.rend()) {
                ++st.unmatched;
                continue;
            }
            const std::size_t b = *it;
            const auto above = static_cast<std::size_t>(it - stack.rbegin());  // begins opened after b, never ended
            st.unmatched += above;
            stack.resize(stack.size() - above - 1);
            tr.spans.push_back({b, i});
            ++st.spans;
        } else if (e.kind == lang::kProfileInstant) {
            tr.spans.push_back({i, i});
            ++st.instants;
        }
    }
    for (auto& [key, stack] : open) st.unmatched += stack.size();
}

// CTA slot per thread key: blocks whose records on one (SM, warp) overlap in time get different slots, so that every
// track holds one thread's records at a time.
std::map<ThreadKey, int> assign_slots(const std::map<ThreadKey, ThreadRecords>& threads) {
    std::map<std::pair<uint32_t, uint32_t>, std::vector<std::pair<int64_t, ThreadKey>>> by_sm_warp;
    for (const auto& [key, tr] : threads) by_sm_warp[{std::get<0>(key), std::get<2>(key)}].push_back({tr.first, key});
    std::map<ThreadKey, int> slot;
    for (auto& [sw, list] : by_sm_warp) {
        std::sort(list.begin(), list.end());
        std::vector<int64_t> slot_end;  // per slot, the last record's time
        for (const auto& [first, key] : list) {
            std::size_t s = 0;
            while (s < slot_end.size() && slot_end[s] > first) ++s;
            if (s == slot_end.size()) slot_end.push_back(0);
            slot_end[s] = threads.at(key).last;
            slot[key] = static_cast<int>(s);
        }
    }
    return slot;
}

struct Out {
    int pid;
    int64_t tid;
    int64_t t;     // aligned ns
    uint64_t seq;  // emission order: program order, blocks of one track in time order
    nlohmann::json ev;
};

}  // namespace

std::vector<int64_t> clock_offsets(const std::vector<ClockReading>& readings) {
    std::vector<int64_t> out(readings.size(), 0);
    if (readings.empty()) return out;
    const int64_t base = readings[0].gpu_ns - readings[0].host_ns;
    for (std::size_t r = 0; r < readings.size(); ++r) out[r] = (readings[r].gpu_ns - readings[r].host_ns) - base;
    return out;
}

std::string tag_name(uint16_t tag) {
    if (const char* b = builtin_name(tag)) return b;
    TagNames& t = tag_names();
    std::lock_guard lock(t.mu);
    if (auto it = t.user.find(tag); it != t.user.end()) return it->second;
    return fmt::format("tag {}", tag);
}

void set_tag_name(uint16_t tag, const std::string& name) {
    TagNames& t = tag_names();
    std::lock_guard lock(t.mu);
    t.user[tag] = name;
}

nlohmann::json build_trace(const std::vector<RankRecords>& ranks, const std::vector<int64_t>& offsets,
                           TraceStats* stats) {
    TraceStats st;
    std::vector<std::map<ThreadKey, ThreadRecords>> threads(ranks.size());
    int64_t t0 = INT64_MAX;
    for (std::size_t r = 0; r < ranks.size(); ++r) {
        const int64_t off = r < offsets.size() ? offsets[r] : 0;
        pair_records(ranks[r], off, threads[r], st);
        for (const auto& [key, tr] : threads[r]) t0 = std::min(t0, tr.first);
    }
    if (t0 == INT64_MAX) t0 = 0;

    std::vector<Out> out;
    nlohmann::json meta = nlohmann::json::array();
    uint64_t seq = 0;
    for (std::size_t r = 0; r < ranks.size(); ++r) {
        const int pid = ranks[r].rank;
        const int64_t off = r < offsets.size() ? offsets[r] : 0;
        meta.push_back(
            {{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", fmt::format("rank {}", pid)}}}});
        meta.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
        const std::map<ThreadKey, int> slots = assign_slots(threads[r]);
        // Threads in time order, so that consecutive blocks on one track are emitted in order.
        std::vector<std::pair<int64_t, ThreadKey>> order;
        for (const auto& [key, tr] : threads[r]) order.push_back({tr.first, key});
        std::sort(order.begin(), order.end());
        std::map<int64_t, bool> named;
        for (const auto& [first, key] : order) {
            const auto [sm, block, warp] = key;
            const int slot = slots.at(key);
            const int64_t tid = static_cast<int64_t>(sm) * 10000 + slot * 100 + warp;
            if (!named[tid]) {
                named[tid] = true;
                const std::string tname = slot == 0 ? fmt::format("SM {} warp {}", sm, warp)
                                                    : fmt::format("SM {} warp {} (CTA slot {})", sm, warp, slot);
                meta.push_back(
                    {{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", tname}}}});
                meta.push_back({{"ph", "M"},
                                {"name", "thread_sort_index"},
                                {"pid", pid},
                                {"tid", tid},
                                {"args", {{"sort_index", tid}}}});
            }
            // The thread's records in program order: each span's B at its begin index, E at its end index.
            std::vector<std::tuple<std::size_t, int, const Span*>> marks;  // (index, 0 begin / 1 end / 2 instant)
            for (const Span& s : threads[r].at(key).spans) {
                if (s.begin == s.end) {
                    marks.push_back({s.begin, 2, &s});
                } else {
                    marks.push_back({s.begin, 0, &s});
                    marks.push_back({s.end, 1, &s});
                }
            }
            std::sort(marks.begin(), marks.end(),
                      [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
            for (const auto& [idx, what, span] : marks) {
                const lang::ProfileEvent& e = ranks[r].events[idx];
                const int64_t t = static_cast<int64_t>(e.t_ns) - off;
                const double ts = static_cast<double>(t - t0) / 1000.0;
                const lang::ProfileEvent& b = ranks[r].events[span->begin];
                nlohmann::json ev = {{"name", span_name(b)}, {"cat", "loom"}, {"pid", pid}, {"tid", tid}, {"ts", ts}};
                if (what == 0) {
                    ev["ph"] = "B";
                    ev["args"] = span_args(b);
                } else if (what == 1) {
                    ev["ph"] = "E";
                } else {
                    ev["ph"] = "i";
                    ev["s"] = "t";
                    ev["args"] = span_args(b);
                }
                out.push_back({pid, tid, t, seq++, std::move(ev)});
            }
        }
    }
    std::stable_sort(out.begin(), out.end(), [](const Out& a, const Out& b) {
        return std::tie(a.pid, a.tid, a.t, a.seq) < std::tie(b.pid, b.tid, b.t, b.seq);
    });
    nlohmann::json events = std::move(meta);
    for (Out& o : out) events.push_back(std::move(o.ev));
    nlohmann::json dropped = nlohmann::json::object();
    for (const RankRecords& rr : ranks) dropped[std::to_string(rr.rank)] = rr.dropped;
    if (stats) *stats = st;
    return {{"traceEvents", std::move(events)},
            {"displayTimeUnit", "ns"},
            {"otherData",
             {{"generator", "loom intra-kernel profiler"},
              {"dropped_records", std::move(dropped)},
              {"unmatched_records", st.unmatched},
              {"clock_offsets_ns", offsets}}}};
}

}  // namespace loom::profile
