// The Hopper GEMM's hook protocols: how a fused algorithm takes part in the persistent GEMM (kernels/gemm/gemm.cuh).
//
// A hooks policy is the kernel's `Hooks` template parameter: a trivially copyable struct of runtime values (ranks,
// signal pointers, tensor maps) passed as a __grid_constant__ kernel parameter, so the kernel may take the address of
// a tensor map inside it. Every policy orders the tiles (TileOrder); beyond that it implements any of the protocols
// below, each a concept over the policy. The kernel asks which ones a policy models (`if constexpr
// (tile::StagedEpilogue<Hooks>)`) and compiles the calls of those only; every other path is the plain GEMM's, so
// GemmNoHooks (grouped order, nothing else) is the plain GEMM at no cost.
//
//   protocol            members                                          used by (kernels/overlap/)
//   TileOrder           tile_order                                       every policy
//   LoadWait            before_load                                      ag_gemm (AgGemmHooks)
//   ASource             a_source, prefetch_a                             ag_gemm (AgGemmHooks)
//   StoreNotify         after_store                                      gemm_rs, gemm_ar (TileNotifyHooks)
//   CtaLifetime         init_cta, finish                                 both epilogue protocols below
//   StagedEpilogue      CtaLifetime + consumer_start, before_epilogue,   gemm_ar's fused epilogue (ArEpilogueHooks)
//                       store_tile
//   AccEpilogue         CtaLifetime + epilogue_acc, d_row_offset         gemm_rs's fused epilogue (RsAccHooks) and
//                                                                        fused pull (RsPullHooks)
//   AccRingCopies       AccEpilogue + ring_copies, ring_wait, ring_copy, gemm_rs's fused epilogue (RsAccHooks)
//                       ring_copy_stride
//   SideWarps           side_warps                                       gemm_rs's fused pull (RsPullHooks)
// and one trait, ScalesAccumulators (where the products' scale is applied). GemmHooks<H> is the whole check: a tile
// order and a combination the kernel supports. A policy states what it implements next to its definition:
//   static_assert(tile::GemmHooks<P> && tile::LoadWait<P> && tile::ASource<P>);
// A new fused algorithm implements these protocols; it adds no entry point to the kernel. A variant that fits none of
// them gets a kernel of its own rather than another switch in this one.
//
// Members templated on the tile (TOut, BLOCK_M, BLOCK_N) are checked at one probe tile (float, 128 x 256), so whether
// a policy models a protocol does not depend on the instantiation; they must accept every tile the kernel is
// instantiated with. The kernel's own conditions on a protocol (tile shapes, clusters, the split-K tail) are static
// assertions in gemm.cuh. Concepts are plain requires-expressions: no <concepts> or other host header (NVRTC).
#pragma once

#include "loom/config.hpp"
#include "loom/ptx/tma.cuh"
#include "loom/tile/epilogue.cuh"
#include "loom/tile/tile_order.hpp"

