#include "ops/collectives/coll_state.hpp"

#include <cstdio>
#include <string>

#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "runtime/log.hpp"
#include "runtime/symmetric_zeroed.hpp"

namespace loom::coll {

using kernels::coll::Params;
using kernels::coll::SyncState;

namespace {

// The SM budget of this rank (Budget::num_sms, resident_blocks) for the topology `topo`.
void plan_sms(World& world, Budget& b) {
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&b.num_sms, cudaDevAttrMultiProcessorCount, world.device()));
    if (!b.topo.shared_gpu) return;
    const int pct = settings().mps_thread_percentage;
    const int budget = shared_gpu_sm_budget(b.num_sms, b.topo.ranks_per_gpu, pct);
    if (budget == b.num_sms) return;
    // No MPS share per rank: every rank's kernels compete for every SM.
    if (world.rank() == 0) {
        const std::string share = pct > 0 ? std::to_string(pct) : std::string("unset");
        log(LogLevel::Warn,
            "warning: {} ranks share a GPU without an MPS share each (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={}): the "
            "collectives and overlapped ops keep to {} of the {} SMs per rank so that every rank's launches stay "
            "resident beside its peers'; give each rank its own share, at most 100 / ranks % (loomrun does), for "
            "kernels of other libraries to keep to it too",
            b.topo.ranks_per_gpu, share, budget, b.num_sms);
    }
    b.resident_blocks = budget;
    b.num_sms = budget;
}

}  // namespace

Core::Core(World& world) {
    LOOM_CHECK(world.world_size() == world.local_world_size(),
               "collectives: expected a single-node world (world size == local world size), given world size {} "
               "with {} ranks on this node (across nodes, all_gather, reduce_scatter, all_reduce, all_to_all and "
               "all_to_all_v run their hierarchical forms; barrier_on_stream runs within one node only)",
               world.world_size(), world.local_world_size());
    LOOM_CHECK(world.local_world_size() <= kMaxLocalPeers, "collectives: expected at most {} ranks per node, given {}",
               kMaxLocalPeers, world.local_world_size());
    sync = detail::alloc_zeroed<SyncState>(world, 1);
    budget.topo = collective_topology(world);
    plan_sms(world, budget);
}

void Core::release(World& world) { world.free(sync); }

Params Core::params() const {
    Params p{};
    p.sync = sync;
    return p;
}

Scratch::Scratch(World& world) : bytes(world.coll_scratch()) { data = world.alloc<char>(bytes); }

void Scratch::release(World& world) {
    // Cached plans may point into the scratch.
    if (Core* c = world.find_state<Core>()) c->plans.clear();
    world.free(data);
}

void Scratch::attach(Params& p) const {
    p.scratch = data;
    p.scratch_bytes = bytes;
}

void check_not_capturing(cudaStream_t stream, const char* op, const char* key) {
    LOOM_CHECK(!stream_ops::capturing(stream),
               "{}: the state '{}' does not exist yet, and creating it synchronises the device, which a CUDA-graph "
               "capture does not allow: make the same calls once without capturing first (a warm-up)",
               op, key);
}

}  // namespace loom::coll

// Declared in loom/ops/collectives.hpp.
void loom::release_collective_state(World& world) { world.release_states("collectives/"); }
