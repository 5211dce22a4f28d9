// all_to_all over ld/st or TMA: push, pull (kernels/collectives/all_to_all.cuh).
#include <string>

#include "ops/collectives/all_to_all/algorithms.hpp"

namespace loom::coll {

void all_to_all_ld_tma(World& world, Core& core, const PlanKey& key, const CollChoice& c, const BufferView& in,
                       const BufferView& out, const CollOptions& opts, cudaStream_t stream) {
    const std::size_t B = in.bytes() / world.world_size();  // per peer
    const bool tma = c.path == DataPath::Tma;
    Launch l;
    l.header = "loom/kernels/collectives/all_to_all.cuh";
    l.name = c.algo == CollAlgo::Pull ? "loom::kernels::coll::all_to_all_pull" : "loom::kernels::coll::all_to_all_push";
    l.template_args = {"unsigned char", std::to_string(path_arg(c.path))};
    l.params = core.params();
    l.params.in = in.data;
    l.params.out = out.data;
    l.params.count = B;
    if (tma) l.smem = tma_staging(l.params);
    l.blocks = pick_blocks(B, tma ? 512 * 1024 : 64 * 1024, tma ? 32 : 64, opts, core.budget);
    core.plans.launch(world, key, l, stream);
}

}  // namespace loom::coll
