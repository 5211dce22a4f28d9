// Expert-parallel MoE dispatch / combine, throughput mode (docs/moe.md, "Expert parallelism: throughput mode"): the
// prefill / training path, DeepEP's "normal" kernels in Loom's terms. Experts are spread over the ranks (any number of
// nodes): E experts, E % W == 0, expert e on rank e / (E / W) as local expert e % (E / W).
//
//   ep_dispatch  each rank's tokens x[T, H] (T may differ per rank, and be 0) go to the ranks of their top-k experts,
//                each token once per destination rank, landing expert-contiguous in the receiver's buffer: the
//                handle's recv_x rows [recv_offsets[l], recv_offsets[l + 1]) are local expert l's tokens (sources in
//                rank order, each source's in token order), ready for loom::grouped_gemm with G = E / W groups
//   ep_combine   the experts' outputs (rows aligned with recv_x) go back and are reduced with the top-k weights into
//                y[T, H] in the original token order
//
// Collective over the World (every rank calls, same order, same options); stream-ordered. The layout is computed on
// the device; the ranks exchange their per-expert counts once per dispatch through symmetric memory (no host
// synchronisation) — except with capacity 0 (auto), where the host reads the needed capacity (one stream
// synchronisation per dispatch) and grows the buffers to it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "loom/ops/moe.hpp"
#include "loom/runtime/world.hpp"
#include "loom/tensor.hpp"

namespace loom {

struct EpOptions {
    // Rows (token, expert entries) any rank may receive per dispatch; the buffers (symmetric: 2 x capacity x H x 2
    // bytes plus capacity x k x 8 per rank) are sized to it at the first call that needs it. A dispatch whose routing
    // needs more on some rank moves no data and marks the handle (ep_check raises). 0 (auto): the capacity each call
    // needs, read by the host after the count exchange (one stream synchronisation per dispatch; buffers grow, never
    // shrink). Give it to capture dispatch / combine in a CUDA graph. A safe bound: W x T_max x min(k, E / W).
    int64_t capacity = 0;
    int num_blocks = 0;  // blocks of the data kernels; 0: from the sizes and the device's SMs
};

// One dispatch's result: valid until the next ep_dispatch on the World (one dispatch -> combine in flight).
struct EpHandle {
    int64_t tokens = 0, hidden = 0;  // this rank's T and H
    int topk = 0, num_experts = 0, local_experts = 0;
    int64_t capacity = 0;  // rows of recv_x (and of the expert output ep_combine takes)
    MatrixView recv_x;     // [capacity, H] bf16, symmetric: the received rows (rows past the last segment
                           // hold stale data)
    const int32_t* recv_offsets = nullptr;  // DEVICE int32 [local_experts + 1]: local expert l's rows
    const int32_t* recv_counts = nullptr;   // DEVICE int32 [local_experts]
    uint64_t call = 0;                      // the dispatch's number, unique in the process (internal)
};

// x: [T, H] bf16, H a multiple of 8, rows 16-byte aligned; topk_idx: DEVICE int32 [T, k] ids in [0, E) or -1 (slot
// unused; an id outside [-1, E) traps with "bad index ... ep_dispatch topk_idx"); topk_weights: DEVICE fp32 [T, k] or
// null (weights 1). ep_combine reads topk_idx and topk_weights again: both must stay unchanged until the handle's
// combine. k 1..32, E / W >= 1, E <= 1024; any number of nodes.
EpHandle ep_dispatch(World& world, const MatrixView& x, const int32_t* topk_idx, const float* topk_weights, int topk,
                     int num_experts, cudaStream_t stream, const EpOptions& opts = {});

// expert_out: [>= handle.capacity, H] bf16 — row i the expert output of recv_x's row i (e.g. grouped_gemm's C over
// recv_x and handle.recv_offsets); y: [T, H] bf16. y[t] = the sum over the ranks d that t went to (ascending) of
// bf16(p_d) in fp32, p_d = the sum over t's slots s on d (slot order, fp32 fma) of topk_weights[t, s] x
// expert_out(row of (t, s)); a token with no slot gets 0. At most one combine per dispatch.
void ep_combine(World& world, const EpHandle& handle, const MatrixView& expert_out, const MatrixView& y,
                cudaStream_t stream, const EpOptions& opts = {});

// Synchronises `stream` and raises loom::Error when the handle's dispatch overflowed its capacity (naming the rows it
// needed), or when the handle is not the World's latest dispatch.
void ep_check(World& world, const EpHandle& handle, cudaStream_t stream);

// Bytes of token rows this rank's dispatch of `handle` sends to other ranks (pairs x H x 2) — the combine pulls the
// same number back. Synchronises `stream` (reads the layout on the host); for benchmarks and reports.
int64_t ep_dispatch_bytes(World& world, const EpHandle& handle, cudaStream_t stream);

// ---- ep_moe_experts: dispatch -> the local experts' grouped GEMMs -> combine ---------------------------------------

enum class EpMoeAlgo {
    Auto,        // Sequential (Overlapped measured no faster with ranks sharing a GPU: docs/moe.md)
    Sequential,  // ep_dispatch, grouped_gemm (w_up, then w_down), ep_combine, one after the other
    Overlapped,  // the dispatch pushes expert by expert (local expert 0 of every rank first) and signals each
                 // (receiver, local expert) once its rows are stored; the first grouped GEMM's tiles of local expert l
                 // start as soon as every source's rows of l have landed, while later experts still arrive. A token
                 // going to several experts of one rank crosses once per expert (Sequential: once per rank). Not in
                 // a CUDA graph capture (raises). One node.
};
const char* to_string(EpMoeAlgo a);

struct EpMoeOptions {
    EpMoeAlgo algo = EpMoeAlgo::Auto;
    EpOptions ep{};             // the dispatch's and the combine's
    GroupedGemmOptions up{};    // the first grouped GEMM's (e.g. activation SwiGLU); max_rows is set by the op
    GroupedGemmOptions down{};  // the second's (with w_down)
};

// y = ep_combine(experts(ep_dispatch(x))): each received row goes through its local expert l: out = act(row x
// w_up_l^T) (GroupedGemmOptions up), then, when w_down.data is not null, out = out x w_down_l^T (options down). The
// experts' weights are this rank's L = E / W local experts stacked as grouped_gemm takes them (NK: w_up [L x N1, H],
// w_down [L x H, N1'] with N1' = N1, or N1 / 2 with SwiGLU); without w_down the first GEMM's output width must be H.
// x, topk_idx, topk_weights, topk, num_experts: as ep_dispatch. y: [T, H] bf16. The intermediate rows are the op's
// (device memory, grown to the capacity). Both algorithms give the same bits for the same GEMM options (Overlapped
// runs Sequential's grouped GEMM configs and tile order). Returns the dispatch's handle (combined already: for
// ep_check). Collective; stream-ordered; capacity 0 (auto) synchronises the stream once, as ep_dispatch.
EpHandle ep_moe_experts(World& world, const MatrixView& x, const int32_t* topk_idx, const float* topk_weights, int topk,
                        int num_experts, const MatrixView& w_up, const MatrixView& w_down, const MatrixView& y,
                        cudaStream_t stream, const EpMoeOptions& opts = {});

// Frees the EP throughput mode's state on this World (collective; synchronises the device).
void release_moe_ep_state(World& world);

}  // namespace loom
