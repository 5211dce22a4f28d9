// bench-collectives: Loom's collectives in nccl-tests' table (the default), or every algorithm / data path against
// NVSHMEM's on-stream collectives and NCCL on the same ranks into JSON (--json DIR, the sweep behind docs/perf).
//
// The table (coll_table.hpp; flags as nccl-tests': nccl_args.hpp):
//   loomrun -n 4 build/bench/bench-collectives [-t all_reduce,all_gather] [-b 8] [-e 128M] [-f 2] [-d float|half|
//            bfloat16|...|all] [-o sum|max|all] [-n 20] [-w 5] [-c 1] [--runs 1] [--seed S] [--algo A] [--path P]
//   one table per collective: size, count, type, redop, root, then time / algbw / busbw / #wrong out-of-place and
//   in-place, #wrong from every element of every rank's result checked against a host reference; the exit status is
//   1 when any element was wrong.
//
// The JSON sweep, --json DIR (also spelled --out DIR):
//   all_gather.json, reduce_scatter.json, all_reduce.json, all_to_all.json under DIR: one row per
//   (ranks, size, loom variant): latency (slowest rank's median), algBW and busBW (nccl-tests conventions:
//   size = the larger buffer — all_gather: out, reduce_scatter: in, all_reduce / all_to_all: the buffer;
//   busBW = algBW x bench::bus_factor), the baselines' us and the automatic choice at that size.
//   Sizes up to --b2b-max (1M) also get a row timed back to back (--b2b-reps calls per timed run, nccl-tests'
//   latency method) for the automatic choice and the baselines: "timing": "back_to_back xN". Sizes up to --lat-max
//   (64K) also get "timing": "per_call_interleaved": one call per timed run, the automatic choice, the baselines
//   and a launch floor (a 4-byte cudaMemsetAsync, "launch_floor_us") interleaved run by run, --lat-iters (200) runs.
//   Every variant's output is checked once after timing (exact sums of small integers in bf16, byte patterns for
//   data movement): a row says "checked": true, and a wrong result stops the benchmark with an error.
//
//   loomrun -n 2 build/bench/bench-collectives --json docs/perf [-b 1K] [-e 1G] [-f 4] [--iters N]
//            [--ops all_gather,reduce_scatter,all_reduce,all_to_all] [--append] [--no-nvshmem] [--no-nccl]
//            [--b2b-max 1M] [--b2b-reps 20] [--lat-max 64K] [--lat-iters 200] [--align-hold-us 0]
//   (-b / -e are also --min-bytes / --max-bytes.) Every timed run starts behind loom::barrier_on_stream;
//   --align-hold-us makes that barrier keep the stream for so long after the ranks met (rows carry "align_hold_us";
//   0 and 30 us time the same all_gather / reduce_scatter).
//   build/bench/bench-collectives --explain      the automatic choice table (no GPU needed: then for 2/4/8 ranks)
//   --plain-out --ops all_reduce,all_to_all: out from cudaMalloc (rows "out_plain": true): two-shot stages its
//   shards, all_to_all pulls.
//   --plain: per size also a row "timing": "placements_interleaved": the automatic choice with in and out symmetric,
//   in plain, out plain and both plain (cudaMalloc), interleaved run by run (placements_us, the choice for each, and
//   "plain_over_symmetric": both plain / symmetric); the both-plain result is checked.
//
// Baselines: NVSHMEM fcollect / reducescatter / sum_reduce / alltoall (on-stream, NVSHMEM_TEAM_WORLD, bf16 sum),
// NCCL's C API (one communicator over the same ranks; NCCL needs one GPU per rank, so it is skipped with a note
// when ranks share a GPU). --append keeps an existing file's rows of other rank counts (runs at 2 and 8 ranks
// collect into the same four files).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "coll_table.hpp"
#include "harness.hpp"
#include "loom/bf16.hpp"
#include "loom/jit/jit.hpp"
#include "loom/kernels/collectives/coll_params.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/nvshmem.hpp"
#include "loom/runtime/settings.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "loom/runtime/world.hpp"
#include "nccl.hpp"
#include "nccl_args.hpp"
#include "ops/collectives/coll_choice.hpp"

namespace fs = std::filesystem;
using loom::BufferView;
using loom::CollAlgo;
using loom::CollKind;
using loom::CollOptions;
using loom::DataPath;
using loom::DType;
using loom::bench::Report;
using loom::bench::TimeOptions;
using nlohmann::json;

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;
// The LL collectives' capacity per chunk (kernels/coll_params.hpp: kMaxLLBlocks x kLLPacketsPerBlock x 8 bytes).
constexpr std::size_t kLLMaxBytes =
    std::size_t(loom::kernels::coll::kMaxLLBlocks) * loom::kernels::coll::kLLPacketsPerBlock * 8;

struct Args {
    std::string out;  // --json / --out DIR: the JSON sweep instead of the table
    loom::bench::NcclArgs table;
    std::size_t min_bytes = KiB;  // the sweep's sizes (from -b / -e / -f when given)
    std::size_t max_bytes = GiB;
    int step_factor = 4;
    int iters = 0;  // 0: by size (20 up to 1 MiB, 10 up to 64 MiB, 5 beyond)
    std::vector<std::string> ops = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all"};
    CollAlgo algo = CollAlgo::Auto;  // the table's call (--algo / --path)
    DataPath path = DataPath::Auto;
    bool append = false, nvshmem = true, nccl = true, explain = false;
    std::size_t b2b_max = MiB;  // sizes up to this also get a back-to-back latency row
    int b2b_reps = 20;
    std::size_t lat_max = 64 * KiB;  // sizes up to this also get the interleaved per-call latency row
    std::size_t nvshmem_max = GiB;   // NVSHMEM baseline only up to this size
    int lat_iters = 200;
    double align_hold_us = 0;  // loom::barrier_on_stream's hold before each timed run
    bool plain_out = false;    // --plain-out: all_reduce / all_to_all into a cudaMalloc'd out (rows "out_plain")
    bool plain = false;        // --plain: the placements row (symmetric vs plain in / out / both, interleaved)
    bool json() const { return !out.empty(); }
};

