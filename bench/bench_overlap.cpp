// Overlapped GEMM + collectives vs their non-overlapped sequences, on the Triton-distributed TP-MLP shapes at the
// run's world size W (M = 8192):
//   AG+GEMM (N, K): (11008, 4096) (14336, 4096) (28672, 8192) (53248, 16384) (29568, 8192), N_loc = N / W
//   GEMM+RS (N, K): (4096, 11008) (4096, 14336) (3584, 14336) (4608, 36864) (8192, 28672) (8192, 29568), K_loc = K / W
// Per shape: (a) the overlapped op with its automatic choices (loom_us; ag_gemm's copy-engine, SM and, ranks sharing
// a GPU, direct producers, and gemm_rs's algorithms and transports timed beside it), (b) Loom's collective
// then Loom's GEMM (sequential), (c) NVSHMEM's collective then cuBLASLt (sequential), and NCCL's then cuBLASLt when
// every rank has its own GPU, the collective alone and the GEMM alone; overlap efficiency =
// t(a) / max(t(comm), t(GEMM)) (1.0 = perfect overlap), speedups vs each baseline. --torch FILE folds in the
// PyTorch figures bench/torch_async_tp.py measured on the same machine (async TP, PyTorch + NCCL sequential).
// Timed alone, points seconds apart drift with the card's heat by up to ~12 %: row "interleaved" times (a), (b), the
// collective and the GEMM run by run, and row "paired" times (a) with each library sequence (NVSHMEM's, NCCL's) run by
// run; those ratios are the fair ones. (PyTorch's run in another process and cannot be interleaved:
// "torch_async_tp_bridged" compares through each process's own cuBLAS + NCCL sequence, see bridge_torch.)
// Before timing, every overlapped config is checked once against (b) on the same inputs (max |diff| / max |ref|,
// NaN-poisoned output), the ranks agreeing on the verdict; a failing config is reported and not timed.
// GEMM+AllReduce (decode to prefill): M in {1, 16, 128, 512, 2048, 8192, 16384} (--ar-m) x (N, K) in
// {(5120, 25600), (5120, 8192)} (Qwen3-32B's row-parallel layers: the MLP's down projection and attention's output
// projection, K_loc = K / W): gemm_ar (auto, and each algorithm and reduction timed beside it; C cudaMalloc'd) against
// Loom's GEMM then all_reduce (into a cudaMalloc'd out too, as the op's own sequence), cuBLASLt then NVSHMEM's
// sum_reduce, and cuBLASLt then NCCL's all_reduce (distinct GPUs). Large M needs a
// symmetric heap of a few GiB per rank (LOOM_SYMMETRIC_SIZE; the fused epilogue receives W - 1 copies of C).
// --rs-fused-diag also times the fused gemm_rs with parts left out (unchecked: wrong results by design). Ranks on
// distinct GPUs also time the fused gemm_rs with the copy-engine transport ("fused-epilogue-ce"), and with
// --rs-ce-chunk at each of the given chunk sizes.
//   loomrun -n 8 build/bench/bench-overlap [--json DIR] [--quick] [--iters N] [--no-nvshmem] [--no-nvshmem-rs]
//   [--no-nccl]
//                                          [--torch DIR/torch_tp.json] [--rs-comm-sms 4,8,16,24] [--ar-comm-sms 2,4,8]
//                                          [--ops all|ag|rs|ar] [--no-align] [--trace] [--shape N,K[,N,K...]]
//                                          [--ar-m 1,16,128,...]
//                                          [--rs-fused-bn 128,192,256] [--rs-fused-diag] [--rs-ce-chunk 1024,4096]
//                                          [--rs-k-split 2] [--ag-n-split 2] [--align-hold-us 50] [--host-us]
// Prints a table per op (rank 0), a line per shape as it finishes: W, M, N, K, Loom's us, each baseline sequence's us
// (Loom's own, NVSHMEM + cuBLASLt, NCCL + cuBLASLt, PyTorch's with --torch) and its ratio baseline / Loom, and the
// overlap efficiency. --json DIR (also spelled --out) writes every row's fields to DIR/ag_gemm.json, DIR/gemm_rs.json
// and DIR/gemm_ar.json (<op>_fp8.json with --dtype f8e4m3).
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../tests/common/scoped_env.hpp"
#include "cublaslt.hpp"
#include "harness.hpp"
#include "loom/bf16.hpp"
#include "loom/kernels/gemm/gemm_params.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/nvshmem.hpp"
#include "loom/runtime/settings.hpp"
#include "nccl.hpp"
#include "ops/collectives/coll_choice.hpp"
#include "ops/overlap/common/state.hpp"
#include "ops/overlap/gemm_ar/gemm_ar.hpp"
#include "ops/overlap/gemm_rs/gemm_rs.hpp"
#include "table.hpp"

namespace {

// Largest difference between two bf16 buffers relative to the reference's largest magnitude,
// max |x - y| / max |y| (NaN -> infinity). Not element-wise (|x - y| / (|y| + 1)): the op and its reference add W
// partials that were each rounded to bf16 (GEMM+ReduceScatter), and where the two GEMMs sum in different orders
// (the reference's split-K tail) the partials round differently by an ulp of their own magnitude, which is large
// next to a small sum: at W = 8, K_loc = 4608 that measure read 0.19 for results that agreed to the rounding
// (tests/dist/test_overlap.cpp: Overlap.GemmRsReferenceStepsAgree). A wrong or missing tile differs by the
// values' own size, far above the tolerance.
double max_scaled_diff(const void* x, const void* y, size_t n) {
    std::vector<uint16_t> a(n), b(n);
    LOOM_CHECK_CUDA(cudaMemcpy(a.data(), x, n * 2, cudaMemcpyDeviceToHost));
    LOOM_CHECK_CUDA(cudaMemcpy(b.data(), y, n * 2, cudaMemcpyDeviceToHost));
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i += 7) {  // a sample is enough for a sanity check; the tests check every element
        const float fa = loom::bf16_to_float(a[i]), fb = loom::bf16_to_float(b[i]);
        if (std::isnan(fa) || std::isnan(fb)) return INFINITY;
        worst = std::max(worst, static_cast<double>(std::fabs(fa - fb)));
        scale = std::max(scale, static_cast<double>(std::fabs(fb)));
    }
    return scale > 0 ? worst / scale : (worst > 0 ? INFINITY : 0);
}

struct Args {
    std::string out;
    std::string torch;  // bench/torch_async_tp.py's JSON, or ""
    bool quick = false;
    bool nvshmem = true;
    bool nvshmem_rs = true;  // --no-nvshmem-rs: NVSHMEM's reducescatter with PEs sharing a GPU can take minutes
    bool nccl = true;
    bool align = true;                 // start every timed run with a device barrier across the ranks
    std::vector<int> rs_comm_sms;      // gemm_rs timed again at each of these comm_sms
    std::vector<int> ar_comm_sms;      // gemm_ar timed again at each of these comm_sms (checked each)
    std::vector<int64_t> shapes;       // --shape N,K,...: only these (N, K) of each op's list
    std::vector<int64_t> ms = {8192};  // --m: ag_gemm / gemm_rs at each of these M (the TP-MLP shapes' 8192)
    std::vector<int64_t> ar_ms;        // --ar-m: gemm_ar at each of these M (none: bench_ar's list)
    std::vector<int> rs_fused_bn;      // gemm_rs forced fused, timed again at each of these BLOCK_N
    std::vector<int> rs_ce_chunk_kib;  // gemm_rs fused with the copy engine, timed at each of these chunk sizes
    bool rs_fused_diag = false;        // gemm_rs fused timed with parts left out (results not checked)
    int rs_k_split = 0;                // gemm_rs: K_loc = K / rs_k_split instead of K / W (0: W)
    int ag_n_split = 0;                // ag_gemm: N_loc = N / ag_n_split instead of N / W (0: W)
    bool host_us = false;              // --host-us: row "host_enqueue_us" (host_block)
    loom::RsAlgo rs_algo = loom::RsAlgo::Auto;  // --rs-algo: the gemm_rs algorithm timed as the op (a)
    loom::DType in = loom::DType::BF16;         // --dtype: A and B (bf16 or f8e4m3; C and the partials stay bf16)
    int iters = 20;
    int argc = 0;
    char** argv = nullptr;
};

using loom::DType;
using loom::MatrixView;
using loom::bench::time_op;
using loom::bench::TimeOptions;

