// loom::WorldState: the extension slot through which an op family keeps per-World state.
//
// Each algorithm that needs state across calls (signals, scratch, side streams, call counters) declares one type
// derived from WorldState with a unique key (`static constexpr const char* kKey = "overlap/ag_gemm/direct"`, the
// family first) and a constructor taking the World. World::state<S>() creates it on first use and the World owns it:
// it is destroyed with the World (before the symmetric heap is unmapped) or by World::release_states(prefix).
// A new op family adds its own state types; it edits nothing shared.
#pragma once

namespace loom {

class World;

class WorldState {
  public:
    WorldState() = default;
    WorldState(const WorldState&) = delete;
    WorldState& operator=(const WorldState&) = delete;
    // Frees local resources (streams, events, cudaMalloc'd memory). Never throws.
    virtual ~WorldState() = default;
    // Frees the state's symmetric allocations (World::free). Collective: World::release_states calls it on every rank
    // for the same states in the same (key) order, after synchronising the device and meeting the peers. Not called
    // when the World shuts down, which unmaps the whole heap.
    virtual void release(World& world) { (void)world; }
};

}  // namespace loom
