#include "ops/collectives/coll_choice.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>

#include "loom/jit/jit.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/store.hpp"

namespace loom {

const char* to_string(CollKind k) {
    switch (k) {
        case CollKind::AllGather:
            return "all_gather";
        case CollKind::ReduceScatter:
            return "reduce_scatter";
        case CollKind::AllReduce:
            return "all_reduce";
        case CollKind::AllToAll:
            return "all_to_all";
        case CollKind::AllToAllV:
            return "all_to_all_v";
    }
    return "?";
}
const char* to_string(CollAlgo a) {
    switch (a) {
        case CollAlgo::Auto:
            return "auto";
        case CollAlgo::Push:
            return "push";
        case CollAlgo::Pull:
            return "pull";
        case CollAlgo::Ring:
            return "ring";
        case CollAlgo::Scatter:
            return "scatter";
        case CollAlgo::OneShot:
            return "one_shot";
        case CollAlgo::TwoShot:
            return "two_shot";
        case CollAlgo::LL:
            return "ll";
    }
    return "?";
}
const char* to_string(DataPath p) {
    switch (p) {
        case DataPath::Auto:
            return "auto";
        case DataPath::LdSt:
            return "ld";
        case DataPath::Tma:
            return "tma";
        case DataPath::CopyEngine:
            return "ce";
    }
    return "?";
}

namespace coll {

namespace {
constexpr std::size_t KiB = 1024, MiB = 1024 * KiB, kAny = SIZE_MAX;
}

// Rows from bench-collectives on H200s, one line of evidence each (docs/perf/<op>.json, rows by algo/path, size,
// ranks and machine: "shared" is one H200 shared by the ranks under MPS, "two GPUs" two H200s joined by NVLink):
// - LL to its capacity on two GPUs, to 128 KiB chunks shared: all_gather.json, reduce_scatter.json, all_to_all.json
//   ll/ld against the best other algorithm per size.
// - all_gather shared: the fan-out push (push/ld, grid-strided) beats every other path at every size, 16 MiB - 1 GiB
//   (all_gather.json, W = 8, 1 GiB: push/ld 2761 us, push/ce 4399).
// - all_gather two GPUs: ring to 16 MiB at W = 2, ld/st to 8 MiB, then the copy engine (all_gather.json, 1 GiB).
// - all_reduce: LL to 256 KiB on two GPUs and at W = 2, to 64 KiB beyond; two-shot past that; two-shot/ce past
//   64 MiB on two GPUs (all_reduce.json, 1 GiB: two_shot/ce 3019 us, two_shot/ld 3185, NCCL 3279).
// - all_to_all two GPUs: ld/st to 64 MiB per peer, then the copy engine (all_to_all.json, 64 MiB: push/ld 120 us,
//   push/ce 127); out not symmetric: pull/ce past 16 MiB (all_to_all.json out_plain, 64 MiB: pull/ce 130, pull/ld 132).
// - TMA bulk copies lost at every size on both machines; scatter/ce reduce_scatter lost to pull at every size
//   (reduce_scatter.json), so no row picks it. Sizes are choose_collective's `bytes`.
const std::vector<ChoiceRow>& choice_table() {
    static const std::vector<ChoiceRow> rows = {
        // AllGather (bytes per rank)
        {CollKind::AllGather, 512 * KiB, GpuSharing::Distinct, CollAlgo::LL, DataPath::LdSt,
         "latency, one GPU per rank: flag-in-data to its capacity (measured)"},
        {CollKind::AllGather, 128 * KiB, GpuSharing::Any, CollAlgo::LL, DataPath::LdSt,
         "latency: flag-in-data, no barrier (measured)"},
        {CollKind::AllGather, 16 * MiB, GpuSharing::Distinct, CollAlgo::Ring, DataPath::LdSt,
         "one GPU per rank, two ranks: ring (measured)", 2},
        {CollKind::AllGather, kAny, GpuSharing::Shared, CollAlgo::Push, DataPath::LdSt,
         "ranks sharing a GPU: fan-out push, the input read once for every out (measured)"},
        {CollKind::AllGather, 8 * MiB, GpuSharing::Any, CollAlgo::Push, DataPath::LdSt, "one pass, all SMs' ld/st"},
        {CollKind::AllGather, kAny, GpuSharing::Any, CollAlgo::Push, DataPath::CopyEngine,
         "large: copy engine (one GPU per rank: 15 % of each chunk through SM stores beside it; measured)"},
        {CollKind::AllGather, 8 * MiB, GpuSharing::Any, CollAlgo::Pull, DataPath::LdSt, "out not symmetric: pull"},
        {CollKind::AllGather, 64 * MiB, GpuSharing::Distinct, CollAlgo::Pull, DataPath::LdSt,
         "out not symmetric: pull"},
        {CollKind::AllGather, kAny, GpuSharing::Any, CollAlgo::Pull, DataPath::CopyEngine,
         "out not symmetric: pull, copy engine"},
        // ReduceScatter (bytes of out)
        {CollKind::ReduceScatter, 512 * KiB, GpuSharing::Distinct, CollAlgo::LL, DataPath::LdSt,
         "latency, one GPU per rank: flag-in-data to its capacity (measured)"},
        {CollKind::ReduceScatter, 128 * KiB, GpuSharing::Any, CollAlgo::LL, DataPath::LdSt,
         "latency: flag-in-data, no barrier (measured)"},
        {CollKind::ReduceScatter, kAny, GpuSharing::Any, CollAlgo::Pull, DataPath::LdSt,
         "one pass, reduce in registers"},
        {CollKind::ReduceScatter, 64 * KiB, GpuSharing::Any, CollAlgo::Scatter, DataPath::LdSt, "in not symmetric"},
        {CollKind::ReduceScatter, kAny, GpuSharing::Any, CollAlgo::Scatter, DataPath::Tma, "in not symmetric"},
        // AllReduce (bytes of the buffer)
        {CollKind::AllReduce, 256 * KiB, GpuSharing::Distinct, CollAlgo::LL, DataPath::LdSt,
         "latency, one GPU per rank: flag-in-data to 256 KiB (measured)"},
        {CollKind::AllReduce, 256 * KiB, GpuSharing::Any, CollAlgo::LL, DataPath::LdSt,
         "latency, two ranks: flag-in-data to 256 KiB (measured)", 2},
        {CollKind::AllReduce, 64 * KiB, GpuSharing::Any, CollAlgo::LL, DataPath::LdSt,
         "latency: flag-in-data, no barrier"},
        {CollKind::AllReduce, 64 * MiB, GpuSharing::Distinct, CollAlgo::TwoShot, DataPath::LdSt,
         "bandwidth: W reads + W writes"},
        {CollKind::AllReduce, kAny, GpuSharing::Distinct, CollAlgo::TwoShot, DataPath::CopyEngine,
         "large, one GPU per rank: reduce_scatter (pull) then a copy-engine all_gather"},
        {CollKind::AllReduce, kAny, GpuSharing::Any, CollAlgo::TwoShot, DataPath::LdSt,
         "bandwidth: W reads + W writes (out not symmetric: staged in the scratch)"},
        {CollKind::AllReduce, kAny, GpuSharing::Any, CollAlgo::OneShot, DataPath::LdSt, "in not symmetric"},
        // AllToAll (bytes per peer)
        {CollKind::AllToAll, 512 * KiB, GpuSharing::Distinct, CollAlgo::LL, DataPath::LdSt,
         "latency, one GPU per rank: flag-in-data to its capacity (measured)"},
        {CollKind::AllToAll, 128 * KiB, GpuSharing::Any, CollAlgo::LL, DataPath::LdSt,
         "latency: flag-in-data, no barrier (measured)"},
        {CollKind::AllToAll, 16 * MiB, GpuSharing::Any, CollAlgo::Push, DataPath::LdSt, "ld/st"},
        {CollKind::AllToAll, 64 * MiB, GpuSharing::Distinct, CollAlgo::Push, DataPath::LdSt,
         "one GPU per rank: ld/st to 64 MiB (measured)"},
        {CollKind::AllToAll, kAny, GpuSharing::Any, CollAlgo::Push, DataPath::CopyEngine,
         "large: copy engine (measured)"},
        {CollKind::AllToAll, 16 * MiB, GpuSharing::Any, CollAlgo::Pull, DataPath::LdSt,
         "out not symmetric: pull (measured)"},
        {CollKind::AllToAll, kAny, GpuSharing::Any, CollAlgo::Pull, DataPath::CopyEngine,
         "out not symmetric: pull, copy engine (measured)"},
        {CollKind::AllToAllV, 16 * MiB, GpuSharing::Any, CollAlgo::Push, DataPath::LdSt, "ld/st (capacity bytes)"},
        {CollKind::AllToAllV, kAny, GpuSharing::Any, CollAlgo::Push, DataPath::Tma,
         "large (capacity bytes; no copy-engine path)"},
        {CollKind::AllToAllV, 16 * MiB, GpuSharing::Any, CollAlgo::Pull, DataPath::LdSt,
         "out not symmetric: pull (capacity bytes; as the equal splits)"},
        {CollKind::AllToAllV, kAny, GpuSharing::Any, CollAlgo::Pull, DataPath::Tma,
         "out not symmetric: pull, large (capacity bytes; no copy-engine path)"},
    };
    return rows;
}

bool offered(CollKind kind, CollAlgo algo, DataPath path) {
    const bool ld = path == DataPath::LdSt, tma = path == DataPath::Tma, ce = path == DataPath::CopyEngine;
    switch (kind) {
        case CollKind::AllGather:
            if (algo == CollAlgo::Push || algo == CollAlgo::Pull) return ld || tma || ce;
            return (algo == CollAlgo::Ring && (ld || tma)) || (algo == CollAlgo::LL && ld);
        case CollKind::ReduceScatter:
            return ((algo == CollAlgo::Pull || algo == CollAlgo::Ring || algo == CollAlgo::LL) && ld) ||
                   (algo == CollAlgo::Scatter && (ld || tma || ce));
        case CollKind::AllReduce:
            return ((algo == CollAlgo::TwoShot || algo == CollAlgo::LL) && ld) || (algo == CollAlgo::TwoShot && ce) ||
                   (algo == CollAlgo::OneShot && (ld || tma));
        case CollKind::AllToAll:
            return ((algo == CollAlgo::Push || algo == CollAlgo::Pull) && (ld || tma || ce)) ||
                   (algo == CollAlgo::LL && ld);
        case CollKind::AllToAllV:
            return (algo == CollAlgo::Push || algo == CollAlgo::Pull) && (ld || tma);
    }
    return false;
}

bool feasible(CollKind kind, CollAlgo algo, bool in_sym, bool out_sym) {
    if (algo == CollAlgo::LL) return true;  // only the LL area is symmetric
    switch (kind) {
        case CollKind::AllGather:
            return algo == CollAlgo::Pull ? in_sym : out_sym;
        case CollKind::ReduceScatter:
            return algo == CollAlgo::Pull ? in_sym : true;
        case CollKind::AllReduce:
            return algo == CollAlgo::TwoShot ? in_sym : true;  // out not symmetric: staged (all_reduce.cpp)
        case CollKind::AllToAll:
        case CollKind::AllToAllV:
            return algo == CollAlgo::Pull ? in_sym : out_sym;
    }
    return false;
}

Staged staged_buffer(CollKind kind, CollAlgo algo) {
    switch (kind) {
        case CollKind::AllGather:
        case CollKind::AllToAll:
        case CollKind::ReduceScatter:
            return algo == CollAlgo::Pull ? Staged::In : Staged::None;
        case CollKind::AllReduce:
            return algo == CollAlgo::TwoShot ? Staged::In : Staged::None;
        case CollKind::AllToAllV:
            return algo == CollAlgo::Push ? Staged::Out : Staged::None;
    }
    return Staged::None;  // reduce_scatter's scatter and all_reduce's one-shot take any buffers
}

double model_traffic_units(CollKind kind, CollAlgo algo, int world, bool staged, bool out_symmetric) {
    const double W = world > 1 ? world : 1;
    double units = 0, copy = 0;  // the algorithm's traffic; the staging copy's (its buffer read and written)
    switch (kind) {
        case CollKind::AllGather:  // bytes: in; out is W x bytes
            // The fan-out push reads in once for W writes; pull and ring read what they write.
            units = algo == CollAlgo::Push ? W + 1 : 2 * W;
            copy = 2;
            break;
        case CollKind::ReduceScatter:  // bytes: out; in is W x bytes
            // Pull: W chunks read, out written. Scatter: in read and written into the scratches, the scratch read,
            // out written. Ring: about the same as scatter.
            units = algo == CollAlgo::Pull ? W + 1 : algo == CollAlgo::Scatter ? 3 * W + 1 : 3 * W;
            copy = 2 * W;
            break;
        case CollKind::AllReduce:  // bytes: the buffer
            // One-shot: in read, written into W scratches, those read, out written. Two-shot: W shards of 1 / W read
            // and written; into an out that is not symmetric, the shards again through the scratch.
            units = algo == CollAlgo::OneShot ? 2 * W + 2 : out_symmetric ? 2 : 3;
            copy = 2;
            break;
        case CollKind::AllToAll:
        case CollKind::AllToAllV:  // bytes: per peer (all_to_all_v: of out's capacity)
            units = 2 * W;
            copy = kind == CollKind::AllToAllV ? 4 * W : 2 * W;  // all_to_all_v stages out: copied in and back
            break;
    }
    if (algo == CollAlgo::LL) units *= 2;  // a flag word beside every data word
    return units + (staged ? copy : 0);
}

double model_us(CollKind kind, CollAlgo algo, std::size_t bytes, const CollTopology& topo, bool staged,
                bool out_symmetric) {
    // Reduce_scatter's scatter and all_reduce's one-shot: 64 MiB, 2 ranks on one H200, both at ~2.3 TB/s of traffic
    // against ~3.2 for pull and two-shot (the table in docs/collectives.md, "Buffers outside the symmetric heap").
    const bool rounds = (kind == CollKind::ReduceScatter && algo == CollAlgo::Scatter) ||
                        (kind == CollKind::AllReduce && algo == CollAlgo::OneShot);
    const int sharing = topo.shared_gpu && topo.ranks_per_gpu > 1 ? topo.ranks_per_gpu : 1;
    const double rate = kModelBytesPerUs / sharing * (rounds ? 0.7 : 1.0);
    // Staged: the copy, and the barrier kernel before it where the copy goes into the scratch (all_reduce copies
    // into a symmetric out: no barrier).
    const int launches = 1 + (staged ? (kind == CollKind::AllReduce && out_symmetric ? 1 : 2) : 0);
    return model_traffic_units(kind, algo, topo.world, staged, out_symmetric) * static_cast<double>(bytes) / rate +
           launches * kModelLaunchUs;
}

DataPath default_path(CollKind kind, CollAlgo algo, std::size_t bytes, const CollTopology& topo) {
    // AllReduce one-shot's TMA push is offered but not yet measured against ld/st: ld/st until bench-collectives
    // says otherwise.
    if (kind == CollKind::AllReduce) return DataPath::LdSt;
    if (offered(kind, algo, DataPath::Tma) && topo.arch >= 90 && bytes > 256 * KiB) return DataPath::Tma;
    return DataPath::LdSt;
}

namespace {
bool sharing_matches(GpuSharing s, const CollTopology& topo) {
    return s == GpuSharing::Any || (s == GpuSharing::Shared) == topo.shared_gpu;
}
}  // namespace

}  // namespace coll

CollTopology collective_topology(World& world) {
    // Each rank's host and PCI bus id, through the store (the host name keeps the same bus id on two hosts of a World
    // of several nodes apart): ranks with the same pair share a GPU.
    char bus[64] = {};
    LOOM_CHECK_CUDA(cudaDeviceGetPCIBusId(bus, sizeof(bus), world.device()));
    char host[HOST_NAME_MAX + 1] = {};
    ::gethostname(host, sizeof host - 1);
    const std::string mine = std::string(host) + "/" + bus;
    const auto all = world.store().all_gather("loom/coll/busid", Bytes(mine.begin(), mine.end()));
    // One answer for the whole World: every rank must choose the same algorithms and grids (their kernels pair blocks
    // and signals across ranks), also where the ranks do not spread evenly over the GPUs (3 ranks on 2 GPUs): the most
    // ranks any GPU runs.
    std::map<std::string, int> ranks_on;
    for (const Bytes& b : all) ++ranks_on[std::string(b.begin(), b.end())];
    CollTopology t{world.world_size(), false, jit::current_arch()};
    for (const auto& [gpu, ranks] : ranks_on) t.ranks_per_gpu = std::max(t.ranks_per_gpu, ranks);
    t.shared_gpu = t.ranks_per_gpu > 1;
    return t;
}

int shared_gpu_sm_budget(int attr_sms, int ranks_per_gpu, int mps_percentage) {
    const int ranks = std::max(ranks_per_gpu, 1);
    const long long pct = mps_percentage;
    if (pct > 0 && pct * ranks <= 100) return attr_sms;  // a share per rank: the attribute already is the share
    return std::max(1, attr_sms / ranks);
}

namespace {

// The first row of `kind` that applies at `bytes` on `topo` and is feasible on the buffers as given (staged false),
// or feasible only with its staged buffer in symmetric memory (staged true); rows.size() where none is.
std::size_t first_row(CollKind kind, std::size_t bytes, const CollTopology& topo, bool in_sym, bool out_sym,
                      bool staged) {
    using namespace coll;
    const auto& rows = choice_table();
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const ChoiceRow& r = rows[i];
        if (r.kind != kind || bytes > r.max_bytes || !sharing_matches(r.sharing, topo)) continue;
        if (r.max_world > 0 && topo.world > r.max_world) continue;
        if (feasible(kind, r.algo, in_sym, out_sym)) {
            if (!staged) return i;
            continue;
        }
        const Staged sb = staged_buffer(kind, r.algo);
        if (staged && sb != Staged::None &&
            feasible(kind, r.algo, in_sym || sb == Staged::In, out_sym || sb == Staged::Out))
            return i;
    }
    return rows.size();
}

}  // namespace