bool g_align = true;         // Args::align, for med()
double g_align_hold_us = 0;  // --align-hold-us: barrier_on_stream's hold before each timed run
bool g_trace = false;
// --scaled: every call of an op passes alpha 0.5 and device scales 2 and 1 (product 1, so its results compare with the
// unscaled baselines bit for bit in scale), so that the op runs its scaled kernels; null: unscaled calls.
const float* g_scales = nullptr;
template <class Opts>
Opts with_scales(Opts o) {
    if (g_scales != nullptr) {
        o.alpha = 0.5f;
        o.scale_a = g_scales;
        o.scale_b = g_scales + 1;
    }
    return o;
}  // --trace: rank 0 prints every timed point's median and wall time (finding the slow part)

// Every rank's timed runs start together on the device (unless --no-align) and the slowest rank's median counts.
TimeOptions time_options(loom::World& w, int iters) {
    TimeOptions o;
    o.world = &w;
    o.iters = iters;
    if (g_align) o.align = [&w](cudaStream_t st) { loom::barrier_on_stream(w, st, g_align_hold_us); };
    return o;
}

double med(const std::function<void(cudaStream_t)>& fn, cudaStream_t s, loom::World& w, int iters) {
    const TimeOptions o = time_options(w, iters);
    const auto t0 = std::chrono::steady_clock::now();
    const double us = time_op(fn, s, o).median_us;
    if (g_trace && w.rank() == 0) {
        static int point = 0;
        std::printf("  point %d: median %.1f us, %.2f s wall\n", point++, us,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        std::fflush(stdout);
    }
    return us;
}
// Several ops timed interleaved run by run (harness time_ops): the overlapped op, the GEMM alone, the collective alone
// and the sequence see the same clocks and heat, so their ratios (row "interleaved": efficiency, speedup over the
// sequence) do not carry the drift between points timed seconds apart (two H200s: the same GEMM read 479 and 522 us
// in two calls). Interleaved, the overlapped op reads 2-10 % slower than timed alone (two H200s), so
// loom_us, the collective, the GEMM and every baseline stay timed alone and are compared with each other, and the
// interleaved block is reported beside them; overlap_efficiency is the interleaved one (overlap_efficiency_alone the
// other).
std::vector<double> meds(const std::vector<std::function<void(cudaStream_t)>>& fns, cudaStream_t s, loom::World& w,
                         int iters) {
    std::vector<double> us;
    for (const auto& t : loom::bench::time_ops(fns, s, time_options(w, iters))) us.push_back(t.median_us);
    return us;
}
// The interleaved figures of one shape ({op, GEMM, collective, sequence} medians, as meds returns them) and the
// ratios taken within them: overlap efficiency op / max(GEMM, collective) and the sequence's time over the op's.
nlohmann::json interleaved_block(const std::vector<double>& t) {
    return {{"loom_us", t[0]},
            {"gemm_us", t[1]},
            {"collective_us", t[2]},
            {"loom_sequential_us", t[3]},
            {"efficiency", t[0] / std::max(t[1], t[2])},
            {"speedup_over_loom_sequential", t[3] / t[0]}};
}
// Host time to enqueue one call of each of {op, GEMM, collective, sequence} (--host-us): 10 calls back to back on
// an idle stream, timed on the host (the device runs behind them), the least of three such bursts, in microseconds.
// What a caller pays on the CPU per call, and what lands in a timed region that starts on an idle GPU.
nlohmann::json host_block(const std::vector<std::function<void(cudaStream_t)>>& fns, cudaStream_t s, loom::World& w) {
    static const char* const names[] = {"op", "gemm", "collective", "sequence"};
    nlohmann::json out;
    for (std::size_t f = 0; f < fns.size() && f < 4; ++f) {
        double best = INFINITY;
        for (int rep = 0; rep < 3; ++rep) {
            LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
            w.barrier("bench-host");
            const auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < 10; ++i) fns[f](s);
            const auto t1 = std::chrono::steady_clock::now();
            best = std::min(best, std::chrono::duration<double, std::micro>(t1 - t0).count() / 10);
        }
        LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
        w.barrier("bench-host");
        out[names[f]] = best;
    }
    return out;
}
// The op and one library baseline interleaved run by run ("paired": {name: {loom_us, baseline_us, speedup}}): their
// ratio without the drift between points timed apart (two H200s: the same fused gemm_rs read 1791 and 2034 us at one
// shape, timed ~10 s apart). Only where the op passed its check.
void paired(nlohmann::json& row, const std::string& name, const std::function<void(cudaStream_t)>& op,
            const std::function<void(cudaStream_t)>& baseline, cudaStream_t s, loom::World& w, int iters) {
    const std::vector<double> t = meds({op, baseline}, s, w, iters);
    row["paired"][name] = {{"loom_us", t[0]}, {"baseline_us", t[1]}, {"speedup", t[1] / t[0]}};
}
// --shape: keep only the listed (N, K) pairs (flattened N, K, N, K, ...); none listed keeps them all.
void keep_shapes(std::vector<std::pair<int64_t, int64_t>>& shapes, const std::vector<int64_t>& only) {
    if (only.empty()) return;
    std::vector<std::pair<int64_t, int64_t>> kept;
    for (const auto& nk : shapes)
        for (std::size_t i = 0; i + 1 < only.size(); i += 2)
            if (nk.first == only[i] && nk.second == only[i + 1]) kept.push_back(nk);
    shapes = kept;
}
// Every (M, N, K) timed: each M of --m with each kept (N, K).
std::vector<std::tuple<int64_t, int64_t, int64_t>> mnk_points(const std::vector<int64_t>& ms,
                                                              const std::vector<std::pair<int64_t, int64_t>>& nk) {
    std::vector<std::tuple<int64_t, int64_t, int64_t>> points;
    for (int64_t m : ms)
        for (const auto& [n, k] : nk) points.emplace_back(m, n, k);
    return points;
}
// Every rank's check, agreed: true only if `diff` is below `tol` on every rank. The timing that follows is a
// sequence of collective calls, so one rank may never skip it alone (8 ranks on one H200 once deadlocked that way:
// rank 7's check failed, it went on to the next variant while the others timed this one). Failing ranks print their
// difference (flushed: a rank stuck later would lose it).
bool agreed_ok(loom::World& w, double diff, double tol, const std::string& what) {
    const bool mine = diff < tol;
    if (!mine) {
        std::printf("FAIL %s: rank %d max rel diff %g (tolerance %g)\n", what.c_str(), w.rank(), diff, tol);
        std::fflush(stdout);
    }
    const auto all = w.store().all_gather("bench-overlap/check", loom::Bytes{static_cast<uint8_t>(mine)});
    for (const auto& v : all)
        if (v.empty() || v[0] == 0) return false;
    return true;
}

// The table of one op, a line per finished row (rank 0; long runs show their progress): W, M, N, K, Loom's us, each
// baseline sequence's us and its ratio baseline / Loom (> 1: Loom faster), the overlap efficiency (interleaved).
struct BaselineColumn {
    std::string title;  // "nccl seq"
    std::string key;    // row["baselines"][key]
};
class OverlapTable {
  public:
    OverlapTable(const char* op, std::vector<BaselineColumn> baselines, const loom::World& w)
        : op_(op), baselines_(std::move(baselines)), table_(columns(baselines_)), print_(w.rank() == 0) {
        if (print_) std::printf("# %s\n%s", op_, table_.header().c_str());
    }
    void row(const nlohmann::json& r) const {
        if (!print_) return;
        const double loom_us = r.value("loom_us", NAN);
        std::vector<std::string> cells = {std::to_string(r.value("world", 0)), std::to_string(r.value("M", 0LL)),
                                          std::to_string(r.value("N", 0LL)), std::to_string(r.value("K", 0LL)),
                                          loom::bench::cell_us(loom_us)};
        for (const auto& b : baselines_) {
            const double us = r.contains("baselines") ? r["baselines"].value(b.key, NAN) : NAN;
            cells.push_back(loom::bench::cell_us(us));
            cells.push_back(loom::bench::cell_ratio(us / loom_us));
        }
        cells.push_back(loom::bench::cell_ratio(r.value("overlap_efficiency", NAN)));
        std::printf("%s", table_.row(cells).c_str());
        std::fflush(stdout);
    }

