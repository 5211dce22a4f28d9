// The TP-MoE ops' public entries: validate, choose the algorithm, dispatch.
#include "ops/moe/tp/tp_moe.hpp"

#include <initializer_list>
#include <string>
#include <utility>

#include "loom/runtime/error.hpp"
#include "ops/moe/routing_internal.hpp"
#include "ops/overlap/common/state.hpp"
#include "runtime/call_agreement.hpp"

namespace loom {

namespace {

bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    LOOM_CHECK_CUDA(cudaStreamIsCapturing(stream, &st));
    return st != cudaStreamCaptureStatusNone;
}

// The facts the choice needs; the device's only when a fused algorithm may run (its state is collective: every rank
// asks in the same calls, since the same options and world reach the same branch).
TpMoeAlgo choose(const char* op, TpMoeAlgo requested, World& world, bool captured, int64_t rows, bool x_words = true) {
    moe::TpMoeFacts f;
    f.x_words = x_words;
    f.world = world.world_size();
    f.single_node = world.world_size() == world.local_world_size() && world.local_world_size() <= kMaxLocalPeers;
    f.captured = captured;
    f.rows = rows;
    if (requested != TpMoeAlgo::Sequential && f.world > 1 && f.single_node && !captured) {
        const auto& dev = overlap::op_state<overlap::DeviceFacts>(world, op, captured);
        f.arch = dev.arch;
        f.device_sms = dev.device_sms;
    }
    return moe::choose_tp_moe_algo(op, requested, f);
}

// A matrix of the call and whether its row count must match across ranks (buffers of at least max_rows may differ).
struct SignedView {
    const char* name;
    const MatrixView* m;
    bool rows = true;
};

// What every rank must give alike (checking mode: detail::AgreedCall): the routing's shape, each matrix's shape and
// type, and the options that choose the algorithm and the GEMM.
detail::CallSignature tp_signature(const char* op, const MoeRouting& r, std::initializer_list<SignedView> views,
                                   const TpMoeOptions& o) {
    detail::CallSignature s(op);
    s.add("routing.tokens", r.shape.tokens).add("routing.topk", r.shape.topk);
    s.add("routing.num_experts", r.shape.num_experts).add("routing.ranks", r.shape.ranks);
    s.add("routing.align", r.shape.align);
    for (const SignedView& v : views) {
        const std::string n(v.name);
        if (v.rows) s.add(n + ".rows", v.m->rows);
        s.add(n + ".cols", v.m->cols).add(n + ".dtype", detail::dtype_field(v.m->dtype));
    }
    s.add("TpMoeOptions::algo", to_string(o.algo)).add("TpMoeOptions::comm_sms", o.comm_sms);
    s.add("GroupedGemmOptions::b_layout", static_cast<int>(o.gemm.b_layout));
    s.add("GroupedGemmOptions::activation", static_cast<int>(o.gemm.activation));
    s.add("GroupedGemmOptions::config", o.gemm.config ? o.gemm.config->str() : std::string("heuristic"));
    return s;
}

// moe_rs's and moe_ar's signature: their buffers' shapes (rows may hold spare rows past max_rows) and options.
detail::CallSignature down_signature(const char* op, const moe::MoeDownCall& c) {
    return tp_signature(op, c.routing, {{"rows", &c.rows, false}, {"w_down", &c.w_down}, {"out", &c.out}}, c.opts);
}

}  // namespace

const char* to_string(TpMoeAlgo a) {
    switch (a) {
        case TpMoeAlgo::Auto:
            return "auto";
        case TpMoeAlgo::Sequential:
            return "sequential";
        case TpMoeAlgo::Fused:
            return "fused";
    }
    return "?";
}

void ag_moe(World& world, const MatrixView& x, const int32_t* topk_idx, const float* topk_weights,
            const MatrixView& w_up, const MoeRouting& routing, const MatrixView& out, cudaStream_t stream,
            const TpMoeOptions& opts) {
    moe::AgMoeCall c{&world, x, w_up, out, topk_idx, topk_weights, routing, stream, opts, capturing(stream)};
    const detail::AgreedCall agreed(
        world,
        [&] {
            // The gathers run for topk_weights only where given; Auto's choice reads x's word alignment (each rank
            // its own pointer's: it must agree, or ranks would run different algorithms).
            detail::CallSignature s =
                tp_signature("ag_moe", routing, {{"x", &x}, {"w_up", &w_up}, {"out", &out, false}}, opts);
            s.add("topk_weights", topk_weights ? "given" : "null");
            if (opts.algo == TpMoeAlgo::Auto) s.add("x in 16-byte words (Auto's choice)", moe::x_in_words(x));
            return s;
        },
        [&] { moe::check_ag_moe(c); });
    if (!agreed.checked()) moe::check_ag_moe(c);
    switch (choose("ag_moe", opts.algo, world, c.captured, c.routing.shape.entries(), moe::x_in_words(x))) {
        case TpMoeAlgo::Fused:
            moe::ag_moe_fused(c);
            break;
        default:
            moe::ag_moe_sequential(c);
    }
}

void moe_rs(World& world, const MatrixView& rows, const MatrixView& w_down, const MoeRouting& routing,
            const MatrixView& out, cudaStream_t stream, const TpMoeOptions& opts) {
    moe::MoeDownCall c{&world, rows, w_down, out, routing, stream, opts, capturing(stream)};
    const detail::AgreedCall agreed(
        world, [&] { return down_signature("moe_rs", c); }, [&] { moe::check_moe_rs(c); });
    if (!agreed.checked()) moe::check_moe_rs(c);
    switch (choose("moe_rs", opts.algo, world, c.captured, c.routing.shape.entries())) {
        case TpMoeAlgo::Fused:
            moe::moe_rs_fused(c);
            break;
        default:
            moe::moe_rs_sequential(c);
    }
}

void moe_ar(World& world, const MatrixView& rows, const MatrixView& w_down, const MoeRouting& routing,
            const MatrixView& out, cudaStream_t stream, const TpMoeOptions& opts) {
    moe::MoeDownCall c{&world, rows, w_down, out, routing, stream, opts, capturing(stream)};
    const detail::AgreedCall agreed(
        world, [&] { return down_signature("moe_ar", c); }, [&] { moe::check_moe_ar(c); });
    if (!agreed.checked()) moe::check_moe_ar(c);
    // Auto is Sequential: the fused moe_ar is chosen only when asked for (Fused raises where it cannot run).
    if (opts.algo == TpMoeAlgo::Fused &&
        choose("moe_ar", opts.algo, world, c.captured, c.routing.shape.entries()) == TpMoeAlgo::Fused) {
        moe::moe_ar_fused(c);
    } else {
        moe::moe_ar_sequential(c);
    }
}

// The TP-MoE ops' states only ("moe/tp/..."): the expert-parallel ones have their own release functions.
void release_moe_state(World& world) { world.release_states("moe/tp/"); }

}  // namespace loom