// A CLI11 check from a parser that raises loom::Error.
template <typename F>
CLI::Validator loom_check(const std::string& what, F parse) {
    return CLI::Validator(
        [parse](std::string& s) -> std::string {
            try {
                parse(s);
                return "";
            } catch (const loom::Error& e) {
                return e.detail();
            }
        },
        what);
}

// The names to_string gives an enum's values, and the value of a name (CLI11 has checked it is one of them).
template <typename E>
std::vector<std::string> names_of(std::initializer_list<E> all) {
    std::vector<std::string> n;
    for (E e : all) n.push_back(loom::to_string(e));
    return n;
}
template <typename E>
E named(const std::string& name, std::initializer_list<E> all) {
    for (E e : all)
        if (name == loom::to_string(e)) return e;
    return *all.begin();
}
constexpr std::initializer_list<CollAlgo> kAlgos = {CollAlgo::Auto,    CollAlgo::Push,    CollAlgo::Pull,
                                                    CollAlgo::Ring,    CollAlgo::Scatter, CollAlgo::OneShot,
                                                    CollAlgo::TwoShot, CollAlgo::LL};
constexpr std::initializer_list<DataPath> kPaths = {DataPath::Auto, DataPath::LdSt, DataPath::Tma,
                                                    DataPath::CopyEngine};

Args parse(int argc, char** argv) {
    Args a;
    bool no_nvshmem = false, no_nccl = false;
    std::string algo = "auto", path = "auto";
    CLI::App app{
        "bench-collectives: Loom's collectives in nccl-tests' table (default), or with --json DIR every algorithm and "
        "data path against NVSHMEM / NCCL into DIR/<op>.json"};
    app.add_option("--json,--out", a.out,
                   "the JSON sweep: every algorithm / data path and the baselines, into DIR/<op>.json (docs/perf)");
    loom::bench::add_nccl_options(app, a.table);
    app.add_option("-t,--ops", a.ops,
                   "collectives, comma-separated: all_gather, reduce_scatter, all_reduce, all_to_all (nccl-tests' "
                   "allreduce, all_reduce_perf, ... too); default all four")
        ->delimiter(',')
        ->check(loom_check("COLL", [](const std::string& s) { loom::bench::parse_coll(s); }));
    app.add_option("--algo", algo, "the table's algorithm (auto, push, pull, ring, scatter, one_shot, two_shot, ll)")
        ->capture_default_str()
        ->check(CLI::IsMember(names_of(kAlgos)));
    app.add_option("--path", path, "the table's data path (auto, ld, tma, ce)")
        ->capture_default_str()
        ->check(CLI::IsMember(names_of(kPaths)));
    app.add_option("--iters", a.iters,
                   "JSON sweep: timed runs per point (0: 20 up to 1 MiB, 10 up to 64 MiB, 5 beyond)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_flag("--append", a.append, "JSON sweep: keep the files' rows of other rank counts");
    app.add_flag("--no-nvshmem", no_nvshmem, "JSON sweep: skip the NVSHMEM baseline");
    app.add_flag("--no-nccl", no_nccl, "JSON sweep: skip the NCCL baseline");
    loom::bench::add_bytes_option(app, "--nvshmem-max", a.nvshmem_max,
                                  "JSON sweep: largest size timed with the NVSHMEM baseline (default 1G; with ranks "
                                  "sharing a GPU its collectives run 40-1400x slower than Loom's at 64 MiB)");
    app.add_flag("--explain", a.explain, "print the automatic choice table");
    app.add_flag("--plain-out", a.plain_out,
                 "JSON sweep: all_reduce / all_to_all into an out from cudaMalloc (outside the symmetric heap: "
                 "two-shot stages its shards in the scratch, all_to_all pulls); rows carry \"out_plain\": true");
    app.add_flag("--plain", a.plain,
                 "JSON sweep: per size also time the automatic choice with in and out symmetric, in plain, out plain "
                 "and both plain (cudaMalloc), interleaved run by run (rows \"timing\": \"placements_interleaved\")");
    loom::bench::add_bytes_option(
        app, "--b2b-max", a.b2b_max,
        "JSON sweep: sizes up to this (default 1M; 0: none) also get a back-to-back latency row");
    app.add_option("--b2b-reps", a.b2b_reps, "JSON sweep: calls per timed run in the back-to-back rows")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    loom::bench::add_bytes_option(
        app, "--lat-max", a.lat_max,
        "JSON sweep: sizes up to this (default 64K; 0: none) also get the interleaved per-call row");
    app.add_option("--lat-iters", a.lat_iters, "JSON sweep: timed runs per op in the interleaved per-call rows")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--align-hold-us", a.align_hold_us,
                   "the aligning barrier before each timed run holds the stream this long once the ranks met, so "
                   "every rank's timed launch is queued when they leave it (0: no hold)")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1000.0));
    loom::bench::parse_or_exit(app, argc, argv);
    for (std::string& op : a.ops) op = loom::to_string(loom::bench::parse_coll(op));
    a.algo = named(algo, kAlgos);
    a.path = named(path, kPaths);
    a.nvshmem = !no_nvshmem;
    a.nccl = !no_nccl;
    // Each mode's own options: one given to the other mode is an error, not silently ignored.
    const std::vector<std::string> table_only = {"-d", "-o", "-n", "-w", "-c", "--runs", "--seed", "--algo", "--path"};
    const std::vector<std::string> json_only = {"--iters",       "--append",    "--no-nvshmem", "--no-nccl",
                                                "--nvshmem-max", "--plain-out", "--plain",      "--b2b-max",
                                                "--b2b-reps",    "--lat-max",   "--lat-iters"};
    for (const std::string& o : a.json() ? table_only : json_only)
        if (app.count(o) > 0) {
            std::fprintf(stderr, "bench-collectives: %s %s\n", o.c_str(),
                         a.json() ? "applies to the table; the JSON sweep (--json DIR) times bf16 sums of every "
                                    "algorithm"
                         : o == "--iters" ? "is the JSON sweep's timed runs (add --json DIR); the table's calls "
                                            "per timed run are -n"
                                          : "applies to the JSON sweep only: add --json DIR");
            std::exit(2);
        }
    LOOM_CHECK(!(a.plain && a.plain_out),
               "bench-collectives: --plain times the plain buffers beside symmetric ones; it excludes --plain-out");
    if (a.json()) {  // the sweep's sizes: -b / -e / -f when given, else 1K to 1G by 4
        if (app.count("-b")) a.min_bytes = a.table.min_bytes;
        if (app.count("-e")) a.max_bytes = a.table.max_bytes;
        if (app.count("-f")) a.step_factor = a.table.step_factor;
        loom::bench::size_series(a.min_bytes, a.max_bytes, a.step_factor);  // raises on a bad range
    } else {
        loom::bench::size_series(a.table.min_bytes, a.table.max_bytes, a.table.step_factor);
        for (const std::string& op : a.ops) loom::bench::type_ops(loom::bench::parse_coll(op), a.table);
        a.max_bytes = a.table.max_bytes;  // the buffers' size
    }
    return a;
}