  private:
    static loom::bench::Table columns(const std::vector<BaselineColumn>& baselines) {
        std::vector<loom::bench::Column> c = {{"W", 2}, {"M", 5}, {"N", 5}, {"K", 5}, {"loom us", 9}};
        for (const auto& b : baselines) c.insert(c.end(), {{b.title + " us", 9}, {"vs " + b.title, 0}});
        c.push_back({"efficiency", 0});
        return loom::bench::Table(c);
    }
    const char* op_;
    std::vector<BaselineColumn> baselines_;
    loom::bench::Table table_;
    bool print_;
};

// The baseline columns of an op: Loom's own sequence, then the libraries' that run, then PyTorch's when folded in.
std::vector<BaselineColumn> baseline_columns(const std::string& loom_seq, const std::string& nvshmem_seq,
                                             const std::string& nccl_seq, bool have_nvshmem, bool have_nccl,
                                             bool have_torch) {
    std::vector<BaselineColumn> b = {{"loom seq", loom_seq}};
    if (have_nvshmem) b.push_back({"nvshmem seq", nvshmem_seq});
    if (have_nccl) b.push_back({"nccl seq", nccl_seq});
    if (have_torch) b.insert(b.end(), {{"torch async", "torch_async_tp"}, {"torch seq", "torch_nccl_sequential"}});
    return b;
}

// DIR/<op>.json on rank 0, with --json DIR only.
void write_report(const loom::bench::Report& report, const Args& args, const std::string& op, const loom::World& w) {
    if (w.rank() == 0 && !args.out.empty()) report.write(args.out + "/" + op + ".json", /*echo_rows=*/false);
}

// The PyTorch row for (op, M, N, K, world) in bench/torch_async_tp.py's output, folded into a bench-overlap row:
// async TP and PyTorch + NCCL sequential become baselines, the collective and matmul alone plain fields.
void add_torch(const nlohmann::json& torch, const char* op, int64_t M, int64_t N, int64_t K, int W, nlohmann::json& row,
               nlohmann::json& baselines) {
    if (torch.is_null()) return;
    for (const auto& t : torch.at("rows")) {
        if (t.at("op") != op || t.value("M", int64_t{8192}) != M || t.at("N") != N || t.at("K") != K ||
            t.at("world") != W)
            continue;
        baselines["torch_async_tp"] = t.at("torch_async_tp_us");
        baselines["torch_nccl_sequential"] = t.at("torch_nccl_sequential_us");
        row["torch_collective_us"] = t.at("torch_collective_us");
        row["torch_matmul_us"] = t.at("torch_matmul_us");
        row["torch_version"] = torch.value("torch", "");
    }
}

// Async TP against Loom without the drift between processes: PyTorch's async TP over PyTorch's own cuBLAS + NCCL
// sequence (both from torch_async_tp.py's run), against Loom's op over cuBLASLt + NCCL (row "paired", this run):
// "torch_async_tp_bridged" = (async TP / PyTorch + NCCL) x (cuBLASLt + NCCL / Loom), > 1 = Loom faster. The two
// sequences run the same libraries, so each process's heat and clocks cancel in its own ratio.
void bridge_torch(nlohmann::json& row, const nlohmann::json& baselines, const std::string& nccl_seq) {
    if (!baselines.contains("torch_async_tp") || !baselines.contains("torch_nccl_sequential") ||
        !row.contains("paired") || !row["paired"].contains(nccl_seq))
        return;
    const nlohmann::json& p = row["paired"][nccl_seq];
    row["torch_async_tp_bridged"] = baselines["torch_async_tp"].get<double>() /
                                    baselines["torch_nccl_sequential"].get<double>() * p["baseline_us"].get<double>() /
                                    p["loom_us"].get<double>();
}

// The inputs' type: the report's op name (fp8 runs write <op>_fp8.json beside the bf16 ones), the random fill, and
// cuBLASLt's input type (fp8 in its fast-accumulation mode, as Loom's fp8 kernel sums).
std::string op_name(const char* op, DType in) { return in == DType::F8E4M3 ? std::string(op) + "_fp8" : op; }
// A row's shape fields: "MxNxK", the dimensions, the per-rank one (`local`: N_loc or K_loc), the world and dtype.
nlohmann::json shape_row(int64_t M, int64_t N, int64_t K, const char* local, int64_t local_dim, int W, DType in) {
    return {{"shape", fmt::format("{}x{}x{}", M, N, K)},
            {"M", M},
            {"N", N},
            {"K", K},
            {local, local_dim},
            {"world", W},
            {"dtype", dtype_name(in)}};
}
void fill_input(void* p, int64_t n, std::uint64_t seed, DType in) {
    if (in == DType::F8E4M3) {
        loom::bench::fill_random_e4m3(p, static_cast<std::size_t>(n), seed);
    } else {
        loom::bench::fill_random_bf16(p, static_cast<std::size_t>(n), seed);
    }
}
cudaDataType_t lt_type(DType in) { return in == DType::F8E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_16BF; }