namespace loom::tile {

// std::same_as without <concepts>.
template <class T, class U>
concept SameAs = kSameType<T, U> && kSameType<U, T>;

// The probe tile of the members templated on it (see the top of the file). Enumerators, not variables: NVRTC's
// -default-device would make static members device globals of every kernel's module.
struct HookProbe {
    using Out = float;
    enum : int { kBlockM = 128, kBlockN = 256 };
};

// ---- TileOrder ------------------------------------------------------------------------------------------------
// tile_order(linear, grid, m_block, n_block): which output tile the linear index is (with CLUSTER_M > 1, which cluster
// tile: tile/scheduler.cuh). The producer thread and the consumers each walk the CTA's indices and must see the same
// tiles: a function of the index, the grid and the policy's fields only. grid is the scheduler's: a FastTileGrid (the
// host's divisors: tile_order.hpp's grouped_order / rotated_order divide by multiplying) or a plain TileGrid. E.g. a
// rank-rotated order, so that an AllGather+GEMM starts with the rows this rank already holds.
template <class H>
concept TileOrder = requires(const H& h, int32_t linear, const TileGrid& g, const FastTileGrid& fg, int32_t& m_block,
                             int32_t& n_block) {
    h.tile_order(linear, g, m_block, n_block);
    h.tile_order(linear, fg, m_block, n_block);
};

// ---- LoadWait -------------------------------------------------------------------------------------------------
// before_load(t): the producer thread, once per tile with rows inside M (per work unit with the split-K tail), before
// the first TMA load of the tile's operands; waits (acquire) until they are in place. The kernel then issues
// fence.proxy.async.global, so the TMA (async proxy) reads what the acquire made visible. A LoadWait policy also
// defines wait_bound_ns(): that wait's bound (0: none), which the consumers, waiting behind the producer, outlast
// (pipeline.cuh, consumer_wait_cycles: a policy without it does not compile).
template <class H>
concept LoadWait = requires(const H& h, const TileCoord& t) {
    h.before_load(t);
};

// ---- ASource --------------------------------------------------------------------------------------------------
// a_source(t, map, row): the producer thread, per tile (after before_load); may point the tile's A loads at another
// tensor map and row (unchanged: the kernel's tmap_a at t.row0). The map must live in parameter space: a
// __grid_constant__ parameter's, e.g. one inside the hooks. Another map's boxes have BLOCK_M rows (GemmArgs::a_box_rows
// is tmap_a's). prefetch_a(): thread 0, once, before the CTA's first barrier: prefetches those maps. AllGather+GEMM
// reads this rank's own rows in place from its shard, and with ranks sharing a GPU every peer's from its staging.
template <class H>
concept ASource = requires(const H& h, const TileCoord& t, const ptx::TmaDescriptor*& map, int32_t& row) {
    h.a_source(t, map, row);
    h.prefetch_a();
};

// ---- StoreNotify ----------------------------------------------------------------------------------------------
// after_store(t): thread 0, per tile with rows inside M, once every consumer thread stored its part of the tile (the
// TMA stores complete: each issuing thread waited for its bulk groups and fenced the async proxy) and passed a named
// barrier of the consumers: all the tile's stores happen-before the call. The hook publishes the tile with a release
// at its readers' scope (e.g. st.release.sys).
template <class H>
concept StoreNotify = requires(const H& h, const TileCoord& t) {
    h.after_store(t);
};

// ---- CtaLifetime ----------------------------------------------------------------------------------------------
// init_cta(): the CTA's thread 0, before the CTA's first barrier (its shared-memory stores are then visible to every
// thread). finish<BLOCK_M>(): every consumer thread, after the CTA's last tile (e.g. publishes a tile still pending).
template <class H>
concept CtaLifetime = requires(const H& h) {
    h.init_cta();
    h.template finish<HookProbe::kBlockM>();
};

// ---- StagedEpilogue -------------------------------------------------------------------------------------------
// The hooks take over the TMA-store epilogue. Each consumer warpgroup stages its whole 64 x BLOCK_N part of the tile
// (TOut, 128B-swizzled slabs of kGemmStoreBufBytes, slab s in buffer s) instead of the plain epilogue's rotating
// per-warp slabs; the accumulators are zeroed before each mainloop, so they are dead during the hooks' work.
//   consumer_start()                   every consumer thread, once, at the start of its path (after the CTA's
//                                      barrier, while the producer already loads): work the first mainloop hides.
//   before_epilogue<TOut, BM, BN>(t)   every consumer thread, before its warpgroup stages the tile: the staging
//                                      buffers must be free (the previous tile's stores read out) when it returns.
//   store_tile<TOut, BM, BN>(tmap_d, staging, t, n)
//                                      every thread of the warpgroup, once its part is staged and fenced for the
//                                      async proxy and the warpgroup passed a barrier: stores, sends or combines it.
// With StoreNotify as well, each warpgroup's thread 0 waits for its bulk stores before the after_store barrier.
// GEMM+AllReduce's fused epilogue (kernels/overlap/gemm_ar.cuh) sends and sums the parts there.
template <class H>
concept StagedEpilogue = CtaLifetime<H> &&
    requires(const H& h, const ptx::TmaDescriptor* tmap_d, uint8_t* staging, const TileCoord& t, int32_t n) {
    h.consumer_start();
    h.template before_epilogue<HookProbe::Out, HookProbe::kBlockM, HookProbe::kBlockN>(t);
    h.template store_tile<HookProbe::Out, HookProbe::kBlockM, HookProbe::kBlockN>(tmap_d, staging, t, n);
};

// ---- AccEpilogue ----------------------------------------------------------------------------------------------
// The hooks see the fp32 accumulators before the kernel's own (plain) epilogue, whose staging and stages stay as
// they are. epilogue_acc<TOut, BM, BN>(acc, t): every consumer thread after the tile's mainloop (the accumulators
// already scaled: ScalesAccumulators); returns false when it sent them elsewhere (this CTA stores nothing of the
// tile), true to have them stored, changed or not. d_row_offset(): the stored tile goes to row t.row0 - offset of D.
// Single-CTA tiles; neither StagedEpilogue nor StoreNotify. GEMM+ReduceScatter's fused epilogue
// (kernels/overlap/gemm_rs.cuh) pushes peers' tiles and keeps its own there; its fused pull (gemm_rs_pull.cuh) only
// learns of each tile's epilogue.
template <class H>
concept AccEpilogue = CtaLifetime<H> && requires(const H& h, float (&acc)[HookProbe::kBlockN / 2], const TileCoord& t) {
    { h.template epilogue_acc<HookProbe::Out, HookProbe::kBlockM, HookProbe::kBlockN>(acc, t) } -> SameAs<bool>;
    { h.d_row_offset() } -> SameAs<int32_t>;
};

// ---- AccRingCopies --------------------------------------------------------------------------------------------
// Copies of the tile that the kernel adds to the accumulators after epilogue_acc returned true, streamed through the
// TMA ring: each copy is a whole tile of TOut in fragment order (warpgroup c's 64 x BLOCK_N part at c x 64 x BLOCK_N x
// sizeof(TOut), its thread i's 16-byte vector v at byte 16 (128 v + i) of the part), added in copy order.
//   ring_copies<TOut, BM, BN>(t)   the producer thread and every consumer thread, the same answer: how many (0: none).
//   ring_wait<TOut, BM, BN>(t)     the producer thread, after the tile's last k-block and before its copies' loads:
//                                  waits (acquire) until every copy is in place; the kernel then fences the async
//                                  proxy.
//   ring_copy<TOut, BM, BN>(t), ring_copy_stride()
//                                  the producer thread: copy c at ring_copy + c x stride.
// The producer bulk-copies each part into the B slot of a ring stage (BLOCK_N x 128 bytes: one part of 16-bit TOut,
// half of an fp32 one); the consumers add their part from shared memory and release the stage. Nothing polls global
// memory on the consumers' path. GEMM+ReduceScatter's fused epilogue adds the peers' copies of its own tiles there.
template <class H>
concept AccRingCopies = AccEpilogue<H> && requires(const H& h, const TileCoord& t) {
    { h.template ring_copies<HookProbe::Out, HookProbe::kBlockM, HookProbe::kBlockN>(t) } -> SameAs<int>;
    h.template ring_wait<HookProbe::Out, HookProbe::kBlockM, HookProbe::kBlockN>(t);
    { h.template ring_copy<HookProbe::Out, HookProbe::kBlockM, HookProbe::kBlockN>(t) } -> SameAs<const uint8_t*>;
    { h.ring_copy_stride() } -> SameAs<int64_t>;
};

// ---- SideWarps ------------------------------------------------------------------------------------------------
// side_warps<TOut, BM, BN>(thread): the producer warpgroup's three warps that issue no TMA (its threads 32-127, as
// thread 0-95) run it concurrently with the whole GEMM; the CTA ends when they return. Neither role then changes its
// register budget (setmaxnreg): every thread keeps the launch bound's. GEMM+ReduceScatter's fused pull
// (kernels/overlap/gemm_rs_pull.cuh) publishes tiles and reduces the rank's own tiles there.
template <class H>
concept SideWarps = requires(const H& h, int thread) {
    h.template side_warps<HookProbe::Out, HookProbe::kBlockM, HookProbe::kBlockN>(thread);
};

// ---- ScalesAccumulators (trait) -------------------------------------------------------------------------------
// Where the products' scale (GemmArgs::alpha times the device scales) is applied: on the accumulators right after the
// mainloop, for AccEpilogue policies (they send and sum the accumulators themselves) and for policies that ask for it
// with `static constexpr bool kScalesAccumulators = true` (AgGemmHooks: its 128 x 256 fp32-output epilogue spilled
// with a runtime scale); in the affine epilogue otherwise. The host launchers mirror the choice
// (src/ops/overlap/common/hooked_gemm.hpp: ScaleAt).
template <class H>
concept ScalesAccumulators = AccEpilogue<H> || requires {
    requires H::kScalesAccumulators;
};

// ---- GemmHooks ------------------------------------------------------------------------------------------------
// A policy the GEMM takes: a tile order, trivially copyable (a __grid_constant__ parameter), and at most one epilogue
// protocol, the accumulators' without StoreNotify (it publishes its tiles itself).
template <class H>
concept GemmHooks = TileOrder<H> && __is_trivially_copyable(H) &&
                    !(StagedEpilogue<H> && AccEpilogue<H>)&&!(AccEpilogue<H> && StoreNotify<H>);

// The default policy: grouped raster order, nothing else. The kernel compiles to the plain GEMM.
struct GemmNoHooks {
    template <class Grid>
    LOOM_DEVICE LOOM_FORCEINLINE void tile_order(int32_t linear, const Grid& g, int32_t& m_block,
                                                 int32_t& n_block) const {
        grouped_order(linear, g, m_block, n_block);
    }
};
static_assert(GemmHooks<GemmNoHooks> && !LoadWait<GemmNoHooks> && !ASource<GemmNoHooks> && !StoreNotify<GemmNoHooks> &&
              !CtaLifetime<GemmNoHooks> && !SideWarps<GemmNoHooks> && !ScalesAccumulators<GemmNoHooks>);

}  // namespace loom::tile