int iters_for(const Args& a, std::size_t bytes) {
    if (a.iters > 0) return a.iters;
    return bytes <= MiB ? 20 : bytes <= 64 * MiB ? 10 : 5;
}

std::string human(std::size_t b) {
    if (b >= GiB && b % GiB == 0) return std::to_string(b / GiB) + "G";
    if (b >= MiB && b % MiB == 0) return std::to_string(b / MiB) + "M";
    if (b >= KiB && b % KiB == 0) return std::to_string(b / KiB) + "K";
    return std::to_string(b);
}

// ---- device fills and checks -------------------------------------------------------------------------------------
// count bf16 elements = v: a 64 Ki-element pattern, then doubling device-to-device copies.
void fill_bf16(void* dst, std::size_t count, int v, cudaStream_t s) {
    const std::size_t first = std::min<std::size_t>(count, 64 * 1024);
    std::vector<uint16_t> h(first, loom::float_to_bf16(static_cast<float>(v)));
    LOOM_CHECK_CUDA(cudaMemcpyAsync(dst, h.data(), first * 2, cudaMemcpyHostToDevice, s));
    char* d = static_cast<char*>(dst);
    for (std::size_t done = first; done < count;) {
        const std::size_t n = std::min(done, count - done);
        LOOM_CHECK_CUDA(cudaMemcpyAsync(d + done * 2, d, n * 2, cudaMemcpyDeviceToDevice, s));
        done += n;
    }
    LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
}
uint16_t bf16_at(const void* base, std::size_t i) {
    uint16_t h = 0;
    LOOM_CHECK_CUDA(cudaMemcpy(&h, static_cast<const char*>(base) + 2 * i, 2, cudaMemcpyDeviceToHost));
    return h;
}
unsigned char byte_at(const void* base, std::size_t i) {
    unsigned char c = 0;
    LOOM_CHECK_CUDA(cudaMemcpy(&c, static_cast<const char*>(base) + i, 1, cudaMemcpyDeviceToHost));
    return c;
}

// ---- baselines ----------------------------------------------------------------------------------------------------
struct Nvshmem {
    bool ok = false;
    std::string note;
    void* in = nullptr;
    void* out = nullptr;
};

Nvshmem nvshmem_init(loom::World& w, const Args& args, std::size_t in_bytes, std::size_t out_bytes) {
    Nvshmem n;
    if (!args.nvshmem) {
        n.note = "NVSHMEM baseline disabled (--no-nvshmem)";
        return n;
    }
    try {
        // NVSHMEM's own heap must hold both buffers (its default is 1 GiB).
        if (!std::getenv("NVSHMEM_SYMMETRIC_SIZE"))
            ::setenv("NVSHMEM_SYMMETRIC_SIZE", std::to_string(in_bytes + out_bytes + 256 * MiB).c_str(), 1);
        loom::nvshmem::init(w);
        n.in = loom::nvshmem::malloc(in_bytes);
        n.out = loom::nvshmem::malloc(out_bytes);
        n.ok = true;
    } catch (const loom::Error& e) {
        n.note = std::string("NVSHMEM baseline unavailable: ") + e.what();
    }
    return n;
}

// ---- one op ---------------------------------------------------------------------------------------------------------
struct Variant {
    CollAlgo algo;
    DataPath path;
};