void bench_ag(loom::World& w, const Args& args, bool have_nvshmem, loom::bench::NcclBaseline& nccl,
              const nlohmann::json& torch, cudaStream_t s) {
    const int W = w.world_size();
    std::vector<std::pair<int64_t, int64_t>> shapes = {
        {11008, 4096}, {14336, 4096}, {28672, 8192}, {53248, 16384}, {29568, 8192}};
    if (args.quick) shapes = {{11008, 4096}, {28672, 8192}};
    keep_shapes(shapes, args.shapes);
    loom::bench::Report report(op_name("ag_gemm", args.in), W, args.argc, args.argv);
    const OverlapTable table(
        "ag_gemm",
        baseline_columns("loom_allgather_then_gemm", "nvshmem_fcollect_then_cublaslt", "nccl_allgather_then_cublaslt",
                         have_nvshmem, nccl.ok(), !torch.is_null()),
        w);
    const DType in = args.in;
    const int64_t ies = static_cast<int64_t>(loom::dtype_size(in));
    for (auto [M, N, K] : mnk_points(args.ms, shapes)) {
        const int64_t n_loc = N / (args.ag_n_split > 0 ? args.ag_n_split : W), rows = M / W;
        void *a, *b, *c, *c_ref, *gfull;
        LOOM_CHECK_CUDA(cudaMalloc(&a, rows * K * ies));
        LOOM_CHECK_CUDA(cudaMalloc(&b, n_loc * K * ies));
        LOOM_CHECK_CUDA(cudaMalloc(&c, M * n_loc * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&c_ref, M * n_loc * 2));
        void* a_sym = w.alloc_bytes(rows * K * ies);  // Loom's all_gather input / output (symmetric)
        void* g_sym = w.alloc_bytes(M * K * ies);
        gfull = g_sym;
        fill_input(a, rows * K, 1 + w.rank(), in);
        fill_input(b, n_loc * K, 100 + w.rank(), in);
        LOOM_CHECK_CUDA(cudaMemcpy(a_sym, a, rows * K * ies, cudaMemcpyDeviceToDevice));
        const MatrixView A{a, in, rows, K, 0}, B{b, in, n_loc, K, 0}, C{c, DType::BF16, M, n_loc, 0};
        auto seq_loom = [&](cudaStream_t st) {
            loom::all_gather(w, {a_sym, in, static_cast<size_t>(rows * K)}, {g_sym, in, static_cast<size_t>(M * K)},
                             st);
            loom::gemm({gfull, in, M, K, 0}, B, {c_ref, DType::BF16, M, n_loc, 0}, {}, st);
        };
        seq_loom(s);
        LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
        nlohmann::json row = shape_row(M, N, K, "N_loc", n_loc, W, in);
        if (g_scales != nullptr) row["scaled"] = true;
        if (g_align_hold_us > 0) row["align_hold_us"] = g_align_hold_us;
        // loom_us is the automatic choice's time; each producer is timed too (the direct one where ranks share a
        // GPU and M / W is a multiple of 128, the heuristic's BLOCK_M at these shapes).
        double t_auto = INFINITY;
        std::vector<loom::AgProducer> producers = {loom::AgProducer::Auto, loom::AgProducer::CopyEngine,
                                                   loom::AgProducer::Sm, loom::AgProducer::Sequential};
        if (loom::collective_topology(w).shared_gpu && rows % 128 == 0) producers.push_back(loom::AgProducer::Direct);
        for (auto prod : producers) {
            loom::AgGemmOptions o;
            o.producer = prod;
            LOOM_CHECK_CUDA(cudaMemset(c, 0xFF, M * n_loc * 2));
            loom::ag_gemm(w, A, B, C, s, with_scales(o));
            LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
            const double diff = max_scaled_diff(c, c_ref, M * n_loc);
            const std::string name = std::string("overlap_") + loom::to_string(prod);
            row["check_" + name] = diff;
            if (!agreed_ok(w, diff, 2e-2,
                           fmt::format("ag_gemm {} N={} K={} vs all_gather + gemm", loom::to_string(prod), N, K)))
                continue;
            const double t =
                med([&](cudaStream_t st) { loom::ag_gemm(w, A, B, C, st, with_scales(o)); }, s, w, args.iters);
            row[name + "_us"] = t;
            if (prod == loom::AgProducer::Auto) t_auto = t;
        }
        // Alone (as every baseline is timed): the collective, the GEMM, the sequence.
        const std::function<void(cudaStream_t)> comm_fn = [&](cudaStream_t st) {
            loom::all_gather(w, {a_sym, in, static_cast<size_t>(rows * K)}, {g_sym, in, static_cast<size_t>(M * K)},
                             st);
        };
        const std::function<void(cudaStream_t)> gemm_fn = [&](cudaStream_t st) {
            loom::gemm({gfull, in, M, K, 0}, B, {c_ref, DType::BF16, M, n_loc, 0}, {}, st);
        };
        const double t_comm = med(comm_fn, s, w, args.iters), t_gemm = med(gemm_fn, s, w, args.iters);
        const double t_seq = med(seq_loom, s, w, args.iters);
        // And the four interleaved (the efficiency's figures; see meds).
        const std::function<void(cudaStream_t)> ag_auto = [&](cudaStream_t st) {
            loom::ag_gemm(w, A, B, C, st, with_scales(loom::AgGemmOptions{}));
        };
        if (std::isfinite(t_auto))
            row["interleaved"] = interleaved_block(meds({ag_auto, gemm_fn, comm_fn, seq_loom}, s, w, args.iters));
        if (args.host_us) row["host_enqueue_us"] = host_block({ag_auto, gemm_fn, comm_fn, seq_loom}, s, w);
        nlohmann::json baselines{{"loom_allgather_then_gemm", t_seq}};
        row["allgather_us"] = t_comm;
        row["gemm_us"] = t_gemm;
        loom::bench::LtGemm lt(M, n_loc, K, lt_type(in), /*fast_accum=*/in == DType::F8E4M3);
        row["cublaslt_us"] = med([&](cudaStream_t st) { lt.run(gfull, b, c_ref, st); }, s, w, args.iters);
        if (have_nvshmem) {
            void* na = loom::nvshmem::malloc(rows * K * ies);
            void* ng = loom::nvshmem::malloc(M * K * ies);
            LOOM_CHECK_CUDA(cudaMemcpy(na, a, rows * K * ies, cudaMemcpyDeviceToDevice));
            row["nvshmem_fcollect_us"] =
                med([&](cudaStream_t st) { loom::nvshmem::fcollect_on_stream(ng, na, rows * K * ies, st); }, s, w,
                    args.iters);
            const std::function<void(cudaStream_t)> nv_seq = [&](cudaStream_t st) {
                loom::nvshmem::fcollect_on_stream(ng, na, rows * K * ies, st);
                lt.run(ng, b, c_ref, st);
            };
            baselines["nvshmem_fcollect_then_cublaslt"] = med(nv_seq, s, w, args.iters);
            if (std::isfinite(t_auto)) paired(row, "nvshmem_fcollect_then_cublaslt", ag_auto, nv_seq, s, w, args.iters);
            LOOM_CHECK_CUDA(cudaDeviceSynchronize());
            loom::nvshmem::free(ng);
            loom::nvshmem::free(na);
        }
        if (nccl.ok()) {  // plain (cudaMalloc) input, the gather buffer as NCCL's output
            row["nccl_allgather_us"] = med(
                [&](cudaStream_t st) { nccl.all_gather(a, gfull, rows * K * ies, DType::U8, st); }, s, w, args.iters);
            const std::function<void(cudaStream_t)> nccl_seq = [&](cudaStream_t st) {
                nccl.all_gather(a, gfull, rows * K * ies, DType::U8, st);
                lt.run(gfull, b, c_ref, st);
            };
            baselines["nccl_allgather_then_cublaslt"] = med(nccl_seq, s, w, args.iters);
            if (std::isfinite(t_auto)) paired(row, "nccl_allgather_then_cublaslt", ag_auto, nccl_seq, s, w, args.iters);
        }
        add_torch(torch, "ag_gemm", M, N, K, W, row, baselines);
        bridge_torch(row, baselines, "nccl_allgather_then_cublaslt");
        if (std::isfinite(t_auto)) {
            row["loom_us"] = t_auto;
            row["overlap_efficiency_alone"] = t_auto / std::max(t_comm, t_gemm);
            row["overlap_efficiency"] = row["interleaved"]["efficiency"];
        }
        row["baselines"] = baselines;
        report.add_row(row);
        table.row(row);
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
        w.barrier();
        w.free(g_sym);
        w.free(a_sym);
        cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(c_ref);
    }
    write_report(report, args, op_name("ag_gemm", in), w);
}

