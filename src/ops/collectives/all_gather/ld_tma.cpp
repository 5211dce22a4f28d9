// all_gather over ld/st or TMA: push, pull, ring (kernels/collectives/all_gather.cuh), and the fan-out push.
#include "loom/runtime/error.hpp"
#include "ops/collectives/all_gather/algorithms.hpp"

namespace loom::coll {

void all_gather_ld_tma(World& world, Core& core, const PlanKey& key, const CollChoice& c, const BufferView& in,
                       const BufferView& out, const CollOptions& opts, cudaStream_t stream) {
    LOOM_CHECK(c.algo == CollAlgo::Push || c.algo == CollAlgo::Pull || c.algo == CollAlgo::Ring,
               "all_gather: unknown algorithm {}", to_string(c.algo));
    const std::size_t B = in.bytes();
    Launch l;
    l.header = "loom/kernels/collectives/all_gather.cuh";
    // Ranks sharing a GPU: push over ld/st reads each vector once for all destinations (every byte, the own chunk's
    // too, goes through the one GPU's memory); on distinct GPUs the per-peer loop keeps NVLink stores first.
    const bool fanout = c.algo == CollAlgo::Push && c.path == DataPath::LdSt && core.budget.topo.shared_gpu;
    if (fanout) {
        l.name = "loom::kernels::coll::all_gather_push_fanout";
        l.template_args = {std::to_string(world.world_size())};
    } else {
        l.name = c.algo == CollAlgo::Push   ? "loom::kernels::coll::all_gather_push"
                 : c.algo == CollAlgo::Pull ? "loom::kernels::coll::all_gather_pull"
                                            : "loom::kernels::coll::all_gather_ring";
        l.template_args = {"unsigned char", std::to_string(path_arg(c.path))};
    }
    l.params = core.params();
    l.params.in = in.data;
    l.params.out = out.data;
    l.params.count = B;  // moved as bytes
    if (c.path == DataPath::Tma) l.smem = tma_staging(l.params);
    if (fanout) l.params.flags |= kernels::coll::kFlagGridStride;
    // ~64 KiB per block per peer keeps enough bytes in flight; TMA needs fewer blocks (one thread drives each); the
    // grid-strided fan-out takes its cap from the rank's SM share.
    const int cap = c.path == DataPath::Tma ? 32 : fanout ? grid_stride_block_cap(core.budget, 64, true) : 64;
    l.blocks = pick_blocks(B, c.path == DataPath::Tma ? 512 * 1024 : 64 * 1024, cap, opts, core.budget);
    core.plans.launch(world, key, l, stream);
}

}  // namespace loom::coll