std::vector<Variant> variants(CollKind k) {
    switch (k) {
        case CollKind::AllGather:
            return {{CollAlgo::Push, DataPath::LdSt},       {CollAlgo::Push, DataPath::Tma},
                    {CollAlgo::Push, DataPath::CopyEngine}, {CollAlgo::Pull, DataPath::LdSt},
                    {CollAlgo::Pull, DataPath::Tma},        {CollAlgo::Pull, DataPath::CopyEngine},
                    {CollAlgo::Ring, DataPath::LdSt},       {CollAlgo::Ring, DataPath::Tma},
                    {CollAlgo::LL, DataPath::LdSt},         {CollAlgo::Auto, DataPath::Auto}};
        case CollKind::ReduceScatter:
            return {{CollAlgo::Pull, DataPath::LdSt},   {CollAlgo::Scatter, DataPath::LdSt},
                    {CollAlgo::Scatter, DataPath::Tma}, {CollAlgo::Scatter, DataPath::CopyEngine},
                    {CollAlgo::Ring, DataPath::LdSt},   {CollAlgo::LL, DataPath::LdSt},
                    {CollAlgo::Auto, DataPath::Auto}};
        case CollKind::AllReduce:
            return {{CollAlgo::LL, DataPath::LdSt},
                    {CollAlgo::OneShot, DataPath::LdSt},
                    {CollAlgo::OneShot, DataPath::Tma},
                    {CollAlgo::TwoShot, DataPath::LdSt},
                    {CollAlgo::TwoShot, DataPath::CopyEngine},
                    {CollAlgo::Auto, DataPath::Auto}};
        default:
            return {{CollAlgo::Push, DataPath::LdSt},       {CollAlgo::Push, DataPath::Tma},
                    {CollAlgo::Push, DataPath::CopyEngine}, {CollAlgo::Pull, DataPath::LdSt},
                    {CollAlgo::Pull, DataPath::Tma},        {CollAlgo::Pull, DataPath::CopyEngine},
                    {CollAlgo::LL, DataPath::LdSt},         {CollAlgo::Auto, DataPath::Auto}};
    }
}

CollKind kind_of(const std::string& op) {
    if (op == "all_gather") return CollKind::AllGather;
    if (op == "reduce_scatter") return CollKind::ReduceScatter;
    if (op == "all_reduce") return CollKind::AllReduce;
    return CollKind::AllToAll;
}

// Buffers of one op at one size (bf16 elements). in_count / out_count per rank; choice_bytes as choose_collective
// takes it.
struct Shape {
    std::size_t size;  // nccl-tests size (bytes of the larger buffer)
    std::size_t in_count, out_count, choice_bytes;
};
Shape shape_of(CollKind k, std::size_t size, int W) {
    const std::size_t es = 2;
    std::size_t per = std::max<std::size_t>(1, size / (std::size_t(W) * es));  // elements per rank-chunk
    switch (k) {
        case CollKind::AllGather:
            return {per * W * es, per, per * W, per * es};
        case CollKind::ReduceScatter:
            return {per * W * es, per * W, per, per * es};
        case CollKind::AllReduce: {
            const std::size_t n = std::max<std::size_t>(1, size / es);
            return {n * es, n, n, n * es};
        }
        default:
            return {per * W * es, per * W, per * W, per * es};
    }
}

// Two private (not symmetric) device buffers for the shared-GPU copy reference; empty on distinct GPUs.
struct CopyBuffers {
    void* src = nullptr;
    void* dst = nullptr;
    std::size_t bytes = 0;
};

// --plain: in and out buffers from cudaMalloc, of the symmetric ones' size (null without --plain).
struct PlainBuffers {
    void* in = nullptr;
    void* out = nullptr;
};

// The automatic choice of op `k` on in / out.
std::function<void(cudaStream_t)> auto_call(loom::World& w, CollKind k, const Shape& sh, void* in, void* out) {
    const BufferView i{in, DType::BF16, sh.in_count}, o{out, DType::BF16, sh.out_count};
    return [&w, k, i, o](cudaStream_t s) {
        switch (k) {
            case CollKind::AllGather:
                loom::all_gather(w, i, o, s);
                break;
            case CollKind::ReduceScatter:
                loom::reduce_scatter(w, i, o, s);
                break;
            case CollKind::AllReduce:
                loom::all_reduce(w, i, o, s);
                break;
            default:
                loom::all_to_all(w, i, o, s);
                break;
        }
    };
}

// Bytes a call with both buffers plain copies beyond the symmetric call (each read and written once more): the
// staged all_gather and all_to_all copy in into the scratch; reduce_scatter and all_reduce take algorithms that use
// the scratch anyway (their cost is the difference of algorithms, timed).
std::size_t staged_copy_bytes(const loom::CollChoice& c, const Shape& sh) { return c.staged ? sh.in_count * 2 : 0; }

