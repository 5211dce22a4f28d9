#include "ops/collectives/coll_ll.hpp"

#include <algorithm>

#include "loom/runtime/error.hpp"
#include "ops/collectives/coll_state.hpp"
#include "runtime/symmetric_zeroed.hpp"

namespace loom::coll {

using kernels::coll::kLLPacketsPerBlock;
using kernels::coll::kMaxLLBlocks;

LLArea::LLArea(World& world) : bytes(std::size_t(2) * kMaxLLBlocks * world.world_size() * kLLPacketsPerBlock * 16) {
    data = detail::alloc_zeroed<char>(world, bytes);
}

void LLArea::release(World& world) {
    // Cached plans may point into the area.
    if (Core* c = world.find_state<Core>()) c->plans.clear();
    world.free(data);
}

void setup_ll(Launch& l, const char* op, std::size_t chunk_bytes, const CollOptions& opts, const Budget& b) {
    LOOM_CHECK(chunk_bytes <= ll_capacity_bytes(),
               "{}: the ll algorithm holds at most {} bytes per chunk ({} blocks x {} packets x 8 bytes), given {}: "
               "use CollAlgo::Auto or another algorithm",
               op, ll_capacity_bytes(), kMaxLLBlocks, kLLPacketsPerBlock, chunk_bytes);
    const std::size_t packets = std::max<std::size_t>(1, (chunk_bytes + 7) / 8);
    // Spread the packets over blocks (>= 1 packet each: every block must exchange with every peer).
    int blocks = pick_blocks(packets, 64, kMaxLLBlocks, opts, b);
    std::size_t per = (packets + blocks - 1) / blocks;
    if (per > std::size_t(kLLPacketsPerBlock)) per = kLLPacketsPerBlock;
    blocks = static_cast<int>((packets + per - 1) / per);
    LOOM_CHECK(blocks <= kMaxLLBlocks, "{}: ll needs {} blocks of {} packets; at most {} blocks (num_sms {})", op,
               blocks, per, kMaxLLBlocks, opts.num_sms);
    l.header = "loom/kernels/collectives/coll_ll.cuh";
    l.name = std::string("loom::kernels::coll::") + op + "_ll";
    l.params.ll_packets = static_cast<uint32_t>(per);
    l.params.ll_blocks = static_cast<uint32_t>(blocks);
    // Packet blocks beyond what may be resident beside every peer's launch are dealt over fewer blocks
    // (coll_ll.cuh: ll_exchange): with 8 ranks on one GPU at 100 % each, 59 packet blocks per rank would leave some
    // ranks' blocks unscheduled while the others wait for their packets.
    l.blocks = b.resident_blocks > 0 ? std::min(blocks, b.resident_blocks) : blocks;
    l.threads = per < 512 ? static_cast<int>((per + 31) / 32 * 32) : 512;
    l.programmatic = true;
}

void launch_ll_bytes(World& world, Core& core, const PlanKey& key, const char* op, const void* in, void* out,
                     std::size_t chunk_bytes, const CollOptions& opts, cudaStream_t stream) {
    Launch l;
    l.params = core.params();
    l.params.in = in;
    l.params.out = out;
    l.params.count = chunk_bytes;
    l.template_args = {"unsigned char"};
    setup_ll(l, op, chunk_bytes, opts, core.budget);
    l.params.ll = state<LLArea>(world, stream, op).data;
    core.plans.launch(world, key, l, stream);
}

}  // namespace loom::coll