void bench_rs(loom::World& w, const Args& args, bool have_nvshmem, loom::bench::NcclBaseline& nccl,
              const nlohmann::json& torch, cudaStream_t s) {
    const int W = w.world_size();
    std::vector<std::pair<int64_t, int64_t>> shapes = {{4096, 11008}, {4096, 14336}, {3584, 14336},
                                                       {4608, 36864}, {8192, 28672}, {8192, 29568}};
    if (args.quick) shapes = {{4096, 11008}, {8192, 28672}};
    keep_shapes(shapes, args.shapes);
    loom::bench::Report report(op_name("gemm_rs", args.in), W, args.argc, args.argv);
    const OverlapTable table(
        "gemm_rs",
        baseline_columns("loom_gemm_then_reduce_scatter", "cublaslt_then_nvshmem_reducescatter",
                         "cublaslt_then_nccl_reducescatter", have_nvshmem, nccl.ok(), !torch.is_null()),
        w);
    const DType in = args.in;
    const int64_t ies = static_cast<int64_t>(loom::dtype_size(in));
    for (auto [M, N, K] : mnk_points(args.ms, shapes)) {
        const int64_t k_loc = K / (args.rs_k_split > 0 ? args.rs_k_split : W), rows = M / W;
        void *a, *b, *c, *c_ref;
        LOOM_CHECK_CUDA(cudaMalloc(&a, M * k_loc * ies));
        LOOM_CHECK_CUDA(cudaMalloc(&b, N * k_loc * ies));
        LOOM_CHECK_CUDA(cudaMalloc(&c, rows * N * 2));
        LOOM_CHECK_CUDA(cudaMalloc(&c_ref, rows * N * 2));
        void* partial = w.alloc_bytes(M * N * 2);
        fill_input(a, M * k_loc, 1 + w.rank(), in);
        fill_input(b, N * k_loc, 100 + w.rank(), in);
        const MatrixView A{a, in, M, k_loc, 0}, B{b, in, N, k_loc, 0}, C{c, DType::BF16, rows, N, 0};
        auto seq_loom = [&](cudaStream_t st) {
            loom::gemm(A, B, {partial, DType::BF16, M, N, 0}, {}, st);
            loom::reduce_scatter(w, {partial, DType::BF16, static_cast<size_t>(M * N)},
                                 {c_ref, DType::BF16, static_cast<size_t>(rows * N)}, st);
        };
        seq_loom(s);
        LOOM_CHECK_CUDA(cudaMemset(c, 0xFF, rows * N * 2));
        loom::GemmRsOptions op_opts;  // the op (a): Auto, or --rs-algo
        op_opts.algo = args.rs_algo;
        loom::gemm_rs(w, A, B, C, s, with_scales(op_opts));
        LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
        nlohmann::json row = shape_row(M, N, K, "K_loc", k_loc, W, in);
        if (g_scales != nullptr) row["scaled"] = true;
        if (args.rs_algo != loom::RsAlgo::Auto) row["rs_algo"] = loom::to_string(args.rs_algo);
        if (g_align_hold_us > 0) row["align_hold_us"] = g_align_hold_us;
        const double diff = max_scaled_diff(c, c_ref, rows * N);
        row["check"] = diff;
        const bool ok = agreed_ok(w, diff, 2e-2, fmt::format("gemm_rs N={} K={} vs gemm + reduce_scatter", N, K));
        double t = NAN;  // timed below, beside the GEMM, the collective and the sequence
        // gemm_rs with `o` on a poisoned output, checked against the sequence (the ranks agreeing; the measure goes
        // to *diff), then timed alone; NAN when the check failed.
        auto checked_us = [&](const loom::GemmRsOptions& o, const std::string& label, double* diff = nullptr) {
            LOOM_CHECK_CUDA(cudaMemset(c, 0xFF, rows * N * 2));
            loom::gemm_rs(w, A, B, C, s, with_scales(o));
            LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
            const double d = max_scaled_diff(c, c_ref, rows * N);
            if (diff) *diff = d;
            return agreed_ok(w, d, 2e-2, fmt::format("gemm_rs ({}) N={} K={}", label, N, K))
                       ? med([&](cudaStream_t st) { loom::gemm_rs(w, A, B, C, st, with_scales(o)); }, s, w, args.iters)
                       : NAN;
        };
        // Each algorithm on its own (auto: the fused epilogue when M / W is a multiple of BLOCK_M, the sequence where
        // ranks share a GPU), each checked against the sequential result.
        // "fused-epilogue" is the epilogue's own NVLink bulk copies (RsTransport::Sm); its copy-engine transport is
        // timed too where ranks have GPUs of their own (auto's choice there).
        std::vector<std::pair<std::string, loom::GemmRsOptions>> variants = {
            {loom::to_string(loom::RsAlgo::FusedEpilogue),
             {0, nullptr, loom::RsAlgo::FusedEpilogue, loom::RsTransport::Sm}},
            {loom::to_string(loom::RsAlgo::ScatterReduce), {0, nullptr, loom::RsAlgo::ScatterReduce}},
            {loom::to_string(loom::RsAlgo::Sequential), {0, nullptr, loom::RsAlgo::Sequential}},
            {loom::to_string(loom::RsAlgo::FusedPull), {0, nullptr, loom::RsAlgo::FusedPull}}};
        if (!loom::collective_topology(w).shared_gpu)
            variants.push_back(
                {"fused-epilogue-ce", {0, nullptr, loom::RsAlgo::FusedEpilogue, loom::RsTransport::CopyEngine}});
        for (const auto& [name, o] : variants) {
            try {
                double d = NAN;
                const double us = checked_us(o, name, &d);
                row["check_" + name] = d;
                if (std::isfinite(us)) row["overlap_" + name + "_us"] = us;
            } catch (const loom::Error& e) {
                row["error_" + name] = e.what();
            }
        }
        if (ok && !args.rs_fused_bn.empty()) {  // the fused epilogue's tile width (stages: as many as fit, <= 6)
            nlohmann::json sweep;
            int dev = 0, sms = 0;
            LOOM_CHECK_CUDA(cudaGetDevice(&dev));
            LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
            // The fused epilogue exists in the Hopper kernel only (arch 90).
            const loom::GemmConfig planned =
                loom::gemm_rs_plan(M, N, k_loc, W, 0, 90, sms, loom::RsAlgo::FusedEpilogue).gemm;
            for (int bn : args.rs_fused_bn) {
                loom::GemmConfig cfg = planned;
                cfg.block_n = bn;
                cfg.stages = loom::kernels::gemm_sm90_plan_stages(cfg.block_m, bn);
                cfg.grid = 0;
                loom::GemmRsOptions o;
                o.algo = loom::RsAlgo::FusedEpilogue;
                o.config = &cfg;
                const std::string key =
                    std::to_string(cfg.block_m) + "x" + std::to_string(bn) + "_st" + std::to_string(cfg.stages);
                sweep[key] = checked_us(o, key);
            }
            row["fused_tile_sweep_us"] = sweep;
        }
        if (ok && args.rs_fused_diag) {
            // The fused epilogue with parts left out (its diagnostic builds, overlap::gemm_rs_diagnostic: 1 no peer
            // pushes, 2 no waits and combine, 3 neither): timing only, the results are wrong by design and not
            // checked. Every rank runs the same mode, so no wait is left without its signal.
            // With the copy-engine transport (key "ce_<mode>") "no pushes" leaves out the epilogue's copies into
            // the outbox (the copy engine still moves the chunks).
            nlohmann::json diag;
            const bool own_gpus = !loom::collective_topology(w).shared_gpu;
            for (loom::RsTransport tr : {loom::RsTransport::Sm, loom::RsTransport::CopyEngine}) {
                if (tr == loom::RsTransport::CopyEngine && !own_gpus) continue;
                loom::GemmRsOptions o{0, nullptr, loom::RsAlgo::FusedEpilogue, tr};
                for (int mode : {1, 2, 3}) {
                    diag[(tr == loom::RsTransport::Sm ? "" : "ce_") + std::to_string(mode)] = med(
                        [&](cudaStream_t st) {
                            loom::overlap::gemm_rs_diagnostic(w, A, B, C, st, with_scales(o), mode);
                        },
                        s, w, args.iters);
                }
            }
            row["fused_diag_skip_us"] = diag;
        }
        if (ok && !args.rs_ce_chunk_kib.empty() && !loom::collective_topology(w).shared_gpu) {
            nlohmann::json sweep;  // the copy-engine transport's chunk size (checked each)
            for (int kib : args.rs_ce_chunk_kib) {
                loom::GemmRsOptions o{0, nullptr, loom::RsAlgo::FusedEpilogue, loom::RsTransport::CopyEngine};
                o.ce_chunk_bytes = static_cast<std::size_t>(kib) << 10;
                sweep[std::to_string(kib)] = checked_us(o, fmt::format("ce chunk {} KiB", kib));
            }
            row["ce_chunk_kib_sweep_us"] = sweep;
        }
        if (ok && !args.rs_comm_sms.empty()) {  // the scatter-reduce's SM budget, for the heuristic's table
            nlohmann::json sweep;
            for (int p : args.rs_comm_sms) {
                loom::GemmRsOptions o;
                o.comm_sms = p;
                o.algo = loom::RsAlgo::ScatterReduce;  // the only algorithm with communication blocks
                sweep[std::to_string(p)] =
                    med([&](cudaStream_t st) { loom::gemm_rs(w, A, B, C, st, with_scales(o)); }, s, w, args.iters);
            }
            row["comm_sms_sweep_us"] = sweep;
        }
        // Alone (as every baseline is timed): the GEMM, the collective, the sequence; and the four interleaved.
        const std::function<void(cudaStream_t)> gemm_fn = [&](cudaStream_t st) {
            loom::gemm(A, B, {partial, DType::BF16, M, N, 0}, {}, st);
        };
        const std::function<void(cudaStream_t)> comm_fn = [&](cudaStream_t st) {
            loom::reduce_scatter(w, {partial, DType::BF16, static_cast<size_t>(M * N)},
                                 {c_ref, DType::BF16, static_cast<size_t>(rows * N)}, st);
        };
        const double t_gemm = med(gemm_fn, s, w, args.iters), t_comm = med(comm_fn, s, w, args.iters);
        nlohmann::json baselines{{"loom_gemm_then_reduce_scatter", med(seq_loom, s, w, args.iters)}};
        const std::function<void(cudaStream_t)> rs_auto = [&](cudaStream_t st) {
            loom::gemm_rs(w, A, B, C, st, with_scales(op_opts));
        };
        if (ok) {
            t = med(rs_auto, s, w, args.iters);
            row["interleaved"] = interleaved_block(meds({rs_auto, gemm_fn, comm_fn, seq_loom}, s, w, args.iters));
            if (args.host_us) row["host_enqueue_us"] = host_block({rs_auto, gemm_fn, comm_fn, seq_loom}, s, w);
        }
        if (ok && args.rs_fused_diag && !loom::collective_topology(w).shared_gpu) {
            // The copy-engine fused epilogue taken apart, timed interleaved run by run with the whole op and the GEMM
            // alone (overlap::gemm_rs_diagnostic; results wrong by design): the copy engine moving no bytes (16), then
            // also no outbox stores, waits or combine (3 | 16: the hooked kernel's structure), then also no fence
            // before each published tile (8), and the whole op without that fence alone.
            const auto ce = [&](int mode) {
                return std::function<void(cudaStream_t)>([&, mode](cudaStream_t st) {
                    loom::overlap::gemm_rs_diagnostic(
                        w, A, B, C, st,
                        with_scales(loom::GemmRsOptions{0, nullptr, loom::RsAlgo::FusedEpilogue,
                                                        loom::RsTransport::CopyEngine}),
                        mode);
                });
            };
            const std::vector<double> t6 = meds({ce(0), ce(16), ce(19), ce(27), ce(8), gemm_fn}, s, w, args.iters);
            row["ce_diag_interleaved_us"] = {{"op", t6[0]},        {"no_ce_bytes", t6[1]},
                                             {"structure", t6[2]}, {"structure_no_fence", t6[3]},
                                             {"no_fence", t6[4]},  {"gemm", t6[5]}};
        }
        if (ok && args.rs_fused_diag) {
            // The fused pull with its reducers doing nothing (mode 1) or only waiting for every tile (mode 2), timed
            // interleaved with the whole op and the GEMM alone (overlap::gemm_rs_diagnostic; results wrong by design).
            const auto pull = [&](int mode) {
                return std::function<void(cudaStream_t)>([&, mode](cudaStream_t st) {
                    loom::overlap::gemm_rs_diagnostic(
                        w, A, B, C, st, with_scales(loom::GemmRsOptions{0, nullptr, loom::RsAlgo::FusedPull}), mode);
                });
            };
            const std::vector<double> t4 = meds({pull(0), pull(1), pull(2), gemm_fn}, s, w, args.iters);
            row["pull_diag_interleaved_us"] = {
                {"pull", t4[0]}, {"no_reducers", t4[1]}, {"waits_only", t4[2]}, {"gemm", t4[3]}};
        }
        row["gemm_us"] = t_gemm;
        row["reduce_scatter_us"] = t_comm;
        loom::bench::LtGemm lt(M, N, k_loc, lt_type(in), /*fast_accum=*/in == DType::F8E4M3);
        row["cublaslt_us"] = med([&](cudaStream_t st) { lt.run(a, b, partial, st); }, s, w, args.iters);
        if (have_nvshmem) {
            void* np = loom::nvshmem::malloc(M * N * 2);
            void* no = loom::nvshmem::malloc(rows * N * 2);
            row["nvshmem_reducescatter_us"] = med(
                [&](cudaStream_t st) { loom::nvshmem::sum_reducescatter_on_stream(DType::BF16, no, np, rows * N, st); },
                s, w, args.iters);
            const std::function<void(cudaStream_t)> nv_seq = [&](cudaStream_t st) {
                lt.run(a, b, np, st);
                loom::nvshmem::sum_reducescatter_on_stream(DType::BF16, no, np, rows * N, st);
            };
            baselines["cublaslt_then_nvshmem_reducescatter"] = med(nv_seq, s, w, args.iters);
            if (ok) paired(row, "cublaslt_then_nvshmem_reducescatter", rs_auto, nv_seq, s, w, args.iters);
            LOOM_CHECK_CUDA(cudaDeviceSynchronize());
            loom::nvshmem::free(no);
            loom::nvshmem::free(np);
        }
        if (nccl.ok()) {
            row["nccl_reducescatter_us"] =
                med([&](cudaStream_t st) { nccl.reduce_scatter(partial, c_ref, rows * N, DType::BF16, st); }, s, w,
                    args.iters);
            const std::function<void(cudaStream_t)> nccl_seq = [&](cudaStream_t st) {
                lt.run(a, b, partial, st);
                nccl.reduce_scatter(partial, c_ref, rows * N, DType::BF16, st);
            };
            baselines["cublaslt_then_nccl_reducescatter"] = med(nccl_seq, s, w, args.iters);
            if (ok) paired(row, "cublaslt_then_nccl_reducescatter", rs_auto, nccl_seq, s, w, args.iters);
        }
        add_torch(torch, "gemm_rs", M, N, K, W, row, baselines);
        bridge_torch(row, baselines, "cublaslt_then_nccl_reducescatter");
        if (ok) {
            row["loom_us"] = t;
            row["overlap_efficiency_alone"] = t / std::max(t_comm, t_gemm);
            row["overlap_efficiency"] = row["interleaved"]["efficiency"];
        }
        row["baselines"] = baselines;
        report.add_row(row);
        table.row(row);
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
        w.barrier();
        w.free(partial);
        cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(c_ref);
    }
    write_report(report, args, op_name("gemm_rs", in), w);
}