// --plain: the automatic choice on the four placements of in and out, interleaved run by run (the same clocks and
// MPS scheduling for each), and the both-plain result checked once.
void bench_placements(loom::World& w, CollKind k, const std::string& op, const Shape& sh,
                      const loom::CollTopology& topo, const TimeOptions& topts, void* sin, void* sout,
                      const PlainBuffers& pb, cudaStream_t stream, Report& report) {
    const int W = w.world_size(), me = w.rank();
    fill_bf16(pb.in, sh.in_count, me + 1, stream);
    w.barrier("bench-coll/placements");
    const char* names[] = {"symmetric", "in_plain", "out_plain", "both_plain"};
    void* const ins[] = {sin, pb.in, sin, pb.in};
    void* const outs[] = {sout, sout, pb.out, pb.out};
    std::vector<std::function<void(cudaStream_t)>> fns;
    json choice = json::object();
    loom::CollChoice both{};
    for (int i = 0; i < 4; ++i) {
        fns.push_back(auto_call(w, k, sh, ins[i], outs[i]));
        const loom::CollChoice c = loom::choose_collective(k, sh.choice_bytes, topo, ins[i] == sin, outs[i] == sout);
        choice[names[i]] =
            std::string(loom::to_string(c.algo)) + "/" + loom::to_string(c.path) + (c.staged ? "+staged" : "");
        if (i == 3) both = c;
    }
    const std::vector<loom::bench::Timing> ts = loom::bench::time_ops(fns, stream, topts);
    // The both-plain result: first and last element of every chunk (data movement) or of the result (reductions).
    LOOM_CHECK_CUDA(cudaMemsetAsync(pb.out, 0, sh.out_count * 2, stream));
    fns[3](stream);
    LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
    w.barrier("bench-coll/placements-checked");
    auto expect = [&](std::size_t i, int want) {
        const uint16_t h = bf16_at(pb.out, i);
        LOOM_CHECK(h == loom::float_to_bf16(static_cast<float>(want)),
                   "bench-collectives: {} plain in and out size {} rank {}: element {} is {}, expected {} (wrong "
                   "result)",
                   op, sh.size, me, i, loom::bf16_to_float(h), want);
    };
    if (k == CollKind::AllGather || k == CollKind::AllToAll) {
        const std::size_t chunk = sh.out_count / W;
        for (int r = 0; r < W; ++r) expect(r * chunk, r + 1), expect(r * chunk + chunk - 1, r + 1);
    } else {
        expect(0, W * (W + 1) / 2);
        expect(sh.out_count - 1, W * (W + 1) / 2);
    }
    json us = json::object();
    for (int i = 0; i < 4; ++i) us[names[i]] = ts[i].median_us;
    // The staging copy's estimate at 4.3 TB/s of device-memory traffic (a D2D copy on an H200, one rank alone).
    const std::size_t staged = staged_copy_bytes(both, sh);
    json row = {{"ranks", W},
                {"size_bytes", sh.size},
                {"size", human(sh.size)},
                {"dtype", "bf16"},
                {"algo", "auto"},
                {"path", "auto"},
                {"timing", "placements_interleaved"},
                {"iters", topts.iters},
                {"loom_us", ts[3].median_us},
                {"placements_us", us},
                {"placements_choice", choice},
                {"plain_over_symmetric", ts[3].median_us / ts[0].median_us},
                {"staged_copy_bytes", staged},
                {"staged_copy_estimate_us", 2.0 * double(staged) / 4.3e6},
                {"shared_gpu", topo.shared_gpu},
                {"checked", true}};
    report.add_row(row);
    if (me == 0)
        std::printf(
            "%-15s %6s placements     symmetric %.2f us, in plain %.2f, out plain %.2f, both plain %.2f "
            "(x%.2f)\n",
            op.c_str(), human(sh.size).c_str(), ts[0].median_us, ts[1].median_us, ts[2].median_us, ts[3].median_us,
            ts[3].median_us / ts[0].median_us);
}

