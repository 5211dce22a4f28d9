// State of the overlapped ops (ag_gemm, gemm_rs, gemm_ar), owned by the World (loom::WorldState).
//
// Each algorithm declares one state type with the key "overlap/<op>/<algorithm>": its symmetric signals (a struct of
// kernels/overlap/overlap_params.hpp holding the fields it uses), its buffers, a side stream where it has one, and the
// host-side call counters from which its signal targets are computed. op_state<S>() creates it on the algorithm's
// first call on a World (collective: every rank makes the same first call) and the World keeps it until
// release_overlap_state(world) (World::release_states("overlap/")) or its own end. Calls on one World come from one
// thread at a time (as for collectives). The pieces below are what the states are made of; the helpers work on them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "loom/ops/overlap.hpp"
#include "loom/runtime/world.hpp"
#include "loom/runtime/world_state.hpp"
#include "runtime/symmetric_zeroed.hpp"

namespace loom {

// The SMs an op plans on, which the plans divide between the GEMM and the communication blocks: `requested` (the
// options' num_sms) when > 0, at most device_sms; else device_sms. Under MPS, cudaDevAttrMultiProcessorCount already
// reports the client's share (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), so device_sms is that attribute. Raises for a
// negative request.
int overlap_usable_sms(int device_sms, int requested);

}  // namespace loom

namespace loom::overlap {

// The device facts every overlapped op plans on (no symmetric memory). Created on the first overlapped call on a
// World: collective, the ranks compare their GPUs through the store.
struct DeviceFacts final : WorldState {
    static constexpr const char* kKey = "overlap/device";
    explicit DeviceFacts(World& world);
    int device = 0;
    int arch = 0;             // compute capability x 10
    int device_sms = 0;       // cudaDevAttrMultiProcessorCount (under MPS: this client's share); ranks sharing the
                              // GPU without a share each: shared_gpu_sm_budget's part of it
    bool shared_gpu = false;  // some GPU of the World runs several ranks (collective_topology: the same on every rank)
    int ranks_per_gpu = 1;    // the most ranks any GPU of the World runs (collective_topology)
};

// Raises the op's error for a state that a CUDA graph capture (`captured`) would have to create.
void check_state_outside_capture(const char* op, bool captured);

// The World's S (an algorithm's state, or DeviceFacts), created on first use. While capturing a CUDA graph
// (`captured`) it must exist already: creating a state synchronises the device (and meets the peers).
template <class S>
S& op_state(World& world, const char* op, bool captured = false) {
    if (S* s = world.find_state<S>()) return *s;
    check_state_outside_capture(op, captured);
    return world.state<S>();
}

// The World's DeviceFacts (op_state); raises for a World the overlapped ops do not support (more than kMaxLocalPeers
// ranks per node, a GPU older than Hopper). A World of several nodes is supported: which algorithms run there is each
// op's choice (check_across_nodes, checks.hpp).
const DeviceFacts& device_facts(World& world, const char* op, bool captured = false);
// The SMs a call plans on (overlap_usable_sms of its options' num_sms); raises below 2 (one for the GEMM, one for the
// communication blocks).
int plan_sms(const DeviceFacts& dev, int requested, const char* op);

// An algorithm's symmetric signals: one Sig in the symmetric heap, zeroed once (detail::alloc_zeroed: no peer writes a
// rank's signals before they are zero). Freed by release() (the state's).
template <class Sig>
struct SymmetricSignals {
    Sig* p = nullptr;
    explicit SymmetricSignals(World& world) : p(detail::alloc_zeroed<Sig>(world, 1)) {}
    Sig* operator->() const { return p; }
    void release(World& world) {
        if (p) world.free(p);
        p = nullptr;
    }
};

// A symmetric buffer an algorithm grows on demand (gather buffer, scratch, partial products). Freed by release().
struct SymmetricBuffer {
    void* p = nullptr;
    std::size_t bytes = 0;
    void release(World& world);
};

// A local device buffer (cudaMalloc), freed with its state.
struct LocalBuffer {
    void* p = nullptr;
    std::size_t bytes = 0;
    LocalBuffer() = default;
    LocalBuffer(const LocalBuffer&) = delete;
    LocalBuffer& operator=(const LocalBuffer&) = delete;
    ~LocalBuffer();
};

// A side stream with its fork / join events, destroyed with its state.
struct SideStream {
    cudaStream_t stream = nullptr;
    cudaEvent_t forked = nullptr, joined = nullptr;
    SideStream();
    SideStream(const SideStream&) = delete;
    SideStream& operator=(const SideStream&) = delete;
    ~SideStream();
};

// buf with at least `bytes` (collective: every rank asks for the same sizes in the same calls). Growing synchronises
// the device and meets every rank first (peers may still read the old buffer), then reallocates; while capturing a
// CUDA graph (`captured`) it raises instead.
void* ensure_symmetric(World& world, SymmetricBuffer& buf, std::size_t bytes, bool captured = false);
// buf as two parity halves of at least `half_bytes` each (ensure_symmetric's collective growth); returns the offset
// of half 1 (half e % 2 of call e starts at (e % 2) x that). The halves sit at half of the allocation, 1 KiB aligned,
// not at this call's size: the same on every rank and in every call between growths, so a smaller call right after a
// larger one does not write its half inside the previous call's, which peers may still be reading.
std::size_t ensure_parity_halves(World& world, SymmetricBuffer& buf, std::size_t half_bytes, bool captured = false);
// buf with at least `bytes` (cudaMalloc; the device is synchronised before a reallocation).
void* ensure_local(LocalBuffer& buf, std::size_t bytes);

// The side stream starts after everything enqueued on `stream` so far (fork) and `stream` continues after
// everything enqueued on the side stream (join).
void fork(SideStream& side, cudaStream_t stream);
void join(SideStream& side, cudaStream_t stream);

// The common base of an algorithm's state: its symmetric signals (Sig) and symmetric buffer (the algorithm names what
// it holds), both freed by release(). A state type adds its key, local resources and counters:
//   struct S final : SignalState<kernels::overlap::SSignals> {
//       static constexpr const char* kKey = "overlap/<op>/<algorithm>";
//       explicit S(World& world) : SignalState(world) {}
//   };
template <class Sig>
struct SignalState : WorldState {
    explicit SignalState(World& world) : sig(world) {}
    void release(World& world) override {
        buf.release(world);
        sig.release(world);
    }
    SymmetricSignals<Sig> sig;
    SymmetricBuffer buf;
};

// The sequential algorithms' partial products: loom::gemm's output in parity halves of one symmetric buffer, the half
// chosen by the call counter.
struct PartialHalves {
    SymmetricBuffer buf;
    std::uint64_t calls = 0;  // the calls that wrote a half (the epoch of the current call)
};
// The common base of a state that holds only PartialHalves (no signals).
struct PartialsState : WorldState {
    void release(World& world) override { partials.buf.release(world); }
    PartialHalves partials;
};

}  // namespace loom::overlap
