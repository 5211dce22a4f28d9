// Host side of loom::barrier_on_stream and of the copy-engine paths' barriers: the collectives' one-block barrier
// kernel (kernels/collectives/coll_common.cuh).
#include "ops/collectives/barrier.hpp"

#include "loom/ops/collectives.hpp"
#include "loom/runtime/error.hpp"
#include "ops/collectives/coll_state.hpp"
#include "runtime/call_agreement.hpp"
#include "runtime/nvtx_range.hpp"

namespace loom::coll {

namespace {
Launch barrier_launch(const Core* core, std::uint32_t hold_ns) {
    Launch l;
    l.header = "loom/kernels/collectives/coll_common.cuh";
    l.name = "loom::kernels::coll::coll_barrier";
    l.blocks = 1;
    l.threads = 32;
    if (core) l.params = core->params();
    l.params.hold_ns = hold_ns;
    return l;
}
}  // namespace

BarrierKernel::BarrierKernel(World&) : kernel(&load(barrier_launch(nullptr, 0))) {}

void launch_barrier(World& world, const Core& core, cudaStream_t stream, std::uint32_t hold_ns) {
    const BarrierKernel& b = world.state<BarrierKernel>();
    launch(world, *b.kernel, barrier_launch(&core, hold_ns), stream);
}

void prepare_barrier(World& world) {
    world.state<Core>();
    world.state<BarrierKernel>();
}

}  // namespace loom::coll

namespace loom {

void barrier_on_stream(World& world, cudaStream_t stream, double hold_us) {
    const loom::detail::NvtxRange nvtx("loom::barrier_on_stream");
    const detail::AgreedCall agreed(
        world, [] { return detail::CallSignature("barrier_on_stream"); },
        [hold_us] {
            LOOM_CHECK(hold_us >= 0 && hold_us <= 1e6, "barrier_on_stream: expected hold_us in [0, 1e6], given {}",
                       hold_us);
        });
    LOOM_CHECK(hold_us >= 0 && hold_us <= 1e6, "barrier_on_stream: expected hold_us in [0, 1e6], given {}", hold_us);
    const coll::Core& core = coll::core(world, stream, "barrier_on_stream");
    coll::launch_barrier(world, core, stream, static_cast<uint32_t>(hold_us * 1e3));
}

}  // namespace loom