void bench_op(loom::World& w, const Args& args, const std::string& op, const loom::CollTopology& topo, Nvshmem& nv,
              loom::bench::NcclBaseline& nccl, const CopyBuffers& copy, void* sin, void* sout,
              const PlainBuffers& plain, cudaStream_t stream, int argc, char** argv) {
    const CollKind k = kind_of(op);
    const int W = w.world_size(), me = w.rank();
    Report report(op, W, argc, argv);
    const double factor = loom::bench::bus_factor(k, W);
    for (std::size_t size : loom::bench::size_series(args.min_bytes, args.max_bytes, args.step_factor)) {
        const Shape sh = shape_of(k, size, W);
        const std::size_t in_bytes = sh.in_count * 2, out_bytes = sh.out_count * 2;
        const TimeOptions topts{
            .warmup = 2,
            .iters = iters_for(args, sh.size),
            .flush_l2 = true,
            .world = &w,
            .align = [&w, hold = args.align_hold_us](cudaStream_t st) { loom::barrier_on_stream(w, st, hold); }};
        // Inputs: reductions sum bf16 (rank + 1) (exact: the sum W(W+1)/2 <= 36 is a short mantissa); data
        // movement moves bf16 (rank + 1) too, so the check can name the source rank of every chunk.
        fill_bf16(sin, sh.in_count, me + 1, stream);
        w.barrier("bench-coll/filled");

        // Baselines first (same buffers' sizes, same stream).
        json baselines = json::object();
        std::function<void(cudaStream_t)> nv_run, nccl_run;
        if (nv.ok && sh.size <= args.nvshmem_max) {
            fill_bf16(nv.in, sh.in_count, me + 1, stream);
            loom::nvshmem::barrier_all();
            nv_run = [&](cudaStream_t s) {
                switch (k) {
                    case CollKind::AllGather:
                        loom::nvshmem::fcollect_on_stream(nv.out, nv.in, in_bytes, s);
                        break;
                    case CollKind::ReduceScatter:
                        loom::nvshmem::sum_reducescatter_on_stream(DType::BF16, nv.out, nv.in, sh.out_count, s);
                        break;
                    case CollKind::AllReduce:
                        loom::nvshmem::sum_reduce_on_stream(DType::BF16, nv.out, nv.in, sh.in_count, s);
                        break;
                    default:
                        loom::nvshmem::alltoall_on_stream(nv.out, nv.in, in_bytes / W, s);
                        break;
                }
            };
            baselines["nvshmem"] = loom::bench::time_op(nv_run, stream, topts).median_us;
        }
        if (nccl.ok()) {
            nccl_run = [&](cudaStream_t s) {
                switch (k) {
                    case CollKind::AllGather:
                        nccl.all_gather(sin, sout, sh.in_count, DType::BF16, s);
                        break;
                    case CollKind::ReduceScatter:
                        nccl.reduce_scatter(sin, sout, sh.out_count, DType::BF16, s);
                        break;
                    case CollKind::AllReduce:
                        nccl.all_reduce(sin, sout, sh.in_count, DType::BF16, s);
                        break;
                    default:
                        nccl.all_to_all(sin, sout, sh.in_count / W, DType::BF16, s);
                        break;
                }
            };
            baselines["nccl"] = loom::bench::time_op(nccl_run, stream, topts).median_us;
        }
        // The raw copy-engine rate of the same traffic: every rank puts its per-peer chunk to every peer at once
        // (cudaMemcpyAsync through stream_ops::put_ce, no signals), the reference for the "85 % of the path's copy
        // bandwidth" goal. Its "speedup" is the fraction of that bandwidth a variant reaches.
        const std::size_t ce_chunk = k == CollKind::AllGather       ? in_bytes
                                     : k == CollKind::AllToAll      ? in_bytes / W
                                     : k == CollKind::ReduceScatter ? out_bytes
                                                                    : 0;
        // (Puts into the peers' out: not with a plain out.)
        if (W > 1 && ce_chunk > 0 && sh.size >= (std::size_t(1) << 20) && !args.plain_out) {
            auto run = [&](cudaStream_t s) {
                for (int i = 1; i < W; ++i)
                    loom::stream_ops::put_ce(w, static_cast<char*>(sout) + me * ce_chunk, sin, ce_chunk, (me + i) % W,
                                             s);
            };
            baselines["copy_engine_puts"] = loom::bench::time_op(run, stream, topts).median_us;
        }
        // With ranks sharing a GPU every byte of every op moves through that GPU's memory, the local chunk too (the
        // puts above leave it out: at W = 2 it is half of an all_gather's writes). The reference there is a plain
        // device-to-device copy on every rank at once that moves as many bytes (reads + writes) as the op must:
        // each input byte read once and each output byte written once, so (in + out) / 2 bytes copied per rank.
        if (topo.shared_gpu && ce_chunk > 0 && copy.src && sh.size >= MiB) {
            const std::size_t n = (in_bytes + out_bytes) / 2;
            LOOM_CHECK(n <= copy.bytes, "bench-collectives: copy reference of {} bytes exceeds its {}-byte buffers", n,
                       copy.bytes);
            auto run = [&](cudaStream_t s) {
                LOOM_CHECK_CUDA(cudaMemcpyAsync(copy.dst, copy.src, n, cudaMemcpyDeviceToDevice, s));
            };
            baselines["copy_same_traffic"] = loom::bench::time_op(run, stream, topts).median_us;
        }
        const loom::CollChoice autoc = loom::choose_collective(k, sh.choice_bytes, topo);
        for (const Variant& v : variants(k)) {
            // LL's capacity per chunk (an error past it).
            const std::size_t chunk_bytes = k == CollKind::ReduceScatter ? out_bytes
                                            : k == CollKind::AllToAll    ? in_bytes / W
                                                                         : in_bytes;
            if (v.algo == CollAlgo::LL && chunk_bytes > kLLMaxBytes) continue;
            if (v.path == DataPath::Tma && topo.arch < 90) continue;
            // With a plain out: the copy-engine two-shot's all_gather half and all_to_all's push need a symmetric out.
            if (args.plain_out && v.algo == CollAlgo::TwoShot && v.path == DataPath::CopyEngine) continue;
            if (args.plain_out && k == CollKind::AllToAll && v.algo == CollAlgo::Push) continue;
            const CollOptions o{v.algo, v.path};
            const BufferView in{sin, DType::BF16, sh.in_count}, out{sout, DType::BF16, sh.out_count};
            auto run = [&](cudaStream_t s) {
                switch (k) {
                    case CollKind::AllGather:
                        loom::all_gather(w, in, out, s, o);
                        break;
                    case CollKind::ReduceScatter:
                        loom::reduce_scatter(w, in, out, s, o);
                        break;
                    case CollKind::AllReduce:
                        loom::all_reduce(w, in, out, s, o);
                        break;
                    default:
                        loom::all_to_all(w, in, out, s, o);
                        break;
                }
            };
            LOOM_CHECK_CUDA(cudaMemsetAsync(sout, 0, out_bytes, stream));
            LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
            w.barrier("bench-coll/variant");
            const loom::bench::Timing t = loom::bench::time_op(run, stream, topts);
            LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
            w.barrier("bench-coll/checked");
            // Check the first and last element of every chunk (data movement) or of the result (reductions).
            const std::string name = std::string(loom::to_string(v.algo)) + "/" + loom::to_string(v.path);
            auto expect = [&](std::size_t i, int want) {
                const uint16_t h = bf16_at(sout, i);
                LOOM_CHECK(h == loom::float_to_bf16(static_cast<float>(want)),
                           "bench-collectives: {} {} size {} rank {}: element {} is {}, expected {} (wrong result)", op,
                           name, sh.size, me, i, loom::bf16_to_float(h), want);
            };
            if (k == CollKind::AllGather || k == CollKind::AllToAll) {
                const std::size_t chunk = sh.out_count / W;
                for (int r = 0; r < W; ++r) {
                    expect(r * chunk, r + 1);
                    expect(r * chunk + chunk - 1, r + 1);
                }
            } else {
                expect(0, W * (W + 1) / 2);
                expect(sh.out_count - 1, W * (W + 1) / 2);
            }
            const double alg = loom::bench::gbps(double(sh.size), t.median_us);
            json row = {{"ranks", W},
                        {"size_bytes", sh.size},
                        {"size", human(sh.size)},
                        {"dtype", "bf16"},
                        {"algo", loom::to_string(v.algo)},
                        {"path", loom::to_string(v.path)},
                        {"loom_us", t.median_us},
                        {"min_us", t.min_us},
                        {"p90_us", t.p90_us},
                        {"iters", t.iters},
                        {"algBW_GBps", alg},
                        {"busBW_GBps", alg * factor},
                        {"auto_choice", std::string(loom::to_string(autoc.algo)) + "/" + loom::to_string(autoc.path)},
                        {"shared_gpu", topo.shared_gpu},
                        {"out_plain", args.plain_out},
                        {"align_hold_us", args.align_hold_us},
                        {"checked", true},
                        {"baselines", baselines}};
            for (auto& [bname, us] : baselines.items())
                row["baseline_busBW_GBps"][bname] = loom::bench::gbps(double(sh.size), us.get<double>()) * factor;
            if (!nv.note.empty()) row["nvshmem_note"] = nv.note;
            if (nv.ok && sh.size > args.nvshmem_max)
                row["nvshmem_note"] = "NVSHMEM baseline not timed above --nvshmem-max " + human(args.nvshmem_max);
            if (!nccl.note().empty()) row["nccl_note"] = nccl.note();
            report.add_row(row);
            if (me == 0)
                std::printf("%-15s %6s %-14s %10.2f us  busBW %8.2f GB/s\n", op.c_str(), human(sh.size).c_str(),
                            name.c_str(), t.median_us, alg * factor);
        }
        if (plain.in) bench_placements(w, k, op, sh, topo, topts, sin, sout, plain, stream, report);
        // Latency the nccl-tests way: b2b_reps calls back to back per timed run (L2 flushed before each run), for
        // the automatic choice and each baseline. Per-call timing above carries a floor of launch and event
        // overhead of several us that hides small-message latency; here consecutive launches overlap.
        const BufferView auto_in{sin, DType::BF16, sh.in_count}, auto_out{sout, DType::BF16, sh.out_count};
        auto loom_run = [&](cudaStream_t s) {
            switch (k) {
                case CollKind::AllGather:
                    loom::all_gather(w, auto_in, auto_out, s);
                    break;
                case CollKind::ReduceScatter:
                    loom::reduce_scatter(w, auto_in, auto_out, s);
                    break;
                case CollKind::AllReduce:
                    loom::all_reduce(w, auto_in, auto_out, s);
                    break;
                default:
                    loom::all_to_all(w, auto_in, auto_out, s);
                    break;
            }
        };
        // The fields every row of the automatic choice carries; the caller adds its timing's.
        auto auto_row = [&](const std::string& timing) {
            return json{{"ranks", W},
                        {"size_bytes", sh.size},
                        {"size", human(sh.size)},
                        {"dtype", "bf16"},
                        {"algo", "auto"},
                        {"path", "auto"},
                        {"timing", timing},
                        {"align_hold_us", args.align_hold_us},
                        {"auto_choice", std::string(loom::to_string(autoc.algo)) + "/" + loom::to_string(autoc.path)},
                        {"shared_gpu", topo.shared_gpu},
                        {"out_plain", args.plain_out}};
        };
        if (sh.size <= args.b2b_max) {
            TimeOptions b2b = topts;
            b2b.reps = args.b2b_reps;
            json bb = json::object();
            if (nv_run) bb["nvshmem"] = loom::bench::time_op(nv_run, stream, b2b).median_us;
            if (nccl_run) bb["nccl"] = loom::bench::time_op(nccl_run, stream, b2b).median_us;
            const double us = loom::bench::time_op(loom_run, stream, b2b).median_us;
            // Host cost of enqueueing one call (wall clock over b2b_reps calls, then one sync): when it exceeds
            // the device time, back-to-back calls are host-bound.
            auto host_us = [&](const std::function<void(cudaStream_t)>& f) {
                LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
                w.barrier("bench-coll/host");
                const auto t0 = std::chrono::steady_clock::now();
                for (int r = 0; r < args.b2b_reps; ++r) f(stream);
                const auto t1 = std::chrono::steady_clock::now();
                LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
                return std::chrono::duration<double, std::micro>(t1 - t0).count() / args.b2b_reps;
            };
            json host = {{"loom", host_us(loom_run)}};
            if (nccl_run) host["nccl"] = host_us(nccl_run);
            json row = auto_row("back_to_back x" + std::to_string(args.b2b_reps));
            row["host_enqueue_us"] = host;
            row["loom_us"] = us;
            row["baselines"] = bb;
            report.add_row(row);
            if (me == 0)
                std::printf("%-15s %6s %-14s %10.2f us  (back to back x%d)\n", op.c_str(), human(sh.size).c_str(),
                            "auto", us, args.b2b_reps);
        }
        // Per-call latency, interleaved run by run: the automatic choice, each baseline and a launch floor (a 4-byte
        // cudaMemsetAsync: one runtime kernel after the same alignment) see the same clocks and the same MPS
        // scheduling, over lat_iters runs. One call per timed run carries the launch of the op's first kernel; with
        // ranks sharing a GPU that moves by tens of percent between rows timed apart (the rows above).
        if (sh.size <= args.lat_max) {
            TimeOptions lat = topts;
            lat.iters = args.lat_iters;
            std::vector<std::function<void(cudaStream_t)>> fns{loom_run};
            std::vector<std::string> names{"loom"};
            if (nv_run) fns.push_back(nv_run), names.push_back("nvshmem");
            if (nccl_run) fns.push_back(nccl_run), names.push_back("nccl");
            fns.push_back([&](cudaStream_t s) { LOOM_CHECK_CUDA(cudaMemsetAsync(sout, 0, 4, s)); });
            names.push_back("launch_floor");
            const std::vector<loom::bench::Timing> ts = loom::bench::time_ops(fns, stream, lat);
            json base = json::object();
            for (std::size_t i = 1; i + 1 < ts.size(); ++i) base[names[i]] = ts[i].median_us;
            json row = auto_row("per_call_interleaved");
            row["iters"] = args.lat_iters;
            row["loom_us"] = ts[0].median_us;
            row["min_us"] = ts[0].min_us;
            row["p90_us"] = ts[0].p90_us;
            row["launch_floor_us"] = ts.back().median_us;
            row["baselines"] = base;
            report.add_row(row);
            if (me == 0) {
                std::printf("%-15s %6s %-14s %10.2f us  (per call, interleaved x%d; floor %.2f us", op.c_str(),
                            human(sh.size).c_str(), "auto", ts[0].median_us, args.lat_iters, ts.back().median_us);
                for (std::size_t i = 1; i + 1 < ts.size(); ++i)
                    std::printf("; %s %.2f us", names[i].c_str(), ts[i].median_us);
                std::printf(")\n");
            }
        }
    }
    if (me == 0) {
        const std::string path = args.out + "/" + op + ".json";
        if (args.append && fs::exists(path)) {
            std::ifstream f(path);
            const json old = json::parse(f);
            Report merged(op, W, argc, argv);
            for (const auto& row : old["rows"])
                if (row.value("ranks", -1) != W) merged.add_row(row);
            // Hold the json: a range-for over to_json()["rows"] would iterate a destroyed temporary (this lost
            // every appended row once).
            const json mine = report.to_json();
            for (const auto& row : mine["rows"]) merged.add_row(row);
            merged.write(path);
        } else {
            report.write(path);
        }
    }
    w.barrier("bench-coll/op-done");
}

