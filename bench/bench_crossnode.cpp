// bench-crossnode: the collectives in a World of several nodes (their hierarchical forms, docs/crossnode.md), each op
// timed whole and step by step: its intra-node step(s) alone and its inter-node step alone (coll::hier::Steps; each
// step's kernels meet their peers on entry, so one step runs back to back on its own), beside NVSHMEM's on-stream
// collective on the same ranks (NVSHMEM_TEAM_WORLD, bf16, sum); and the overlapped GEMMs ag_gemm and gemm_rs across
// nodes, each against its sequence of public calls, with the GEMM and the collective's steps alone.
//
//   LOOM_NODE_SIZE=2 loomrun -n 4 build/bench/bench-crossnode --out docs/perf/crossnode_collectives.json   # 2 x 2
//   LOOM_NODE_SIZE=4 loomrun -n 8 build/bench/bench-crossnode --out docs/perf/crossnode_collectives.json --append
//   LOOM_NODE_SIZE=2 loomrun -n 8 build/bench/bench-crossnode --out docs/perf/crossnode_collectives.json --append
//       [--ops all_gather,reduce_scatter,all_reduce,all_to_all] [--min-bytes 4K] [--max-bytes 16M] [--factor 4]
//       [--iters 20] [--no-nvshmem] [--coll-scratch 64M]
//   LOOM_NODE_SIZE=2 loomrun -n 4 build/bench/bench-crossnode --ops ag_gemm,gemm_rs \
//       --out docs/perf/crossnode_overlap.json   [--gemm-shapes 4096x4096x4096,8192x4096x4096,4096x8192x8192]
//   (then LOOM_NODE_SIZE=4 -n 8 and LOOM_NODE_SIZE=2 -n 8 with --append, as above)
//
// One report per family: the collectives' rows go to a report of op "crossnode_collectives", the overlapped GEMMs'
// to one of op "crossnode_overlap" (--out's default names it so); one run takes ops of one family. --append keeps the
// existing report's rows of other layouts (nodes x ranks per node) and replaces this layout's.
//
// Collective rows. Size: the larger buffer of a rank (nccl-tests' convention): all_gather's out, reduce_scatter's in,
// the buffer of all_reduce and all_to_all; bf16 elements. Row fields: loom_us (the whole op, slowest rank's median),
// intra_us and inter_us (each step alone), baselines.nvshmem, algBW_GBps, nodes, ranks_per_node, ranks. The whole
// op's result is checked once per row (exact sums of small integers; data movement by source rank): "checked": true,
// and a wrong result stops the benchmark. Every timed run starts after a host barrier (loom::barrier_on_stream runs
// within one node), so the host skew between ranks (tens of microseconds) is part of small sizes' figures. At the
// default --coll-scratch (WorldOptions::coll_scratch, 64 MiB) all_reduce takes up to (nodes + 1) x size / ranks per
// node of scratch: raise it for --max-bytes past 16M.
//
// Overlapped-GEMM rows (crossnode_overlap.cpp), per MxNxK of --gemm-shapes (the layer's GEMM over every rank:
// ag_gemm's N and gemm_rs's K split over the ranks, so M and that dimension are multiples of the ranks, the latter
// of 8 x ranks), bf16: loom_us (the op's two-level form), auto_us (the op with default options),
// baselines.loom_sequence (loom::all_gather then loom::gemm; loom::gemm then loom::reduce_scatter), gemm_us, coll_us
// (the collective whole), intra_us, inter_us, overlap_efficiency, shape, M, N, K, N_loc or K_loc, nodes,
// ranks_per_node, ranks. Both forms of the op are checked once per row against the sequence's result (bf16 within a
// tolerance, every element; crossnode_overlap.cpp says why), and a wrong result stops the benchmark. gemm_rs's
// hierarchical reduce_scatter stages 2 x nodes x M x N / ranks bf16 in the collective scratch: a shape past
// M x N = 16 Mi x ranks per node needs --coll-scratch raised (the error says so).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "crossnode_overlap.hpp"
#include "harness.hpp"
#include "loom/bf16.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/nvshmem.hpp"
#include "loom/runtime/world.hpp"
#include "ops/collectives/hier/hier.hpp"