CollChoice choose_collective(CollKind kind, std::size_t bytes, const CollTopology& topo, bool in_symmetric,
                             bool out_symmetric) {
    using namespace coll;
    const auto& rows = choice_table();
    const std::size_t a = first_row(kind, bytes, topo, in_symmetric, out_symmetric, false);
    const std::size_t s = first_row(kind, bytes, topo, in_symmetric, out_symmetric, true);
    if (a == rows.size() && s == rows.size())
        return CollChoice{CollAlgo::Auto, DataPath::Auto, 0, "no feasible algorithm"};
    auto path_of = [&](std::size_t i) {
        return rows[i].path == DataPath::Tma && topo.arch < 90 ? DataPath::LdSt : rows[i].path;
    };
    // The staged row wins where nothing runs unstaged, or where the table prefers it and the model agrees.
    double staged_us = 0, given_us = 0;
    const bool take_staged =
        s < rows.size() &&
        (a == rows.size() ||
         (s < a && (staged_us = model_us(kind, rows[s].algo, bytes, topo, true, out_symmetric)) <
                       (given_us = model_us(kind, rows[a].algo, bytes, topo, false, out_symmetric))));
    if (!take_staged) return CollChoice{rows[a].algo, path_of(a), 0, fmt::format("table row {}: {}", a, rows[a].why)};
    DataPath path = path_of(s);
    if (path == DataPath::CopyEngine) path = DataPath::LdSt;
    const std::string model = a == rows.size()
                                  ? std::string()
                                  : fmt::format(" (model: {:.1f} us staged, {:.1f} us for {} on the buffers as given)",
                                                staged_us, given_us, to_string(rows[a].algo));
    return CollChoice{rows[s].algo, path, 0,
                      fmt::format("table row {}: {}; {} staged through symmetric memory{}", s, rows[s].why,
                                  staged_buffer(kind, rows[s].algo) == Staged::In ? "in" : "out", model),
                      true};
}