void explain_offline() {
    for (int world : {2, 4, 8})
        for (bool shared : {true, false}) {
            loom::CollTopology t;
            t.world = world;
            t.shared_gpu = shared;
            t.arch = 90;
            std::printf("%s\n", loom::explain_collectives(t).c_str());
        }
}

// The JSON sweep (--json DIR): every variant and the baselines of each op, into DIR/<op>.json.
void json_sweep(loom::World& w, const Args& args, const loom::CollTopology& topo, void* sin, std::size_t buf,
                cudaStream_t stream, int argc, char** argv) {
    fs::create_directories(args.out);
    for (const auto& op : args.ops)
        LOOM_CHECK(!args.plain_out || op == "all_reduce" || op == "all_to_all",
                   "bench-collectives: --plain-out times all_reduce and all_to_all only; add --ops all_reduce or "
                   "--ops all_to_all, given {}",
                   op);
    void* sout = nullptr;
    if (args.plain_out)
        LOOM_CHECK_CUDA(cudaMalloc(&sout, buf));
    else
        sout = w.alloc_bytes(buf);
    Nvshmem nv = nvshmem_init(w, args, buf, buf);
    if (w.rank() == 0 && !nv.note.empty()) std::printf("%s\n", nv.note.c_str());
    loom::bench::NcclBaseline nccl(w, args.nccl, topo.shared_gpu);
    if (w.rank() == 0 && !nccl.note().empty()) std::printf("%s\n", nccl.note().c_str());
    CopyBuffers copy;
    if (topo.shared_gpu) {
        copy.bytes = buf;
        LOOM_CHECK_CUDA(cudaMalloc(&copy.src, buf));
        LOOM_CHECK_CUDA(cudaMalloc(&copy.dst, buf));
        LOOM_CHECK_CUDA(cudaMemset(copy.src, 0x3c, buf));
    }
    PlainBuffers plain;
    if (args.plain) {
        LOOM_CHECK_CUDA(cudaMalloc(&plain.in, buf));
        LOOM_CHECK_CUDA(cudaMalloc(&plain.out, buf));
    }
    for (const auto& op : args.ops) bench_op(w, args, op, topo, nv, nccl, copy, sin, sout, plain, stream, argc, argv);
    if (plain.in) {
        LOOM_CHECK_CUDA(cudaFree(plain.out));
        LOOM_CHECK_CUDA(cudaFree(plain.in));
    }
    if (copy.src) {
        LOOM_CHECK_CUDA(cudaFree(copy.dst));
        LOOM_CHECK_CUDA(cudaFree(copy.src));
    }
    if (nv.ok) {
        loom::nvshmem::free(nv.out);
        loom::nvshmem::free(nv.in);
        loom::nvshmem::finalize();
    }
    if (args.plain_out)
        LOOM_CHECK_CUDA(cudaFree(sout));
    else
        w.free(sout);
}

