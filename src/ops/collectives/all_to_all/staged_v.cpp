// all_to_all_v's staging through symmetric memory, for buffers outside the symmetric heap.
//
// Counts and offsets: the kernels read every sender's send_counts (and, pulling, its send_offsets) from the sender's
// memory at the same symmetric offset. Where the caller's are not symmetric they are copied into A2avArgsArea (2 x
// kMaxLocalPeers int64, symmetric) on the stream before the kernel: ~1 us of one small copy. Every rank must then
// pass them equally placed (symmetric on every rank or on none), as every other argument of a collective. The area
// is free when a call copies into it: the peers read it between the entry and exit barriers of the previous call's
// kernels, which completed before this call's copy (stream order).
//
// Out (push into an out that is not symmetric; Auto's choice where neither in nor out is): in windows of C elements
// of out, C = the scratch's size. After a barrier kernel (every peer finished its earlier collectives, which may
// still read this rank's scratch), per window [base, base + C): copy the window of out into this rank's scratch (so
// that elements no block lands on keep their values, as with a symmetric out), run the push kernel with the window
// (round_base, round_elems: every sender writes only its blocks' part inside the receiver's window, into the
// receiver's scratch), and copy the scratch back into the window. The kernel's exit barrier (every block landed)
// orders the copy back; the next window's copy in follows it on the stream, and the peers write the scratch again
// only after the next kernel's entry barrier. Cost beyond the push into a symmetric out: two local copies of out's
// capacity (read and written twice), a barrier kernel, and a kernel launch per window.
#include <algorithm>
#include <cstdint>

#include "loom/runtime/error.hpp"
#include "ops/collectives/all_to_all/algorithms.hpp"
#include "ops/collectives/barrier.hpp"

namespace loom::coll {

namespace {

// Symmetric [2][kMaxLocalPeers] int64: send_counts (row 0) and send_offsets (row 1) of the call, where staged. Written
// by a copy before every kernel that reads it, so neither zeroed nor met over when created.
struct A2avArgsArea final : WorldState {
    static constexpr const char* kKey = "collectives/all_to_all_v/args";
    explicit A2avArgsArea(World& world) : data(world.alloc<int64_t>(2 * kMaxLocalPeers)) {}
    void release(World& world) override { world.free(data); }

    int64_t* data = nullptr;
};

const int64_t* staged_copy(World& world, int64_t* dst, const int64_t* src, cudaStream_t stream) {
    LOOM_CHECK_CUDA(cudaMemcpyAsync(dst, src, sizeof(int64_t) * world.world_size(), cudaMemcpyDeviceToDevice, stream));
    return dst;
}

}  // namespace

A2avArgs stage_a2av_args(World& world, cudaStream_t stream, bool pull, const A2avArgs& given) {
    const std::size_t bytes = sizeof(int64_t) * world.world_size();
    const bool counts = !world.is_symmetric(given.send_counts, bytes);
    const bool offsets = pull && given.send_offsets != nullptr && !world.is_symmetric(given.send_offsets, bytes);
    if (!counts && !offsets) return given;
    int64_t* const area = world.state<A2avArgsArea>().data;
    A2avArgs a = given;
    if (counts) a.send_counts = staged_copy(world, area, given.send_counts, stream);
    if (offsets) a.send_offsets = staged_copy(world, area + kMaxLocalPeers, given.send_offsets, stream);
    return a;
}

void all_to_all_v_staged(World& world, Core& core, Launch l, const BufferView& out, cudaStream_t stream) {
    LOOM_CHECK(l.name == "loom::kernels::coll::all_to_all_v_push",
               "all_to_all_v: staged through the scratch runs push, given {}", l.name);
    const std::size_t es = dtype_size(out.dtype), cap = out.count;
    const Scratch& scratch = world.state<Scratch>();
    const std::size_t C = std::min(cap, scratch.bytes / es / 16 * 16);  // elements per window, the same on every rank
    const jit::Kernel& k = load(l);                                     // compiled before anything is enqueued
    l.params.out = scratch.data;
    l.params.round_elems = C;
    launch_barrier(world, core, stream);
    char* const dst = static_cast<char*>(out.data);
    for (std::size_t base = 0; base < cap; base += C) {
        const std::size_t n = std::min(C, cap - base);
        LOOM_CHECK_CUDA(cudaMemcpyAsync(scratch.data, dst + base * es, n * es, cudaMemcpyDeviceToDevice, stream));
        l.params.round_base = base;
        launch(world, k, l, stream);
        LOOM_CHECK_CUDA(cudaMemcpyAsync(dst + base * es, scratch.data, n * es, cudaMemcpyDeviceToDevice, stream));
    }
}

}  // namespace loom::coll
