// The overlapped ops' shared validation (raises loom::Error naming what was expected and what was given), and the
// validated call every op's algorithms take.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "loom/ops/overlap.hpp"
#include "loom/runtime/settings.hpp"
#include "ops/overlap/common/plan.hpp"
#include "ops/overlap/common/state.hpp"
#include "runtime/call_agreement.hpp"

namespace loom::overlap {

// A, B, C of the op: types, pointers, alignment, leading dimensions, K (B as [N, K]), and each whole in memory this
// rank's GPU may use (one live symmetric allocation when in the heap: runtime/pointer_check.hpp).
void check_inputs(World& world, const char* op, const MatrixView& a, const MatrixView& b, const MatrixView& c);

// An op's scale of its products: the options' alpha and device scales (scale_a / scale_b, null: 1). As GemmOptions
// (gemm_options) they reach loom::gemm and the hooked GEMM's GemmArgs (gemm_sm90_launch); the hooked kernel applies
// them on the accumulators or in its affine epilogue (ScaleAt, hooked_gemm.hpp).
struct OpScale {
    float alpha = 1.f;
    const float* a = nullptr;
    const float* b = nullptr;
};
template <class Opts>
OpScale scale_of(const Opts& o) {
    return OpScale{o.alpha, o.scale_a, o.scale_b};
}
// alpha finite; the device scales as gemm_check_device_scale, on `device`.
void check_scale(const char* op, const OpScale& s, int device = -1);

// The argument checks every op's call makes before anything else, on its own (check_inputs, check_scale): run alone,
// or inside the cross-rank check (signature(), runtime/call_agreement.hpp).
template <class Opts>
void check_args(World& world, const char* op, const MatrixView& a, const MatrixView& b, const MatrixView& c,
                const Opts& o) {
    check_inputs(world, op, a, b, c);
    check_scale(op, scale_of(o), world.device());
}
// An overlapped call's signature for the cross-rank check: the op, A's, B's and C's shapes and dtypes, where A and C
// lie in the symmetric heap; the caller adds its options.
detail::CallSignature signature(World& world, const char* op, const MatrixView& a, const MatrixView& b,
                                const MatrixView& c);
// The config field of a signature: "heuristic" or the config's str().
std::string config_field(const GemmConfig* config);

// in: the input type (its block_k). split_tail_ok: the op's hooks publish nothing per tile, so its GEMM may split the
// tail (ag_gemm; the kernel spec names those hooks, gemm_kernel_spec); otherwise tail_splits must be 1.
void check_config(const char* op, const GemmConfig& cfg, DType in, bool split_tail_ok = false);
// The caller's tile, when given, in place of the plan's (a grid of 0 is planned on the SMs the plan leaves to the
// GEMM: num_sms minus the comm blocks and the reserved SMs); then check_config.
void use_config(const char* op, OverlapPlan& plan, const GemmConfig* config, int64_t m, int64_t n, int num_sms,
                DType in, bool split_tail_ok = false);
// Raises unless cfg's tiles over [m, n] fit the per-tile signals (kMaxTileSignals).
void check_tile_count(const char* op, int64_t m, int64_t n, const GemmConfig& cfg);

// What every op's validated call holds; the op's call type extends it with its shape and its choice.
struct OpCall {
    World* world = nullptr;
    MatrixView a, b, c;
    cudaStream_t stream = nullptr;
    OpScale sc;
    const DeviceFacts* dev = nullptr;
    int num_sms = 0;  // the SMs the op plans on (plan_sms)
    bool captured = false;
    int W = 0;      // world size
    int nodes = 1;  // world.num_nodes()
    int L = 0;      // ranks per node (world.local_world_size())
};
// The validation every op starts with: the World's DeviceFacts (created on its first call), the SMs the call plans on,
// A, B, C and the products' scale.
template <class Opts>
void begin_call(OpCall& x, const char* op, World& world, const MatrixView& a, const MatrixView& b, const MatrixView& c,
                cudaStream_t stream, const Opts& o, bool captured) {
    x.world = &world;
    x.a = a;
    x.b = b;
    x.c = c;
    x.stream = stream;
    x.captured = captured;
    x.dev = &device_facts(world, op, captured);
    x.num_sms = plan_sms(*x.dev, o.num_sms, op);
    x.W = world.world_size();
    x.nodes = world.num_nodes();
    x.L = world.local_world_size();
    check_inputs(world, op, a, b, c);
    x.sc = scale_of(o);
    check_scale(op, x.sc, world.device());
}

// Whether `stream` is capturing a CUDA graph; raises if it is and the call's algorithm cannot be replayed
// (`replayable`). Replayable: the Sequential algorithms (AgProducer / RsAlgo / ArAlgo::Sequential: loom::gemm and the
// collectives, whose callers make their buffer reuse replay-safe), gemm_ar's fused epilogue and gemm_rs's with the SM
// transport (their call numbers and buffer halves are the device's). The other overlapped algorithms compute their
// signal targets and pick their buffer halves on the host, per call: a replayed graph would repeat one call's targets
// and halves, and its waits would pass on the previous replay's signals (wrong results) or never (a hang). Called
// before the op touches any state, so a refused capture stays valid and the caller can end it.
bool check_capture(cudaStream_t stream, const char* op, bool replayable);

// In a World of several nodes (nodes > 1) an op's algorithms that reach their peers by load / store, TMA or the copy
// engine only (the node's fd-mapped heap) cannot run. Raises, naming the op, the kind of choice (`what`: "producer",
// "algorithm"), the algorithm asked for, what it needs, what runs across nodes instead and the World given, unless
// `runs_across` or nodes == 1.
void check_across_nodes(const char* op, const char* what, const char* algo, bool runs_across, const char* needs,
                        const char* instead, int nodes, int ranks_per_node);

// Whether the ops print their plans (the debug log level, LOOM_LOG_LEVEL=debug).
inline bool debug() { return log_enabled(LogLevel::Debug); }

}  // namespace loom::overlap
