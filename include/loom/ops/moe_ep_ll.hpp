// Expert-parallel MoE dispatch / combine, low-latency mode (decode; docs/moe.md "Expert parallelism: low-latency
// mode"). E experts over the W ranks (any number of nodes), L = E / W of them per rank: expert e lives on rank e / L
// as local expert e % L. Every rank passes at most max_tokens tokens per call (T may differ per rank, T may be 0).
//
//   ep_ll_dispatch   each (token t, slot s) entry with topk_idx[t, s] >= 0 goes to its expert's rank: the token's row
//                    (fp8 e4m3 with one fp32 scale per 128 elements, cast in the send, or bf16), received in the
//                    expert-major layout recv.x [L, W x M, H]: local expert le's entries from source rank r are rows
//                    [r x M, r x M + recv.counts[le, r]) of block le (in no particular order), recv.src_info their
//                    source entries t x k + s.
//   ep_ll_combine    the expert outputs [L, W x M, H] bf16 (rows in dispatch's receive layout) go back to their
//                    tokens' ranks: y[t] = sum over slots s with topk_idx[t, s] >= 0 of topk_weights[t, s] x
//                    expert_out(entry (t, s)), fp32 accumulation in slot order, bf16 out. Where expert_out is in the
//                    World's symmetric heap (World::alloc), the token ranks on this node read each row from there
//                    (one pass over the bytes, no copy through the op's buffers); elsewhere (cudaMalloc memory, or a
//                    token rank on another node) the rows are pushed to the token's rank. Each rank decides for its
//                    own expert_out. Either way expert_out is free again when the call (its receive half) completes.
//
// Collective over the World (same order, shape and options on every rank; one stream per World for these ops).
// Stream-ordered, no host synchronisation, no barrier between calls (the buffers are double-buffered), capturable in a
// CUDA graph once a call of the same shape and options ran outside the capture (the first call of a shape allocates
// the op's symmetric buffers: collective, synchronising). The kernels are compiled at first use by Loom's JIT.
//
// Return without waiting (options.return_without_waiting): the call launches only the send half and returns; the
// entries travel while the stream runs other work; ep_ll_dispatch_wait / ep_ll_combine_wait launch the receive half
// (which waits for the peers' sends and writes the outputs). A pending receive must be completed before the next call
// of the same op (and before a combine reads a dispatch's recv).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "loom/runtime/world.hpp"
#include "loom/tensor.hpp"

namespace loom {

struct EpLowLatencyShape {
    int max_tokens = 0;   // M: the most tokens a rank passes in one call (recv capacity W x M per local expert)
    int hidden = 0;       // H: a multiple of 128
    int topk = 0;         // k: 1..32
    int num_experts = 0;  // E: a multiple of the world size, at most 1024

    int local_experts(int world_size) const { return num_experts / world_size; }
};

// The receive layout of a dispatch, in the caller's device memory (16-byte aligned); combine reads src_info and
// counts. Sizes: ep_ll_recv_x_bytes etc.
struct EpLowLatencyRecv {
    void* x = nullptr;            // [L, W x M, H] fp8 e4m3 (options.fp8) or bf16
    float* scales = nullptr;      // [L, W x M, H / 128] fp32: x = fp8 x scale (options.fp8; else unused)
    int32_t* src_info = nullptr;  // [L, W x M] the source entry t x k + s of each row
    int32_t* counts = nullptr;    // [L, W] rows received from each source rank
};

struct EpLowLatencyOptions {
    bool fp8 = true;                      // dispatch: cast to fp8 e4m3 with per-128 scales in the send (else bf16)
    bool return_without_waiting = false;  // launch the send half only; the *_wait call launches the receive half
    // dispatch, one node: every rank's recv.x, recv.scales and recv.src_info are in the World's symmetric heap
    // (World::alloc); the senders write each entry straight into them once the receiver's call has started, and the
    // receive half only counts (no copy). Any buffers of the heap will do (the offsets travel with the call).
    bool recv_in_heap = false;
};

std::size_t ep_ll_recv_x_bytes(const EpLowLatencyShape& shape, int world_size, bool fp8);
std::size_t ep_ll_recv_scales_bytes(const EpLowLatencyShape& shape, int world_size);
std::size_t ep_ll_recv_src_info_bytes(const EpLowLatencyShape& shape, int world_size);
std::size_t ep_ll_recv_counts_bytes(const EpLowLatencyShape& shape, int world_size);

// x: [T, H] bf16, T <= max_tokens (rows 16-byte aligned); topk_idx: DEVICE int32 [T, k], ids in [0, E) or -1 (slot
// unused); an id outside [-1, E), or more entries for one expert than max_tokens (a token naming an expert twice),
// traps the kernel with a named "bad index" diagnostic. Raises loom::Error naming the argument on bad host input.
void ep_ll_dispatch(World& world, const MatrixView& x, const int32_t* topk_idx, const EpLowLatencyShape& shape,
                    const EpLowLatencyRecv& recv, cudaStream_t stream, const EpLowLatencyOptions& opts = {});
// The receive half of a dispatch made with return_without_waiting (into that call's recv).
void ep_ll_dispatch_wait(World& world, cudaStream_t stream);

// expert_out: [L x W x M, H] bf16 dense (block le, row r x M + i: the output for recv row (le, r x M + i)); recv: the
// dispatch's (src_info, counts); topk_idx, topk_weights: DEVICE [T, k] (the dispatch's routing); y: [T, H] bf16.
void ep_ll_combine(World& world, const MatrixView& expert_out, const int32_t* topk_idx, const float* topk_weights,
                   const EpLowLatencyShape& shape, const EpLowLatencyRecv& recv, const MatrixView& y,
                   cudaStream_t stream, const EpLowLatencyOptions& opts = {});
// The receive half of a combine made with return_without_waiting (into that call's y).
void ep_ll_combine_wait(World& world, cudaStream_t stream);

// Frees the ops' state (symmetric buffers; collective). The next call creates it again.
void release_ep_ll_state(World& world);

}  // namespace loom
