// Attention ops (docs/attention.md).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "loom/ops/gemm.hpp"
#include "loom/runtime/world.hpp"
#include "loom/tensor.hpp"

namespace loom {

// ---- Ulysses sequence parallelism ------------------------------------------------------------------------------
// DeepSpeed-Ulysses' all-to-alls around attention, overlapped with the projections (docs/attention.md "Ulysses
// sequence parallelism"). W ranks split a sequence of S tokens (S / W each) and the heads (Hq / W q heads each):
//
//   qkv_gemm_a2a  x[S / W, hidden] * W_qkv[(Hq + 2 Hkv) D, hidden]^T, then heads <-> sequence: every rank ends with
//                 q[S, Hq / W, D], k[S, Hkv_r, D], v[S, Hkv_r, D] (the whole sequence, its heads).
//   a2a_o_gemm    o[S, Hq / W, D] (attention's output, its heads), then sequence <-> heads: o_shard[S / W, Hq D],
//                 out[S / W, hidden] = o_shard * W_o[hidden, Hq D]^T.
//
// Heads: rank r owns q heads [r Hq / W, (r + 1) Hq / W) and kv heads [floor(r Hkv / W), + Hkv_r), Hkv_r =
// max(Hkv / W, 1): W must divide Hq and Hq / Hkv must be whole; either W divides Hkv (each rank its Hkv / W kv heads)
// or Hkv divides W (each rank the one kv head of its q heads, replicated on W / Hkv ranks). Rows of a [S, heads, D]
// tensor are tokens in rank order: rank p's shard is rows [p S / W, (p + 1) S / W).
// Collective over the World (every rank the same shapes and options, in the same order); enqueued on `stream`
// without synchronising the host. bf16 or fp16 throughout, fp32 accumulation; D a multiple of 8; every buffer
// anywhere on the device (the ops stage through their own symmetric buffers). Single-node worlds, sm_90.
enum class UlyssesAlgo {
    Auto,        // Fused with more than one rank, else Sequential
    Fused,       // qkv_gemm_a2a: the GEMM publishes each tile and a side-stream kernel pulls this rank's head columns
                 // of every rank's tiles as they are stored; a2a_o_gemm: a side-stream kernel pushes o's row chunks
                 // to their owners while the GEMM's tiles wait for their chunks
    Sequential,  // loom::gemm, then the all-to-all kernel (a2a_o_gemm: the all-to-all, then loom::gemm): no overlap
};
const char* to_string(UlyssesAlgo a);

struct UlyssesHeads {
    int64_t q = 0;    // Hq: query heads (all ranks)
    int64_t kv = 0;   // Hkv: key / value heads (all ranks); Hq a multiple of it
    int64_t dim = 0;  // D
};

struct UlyssesOptions {
    UlyssesAlgo algo = UlyssesAlgo::Auto;
    int comm_sms = 0;                    // Fused: the all-to-all kernel's blocks; 0: 16 (at most a quarter of the SMs)
    const GemmConfig* config = nullptr;  // Fused: the GEMM's tile config (cluster_m 1); nullptr: the heuristic
    int num_sms = 0;                     // the SMs the op plans on; 0: the device's (under MPS the client's share)
};

// x: [S / W, hidden]; w_qkv: [(Hq + 2 Hkv) D, hidden] (rows: the q heads', then k's, then v's); q: [S, Hq / W x D];
// k, v: [S, Hkv_r x D] (row strides may exceed the widths).
void qkv_gemm_a2a(World& world, const MatrixView& x, const MatrixView& w_qkv, const UlyssesHeads& heads,
                  const MatrixView& q, const MatrixView& k, const MatrixView& v, cudaStream_t stream,
                  const UlyssesOptions& opts = {});
// o: [S, Hq / W x D]; w_o: [hidden, Hq D]; out: [S / W, hidden].
void a2a_o_gemm(World& world, const MatrixView& o, const MatrixView& w_o, const MatrixView& out, cudaStream_t stream,
                const UlyssesOptions& opts = {});

// Frees the Ulysses ops' state on this World: buffers, signals, side streams (collective; synchronises the device).
void release_ulysses_state(World& world);

}  // namespace loom
