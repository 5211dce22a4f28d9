#include "coll_table.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "coll_data.hpp"
#include "harness.hpp"
#include "loom/runtime/error.hpp"
#include "loom/version.hpp"
#include "table.hpp"

namespace loom::bench {
namespace {

// The run's seed: the given one, else rank 0's clock, the same on every rank.
std::uint64_t agreed_seed(World& w, std::uint64_t given) {
    if (given != 0) return given;
    const auto now = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    Bytes mine(sizeof now);
    std::memcpy(mine.data(), &now, sizeof now);
    const auto all = w.store().all_gather("bench-coll/seed", mine);
    std::uint64_t seed = 0;
    std::memcpy(&seed, all[0].data(), sizeof seed);
    return seed | 1;  // never 0
}

// "#  Rank  0 Pid  1234 on host device  0 [0000:1b:00.0] NVIDIA H200", every rank's, on rank 0.
void print_devices(World& w) {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    int dev = 0;
    LOOM_CHECK_CUDA(cudaGetDevice(&dev));
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, dev) != cudaSuccess) {
        cudaGetLastError();
        std::strcpy(bus, "?");
    }
    const std::string line = fmt::format("#  Rank {:2} Pid {:6} on {:>10} device {:2} [{}] {}", w.rank(),
                                         static_cast<long>(getpid()), host, dev, bus, gpu_name());
    const auto all = w.store().all_gather("bench-coll/devices", Bytes(line.begin(), line.end()));
    if (w.rank() != 0) return;
    std::printf("#\n# Using devices\n");
    for (const auto& b : all) std::printf("%s\n", std::string(b.begin(), b.end()).c_str());
    std::printf("#\n");
}

void call(World& w, CollKind k, const BufferView& in, const BufferView& out, cudaStream_t s, const CollOptions& o) {
    switch (k) {
        case CollKind::AllGather:
            all_gather(w, in, out, s, o);
            break;
        case CollKind::ReduceScatter:
            reduce_scatter(w, in, out, s, o);
            break;
        case CollKind::AllReduce:
            all_reduce(w, in, out, s, o);
            break;
        default:
            all_to_all(w, in, out, s, o);
            break;
    }
}

long long sum_over_ranks(World& w, long long mine) {
    Bytes b(sizeof mine);
    std::memcpy(b.data(), &mine, sizeof mine);
    long long total = 0;
    for (const auto& r : w.store().all_gather("bench-coll/wrong", b)) {
        long long v = 0;
        std::memcpy(&v, r.data(), sizeof v);
        total += v;
    }
    return total;
}

// One size of one (collective, type, op): where in and out lie for a placement.
struct Placement {
    char* in;
    char* out;
    bool in_place;
};

class SizeRun {
  public:
    SizeRun(World& w, const TableRun& run, const CollCase& c, cudaStream_t s) : w_(w), run_(run), c_(c), s_(s) {
        es_ = static_cast<std::size_t>(dtype_size(c.dtype));
        host_in_.resize(c.in_count() * es_);
        fill_input(c, w.rank(), host_in_.data());
        opts_ = CollOptions{run.algo, run.path, c.op};
    }

    // Loom's in-place form of the collective on symmetric buffers in / out, or null in when it has none.
    Placement in_place(char* in, char* out) const {
        const std::size_t mine = static_cast<std::size_t>(w_.rank()) * c_.chunk * es_;
        switch (c_.kind) {
            case CollKind::AllReduce:
                return {in, in, true};
            case CollKind::AllGather:
                return {out + mine, out, true};
            case CollKind::ReduceScatter:
                return {in, in + mine, true};
            default:
                return {nullptr, nullptr, true};
        }
    }

    NcclCell measure(const Placement& p, double factor, std::size_t bytes) {
        NcclCell cell;
        if (p.in == nullptr) return cell;
        const BufferView in{p.in, c_.dtype, c_.in_count()}, out{p.out, c_.dtype, c_.out_count()};
        prepare(p);
        call(w_, c_.kind, in, out, s_, opts_);  // checked, or at least never timed (state creation, JIT)
        LOOM_CHECK_CUDA(cudaStreamSynchronize(s_));
        if (run_.args.check) cell.wrong = sum_over_ranks(w_, check(p));
        TimeOptions t;
        t.warmup = run_.args.warmup;
        t.iters = run_.args.runs;
        t.flush_l2 = false;  // nccl-tests' way: back-to-back calls on warm caches
        t.world = &w_;
        t.align = [this](cudaStream_t st) { barrier_on_stream(w_, st, run_.align_hold_us); };
        t.reps = run_.args.iters;
        const Timing timing = time_op([&](cudaStream_t st) { call(w_, c_.kind, in, out, st, opts_); }, s_, t);
        cell.ran = true;
        cell.us = timing.median_us;
        cell.algbw = algbw_gbps(static_cast<double>(bytes), cell.us);
        cell.busbw = cell.algbw * factor;
        return cell;
    }