std::string explain_collectives(const CollTopology& topo) {
    using namespace coll;
    std::string s = fmt::format("Loom collectives: automatic choice (world {}, {}, sm_{})\n", topo.world,
                                topo.shared_gpu ? "ranks share a GPU" : "one GPU per rank", topo.arch);
    s += "table (first feasible row wins; edit src/ops/collectives/coll_choice.cpp from bench-collectives results):\n";
    const auto& rows = choice_table();
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const ChoiceRow& r = rows[i];
        s += fmt::format("  [{:2}] {:<15} <= {:>10}  {:<8} {:<5} {:<8} {:<4} {}\n", i, to_string(r.kind),
                         r.max_bytes == SIZE_MAX ? std::string("any") : fmt::format("{}", r.max_bytes),
                         r.sharing == GpuSharing::Any      ? "any"
                         : r.sharing == GpuSharing::Shared ? "shared"
                                                           : "distinct",
                         r.max_world > 0 ? fmt::format("W<={}", r.max_world) : std::string("any W"), to_string(r.algo),
                         to_string(r.path), r.why);
    }
    for (const bool sym : {true, false}) {
        s += sym ? "choice with symmetric buffers:\n" : "choice with in and out outside the symmetric heap:\n";
        for (CollKind k : {CollKind::AllGather, CollKind::ReduceScatter, CollKind::AllReduce, CollKind::AllToAll,
                           CollKind::AllToAllV}) {
            s += fmt::format("  {:<15}", to_string(k));
            for (std::size_t b = 1024; b <= (std::size_t(1) << 30); b *= 16) {
                const CollChoice c = choose_collective(k, b, topo, sym, sym);
                s += fmt::format(" {}:{}/{}{}",
                                 b >= (1u << 20) ? fmt::format("{}M", b >> 20) : fmt::format("{}K", b >> 10),
                                 to_string(c.algo), to_string(c.path), c.staged ? "+staged" : "");
            }
            s += "\n";
        }
    }
    return s;
}