using json = nlohmann::json;
using loom::BufferView;
using loom::DType;
using loom::bench::TimeOptions;
using Steps = loom::coll::hier::Steps;

namespace {

struct Args {
    std::string out;  // default: <the report's op>.json
    std::string ops = "all_gather,reduce_scatter,all_reduce,all_to_all";
    std::string gemm_shapes = "4096x4096x4096,8192x4096x4096,4096x8192x8192";
    std::size_t min_bytes = 4096, max_bytes = std::size_t(16) << 20;
    std::size_t coll_scratch = loom::WorldOptions{}.coll_scratch;
    double factor = 4;
    int iters = 20;
    bool append = false, no_nvshmem = false;
};

const std::vector<std::string> kCollOps = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all"};
const std::vector<std::string> kOverlapOps = {"ag_gemm", "gemm_rs"};

bool is_one_of(const std::string& op, const std::vector<std::string>& ops) {
    return std::find(ops.begin(), ops.end(), op) != ops.end();
}

std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> v;
    std::stringstream ss(s);
    for (std::string x; std::getline(ss, x, ',');)
        if (!x.empty()) v.push_back(x);
    return v;
}

std::string size_name(std::size_t b) {
    if (b >= (std::size_t(1) << 20) && b % (std::size_t(1) << 20) == 0) return std::to_string(b >> 20) + " MiB";
    if (b >= 1024 && b % 1024 == 0) return std::to_string(b >> 10) + " KiB";
    return std::to_string(b) + " B";
}

