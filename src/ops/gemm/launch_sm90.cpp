// The Hopper kernel's launch: its JIT spec (and the sm_80 kernel's), the tensor maps, the arguments and launch
// dimensions, and loom::gemm's launch of it with the split tail.
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

#include "loom/runtime/error.hpp"
#include "loom/runtime/tma.hpp"
#include "ops/gemm/gemm_internal.hpp"

namespace loom {

bool gemm_plain_epilogue(const GemmConfig& cfg, DType out) {
    // 16-bit outputs only: what it saves is the stmatrix staging; with fp32 out (pair stores either way) the hooked
    // GEMMs' register allocation spilled without the arithmetic and did not with it.
    return !cfg.sm80 && gemm_tma_store(cfg) && dtype_size(out) == 2 &&
           cfg.block_n >= kernels::gemm_store_box_cols(static_cast<int>(dtype_size(out)));
}

std::optional<DType> gemm_kernel_bias(const GemmConfig& cfg, DType out, const GemmOptions& opts) {
    if (opts.bias.data) return opts.bias.dtype;
    if (opts.alpha == 1.f && !opts.scale_a && !opts.scale_b && gemm_plain_epilogue(cfg, out)) return std::nullopt;
    return DType::F32;
}

jit::KernelSpec gemm_kernel_spec(const GemmConfig& cfg, DType in, DType out, std::optional<DType> bias, bool b_kn,
                                 const std::string& hooks, const std::string& header) {
    jit::KernelSpec spec;
    if (cfg.sm80) {
        spec.header = "loom/kernels/gemm/gemm_sm80.cuh";
        spec.name = "loom::kernels::gemm_sm80_mma_sync";
        spec.template_args = {dtype_cuda_name(in), dtype_cuda_name(out), dtype_cuda_name(bias.value_or(DType::F32)),
                              "4", b_kn ? "false" : "true"};
        return spec;
    }
    LOOM_CHECK(bias || gemm_plain_epilogue(cfg, out),
               "gemm: the kernel without alpha / bias (no bias type) needs the TMA-store epilogue, given {}",
               cfg.str());
    spec.header = header;
    spec.name = "loom::kernels::gemm_sm90_tma_wgmma";
    spec.template_args = {dtype_cuda_name(in),
                          dtype_cuda_name(out),
                          bias ? dtype_cuda_name(*bias) : "void",
                          std::to_string(cfg.block_m),
                          std::to_string(cfg.block_n),
                          std::to_string(cfg.stages),
                          b_kn ? "false" : "true",
                          std::to_string(cfg.cluster_m),
                          gemm_tma_store(cfg) ? "true" : "false",
                          hooks};
    if (cfg.tail_splits >= 2) {
        // Hooks that publish tiles (epilogue / after-store parts) cannot take it (kernels/gemm/gemm.cuh asserts it).
        LOOM_CHECK((hooks == "loom::tile::GemmNoHooks" || hooks == "loom::kernels::overlap::AgGemmHooks") &&
                       cfg.cluster_m == 1,
                   "gemm: the split tail is for the plain GEMM and ag_gemm's hooks with cluster_m 1, given hooks {}, "
                   "cluster_m {}",
                   hooks, cfg.cluster_m);
        spec.template_args.push_back("true");  // kSplitTail
    }
    if (cfg.cluster_k > 1) {
        // K-clusters: the plain GEMM only (kernels/gemm/gemm.cuh asserts it), with the direct-store epilogue.
        LOOM_CHECK(hooks == "loom::tile::GemmNoHooks" && cfg.cluster_m == 1 && cfg.tail_splits == 1,
                   "gemm: cluster_k is for the plain GEMM with cluster_m 1 and tail_splits 1, given hooks {}, "
                   "cluster_m {}, tail_splits {}",
                   hooks, cfg.cluster_m, cfg.tail_splits);
        spec.template_args.push_back("false");  // kSplitTail
        spec.template_args.push_back(std::to_string(cfg.cluster_k));
    }
    return spec;
}

kernels::GemmArgs detail::gemm_whole_tile_args(const MatrixView& c, int64_t m, int64_t n, int64_t k,
                                               const GemmOptions& o) {
    kernels::GemmArgs args{.d = c.data,
                           .bias = o.bias.data,
                           .ldd = c.stride(),
                           .m = static_cast<int32_t>(m),
                           .n = static_cast<int32_t>(n),
                           .k = static_cast<int32_t>(k),
                           .alpha = o.alpha,
                           .beta = o.beta};
    args.scale_a = o.scale_a;
    args.scale_b = o.scale_b;
    return args;
}

GemmSm90Launch gemm_sm90_launch(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o,
                                const GemmConfig& cfg, int num_sms, cudaStream_t stream) {
    LOOM_CHECK(
        !gemm_tma_store(cfg) || o.beta == 0.f,
        "gemm: the TMA-store epilogue does not read C: expected beta 0 or config.tma_store = false, given beta {}",
        o.beta);
    GemmSm90Launch l{};
    const int64_t m = a.rows, k = a.cols, n = c.cols;
    // The kernel assumes every tile has k-blocks (kernels/gemm/gemm.cuh: no zeroing after an empty mainloop).
    LOOM_CHECK(m > 0 && n > 0 && k > 0, "gemm: expected non-empty shapes, given M={} N={} K={}", m, n, k);
    // Skinny A (one M-block, single-CTA tiles): a box of M rows rounded up to 8 (one 128B-swizzle atom), not BLOCK_M.
    const int a_box_rows = m < cfg.block_m && cfg.cluster_m == 1 ? static_cast<int>((m + 7) / 8 * 8) : cfg.block_m;
    l.tmap_a = make_tma_2d(a, a_box_rows, cfg.block_k);
    // A K-major B tile is loaded in cluster_m slices (each CTA of a cluster multicasts one); [K, N] B in 64-column
    // boxes either way.
    l.tmap_b = o.b_kn ? make_tma_2d(b, cfg.block_k, 64) : make_tma_2d(b, cfg.block_n / cfg.cluster_m, cfg.block_k);
    // The plain epilogue stores per warp (16-row boxes); GEMMs with epilogue hooks re-encode it with
    // kGemmWholeTileBoxRows (see GemmSm90Launch::tmap_d).
    l.tmap_d =
        make_tma_2d(c, kernels::kGemmStoreBoxRows, kernels::gemm_store_box_cols(static_cast<int>(dtype_size(c.dtype))));
    l.args = detail::gemm_whole_tile_args(c, m, n, k, o);
    l.args.a_box_rows = a_box_rows < cfg.block_m ? a_box_rows : 0;
    l.args.grid =
        tile::FastTileGrid::of(tile::scheduler_grid(m, n, cfg.block_m, cfg.block_n, cfg.cluster_m, cfg.group_m));
    const int64_t grid = cfg.grid > 0 ? cfg.grid : gemm_sm90_grid(m, n, cfg, num_sms);
    if (cfg.cluster_k > 1) {
        // One cluster per tile (kernels/gemm/gemm.cuh: every CTA takes part in its tile's cluster barriers), each rank
        // at least one k-block.
        const int64_t tiles = static_cast<int64_t>(l.args.grid.num_tiles());
        const int64_t num_kb = (k + cfg.block_k - 1) / cfg.block_k;
        LOOM_CHECK(grid == tiles * cfg.cluster_k,
                   "gemm: cluster_k {} runs one cluster per tile: expected grid 0 or {} ({} tiles x {}), given {}",
                   cfg.cluster_k, tiles * cfg.cluster_k, tiles, cfg.cluster_k, grid);
        LOOM_CHECK(num_kb >= cfg.cluster_k,
                   "gemm: cluster_k {} splits K into that many ranges of k-blocks ({} elements each): expected K >= "
                   "{}, given K={}",
                   cfg.cluster_k, cfg.block_k, static_cast<int64_t>(cfg.cluster_k - 1) * cfg.block_k + 1, k);
    }
    const int cluster = cfg.cluster_m * cfg.cluster_k;
    l.launch.grid = dim3(static_cast<unsigned>(std::max<int64_t>(grid, cluster)));
    l.launch.cluster = dim3(static_cast<unsigned>(cluster), 1, 1);
    l.launch.block = dim3(static_cast<unsigned>(128 * (cfg.consumers() + 1)));
    l.launch.smem = kernels::gemm_sm90_smem_bytes(cfg.block_m, cfg.block_n, cfg.stages);
    l.launch.stream = stream;
    return l;
}

void detail::gemm_launch_sm90(const MatrixView& a, const MatrixView& b, const MatrixView& c, const GemmOptions& o,
                              GemmConfig cfg, std::optional<DType> bias, int num_sms, cudaStream_t stream,
                              const char* source) {
    const int64_t m = a.rows, k = a.cols, n = c.cols;
    GemmSm90Launch l = gemm_sm90_launch(a, b, c, o, cfg, num_sms, stream);
    // The split tail as this launch runs it (none without a tail at this grid, or while capturing a graph); the
    // workspace stays locked until the launch is enqueued.
    std::unique_lock<std::mutex> ws_lock;
    cfg.tail_splits = gemm_bind_split_tail(l, cfg, m, n, k, stream, ws_lock);
    gemm_log_config(m, n, k, cfg, source);
    const jit::Kernel* kernel = &jit::get_kernel(gemm_kernel_spec(cfg, a.dtype, c.dtype, bias, o.b_kn));
    // A cluster is scheduled whole on one GPC: where none fits this context's SMs (a small MPS share) its launch
    // would fail, so it is refused here, by name.
    LOOM_CHECK(
        cfg.cluster_k == 1 || kernel->max_active_clusters(l.launch) >= 1,
        "gemm: cluster_k {} needs clusters of {} CTAs ({} B of shared memory each) scheduled together on one GPC, "
        "and this context's SMs fit none (an MPS share too small?): expected cluster_k 1 or a smaller one, "
        "given {}",
        cfg.cluster_k, cfg.cluster_k, l.launch.smem, cfg.str());
    struct NoHooks {
    } hooks;  // loom::tile::GemmNoHooks: an empty object, one byte as a kernel parameter
    (*kernel)(l.launch, l.tmap_a, l.tmap_b, l.tmap_d, l.args, hooks);
}

}  // namespace loom