namespace coll {

CollChoice resolve(CollKind kind, std::size_t bytes, const CollTopology& topo, const CollOptions& opts,
                   bool in_symmetric, bool out_symmetric) {
    const char* op = to_string(kind);
    CollChoice c;
    if (opts.algo == CollAlgo::Auto) {
        c = choose_collective(kind, bytes, topo, in_symmetric, out_symmetric);
        LOOM_CHECK(c.algo != CollAlgo::Auto,
                   "{}: no algorithm can run with these buffers (in {}symmetric, out {}symmetric): allocate them "
                   "with world.alloc",
                   op, in_symmetric ? "" : "not ", out_symmetric ? "" : "not ");
    } else {
        c.algo = opts.algo;
        c.path = default_path(kind, c.algo, bytes, topo);
        c.reason = "CollOptions::algo";
        c.staged = !feasible(kind, c.algo, in_symmetric, out_symmetric) && stageable(kind, c.algo);
    }
    if (c.staged && c.path == DataPath::CopyEngine) c.path = DataPath::LdSt;
    if (opts.path != DataPath::Auto) c.path = opts.path;
    LOOM_CHECK(offered(kind, c.algo, c.path), "{}: the {} algorithm has no {} data path", op, to_string(c.algo),
               to_string(c.path));
    LOOM_CHECK(!c.staged || c.path != DataPath::CopyEngine,
               "{}: {} through the copy engine needs {} in the symmetric heap (allocate it with world.alloc); staged "
               "through the scratch it runs on ld/st or tma: leave the data path to Loom or pass one of those",
               op, to_string(c.algo), staged_buffer(kind, c.algo) == Staged::In ? "in" : "out");
    LOOM_CHECK(c.path != DataPath::Tma || topo.arch >= 90, "{}: the tma data path needs sm_90, given sm_{}", op,
               topo.arch);
    return c;
}

}  // namespace coll
}  // namespace loom
