// loom::ag_gemm: AllGather+GEMM (kernels/overlap/ag_gemm.cuh; docs/overlap.md). The entry validates the call, chooses
// the producer (plan.cpp) and dispatches to it: copy_engine.cpp, sm_push.cpp, direct.cpp, sequential.cpp, across
// nodes across_nodes.cpp or sequential.cpp (and gathered_copy.cpp for a gathered buffer outside the symmetric heap). A
// call that leaves every choice to Loom runs the options the autotuner decided for its shape (common/tune.hpp).
#include "ops/overlap/ag_gemm/ag_gemm.hpp"

#include <cstdint>
#include <utility>

#include "loom/ops/overlap.hpp"
#include "loom/runtime/error.hpp"
#include "ops/gemm/gemm_internal.hpp"
#include "runtime/call_agreement.hpp"
#include "runtime/nvtx_range.hpp"
#include "runtime/pointer_check.hpp"

namespace loom {
namespace {

using overlap::AgCall;

// The optional gather buffer, whole, in memory this rank's GPU may use, and apart from A, B and C (the gather writes
// it while the GEMM reads A and B and writes C). Its shape and heap placement: plan.cpp.
void check_gathered(World& world, const AgGemmOptions& o, const MatrixView& a, const MatrixView& b,
                    const MatrixView& c) {
    const MatrixView& g = o.gathered;
    if (g.data == nullptr) return;
    const char* which = "AgGemmOptions::gathered";
    const std::size_t bytes = detail::matrix_bytes("ag_gemm", which, g);
    detail::check_memory(&world, world.device(), "ag_gemm", which, g.data, bytes);
    const auto lo = reinterpret_cast<std::uintptr_t>(g.data), hi = lo + bytes;
    for (const auto& [name, m] : {std::pair<const char*, const MatrixView*>{"A", &a}, {"B", &b}, {"C", &c}}) {
        const auto mlo = reinterpret_cast<std::uintptr_t>(m->data);
        const auto mhi = mlo + detail::matrix_bytes("ag_gemm", name, *m);
        LOOM_CHECK(hi <= mlo || mhi <= lo,
                   "ag_gemm: expected {} apart from {}, given overlapping ranges [{}, +{}) and [{}, +{})", which, name,
                   g.data, bytes, m->data, mhi - mlo);
    }
}

detail::CallSignature signature(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c,
                                const AgGemmOptions& o) {
    detail::CallSignature s = overlap::signature(world, "ag_gemm", a, b, c);
    s.add("AgGemmOptions::producer", to_string(o.producer))
        .add("AgGemmOptions::sm_path", to_string(o.sm_path))
        .add("AgGemmOptions::comm_sms", o.comm_sms)
        .add("AgGemmOptions::gathered", detail::placement_field(world, o.gathered.data))
        .add("AgGemmOptions::config", overlap::config_field(o.config))
        .add("AgGemmOptions::num_sms", o.num_sms);
    return s;
}

// The call's inputs checked, its facts gathered (the World's DeviceFacts: created on the first call).
AgCall validate(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
                const AgGemmOptions& o, bool captured) {
    constexpr const char* op = "ag_gemm";
    AgCall x;
    overlap::begin_call(x, op, world, a, b, c, stream, o, captured);
    x.me = world.local_rank();
    LOOM_CHECK(a.stride() == a.cols, "{}: expected this rank's A shard dense (ld == K = {}), given ld {}", op, a.cols,
               a.stride());
    x.R = a.rows;
    x.M = x.R * x.W;
    x.K = a.cols;
    x.N = b.rows;
    x.chunk_bytes = static_cast<std::size_t>(x.R * x.K) * dtype_size(a.dtype);
    LOOM_CHECK(c.rows == x.M && c.cols == x.N,
               "{}: expected C of [M, N_loc] = [{} x {} rows, {}] (world x A's rows, B's rows), given {} x {}", op, x.W,
               x.R, x.N, c.rows, c.cols);
    LOOM_CHECK(x.M <= INT32_MAX, "{}: expected M to fit in int32, given {}", op, x.M);
    LOOM_CHECK(o.comm_sms >= 0, "{}: expected comm_sms >= 0, given {}", op, o.comm_sms);
    check_gathered(world, o, a, b, c);
    return x;
}

// The op with the options as given.
void as_given(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
              const AgGemmOptions& o) {
    // Only the sequential producer replays in a graph: the one asked for, or Auto's choice for the shapes (one wave).
    const bool captured = overlap::check_capture(
        stream, "ag_gemm", o.producer == AgProducer::Sequential || o.producer == AgProducer::Auto);
    AgCall x = validate(world, a, b, c, stream, o, captured);
    overlap::choose_producer(x, o);  // refuses a producer that cannot replay under capture
    if (x.producer == AgProducer::Sequential) {
        overlap::ag_gemm_sequential(x);
        if (x.gathered_out) overlap::ag_gemm_copy_gathered(x);
        return;
    }
    if (x.nodes > 1) {  // the copy-engine producer across nodes: the two-level form
        overlap::ag_gemm_across_nodes(x, o);
        if (x.gathered_out) overlap::ag_gemm_copy_gathered(x);
        return;
    }
    const kernels::overlap::AgGemmHookArgs h = overlap::prepare_overlapped(x, o);
    switch (x.producer) {
        case AgProducer::Direct:
            overlap::ag_gemm_direct(x, h);
            break;
        case AgProducer::CopyEngine:
            overlap::ag_gemm_copy_engine(x, h);
            break;
        default:
            overlap::ag_gemm_sm_push(x, h, o.sm_path != DataPath::LdSt);
            break;
    }
    if (x.gathered_out) overlap::ag_gemm_copy_gathered(x);
}

}  // namespace

void ag_gemm(World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c, cudaStream_t stream,
             const AgGemmOptions& o) {
    const loom::detail::NvtxRange nvtx("loom::ag_gemm M={} N={} K={}", c.rows, c.cols, a.cols);
    const detail::AgreedCall agreed(
        world, [&] { return signature(world, a, b, c, o); },
        [&] {
            overlap::check_args(world, "ag_gemm", a, b, c, o);
            check_gathered(world, o, a, b, c);
        });
    const bool choices_left = o.producer == AgProducer::Auto && o.sm_path == DataPath::Auto && o.comm_sms == 0 &&
                              o.config == nullptr && o.gathered.data == nullptr;
    if (!choices_left) return as_given(world, a, b, c, stream, o);
    overlap::run_tuned<AgGemmOptions>(
        world, "ag_gemm", a, b, c, stream, o.num_sms,
        [&](const overlap::DeviceFacts& dev, int sms) { return overlap::ag_gemm_candidates(world, a, b, dev, sms); },
        [&](const AgGemmOptions& x, const MatrixView& out) {
            as_given(world, a, b, out, stream, overlap::with_callers_terms(x, o));
        });
}

}  // namespace loom