// The default: nccl-tests' table of each op (coll_table.hpp). Returns the wrong elements counted.
long long table(loom::World& w, const Args& args, void* sin, std::size_t buf, cudaStream_t stream) {
    loom::bench::TableRun run;
    for (const auto& op : args.ops) run.kinds.push_back(loom::bench::parse_coll(op));
    run.args = args.table;
    run.algo = args.algo;
    run.path = args.path;
    run.align_hold_us = args.align_hold_us;
    void* sout = w.alloc_bytes(buf);
    const long long wrong = loom::bench::run_tables(w, run, sin, sout, buf, stream);
    LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
    w.barrier("bench-coll/table-done");
    w.free(sout);
    return wrong;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Args args = parse(argc, argv);
        if (!loom::driver::available()) {
            if (args.explain) {
                std::printf("no GPU (%s): the choice for sm_90 at 2, 4 and 8 ranks\n",
                            loom::driver::unavailable_reason().c_str());
                explain_offline();
                return 0;
            }
            std::printf("no GPU: %s\n", loom::driver::unavailable_reason().c_str());
            return 1;
        }
        // Per-rank symmetric heap: in + out of the largest size (all_gather's out is the size itself, its in a
        // W-th of it; all_to_all's both the size), plus the collectives' scratch and LL area.
        const std::size_t need = 2 * args.max_bytes + 160 * MiB;
        loom::WorldOptions opts;
        opts.symmetric_size = std::max(loom::settings().symmetric_size, need);
        loom::World w = loom::World::from_env(opts);
        const loom::CollTopology topo = loom::collective_topology(w);
        if (args.explain && w.rank() == 0) std::printf("%s\n", loom::explain_collectives(topo).c_str());
        cudaStream_t stream;
        LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        const std::size_t buf = std::max<std::size_t>(args.max_bytes, 4 * KiB);
        void* sin = w.alloc_bytes(buf);
        long long wrong = 0;
        if (args.json())
            json_sweep(w, args, topo, sin, buf, stream, argc, argv);
        else
            wrong = table(w, args, sin, buf, stream);
        w.free(sin);
        LOOM_CHECK_CUDA(cudaStreamDestroy(stream));
        return wrong == 0 ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench-collectives: %s\n", e.what());
        return 1;
    }
}
