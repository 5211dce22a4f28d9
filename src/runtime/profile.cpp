// The profiler's public host API and the collective trace writer (loom/runtime/profile.hpp).
//
// write_trace: each rank takes its ring's records and pairs its GPU clock with the host's monotonic clock (one
// clock_ping); the records go to a part file in the trace's directory (the ops are node-local, so every rank sees the
// directory) and the clock reading, counts and the part's path through one all-gather of the store; rank 0 aligns the
// clocks (offsets relative to rank 0), builds the trace, writes it (temporary file, then rename) and removes the parts;
// a second all-gather hands its path to every rank.
#include "loom/runtime/profile.hpp"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>

#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "loom/runtime/store.hpp"
#include "loom/runtime/world.hpp"
#include "runtime/log.hpp"
#include "runtime/profile_ring.hpp"
#include "runtime/profile_trace.hpp"

namespace loom::profile {
namespace {

std::atomic<int> g_override{-1};  // -1: LOOM_PROFILE decides
std::atomic<int> g_writes{0};     // write_trace calls of this process (the same sequence on every rank)

namespace fs = std::filesystem;

void write_part(const fs::path& part, const RankRecords& rr) {
    std::ofstream f(part, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(rr.events.data()),
            static_cast<std::streamsize>(rr.events.size() * sizeof(lang::ProfileEvent)));
    LOOM_CHECK(f.good(), "profile: cannot write the part file {}", part.string());
}

std::vector<lang::ProfileEvent> read_part(const std::string& part, uint64_t count) {
    std::vector<lang::ProfileEvent> ev(count);
    std::ifstream f(part, std::ios::binary);
    f.read(reinterpret_cast<char*>(ev.data()), static_cast<std::streamsize>(count * sizeof(lang::ProfileEvent)));
    LOOM_CHECK(f.good() || count == 0, "profile: cannot read {} records from the part file {}", count, part);
    return ev;
}

Bytes to_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string from_bytes(const Bytes& b) { return std::string(b.begin(), b.end()); }

// Rank 0: the trace of every rank's part, written to `out`. Returns the number of spans and instants.
std::size_t merge_parts(const std::vector<nlohmann::json>& recs, const std::string& out) {
    std::vector<RankRecords> ranks;
    std::vector<ClockReading> clocks;
    for (std::size_t r = 0; r < recs.size(); ++r) {
        const nlohmann::json& j = recs[r];
        RankRecords rr;
        rr.rank = static_cast<int>(r);
        rr.dropped = j.at("dropped").get<uint64_t>();
        rr.events = read_part(j.at("part").get<std::string>(), j.at("count").get<uint64_t>());
        ranks.push_back(std::move(rr));
        clocks.push_back(
            {j.at("host_ns").get<int64_t>(), j.at("gpu_ns").get<int64_t>(), j.at("half_ns").get<int64_t>()});
    }
    TraceStats st;
    nlohmann::json trace = build_trace(ranks, clock_offsets(clocks), &st);
    nlohmann::json windows = nlohmann::json::array();
    for (const ClockReading& c : clocks) windows.push_back(c.half_window_ns);
    trace["otherData"]["clock_uncertainty_ns"] = windows;
    const std::string tmp = out + ".tmp";
    {
        std::ofstream f(tmp, std::ios::trunc);
        f << trace.dump() << '\n';
        LOOM_CHECK(f.good(), "profile: cannot write the trace {}", tmp);
    }
    fs::rename(tmp, out);
    uint64_t dropped = 0;
    for (const RankRecords& rr : ranks) dropped += rr.dropped;
    if (dropped)
        loom::log(LogLevel::Warn,
                  "warning: profile: {} records dropped (ring of {} records per rank full); clear it between "
                  "the calls to trace (loom::profile::clear)",
                  dropped, detail::kRingRecords);
    if (st.unmatched) loom::log(LogLevel::Info, "profile: {} unmatched begin / end records left out", st.unmatched);
    return st.spans + st.instants;
}

}  // namespace

bool enabled() {
    const int o = g_override.load(std::memory_order_relaxed);
    return o >= 0 ? o == 1 : !settings().profile_dir.empty();
}

void set_enabled(bool on) { g_override.store(on ? 1 : 0, std::memory_order_relaxed); }

void register_tag(uint16_t tag, const std::string& name) {
    LOOM_CHECK(tag >= lang::kProfileUserTag0, "profile::register_tag: expected a tag >= {} (the user range), given {}",
               static_cast<int>(lang::kProfileUserTag0), tag);
    set_tag_name(tag, name);
}

void clear() { (void)detail::take_records(0); }

RingCounts ring_counts() { return detail::peek_counts(); }

std::string write_trace(World& world, const std::string& path) {
    return detail::write_trace_with(world.store(), world.rank(), world.world_size(), path);
}

namespace detail {

std::string write_trace_with(Store& store, int rank, int world_size, const std::string& path) {
    const int n = g_writes.fetch_add(1);
    const RankRecords mine = take_records(rank);
    const ClockReading clock = read_clock();
    fs::path dir = path.empty() ? fs::path(settings().profile_dir) : fs::path(path).parent_path();
    if (dir.empty()) dir = ".";
    std::error_code ec;
    fs::create_directories(dir, ec);
    LOOM_CHECK(fs::is_directory(dir), "profile: expected a writable directory for the trace, given \"{}\" ({})",
               dir.string(), ec ? ec.message() : "not a directory");
    const fs::path part = dir / fmt::format(".loom_trace_part_{}_{}_r{}.bin", ::getpid(), n, rank);
    write_part(part, mine);
    const nlohmann::json rec = {{"host_ns", clock.host_ns},
                                {"gpu_ns", clock.gpu_ns},
                                {"half_ns", clock.half_window_ns},
                                {"count", mine.events.size()},
                                {"dropped", mine.dropped},
                                {"part", fs::absolute(part).string()},
                                {"pid", ::getpid()}};
    const std::string key = fmt::format("loom/profile/{}", n);
    const std::vector<Bytes> all = store.all_gather(key, to_bytes(rec.dump()));
    LOOM_CHECK(static_cast<int>(all.size()) == world_size, "profile: expected {} ranks' records, given {}", world_size,
               all.size());
    std::string written;
    if (rank == 0) {
        std::vector<nlohmann::json> recs;
        uint64_t total = 0;
        for (const Bytes& b : all) {
            recs.push_back(nlohmann::json::parse(from_bytes(b)));
            total += recs.back().at("count").get<uint64_t>();
        }
        try {
            if (total > 0) {
                written = path.empty() ? (dir / fmt::format("loom_trace_{}_{}.json", ::getpid(), n)).string() : path;
                merge_parts(recs, written);
            }
        } catch (...) {
            for (const auto& j : recs) fs::remove(j.at("part").get<std::string>(), ec);
            (void)store.all_gather(key + "/done", {});
            throw;
        }
        for (const auto& j : recs) fs::remove(j.at("part").get<std::string>(), ec);
    }
    const std::vector<Bytes> done = store.all_gather(key + "/done", to_bytes(written));
    return from_bytes(done.at(0));
}

}  // namespace detail
}  // namespace loom::profile