void bench_ar(loom::World& w, const Args& args, bool have_nvshmem, loom::bench::NcclBaseline& nccl, cudaStream_t s) {
    const int W = w.world_size();
    std::vector<std::pair<int64_t, int64_t>> shapes = {{5120, 25600}, {5120, 8192}};
    keep_shapes(shapes, args.shapes);
    const std::vector<int64_t> ms = !args.ar_ms.empty() ? args.ar_ms
                                    : args.quick        ? std::vector<int64_t>{16, 2048}
                                                        : std::vector<int64_t>{1, 16, 128, 512, 2048, 8192, 16384};
    loom::bench::Report report(op_name("gemm_ar", args.in), W, args.argc, args.argv);
    const OverlapTable table("gemm_ar",
                             baseline_columns("loom_gemm_then_all_reduce", "cublaslt_then_nvshmem_allreduce",
                                              "cublaslt_then_nccl_allreduce", have_nvshmem, nccl.ok(), false),
                             w);
    const DType in = args.in;
    const int64_t ies = static_cast<int64_t>(loom::dtype_size(in));
    for (auto [N, K] : shapes) {
        for (int64_t M : ms) {
            const int64_t k_loc = K / W;
            void *a, *b, *c, *c_seq;
            LOOM_CHECK_CUDA(cudaMalloc(&a, M * k_loc * ies));
            LOOM_CHECK_CUDA(cudaMalloc(&b, N * k_loc * ies));
            LOOM_CHECK_CUDA(cudaMalloc(&c, M * N * 2));
            LOOM_CHECK_CUDA(cudaMalloc(&c_seq, M * N * 2));
            void* partial = w.alloc_bytes(M * N * 2);
            void* c_ref = w.alloc_bytes(M * N * 2);
            fill_input(a, M * k_loc, 7 + w.rank(), in);
            fill_input(b, N * k_loc, 300 + w.rank(), in);
            const MatrixView A{a, in, M, k_loc, 0}, B{b, in, N, k_loc, 0}, C{c, DType::BF16, M, N, 0};
            const std::size_t count = static_cast<std::size_t>(M * N);
            const std::function<void(cudaStream_t)> gemm_fn = [&](cudaStream_t st) {
                loom::gemm(A, B, {partial, DType::BF16, M, N, 0}, {}, st);
            };
            // The sequence's all_reduce into a C of the op's kind (cudaMalloc'd, outside the symmetric heap): into a
            // plain out the all_reduce's two-shot stages its shards (3 units of C of traffic against 2 into a
            // symmetric out), and the op pays that too. The symmetric-out sequence (seq_sym) computes the reference and
            // is timed in plain_c_interleaved.
            const std::function<void(cudaStream_t)> comm_fn = [&](cudaStream_t st) {
                loom::all_reduce(w, {partial, DType::BF16, count}, {c_seq, DType::BF16, count}, st);
            };
            const std::function<void(cudaStream_t)> seq_loom = [&](cudaStream_t st) {
                gemm_fn(st);
                comm_fn(st);
            };
            const std::function<void(cudaStream_t)> seq_sym = [&](cudaStream_t st) {
                gemm_fn(st);
                loom::all_reduce(w, {partial, DType::BF16, count}, {c_ref, DType::BF16, count}, st);
            };
            const std::function<void(cudaStream_t)> op = [&](cudaStream_t st) {
                loom::gemm_ar(w, A, B, C, st, with_scales(loom::GemmArOptions{}));
            };
            seq_sym(s);
            LOOM_CHECK_CUDA(cudaMemset(c, 0xFF, M * N * 2));
            op(s);
            LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
            nlohmann::json row = shape_row(M, N, K, "K_loc", k_loc, W, in);
            if (g_scales != nullptr) row["scaled"] = true;
            if (g_align_hold_us > 0) row["align_hold_us"] = g_align_hold_us;
            const double diff = max_scaled_diff(c, c_ref, M * N);
            row["check"] = diff;
            const bool ok =
                agreed_ok(w, diff, 2e-2, fmt::format("gemm_ar M={} N={} K={} vs gemm + all_reduce", M, N, K));
            const double t_gemm = med(gemm_fn, s, w, args.iters), t_comm = med(comm_fn, s, w, args.iters);
            nlohmann::json baselines{{"loom_gemm_then_all_reduce", med(seq_loom, s, w, args.iters)}};
            loom::bench::LtGemm lt(M, N, k_loc, lt_type(in), /*fast_accum=*/in == DType::F8E4M3);
            row["cublaslt_us"] = med([&](cudaStream_t st) { lt.run(a, b, partial, st); }, s, w, args.iters);
            if (have_nvshmem) {
                void* np = loom::nvshmem::malloc(M * N * 2);
                void* no = loom::nvshmem::malloc(M * N * 2);
                row["nvshmem_allreduce_us"] =
                    med([&](cudaStream_t st) { loom::nvshmem::sum_reduce_on_stream(DType::BF16, no, np, count, st); },
                        s, w, args.iters);
                const std::function<void(cudaStream_t)> nv_seq = [&](cudaStream_t st) {
                    lt.run(a, b, np, st);
                    loom::nvshmem::sum_reduce_on_stream(DType::BF16, no, np, count, st);
                };
                baselines["cublaslt_then_nvshmem_allreduce"] = med(nv_seq, s, w, args.iters);
                if (ok) paired(row, "cublaslt_then_nvshmem_allreduce", op, nv_seq, s, w, args.iters);
                LOOM_CHECK_CUDA(cudaDeviceSynchronize());
                loom::nvshmem::free(no);
                loom::nvshmem::free(np);
            }
            if (nccl.ok()) {
                row["nccl_allreduce_us"] =
                    med([&](cudaStream_t st) { nccl.all_reduce(partial, c_ref, count, DType::BF16, st); }, s, w,
                        args.iters);
                const std::function<void(cudaStream_t)> nccl_seq = [&](cudaStream_t st) {
                    lt.run(a, b, partial, st);
                    nccl.all_reduce(partial, c_ref, count, DType::BF16, st);
                };
                baselines["cublaslt_then_nccl_allreduce"] = med(nccl_seq, s, w, args.iters);
                if (ok) paired(row, "cublaslt_then_nccl_allreduce", op, nccl_seq, s, w, args.iters);
            }
            // Each algorithm on its own, the reduce kernel with each reduction too, checked against the sequence.
            struct ArVariant {
                loom::ArAlgo algo;
                loom::ArShots shots;
            };
            for (const ArVariant v : {ArVariant{loom::ArAlgo::FusedEpilogue, loom::ArShots::Auto},
                                      ArVariant{loom::ArAlgo::ReduceKernel, loom::ArShots::Auto},
                                      ArVariant{loom::ArAlgo::ReduceKernel, loom::ArShots::OneShot},
                                      ArVariant{loom::ArAlgo::ReduceKernel, loom::ArShots::TwoShot},
                                      ArVariant{loom::ArAlgo::Sequential, loom::ArShots::Auto}}) {
                loom::GemmArOptions o;
                o.algo = v.algo;
                o.shots = v.shots;
                const std::string name = v.shots == loom::ArShots::Auto
                                             ? std::string(loom::to_string(v.algo))
                                             : fmt::format("{}-{}", loom::to_string(v.algo), loom::to_string(v.shots));
                try {
                    LOOM_CHECK_CUDA(cudaMemset(c, 0xFF, M * N * 2));
                    loom::gemm_ar(w, A, B, C, s, with_scales(o));
                    LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
                    const double d = max_scaled_diff(c, c_ref, M * N);
                    row["check_" + name] = d;
                    if (agreed_ok(w, d, 2e-2, fmt::format("gemm_ar ({}) M={} N={} K={}", name, M, N, K)))
                        row["overlap_" + name + "_us"] = med(
                            [&](cudaStream_t st) { loom::gemm_ar(w, A, B, C, st, with_scales(o)); }, s, w, args.iters);
                } catch (const loom::Error& e) {
                    row["error_" + name] = e.what();
                }
            }
            if (ok && !args.ar_comm_sms.empty()) {  // the reduce kernel's SM budget, for the plan's heuristic
                nlohmann::json sweep;
                for (int p : args.ar_comm_sms) {
                    loom::GemmArOptions o;
                    o.comm_sms = p;
                    o.algo = loom::ArAlgo::ReduceKernel;  // the only algorithm with reduce blocks
                    LOOM_CHECK_CUDA(cudaMemset(c, 0xFF, M * N * 2));
                    loom::gemm_ar(w, A, B, C, s, with_scales(o));
                    LOOM_CHECK_CUDA(cudaStreamSynchronize(s));
                    const bool good = agreed_ok(w, max_scaled_diff(c, c_ref, M * N), 2e-2,
                                                fmt::format("gemm_ar comm_sms {} M={} N={} K={}", p, M, N, K));
                    sweep[std::to_string(p)] =
                        good ? med([&](cudaStream_t st) { loom::gemm_ar(w, A, B, C, st, with_scales(o)); }, s, w,
                                   args.iters)
                             : NAN;
                }
                row["comm_sms_sweep_us"] = sweep;
            }
            row["gemm_us"] = t_gemm;
            row["all_reduce_us"] = t_comm;
            {
                // gemm_ar's plan and cost model at this shape (what Auto runs without a tuned pick), to set beside
                // the times above: the model's estimates for the sequence and for each reduction.
                const loom::overlap::DeviceFacts& dev = loom::overlap::device_facts(w, "gemm_ar");
                const int sms = loom::overlap::plan_sms(dev, 0, "gemm_ar");
                const loom::OverlapPlan plan = loom::gemm_ar_plan(M, N, k_loc, W, 0, dev.arch, sms, loom::ArAlgo::Auto,
                                                                  2, in, loom::ArShots::Auto, dev.ranks_per_gpu);
                const loom::GemmConfig tile = loom::overlap::gemm_config(M, N, k_loc, dev.arch, sms, false, in);
                nlohmann::json model{{"plan", plan.str()}, {"sms", sms}};
                for (bool two : {false, true}) {
                    const loom::ArCost c =
                        loom::gemm_ar_cost(M, N, k_loc, W, sms, dev.ranks_per_gpu, 2, in, tile, two, 0);
                    model["sequence_us"] = c.sequence_us;
                    model[two ? "two_shot" : "one_shot"] = {{"overlap_us", c.overlap_us},
                                                            {"comm_blocks", c.comm_blocks}};
                }
                row["ar_model"] = model;
            }
            if (ok) {
                // What a C outside the symmetric heap costs (the bench's C is cudaMalloc'd, as is the timed sequence's
                // out): the op into a symmetric C and the sequence into the symmetric c_ref, interleaved with the op
                // and the sequence into a plain out.
                void* c_sym = w.alloc_bytes(M * N * 2);
                const MatrixView Csym{c_sym, DType::BF16, M, N, 0};
                const std::vector<double> pc = meds(
                    {op, [&](cudaStream_t st) { loom::gemm_ar(w, A, B, Csym, st, with_scales(loom::GemmArOptions{})); },
                     seq_sym, seq_loom},
                    s, w, args.iters);
                row["plain_c_interleaved"] = {{"op_us", pc[0]},
                                              {"op_symmetric_c_us", pc[1]},
                                              {"sequence_us", pc[2]},
                                              {"sequence_plain_out_us", pc[3]}};
                LOOM_CHECK_CUDA(cudaDeviceSynchronize());
                w.free(c_sym);
                const double t = med(op, s, w, args.iters);
                row["interleaved"] = interleaved_block(meds({op, gemm_fn, comm_fn, seq_loom}, s, w, args.iters));
                if (args.host_us) row["host_enqueue_us"] = host_block({op, gemm_fn, comm_fn, seq_loom}, s, w);
                row["loom_us"] = t;
                row["overlap_efficiency_alone"] = t / std::max(t_comm, t_gemm);
                row["overlap_efficiency"] = row["interleaved"]["efficiency"];
            }
            row["baselines"] = baselines;
            report.add_row(row);
            table.row(row);
            LOOM_CHECK_CUDA(cudaDeviceSynchronize());
            w.barrier();
            w.free(c_ref);
            w.free(partial);
            cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(c_seq);
        }
    }
    write_report(report, args, op_name("gemm_ar", in), w);
}

}  // namespace

