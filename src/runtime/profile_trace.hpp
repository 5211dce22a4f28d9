// Building the profiler's trace on the host (pure CPU; collection: profile.cpp): pairing begin / end records into
// spans, aligning the ranks' clocks, laying the spans out on tracks and writing the Trace Event JSON.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/lang/profile_event.hpp"

namespace loom::profile {

// One pairing of a rank's GPU clock with the host's monotonic clock (shared by the node's processes), taken in one
// ping: the GPU read gpu_ns while the host clock was within [host_ns - half_window_ns, host_ns + half_window_ns].
struct ClockReading {
    int64_t host_ns = 0;
    int64_t gpu_ns = 0;
    int64_t half_window_ns = 0;
};

// Per rank, the amount to subtract from its GPU timestamps to express them on rank 0's GPU clock: (gpu - host) of
// the rank minus (gpu - host) of rank 0. readings[0] is rank 0's.
std::vector<int64_t> clock_offsets(const std::vector<ClockReading>& readings);

struct RankRecords {
    int rank = 0;
    std::vector<lang::ProfileEvent> events;  // in ring order
    uint64_t dropped = 0;
};

// The tag's name: Loom's ("gemm.tile", "ag.chunk_wait", ...), a registered user tag's, else "tag <n>".
std::string tag_name(uint16_t tag);
void set_tag_name(uint16_t tag, const std::string& name);

struct TraceStats {
    std::size_t spans = 0;
    std::size_t instants = 0;
    std::size_t unmatched = 0;  // begin without end or end without begin (dropped records, a trapped kernel)
};

// The Trace Event JSON ({"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}): per rank a process
// (pid = rank, "rank r"), per track a thread (tid = SM x 10000 + CTA slot x 100 + warp, "SM s warp w"; the CTA
// slot tells apart blocks resident on one SM at once); spans as
// B / E pairs (args: value), instants as ph "i"; ts in µs from the earliest aligned record; events sorted by (pid,
// tid, ts). `offsets[r]` is subtracted from rank r's timestamps (clock_offsets).
nlohmann::json build_trace(const std::vector<RankRecords>& ranks, const std::vector<int64_t>& offsets,
                           TraceStats* stats = nullptr);

}  // namespace loom::profile
