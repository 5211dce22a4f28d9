// The overlapped ops' plans: how a GEMM and its communication share the SMs, and the GEMM configs the hooks take.
#pragma once

#include <cstdint>
#include <string>

#include "loom/ops/overlap.hpp"

namespace loom {

// The configs the heuristics pick (printed at the debug log level).
struct OverlapPlan {
    GemmConfig gemm;  // grid = the SMs left to the GEMM
    int comm_blocks = 0;
    // SMs left free for work the CUDA runtime runs on SMs behind the op's back: a cudaMemcpyAsync between two
    // allocations of one GPU (ranks sharing it) is a copy kernel, which a persistent GEMM spinning on that very copy's
    // signal would otherwise starve.
    int reserved_sms = 0;
    RsAlgo rs_algo = RsAlgo::Auto;  // gemm_rs_plan: the algorithm chosen (never Auto there)
    ArAlgo ar_algo = ArAlgo::Auto;  // gemm_ar_plan: the algorithm chosen (never Auto there)
    bool ar_two_shot = false;       // gemm_ar_plan, ReduceKernel: the two-shot reduction
    std::string str() const;
};

}  // namespace loom

namespace loom::overlap {

// Communication blocks of an op on `num_sms` usable SMs (overlap_usable_sms): `requested` (> 0, the caller's
// comm_sms) or the op's default `dflt` capped at a quarter of the SMs; never more than num_sms - 1 nor
// kMaxCommBlocks. Deadlock freedom rests on the cap: the comm kernel starts concurrently with the GEMM and its
// blocks spin (waiting for tiles, or for each other in gemm_rs's phase 2), so they must leave at least one SM to
// the GEMM (whose CTAs never wait in gemm_rs / gemm_ar), and all P of them must fit at once once the GEMM is done.
int comm_blocks(int requested, int dflt, int num_sms);

// Fused epilogues (gemm_rs's and gemm_ar's epilogue hooks stage each warpgroup's whole part of the tile): why `cfg`
// cannot stage its tile of `out_bytes` elements ("" when it can): BLOCK_N x out_bytes a multiple of 128 (whole slabs)
// and the stages beside the staged tile within the shared memory.
std::string whole_tile_unfit(const GemmConfig& cfg, int out_bytes);
// `c` adapted to a fused epilogue: BLOCK_N rounded up to whole 128-byte slab rows (the heuristic picks 144 or 160 on
// small shapes), then the stages that fit beside the staged tile (at most 12; at least 3, narrowing BLOCK_N by 64 if
// needed: 128 x 256 bf16 gets 3). The grid is left to the caller.
GemmConfig whole_tile_config(GemmConfig c, int out_bytes);

// The GEMM of an overlapped op on `gemm_sms` SMs: the plain heuristic, one CTA per tile (the hooks order single
// tiles), TMA-store epilogue (after_store publishes completed bulk stores), grid sized to those SMs. split_tail: the
// heuristic's split-K tail too (ag_gemm, whose hooks publish nothing per tile; gemm_rs / gemm_ar cannot take it).
// in: the input type (block_k: 64 for 16-bit inputs, 128 for fp8).
GemmConfig gemm_config(int64_t m, int64_t n, int64_t k, int arch, int gemm_sms, bool split_tail = false,
                       DType in = DType::BF16);
// Output tiles of cfg's BLOCK_M x BLOCK_N over [m, n].
int64_t tile_count(int64_t m, int64_t n, const GemmConfig& cfg);
// Narrows cfg.group_m to the largest divisor of `blocks_per_rank` (M-blocks of one rank's rows) not above it, so that
// no raster group of the rotated orders straddles two ranks' rows.
void groups_inside_bands(GemmConfig& cfg, int64_t blocks_per_rank);

}  // namespace loom::overlap
