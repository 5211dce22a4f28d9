#include "ops/overlap/common/checks.hpp"

#include <cmath>
#include <cstdint>

#include "loom/kernels/overlap/overlap_params.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "ops/gemm/gemm_internal.hpp"

namespace loom::overlap {

void check_inputs(World& world, const char* op, const MatrixView& a, const MatrixView& b, const MatrixView& c) {
    LOOM_CHECK(a.dtype == DType::BF16 || a.dtype == DType::F16 || a.dtype == DType::F8E4M3,
               "{}: expected A bf16, f16 or f8e4m3, given {}", op, dtype_name(a.dtype));
    LOOM_CHECK(b.dtype == a.dtype, "{}: expected B of A's dtype {}, given {}", op, dtype_name(a.dtype),
               dtype_name(b.dtype));
    LOOM_CHECK(c.dtype == DType::BF16 || c.dtype == DType::F16 || c.dtype == DType::F32,
               "{}: expected C bf16, f16 or f32, given {}", op, dtype_name(c.dtype));
    for (const auto* v : {&a, &b, &c}) {
        const char* name = v == &a ? "A" : v == &b ? "B" : "C";
        LOOM_CHECK(v->data != nullptr, "{}: expected a device pointer for {}, given nullptr", op, name);
        LOOM_CHECK(v->rows > 0 && v->cols > 0, "{}: expected a non-empty {}, given {} x {}", op, name, v->rows,
                   v->cols);
        LOOM_CHECK(reinterpret_cast<std::uintptr_t>(v->data) % 16 == 0,
                   "{}: expected {} 16-byte aligned, given address {}", op, name, v->data);
        LOOM_CHECK((v->stride() * dtype_size(v->dtype)) % 16 == 0 && v->stride() >= v->cols,
                   "{}: expected {}'s leading dimension >= {} and a multiple of 16 bytes, given {}", op, name, v->cols,
                   v->stride());
    }
    LOOM_CHECK(a.cols % 8 == 0 && b.rows % 8 == 0, "{}: expected K and N multiples of 8, given K={} N={}", op, a.cols,
               b.rows);
    LOOM_CHECK(b.cols == a.cols, "{}: expected B as [N, K] with K = {} (A's columns), given {} x {}", op, a.cols,
               b.rows, b.cols);
    LOOM_CHECK(a.dtype != DType::F8E4M3 || a.cols % 16 == 0,
               "{}: f8e4m3 inputs expect K a multiple of 16 (16-byte rows), given K={}", op, a.cols);
    gemm_check_memory(op, a, b, c, GemmOptions{}, &world, world.device());
}

detail::CallSignature signature(World& world, const char* op, const MatrixView& a, const MatrixView& b,
                                const MatrixView& c) {
    detail::CallSignature s(op);
    for (const auto* v : {&a, &b, &c}) {
        const std::string name = v == &a ? "A" : v == &b ? "B" : "C";
        s.add(name + ".rows", v->rows).add(name + ".cols", v->cols).add(name + ".dtype", detail::dtype_field(v->dtype));
    }
    s.add("A", detail::placement_field(world, a.data)).add("C", detail::placement_field(world, c.data));
    return s;
}

std::string config_field(const GemmConfig* config) { return config ? config->str() : "heuristic"; }

void check_scale(const char* op, const OpScale& s, int device) {
    LOOM_CHECK(std::isfinite(s.alpha), "{}: expected a finite alpha, given {}", op, s.alpha);
    gemm_check_device_scale(op, "scale_a", s.a, device);
    gemm_check_device_scale(op, "scale_b", s.b, device);
}

void check_config(const char* op, const GemmConfig& cfg, DType in, bool split_tail_ok) {
    LOOM_CHECK(!cfg.sm80, "{}: expected the Hopper GEMM config (sm80 = false)", op);
    LOOM_CHECK(cfg.cluster_m == 1 && cfg.cluster_k == 1,
               "{}: expected cluster_m 1 and cluster_k 1 (the overlap hooks order single-CTA tiles), given {} and {}",
               op, cfg.cluster_m, cfg.cluster_k);
    LOOM_CHECK(cfg.tma_store, "{}: expected tma_store = true (after_store publishes completed TMA stores)", op);
    LOOM_CHECK(cfg.tail_splits == 1 || split_tail_ok,
               "{}: expected tail_splits 1 (its hooks publish every tile: no split-K tail), given {}", op,
               cfg.tail_splits);
    gemm_validate_config(cfg, false, in);
}

void use_config(const char* op, OverlapPlan& plan, const GemmConfig* config, int64_t m, int64_t n, int num_sms,
                DType in, bool split_tail_ok) {
    if (config) {
        plan.gemm = *config;
        const int usable = num_sms - plan.comm_blocks - plan.reserved_sms;
        if (plan.gemm.grid == 0) plan.gemm.grid = static_cast<int>(gemm_sm90_grid(m, n, plan.gemm, usable));
        // The hooked GEMM's CTAs wait for peers (and the side blocks for the GEMM): all of them must be resident.
        LOOM_CHECK(plan.gemm.grid <= usable,
                   "{}: expected config.grid <= {} (the SMs left to the GEMM: every CTA of the overlapped GEMM must be "
                   "resident at once), given {}",
                   op, usable, plan.gemm.grid);
    }
    check_config(op, plan.gemm, in, split_tail_ok);
}

void check_tile_count(const char* op, int64_t m, int64_t n, const GemmConfig& cfg) {
    const int64_t num_m = (m + cfg.block_m - 1) / cfg.block_m, num_n = (n + cfg.block_n - 1) / cfg.block_n;
    LOOM_CHECK(num_m * num_n <= kernels::overlap::kMaxTileSignals,
               "{}: expected at most {} output tiles, given {} x {} (M={} N={} with {})", op,
               kernels::overlap::kMaxTileSignals, num_m, num_n, m, n, cfg.str());
}

void check_across_nodes(const char* op, const char* what, const char* algo, bool runs_across, const char* needs,
                        const char* instead, int nodes, int ranks_per_node) {
    LOOM_CHECK(nodes <= 1 || runs_across,
               "{}: the {} {} runs within one node ({}); in a World of several nodes expected {}, given {} in a World "
               "of {} nodes x {} ranks",
               op, what, algo, needs, instead, algo, nodes, ranks_per_node);
}

bool check_capture(cudaStream_t stream, const char* op, bool replayable) {
    const bool captured = stream_ops::capturing(stream);
    LOOM_CHECK(!captured || replayable,
               "{}: expected a stream that is not capturing a CUDA graph, or an algorithm that replays: this one "
               "computes its signal targets and buffer halves on the host per call, so a replayed graph would reuse "
               "one call's (wrong results or a hang). Call {} outside the capture, or pass its Sequential algorithm "
               "(loom::gemm and a collective), or for gemm_ar FusedEpilogue, for gemm_rs FusedEpilogue with the Sm "
               "transport (their call numbers are the device's)",
               op, op);
    return captured;
}

}  // namespace loom::overlap