int main(int argc, char** argv) {
    Args args;
    args.argc = argc;
    args.argv = argv;
    bool no_nvshmem = false, no_nccl = false;
    CLI::App app{"bench-overlap: ag_gemm / gemm_rs / gemm_ar against the sequential and library baselines"};
    app.add_option("--json,--out", args.out,
                   "also write the rows as JSON: DIR/ag_gemm.json, gemm_rs.json, gemm_ar.json");
    app.add_flag("--quick", args.quick, "two shapes per op");
    app.add_option("--iters", args.iters, "timed runs per point")->capture_default_str()->check(CLI::PositiveNumber);
    app.add_flag("--no-nvshmem", no_nvshmem, "skip the NVSHMEM baselines");
    bool no_nvshmem_rs = false;
    app.add_flag(
        "--no-nvshmem-rs", no_nvshmem_rs,
        "skip NVSHMEM's reducescatter baseline only (4 PEs sharing one H200 took > 100 s for one 128 MiB call)");
    bool no_align = false;
    std::string ops = "all";
    app.add_option("--ops", ops, "which ops to time")
        ->check(CLI::IsMember({"all", "ag", "rs", "ar"}))
        ->capture_default_str();
    app.add_flag("--trace", g_trace, "print every timed point's median and wall time as it finishes (rank 0)");
    app.add_flag("--no-align", no_align, "no device barrier before each timed run (the host barrier stays)");
    app.add_flag(
        "--host-us", args.host_us,
        "row host_enqueue_us: host time to enqueue one call of the op, the GEMM, the collective and the sequence");
    app.add_option("--align-hold-us", g_align_hold_us,
                   "the device barrier keeps the stream this long after the ranks met, so that the timed ops are "
                   "enqueued before their start event runs: the timed region then holds GPU time only, not the "
                   "host's enqueue (rows carry align_hold_us)")
        ->check(CLI::NonNegativeNumber);
    app.add_flag("--no-nccl", no_nccl, "skip the NCCL baselines (absent anyway when ranks share a GPU)");
    app.add_option("--rs-comm-sms", args.rs_comm_sms, "also time gemm_rs at each of these comm_sms (e.g. 4,8,16,24)")
        ->delimiter(',');
    app.add_option("--ar-m", args.ar_ms, "gemm_ar at these M (e.g. 1,128,4096,16384)")
        ->delimiter(',')
        ->check(CLI::PositiveNumber);
    app.add_option("--ar-comm-sms", args.ar_comm_sms, "also time gemm_ar at each of these comm_sms (e.g. 2,4,8,16)")
        ->delimiter(',');
    app.add_flag("--rs-fused-diag", args.rs_fused_diag,
                 "also time the fused gemm_rs with its peer pushes, its waits + combine, or both left out "
                 "(its kernels built with LOOM_DIAG_RS_FUSED_SKIP=1|2|3; timing only, results wrong by design)");
    app.add_option("--rs-ce-chunk", args.rs_ce_chunk_kib,
                   "also time the fused gemm_rs with the copy-engine transport at these chunk sizes in KiB (e.g. "
                   "1024,2048,4096; ranks on distinct GPUs only)")
        ->delimiter(',');
    app.add_option("--rs-fused-bn", args.rs_fused_bn,
                   "also time the fused gemm_rs at each of these BLOCK_N (e.g. 128,192,256)")
        ->delimiter(',');
    bool scaled = false;
    app.add_flag("--scaled", scaled,
                 "every op call passes alpha 0.5 and device scales 2 and 1 (product 1): times the scaled kernels "
                 "against the same baselines (rows carry scaled)");
    std::string dtype = "bf16";
    app.add_option("--dtype", dtype,
                   "A and B: bf16, or f8e4m3 (C and the partial products bf16; cuBLASLt in its fp8 fast-accumulation "
                   "mode; rows go to <op>_fp8.json)")
        ->check(CLI::IsMember({"bf16", "f8e4m3"}))
        ->capture_default_str();
    std::string rs_algo = "auto";
    app.add_option("--rs-algo", rs_algo, "the gemm_rs algorithm timed as the op (a)")
        ->check(CLI::IsMember({"auto", "fused-epilogue", "scatter-reduce", "sequential", "fused-pull"}))
        ->capture_default_str();
    app.add_option("--rs-k-split", args.rs_k_split,
                   "gemm_rs with K_loc = K / this instead of K / W: e.g. 2 on one rank times the W = 2 GEMMs with "
                   "nothing to send, the fused epilogue's own cost")
        ->check(CLI::PositiveNumber);
    app.add_option("--ag-n-split", args.ag_n_split,
                   "ag_gemm with N_loc = N / this instead of N / W: e.g. 2 on one rank times the W = 2 GEMM with "
                   "nothing to gather, the hooked GEMM's own cost")
        ->check(CLI::PositiveNumber);
    app.add_option("--shape", args.shapes, "only these shapes of each op: N,K[,N,K...] (e.g. 4608,36864)")
        ->delimiter(',');
    app.add_option("--m", args.ms, "ag_gemm / gemm_rs at each of these M (default 8192; a multiple of 8 x W)")
        ->delimiter(',')
        ->check(CLI::PositiveNumber);
    app.add_option("--torch", args.torch, "bench/torch_async_tp.py's torch_tp.json: PyTorch baselines to fold in")
        ->check(CLI::ExistingFile);
    loom::bench::parse_or_exit(app, argc, argv);
    for (loom::RsAlgo a : {loom::RsAlgo::Auto, loom::RsAlgo::FusedEpilogue, loom::RsAlgo::ScatterReduce,
                           loom::RsAlgo::Sequential, loom::RsAlgo::FusedPull})
        if (rs_algo == loom::to_string(a)) args.rs_algo = a;
    if (dtype == "f8e4m3") args.in = DType::F8E4M3;
    args.nvshmem = !no_nvshmem;
    args.nvshmem_rs = !no_nvshmem_rs;
    if (args.shapes.size() % 2 != 0) {
        std::fprintf(stderr, "bench-overlap: expected --shape as N,K pairs, given %zu numbers\n", args.shapes.size());
        return 2;
    }
    args.nccl = !no_nccl;
    args.align = g_align = !no_align;
    nlohmann::json torch;
    if (!args.torch.empty()) torch = nlohmann::json::parse(std::ifstream(args.torch));
    if (!loom::driver::available()) {
        std::printf("no GPU: %s\n", loom::driver::unavailable_reason().c_str());
        return 1;
    }
    try {
        // Every algorithm keeps its own symmetric state (the sequences' [M, N] parity halves alone are 256 MiB at
        // N = 8192), and all of them are timed in one process: 1 GiB ran out at the largest gemm_rs shapes.
        loom::WorldOptions wopts;
        wopts.symmetric_size = std::max(loom::settings().symmetric_size, std::size_t{4} << 30);
        auto w = loom::World::from_env(wopts);
        cudaStream_t s;
        LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        bool have_nvshmem = false;
        if (args.nvshmem) {
            try {
                loom::nvshmem::init(w);
                have_nvshmem = true;
            } catch (const std::exception& e) {
                if (w.rank() == 0) std::printf("NVSHMEM baseline skipped: %s\n", e.what());
            }
        }
        loom::bench::NcclBaseline nccl(w, args.nccl, loom::collective_topology(w).shared_gpu);
        float* scales = nullptr;
        if (scaled) {
            const float v[2] = {2.f, 1.f};
            LOOM_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&scales), sizeof v));
            LOOM_CHECK_CUDA(cudaMemcpy(scales, v, sizeof v, cudaMemcpyHostToDevice));
            g_scales = scales;
        }
        if (w.rank() == 0 && !nccl.note().empty()) std::printf("%s\n", nccl.note().c_str());
        if (ops == "all" || ops == "ag") bench_ag(w, args, have_nvshmem, nccl, torch, s);
        if (ops == "all" || ops == "rs") bench_rs(w, args, have_nvshmem && args.nvshmem_rs, nccl, torch, s);
        if (ops == "all" || ops == "ar") bench_ar(w, args, have_nvshmem, nccl, s);
        if (have_nvshmem) loom::nvshmem::finalize();
        loom::release_overlap_state(w);
        if (scales != nullptr) cudaFree(scales);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench-overlap: %s\n", e.what());
        return 1;
    }
}
