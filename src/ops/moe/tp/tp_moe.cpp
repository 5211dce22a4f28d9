// The TP-MoE ops' public entries: validate, choose the algorithm, dispatch.
#include "ops/moe/tp/tp_moe.hpp"

#include "loom/runtime/error.hpp"
#include "ops/moe/routing_internal.hpp"

namespace loom {

namespace {

bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    LOOM_CHECK_CUDA(cudaStreamIsCapturing(stream, &st));
    return st != cudaStreamCaptureStatusNone;
}

// Auto: Sequential, the one algorithm.
TpMoeAlgo choose(TpMoeAlgo requested) { return requested == TpMoeAlgo::Auto ? TpMoeAlgo::Sequential : requested; }

}  // namespace

const char* to_string(TpMoeAlgo a) {
    switch (a) {
        case TpMoeAlgo::Auto:
            return "auto";
        case TpMoeAlgo::Sequential:
            return "sequential";
    }
    return "?";
}

void ag_moe(World& world, const MatrixView& x, const int32_t* topk_idx, const float* topk_weights,
            const MatrixView& w_up, const MoeRouting& routing, const MatrixView& out, cudaStream_t stream,
            const TpMoeOptions& opts) {
    moe::AgMoeCall c{&world, x, w_up, out, topk_idx, topk_weights, routing, stream, opts, capturing(stream)};
    moe::check_ag_moe(c);
    switch (choose(opts.algo)) {
        default:
            moe::ag_moe_sequential(c);
    }
}

void moe_rs(World& world, const MatrixView& rows, const MatrixView& w_down, const MoeRouting& routing,
            const MatrixView& out, cudaStream_t stream, const TpMoeOptions& opts) {
    moe::MoeDownCall c{&world, rows, w_down, out, routing, stream, opts, capturing(stream)};
    moe::check_moe_rs(c);
    switch (choose(opts.algo)) {
        default:
            moe::moe_rs_sequential(c);
    }
}

void moe_ar(World& world, const MatrixView& rows, const MatrixView& w_down, const MoeRouting& routing,
            const MatrixView& out, cudaStream_t stream, const TpMoeOptions& opts) {
    moe::MoeDownCall c{&world, rows, w_down, out, routing, stream, opts, capturing(stream)};
    moe::check_moe_ar(c);
    switch (choose(opts.algo)) {
        default:
            moe::moe_ar_sequential(c);
    }
}

void release_moe_state(World& world) { world.release_states("moe/"); }

}  // namespace loom