  private:
    // The input written, the output poisoned where it does not hold the input; every rank ready before any call.
    void prepare(const Placement& p) {
        const std::size_t out_bytes = c_.out_count() * es_;
        const bool overlaps = p.in_place && c_.kind != CollKind::AllGather;  // out lies inside in
        if (!overlaps) LOOM_CHECK_CUDA(cudaMemsetAsync(p.out, 0xff, out_bytes, s_));
        LOOM_CHECK_CUDA(cudaMemcpyAsync(p.in, host_in_.data(), host_in_.size(), cudaMemcpyHostToDevice, s_));
        LOOM_CHECK_CUDA(cudaStreamSynchronize(s_));
        w_.barrier("bench-coll/prepared");
    }

    long long check(const Placement& p) {
        std::vector<char> got(c_.out_count() * es_);
        LOOM_CHECK_CUDA(cudaMemcpy(got.data(), p.out, got.size(), cudaMemcpyDeviceToHost));
        Mismatch first;
        const std::size_t wrong = count_wrong(c_, w_.rank(), got.data(), &first);
        if (wrong > 0) {
            std::fprintf(stderr,
                         "bench-collectives: rank %d %s %s %s %zu B %s: %zu of %zu elements wrong; element %zu is %s, "
                         "expected %s\n",
                         w_.rank(), to_string(c_.kind), nccl_type_name(c_.dtype), nccl_op_name(c_.op),
                         c_.out_count() * es_, p.in_place ? "in-place" : "out-of-place", wrong, c_.out_count(),
                         first.index, first.got.c_str(), first.expected.c_str());
            std::fflush(stderr);
        }
        return static_cast<long long>(wrong);
    }

    World& w_;
    const TableRun& run_;
    CollCase c_;
    cudaStream_t s_;
    std::size_t es_ = 0;
    std::vector<char> host_in_;
    CollOptions opts_;
};

// One collective's table: every (type, op) at every size. Returns #wrong; adds to busbw_sum / cells.
long long run_table(World& w, const TableRun& run, CollKind k, std::uint64_t seed, char* in, char* out,
                    std::size_t buf_bytes, cudaStream_t s) {
    const int W = w.world_size();
    const double factor = bus_factor(k, W);
    const bool root = w.rank() == 0;
    if (root) {
        std::printf("# Collective %s, Loom's %s/%s\n", to_string(k), to_string(run.algo), to_string(run.path));
        std::printf("%s", nccl_header().c_str());
    }
    long long wrong = 0;
    double busbw_sum = 0;
    int cells = 0;
    for (const TypeOp& to : type_ops(k, run.args)) {
        std::size_t last = 0;
        for (std::size_t size : size_series(run.args.min_bytes, run.args.max_bytes, run.args.step_factor)) {
            const CollSize cs = coll_size(k, size, to.dtype, W);
            if (cs.count == 0 || cs.bytes == last) continue;  // too small for one element per chunk, or repeated
            last = cs.bytes;
            LOOM_CHECK(cs.bytes <= buf_bytes, "bench-collectives: {} bytes exceed the {}-byte buffers", cs.bytes,
                       buf_bytes);
            SizeRun sr(w, run, CollCase{k, to.dtype, to.op, W, cs.chunk, seed}, s);
            NcclRow row{cs.bytes, cs.count, nccl_type_name(to.dtype), to.op_name, -1, {}, {}};
            row.out_of_place = sr.measure({in, out, false}, factor, cs.bytes);
            row.in_place = sr.measure(sr.in_place(in, out), factor, cs.bytes);
            for (const NcclCell* c : {&row.out_of_place, &row.in_place}) {
                if (!c->ran) continue;
                busbw_sum += c->busbw;
                ++cells;
                wrong += std::max(0ll, c->wrong);
            }
            if (root) {
                std::printf("%s", nccl_row(row).c_str());
                std::fflush(stdout);
            }
        }
    }
    if (root) std::printf("%s", nccl_footer(wrong, cells ? busbw_sum / cells : 0.0).c_str());
    return wrong;
}

}  // namespace

long long run_tables(World& w, const TableRun& run, void* in, void* out, std::size_t buf_bytes, cudaStream_t stream) {
    const std::uint64_t seed = agreed_seed(w, run.args.seed);
    if (w.rank() == 0)
        std::printf(
            "# bench-collectives (Loom %s): nranks %d minBytes %zu maxBytes %zu step: %d(factor) warmup iters: %d "
            "iters: %d runs: %d validation: %d seed: %llu\n",
            loom::version(), w.world_size(), run.args.min_bytes, run.args.max_bytes, run.args.step_factor,
            run.args.warmup, run.args.iters, run.args.runs, run.args.check, static_cast<unsigned long long>(seed));
    print_devices(w);
    long long wrong = 0;
    for (CollKind k : run.kinds)
        wrong += run_table(w, run, k, seed, static_cast<char*>(in), static_cast<char*>(out), buf_bytes, stream);
    return wrong;
}

}  // namespace loom::bench
