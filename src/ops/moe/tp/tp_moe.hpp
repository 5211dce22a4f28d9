// The TP-MoE ops' internals: the validated call every algorithm takes, the checks, the algorithms.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "loom/ops/moe.hpp"
#include "loom/runtime/world.hpp"
#include "loom/runtime/world_state.hpp"

namespace loom::moe {

// One ag_moe call, validated: E experts, N the slice's product columns (w_up's rows / E with NK).
struct AgMoeCall {
    World* world = nullptr;
    MatrixView x, w_up, out;
    const int32_t* topk_idx = nullptr;
    const float* topk_weights = nullptr;
    MoeRouting routing;
    cudaStream_t stream = nullptr;
    TpMoeOptions opts;
    bool captured = false;  // the stream is capturing a CUDA graph
};
// One moe_rs / moe_ar call, validated: H = w_down's rows / E (NK).
struct MoeDownCall {
    World* world = nullptr;
    MatrixView rows, w_down, out;
    MoeRouting routing;
    cudaStream_t stream = nullptr;
    TpMoeOptions opts;
    bool captured = false;
};

// Argument checks (raise loom::Error naming the op, the argument, what was expected and what was given).
void check_ag_moe(const AgMoeCall& c);
void check_moe_rs(const MoeDownCall& c);
void check_moe_ar(const MoeDownCall& c);

// A symmetric buffer grown on demand (collective: every rank asks for the same sizes in the same order).
struct SymmetricBuffer {
    void* data = nullptr;
    std::size_t bytes = 0;
    // At least `need` bytes; growing inside a CUDA graph capture raises (it synchronises the device).
    void* ensure(World& world, std::size_t need, const char* op, bool captured);
    void release(World& world);
};

// What the choice between the algorithms depends on (fused_plan.cpp; a pure function of these, for CPU tests).
struct TpMoeFacts {
    int world = 1;            // world size
    bool single_node = true;  // world size == local world size <= kMaxLocalPeers
    bool captured = false;    // the stream is capturing a CUDA graph
    int arch = 0;             // compute capability x 10 (0: not asked, e.g. while capturing)
    int device_sms = 0;       // SMs this rank plans on (under MPS: its share)
    int64_t rows = 0;         // the call's routed rows: gathered tokens x top-k
    bool x_words = true;      // ag_moe: x's rows are whole 16-byte words from a 16-byte aligned address
};
// ag_moe: whether x's rows are whole 16-byte words from a 16-byte aligned address (the fused push moves such words).
bool x_in_words(const MatrixView& x);
// Auto's smallest call for a fused algorithm, in routed rows (docs/perf/moe.json and bench-moe tp --tokens on 4 ranks
// sharing an H200: ag_moe Fused at 0.97x Sequential at 1024 rows (Mixtral-8x7B, 512 tokens), 1.00-1.06x from 2048;
// moe_rs within 2 % either way below 2048 rows and ahead above): smaller calls stream weights, and the fused
// algorithms' waits cost what their overlap saves.
inline constexpr int64_t kTpMoeFusedMinRows = 2048;
// The algorithm `requested` resolves to for `op`. Auto: Fused where it applies (world > 1, one node, sm_90, at least
// 2 SMs, not capturing: its signal values are host call counts) and the call has
// kTpMoeFusedMinRows routed rows or more, else Sequential. Fused where it does not apply raises loom::Error naming the
// op and why.
TpMoeAlgo choose_tp_moe_algo(const char* op, TpMoeAlgo requested, const TpMoeFacts& f);
// ag_moe Fused: blocks of the push kernel writing `push_bytes` (its routed rows times the ranks): one per 64 KiB, 1 at
// least, at most two per SM of device_sms (the push precedes the GEMM on the stream: nothing of this rank runs beside
// it).
int ag_push_blocks(int64_t push_bytes, int device_sms);
// moe_rs / moe_ar Fused: tokens per work item of the reduce kernels for `tokens` tokens per source rank, rows of h
// elements of elem_bytes: about 4096 16-byte words of output per item, at least 8 items where the tokens allow, at
// most kTpMoeMaxChunkEntries / topk (the item's staged routing pairs); 1 at least.
int down_chunk_tokens(int64_t tokens, int64_t h, int elem_bytes, int topk);
// moe_rs Fused: blocks of the reduce kernel beside the GEMM: enough to move `side_bytes` (the peers' send items, which
// become ready while the GEMM runs) in half the GEMM's estimated time (its flops at ~5 TFLOP/s, or its bytes at
// ~30 GB/s, per SM of num_sms, whichever is longer) at ~30 GB/s a block; 1 at least, at most a quarter of the SMs and
// num_sms - 1 (the GEMM keeps the rest).
int rs_side_blocks(double side_bytes, double gemm_flops, double gemm_bytes, int num_sms);
// moe_rs / moe_ar Fused: blocks of the reduce kernel launched after the GEMM: two per SM (512 threads each), at most
// one per item, 1 at least.
int down_tail_blocks(int64_t items, int num_sms);

void ag_moe_sequential(const AgMoeCall& c);
void moe_rs_sequential(const MoeDownCall& c);
void moe_ar_sequential(const MoeDownCall& c);
void ag_moe_fused(const AgMoeCall& c);    // fused_ag.cpp
void moe_rs_fused(const MoeDownCall& c);  // fused_rs.cpp
void moe_ar_fused(const MoeDownCall& c);  // fused_ar.cpp

}  // namespace loom::moe