// count bf16 elements of `value` into dst (device), synchronously.
void fill(void* dst, std::size_t count, float value) {
    std::vector<std::uint16_t> h(count, loom::float_to_bf16(value));
    LOOM_CHECK_CUDA(cudaMemcpy(dst, h.data(), count * 2, cudaMemcpyHostToDevice));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());  // a pageable upload may still be in flight when cudaMemcpy returns
}
// Every element of the rank's result equal to `want(i)`: "" or the first wrong one.
std::string check(const void* src, std::size_t count, const std::function<float(std::size_t)>& want) {
    std::vector<std::uint16_t> h(count);
    LOOM_CHECK_CUDA(cudaMemcpy(h.data(), src, count * 2, cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < count; ++i)
        if (loom::bf16_to_float(h[i]) != want(i))
            return "element " + std::to_string(i) + ": expected " + std::to_string(want(i)) + ", got " +
                   std::to_string(loom::bf16_to_float(h[i]));
    return "";
}

int run_bench(int argc, char** argv) {
    Args args;
    CLI::App app{
        "bench-crossnode: the hierarchical collectives and the overlapped GEMMs in a World of several nodes, whole and "
        "by step"};
    app.add_option("--out", args.out,
                   "JSON report path (default: crossnode_collectives.json or crossnode_overlap.json)");
    app.add_option("--ops", args.ops,
                   "comma-separated, of one family: all_gather, reduce_scatter, all_reduce, all_to_all; or ag_gemm, "
                   "gemm_rs")
        ->capture_default_str();
    app.add_option("--gemm-shapes", args.gemm_shapes,
                   "ag_gemm, gemm_rs: comma-separated MxNxK, the layer's GEMM over every rank")
        ->capture_default_str();
    loom::bench::add_bytes_option(app, "--min-bytes", args.min_bytes, "smallest size (the larger buffer)");
    loom::bench::add_bytes_option(app, "--max-bytes", args.max_bytes, "largest size");
    loom::bench::add_bytes_option(app, "--coll-scratch", args.coll_scratch,
                                  "the collectives' symmetric scratch (WorldOptions::coll_scratch)");
    app.add_option("--factor", args.factor, "size step")->check(CLI::Range(1.5, 1024.0));
    app.add_option("--iters", args.iters, "timed runs per figure")->check(CLI::PositiveNumber);
    app.add_flag("--append", args.append, "keep the existing report's rows of other layouts");
    app.add_flag("--no-nvshmem", args.no_nvshmem, "leave out NVSHMEM's collectives");
    loom::bench::parse_or_exit(app, argc, argv);

    // The ops, of one family: each family has its report (op crossnode_collectives or crossnode_overlap).
    const std::vector<std::string> ops = split(args.ops);
    LOOM_CHECK(!ops.empty(), "--ops: expected at least one op, given '{}'", args.ops);
    const bool overlap = is_one_of(ops[0], kOverlapOps);
    for (const std::string& op : ops) {
        LOOM_CHECK(is_one_of(op, kCollOps) || is_one_of(op, kOverlapOps),
                   "--ops: expected ops from all_gather, reduce_scatter, all_reduce, all_to_all, ag_gemm, gemm_rs, "
                   "given {}",
                   op);
        LOOM_CHECK(is_one_of(op, overlap ? kOverlapOps : kCollOps),
                   "--ops: expected the collectives or the overlapped GEMMs (ag_gemm, gemm_rs), not both (each family "
                   "writes its own report), given {}",
                   args.ops);
    }
    const std::vector<loom::bench::GemmShape> shapes =
        overlap ? loom::bench::parse_gemm_shapes(args.gemm_shapes) : std::vector<loom::bench::GemmShape>{};
    const std::string report_op = overlap ? "crossnode_overlap" : "crossnode_collectives";
    if (args.out.empty()) args.out = report_op + ".json";

    loom::WorldOptions wo;
    wo.coll_scratch = args.coll_scratch;
    loom::World w = loom::World::from_env(wo);
    const int W = w.world_size(), me = w.rank(), N = w.num_nodes(), L = w.local_world_size();
    if (N == 1) {
        if (me == 0)
            std::fprintf(stderr,
                         "bench-crossnode: the World has one node; run under loomrun with LOOM_NODE_SIZE=k (emulated "
                         "nodes of k ranks) or on several hosts\n");
        return 2;
    }
    cudaStream_t stream;
    LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    // The collectives' buffers (the overlapped GEMMs' rows allocate their own).
    char* in = overlap ? nullptr : static_cast<char*>(w.alloc_bytes(args.max_bytes));
    char* out = overlap ? nullptr : static_cast<char*>(w.alloc_bytes(args.max_bytes));
    const bool nv = !overlap && !args.no_nvshmem && loom::nvshmem::initialized();
    void* nv_in = nv ? loom::nvshmem::malloc(args.max_bytes) : nullptr;
    void* nv_out = nv ? loom::nvshmem::malloc(args.max_bytes) : nullptr;

    loom::bench::Report report(report_op, W, argc, argv);
    json rows = json::array();
    if (args.append && me == 0 && std::filesystem::exists(args.out)) {
        std::ifstream f(args.out);
        const json old = json::parse(f);
        for (const auto& r : old["rows"])
            if (!(r.value("nodes", 0) == N && r.value("ranks_per_node", 0) == L)) rows.push_back(r);
    }

    for (const std::string& op : ops) {
        if (overlap) {
            for (const loom::bench::GemmShape& shape : shapes)
                rows.push_back(loom::bench::crossnode_overlap_row(w, op, shape, args.iters, stream));
            continue;
        }
        for (double s = static_cast<double>(args.min_bytes); s <= static_cast<double>(args.max_bytes) * 1.0001;
             s *= args.factor) {
            // Element counts: in_count / out_count of bf16, the size rounded down to what the op's shape allows.
            const std::size_t elems = static_cast<std::size_t>(s) / 2;
            std::size_t in_count, out_count;
            if (op == "all_gather") {
                in_count = std::max<std::size_t>(1, elems / W);
                out_count = in_count * W;
            } else if (op == "reduce_scatter") {
                out_count = std::max<std::size_t>(1, elems / W);
                in_count = out_count * W;
            } else if (op == "all_reduce") {
                in_count = out_count = std::max<std::size_t>(1, elems);
            } else {
                in_count = out_count = std::max<std::size_t>(1, elems / W) * W;
            }
            const std::size_t size = std::max(in_count, out_count) * 2;
            const BufferView vin{in, DType::BF16, in_count}, vout{out, DType::BF16, out_count};
            const auto run = [&, op](Steps st) {
                return [&, op, st](cudaStream_t str) {
                    const loom::CollOptions o;
                    if (op == "all_gather") loom::coll::hier::all_gather(w, vin, vout, o, str, st);
                    if (op == "reduce_scatter") loom::coll::hier::reduce_scatter(w, vin, vout, o, str, st);
                    if (op == "all_reduce") loom::coll::hier::all_reduce(w, vin, vout, o, str, st);
                    if (op == "all_to_all") loom::coll::hier::all_to_all(w, vin, vout, o, str, st);
                };
            };
            // The whole op through the public entry (what users call), checked once.
            fill(in, in_count, static_cast<float>(me + 1));
            LOOM_CHECK_CUDA(cudaDeviceSynchronize());
            w.barrier("bench-crossnode/filled");
            if (op == "all_gather") loom::all_gather(w, vin, vout, stream);
            if (op == "reduce_scatter") loom::reduce_scatter(w, vin, vout, stream);
            if (op == "all_reduce") loom::all_reduce(w, vin, vout, stream);
            if (op == "all_to_all") loom::all_to_all(w, vin, vout, stream);
            LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
            const float sum = static_cast<float>(W) * (W + 1) / 2;
            const std::size_t per = out_count / W;
            const std::string bad = check(out, out_count, [&](std::size_t i) {
                if (op == "all_gather" || op == "all_to_all")
                    return static_cast<float>(i / (op == "all_gather" ? in_count : per) + 1);
                return sum;
            });
            LOOM_CHECK(bad.empty(), "rank {}: {} of {}: {}", me, op, size_name(size), bad);

            std::vector<std::function<void(cudaStream_t)>> fns = {run(Steps::All), run(Steps::Intra),
                                                                  run(Steps::Inter)};
            if (nv) {
                fns.push_back([&, op](cudaStream_t str) {
                    if (op == "all_gather") loom::nvshmem::fcollect_on_stream(nv_out, nv_in, in_count * 2, str);
                    if (op == "reduce_scatter")
                        loom::nvshmem::sum_reducescatter_on_stream(DType::BF16, nv_out, nv_in, out_count, str);
                    if (op == "all_reduce")
                        loom::nvshmem::sum_reduce_on_stream(DType::BF16, nv_out, nv_in, in_count, str);
                    if (op == "all_to_all") loom::nvshmem::alltoall_on_stream(nv_out, nv_in, in_count * 2 / W, str);
                });
            }
            TimeOptions topts;
            topts.warmup = 3;
            topts.iters = args.iters;
            topts.world = &w;
            const std::vector<loom::bench::Timing> t = loom::bench::time_ops(fns, stream, topts);
            json row = {{"shape", op + " " + size_name(size) + " bf16 " + std::to_string(N) + "x" + std::to_string(L)},
                        {"op", op},
                        {"size", size_name(size)},
                        {"size_bytes", size},
                        {"dtype", "bf16"},
                        {"ranks", W},
                        {"nodes", N},
                        {"ranks_per_node", L},
                        {"loom_us", t[0].median_us},
                        {"min_us", t[0].min_us},
                        {"p90_us", t[0].p90_us},
                        {"intra_us", t[1].median_us},
                        {"inter_us", t[2].median_us},
                        {"algBW_GBps", loom::bench::gbps(static_cast<double>(size), t[0].median_us)},
                        {"iters", args.iters},
                        {"checked", true},
                        {"machine", "emulated nodes (LOOM_NODE_SIZE) on one host"}};
            json baselines = json::object();
            if (nv) baselines["nvshmem"] = t[3].median_us;
            row["baselines"] = baselines;
            if (me == 0)
                std::printf("%-15s %10s %dx%d  loom %9.2f us  intra %9.2f us  inter %9.2f us%s\n", op.c_str(),
                            size_name(size).c_str(), N, L, t[0].median_us, t[1].median_us, t[2].median_us,
                            nv ? ("  nvshmem " + std::to_string(t[3].median_us) + " us").c_str() : "");
            rows.push_back(row);
        }
    }
    if (me == 0) {
        for (auto& r : rows) report.add_row(r);
        report.write(args.out, false);
    }
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    if (nv) {
        loom::nvshmem::free(nv_out);
        loom::nvshmem::free(nv_in);
    }
    if (!overlap) {
        w.free(out);
        w.free(in);
    }
    loom::release_collective_state(w);
    cudaStreamDestroy(stream);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run_bench(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench-crossnode: %s\n", e.what());
        return 1;
    }
}
