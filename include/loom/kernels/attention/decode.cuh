// Flash-decode: one query token per sequence against its KV cache, split over the KV length.
//
//   decode_split<T, D, kHeads, kHeadSplit, kStages, kTile, kMma>
//                  grid (head_chunks, splits, batch x num_kv_heads), 128 x kHeadSplit threads. Block
//                  (c, s, b x Hkv + h) reads tokens [s x chunk, min(len, (s + 1) x chunk)) of KV head h of sequence b
//                  once, for the query heads [c x kHeads, +kHeads) of h's group (every query head of the group when it
//                  has at most kDecodeMaxHeads): all of them share each K / V row it loads.
//   decode_merge<T, D>
//                  one block per (b, q head): the softmax-weighted mean of the splits' partials (when the split kernel
//                  does not merge them itself).
//
// Data path of decode_split: a cp.async pipeline of kStages shared-memory stages, each a tile of kTile tokens of K and
// of V (4 x kTile x D bytes; 16 KiB at kTile = 4096 / D), kStages - 1 tiles in flight while one is consumed and
// kStages while the block waits for one. Every thread copies 16-byte chunks of the tile's rows, one lane of each row
// computing the row's address for the others (shuffled). A paged cache's block-table entries (one per token row: page
// size 1 is a page per token) are copied by cp.async into a shared-memory ring kStages tiles ahead of their tile, in
// the group of an earlier tile, so a page lookup is a shared-memory read and never a global load that the copies wait
// on. Two barriers per tile: iteration i refills the stage that tile i - 1 used with tile i + kStages - 1 once every
// warp is done with it, then waits for tile i.
//
// Consumers, CUDA cores (kMma 0): in each 128-thread half, a token's head row (D elements) is read from shared memory
// by D / 8 lanes, 16 bytes each (a warp reads whole rows: no bank conflicts); the half's 128 / (D / 8) token lanes take
// kTile / (128 / (D / 8)) tokens of each tile. Scores: each lane dots its 8 elements with each of its half's query
// heads, a butterfly over the D / 8 lanes sums them. Tensor cores (kMma 1): each warp takes 16-token slices of the
// tile; S = Q K^T and O += P V by mma.sync m16n8k16 with the block's heads as the rows of the A operand (rows past
// kHeads zero, so half the MMA work is padding: the tensor cores have it to spare); K and V fragments by ldmatrix (V
// transposed). Either way the softmax is online in the log2 domain (scores times scale x log2 e; ex2.approx), per
// token lane or per warp, rescaled once per tile (per 16-token slice with kMma); the partial (max, sum, acc) states
// are combined through the pipeline's shared memory (reused) at the end.
//
// Results: with one split the block writes O (of T) and LSE = ln(sum_j exp(s_j)) directly; with more, each split
// writes its normalised partial O (fp32) and its log2-domain LSE, and either the last split block of its (sequence,
// kv head, head chunk) to finish merges them (merge_counters: an arrival counter per triple) or decode_merge does.
// A split (or a sequence) without tokens has LSE -inf and O = 0; a sequence of length 0 therefore gets O = 0,
// LSE = -inf.
//
// Bad device data traps, naming itself: a length outside [0, max_seq_len], a block-table entry outside
// [0, num_pages).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "loom/config.hpp"
#include "loom/kernels/attention/decode_params.hpp"
#include "loom/ptx/async.cuh"
#include "loom/ptx/memory.cuh"
#include "loom/ptx/sm80.cuh"
#include "loom/ptx/special.cuh"
#include "loom/tile/convert.cuh"

namespace loom::kernels::attention {

LOOM_DEVICE LOOM_FORCEINLINE float neg_inf() { return __int_as_float(0xff800000u); }
// 2^x, approximate (2 ulp); 2^-inf = 0.
LOOM_DEVICE LOOM_FORCEINLINE float fast_exp2(float x) { return ptx::ex2_approx_ftz(x); }

template <class T>
LOOM_DEVICE LOOM_FORCEINLINE void to_float8(const uint4& v, float (&f)[8]);
template <>
LOOM_DEVICE LOOM_FORCEINLINE void to_float8<__nv_bfloat16>(const uint4& v, float (&f)[8]) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}
template <>
LOOM_DEVICE LOOM_FORCEINLINE void to_float8<__half>(const uint4& v, float (&f)[8]) {
    const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 t = __half22float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}
using tile::from_float;

// Two floats as a packed pair of T (the first in the low half): an mma operand register.
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE uint32_t pack2(float lo, float hi);
template <>
LOOM_DEVICE LOOM_FORCEINLINE uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
LOOM_DEVICE LOOM_FORCEINLINE uint32_t pack2<__half>(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- named traps for bad device data --------------------------------------------------------------------------
// One call at the kernel's end (a call inside the loop would make ptxas save the loop's registers around it), by the
// threads that saw bad data; the first of each warp prints, then every one traps.
__noinline__ LOOM_DEVICE inline void trap_bad_input(int b, int len, int max_len, int bad_i, int bad_page,
                                                    int num_pages) {
    const unsigned active = __activemask();
    if ((threadIdx.x & 31) == static_cast<unsigned>(__ffs(active) - 1)) {
        if (len < 0 || len > max_len) {
            printf("loom: decode_attention: seq_lens[%d] = %d is outside [0, %d] (the KV capacity, or max_seq_len)\n",
                   b, len, max_len);
        } else {
            printf("loom: decode_attention: block_table[%d][%d] = %d is outside [0, %d) (num_pages)\n", b, bad_i,
                   bad_page, num_pages);
        }
    }
    __trap();
}

// The softmax-weighted mean of one row's split partials at columns [d, d + N): writes o[0, N), returns the row's
// log2-domain LSE (-inf when no split has tokens; o is then 0). part_o / part_lse point at the row.
template <int N>
LOOM_DEVICE LOOM_FORCEINLINE float merge_splits(const float* part_o, const float* part_lse, int splits, int D, int d,
                                                float (&o)[N]) {
    float mx = neg_inf();
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, __ldcg(part_lse + s));
    const float ref = mx == neg_inf() ? 0.f : mx;
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = 0.f;
    for (int s = 0; s < splits; ++s) {
        const float w = fast_exp2(__ldcg(part_lse + s) - ref);
        sum += w;
#pragma unroll
        for (int k = 0; k < N; ++k) o[k] = fmaf(w, __ldcg(part_o + static_cast<int64_t>(s) * D + d + k), o[k]);
    }
    const bool any = sum > 0.f;
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = any ? o[k] / sum : 0.f;
    return any ? ref + log2f(sum) : neg_inf();
}

// Decode split kernel, one block per (head chunk, split, b x Hkv + kv head); see the file comment for the pipeline.
//   kHeads      query heads of the block (its share of the KV group)
//   kHeadSplit  1 or 2: 128 x kHeadSplit threads in halves of 128; half h holds query heads
//               [h kHeads / kHeadSplit, +kHeads / kHeadSplit) and reads every K / V row of a tile from shared memory
//   kStages     shared-memory stages (kStages - 1 tiles in flight while one is consumed, kStages during a wait)
//   kTile       tokens per stage: (kTile, D) of K and of V, 4 kTile D bytes per stage
//   kMma        0: CUDA-core consumers (token lanes); 1: tensor-core consumers (mma.sync m16n8k16, fp32 accumulate),
//               each of the 4 warps taking 16-token slices of the tile, the block's heads the rows of a 16-row A
//               operand (rows past kHeads zero): S = Q K^T, then O += P V with P rounded to T. kHeadSplit 1, kTile a
//               multiple of 64.
// Shared-memory rows are 16-byte chunks XOR-swizzled by the row (chunk c of row r at c ^ (r mod 8)), so that
// ldmatrix's 8-row reads hit 8 different bank groups; the token lanes read whole rows either way.
template <class T, int D, int kHeads, int kHeadSplit, int kStages, int kTile, int kMma>
__global__ void __launch_bounds__(128 * kHeadSplit, 2) decode_split(DecodeParams p) {
    static_assert(D == 64 || D == 128 || D == 256, "head_dim 64, 128 or 256");
    static_assert(kHeads >= 1 && kHeads <= kDecodeMaxHeads, "heads per block");
    static_assert(kHeadSplit == 1 || kHeadSplit == 2, "head split 1 or 2");
    static_assert(kHeads % kHeadSplit == 0, "the head split divides the heads");
    static_assert(kStages >= 2 && kStages <= 8, "2 ... 8 stages");
    static_assert(kMma == 0 || (kHeadSplit == 1 && kTile % 64 == 0), "tensor cores: one half, 64-token tiles");
    // A kernel launched programmatically after this one (sp_decode_attention's combine) may start its launch once
    // every block has begun; it waits in griddep_wait() for this grid to complete before reading any output.
    ptx::griddep_launch_dependents();
    constexpr int kThreads = 128 * kHeadSplit;
    constexpr int L = D / 8;                 // 16-byte chunks per token row
    constexpr int NG = 128 / L;              // token lanes of a head-split half
    constexpr int kH = kHeads / kHeadSplit;  // query heads per half
    constexpr int kSub = kTile / NG;         // tokens per token lane per tile
    static_assert(kMma == 1 || (kTile % (NG * kHeadSplit) == 0 && kSub >= 1 && kSub <= 8),
                  "tile: 1 ... 8 tokens per token lane");
    constexpr int kRows = kTile * L / kThreads;  // tile rows this thread copies (of K, and the same of V)
    constexpr int kRowStride = kThreads / L;     // between them
    constexpr int kStageElems = kTile * D;       // of K (and of V) per stage
    // The partial softmax states combined at the end: per half, kParts of them per head (token lanes, or warps).
    constexpr int kParts = kMma ? 4 : NG;

    // Dynamic shared memory: the pipeline, K then V, [kStages][kTile][D] of T each, then the block-table ring
    // [decode_table_slots(kStages)][kTile] of int32 and the sequence's table row pointer; after the loop it is reused
    // for the partial states (m, l, acc), then by the fused merge: decode_split_smem_bytes() is the larger of the two.
    // The kernel declares no static shared variables, so the window starts at the shared base, 128-byte aligned: a
    // cp.async's 32-byte global sector then lands in one aligned 32-byte piece of a stage. (A window 16 bytes past the
    // base makes every sector straddle two pieces: the copies read each sector from L2 twice and L2, not HBM, limits
    // the stream.)
    extern __shared__ __align__(128) unsigned char smem[];
    T* const sk = reinterpret_cast<T*>(smem);
    T* const sv = sk + kStages * kStageElems;

    const int tid = static_cast<int>(threadIdx.x);
    const int b = static_cast<int>(blockIdx.z) / p.num_kv_heads;
    const int kvh = static_cast<int>(blockIdx.z) - b * p.num_kv_heads;
    const int split = static_cast<int>(blockIdx.y);
    const int h_first = static_cast<int>(blockIdx.x) * kHeads;  // within the group
    const int nh = p.group - h_first < kHeads ? p.group - h_first : kHeads;
    const int64_t row0 = static_cast<int64_t>(b) * p.num_q_heads + kvh * p.group + h_first;  // first (b, q head)

    const int len_in = __ldg(p.seq_lens + b);
    const bool bad_len = len_in < 0 || len_in > p.max_seq_len;  // traps at the end
    const int len = bad_len ? 0 : len_in;
    const int t_begin = split * p.chunk;
    const int t_end = len < t_begin + p.chunk ? len : t_begin + p.chunk;
    const int tiles = t_end > t_begin ? (t_end - t_begin + kTile - 1) / kTile : 0;

    // Producer role: this thread copies 16-byte chunk pl = tid % L of the tile rows pr + i x kRowStride (pr = tid / L,
    // i < kRows), of K and of V. The L lanes of a row group share those rows' addresses: lane pl computes the KV rows
    // of rows i = pl + j x L (j < kOwn) and the others take them by shuffle, so a row costs one address computation
    // (a division, not one per 16-byte chunk). A paged cache's block-table entries come to a shared-memory ring by
    // 4-byte cp.async, one per token row, kStages tiles ahead of the tile (in the copy group of the tile copied then):
    // a page lookup is a shared-memory read of data that has landed, never a global load that a copy waits for.
    constexpr int kOwn = (kRows + L - 1) / L;                           // rows whose address this lane computes
    constexpr int kTablePerThread = (kTile + kThreads - 1) / kThreads;  // table entries this thread fetches per tile
    constexpr int kSlots = decode_table_slots(kStages);
    const uint32_t row_elems = static_cast<uint32_t>(p.num_kv_heads) * D;  // at most 65535 x 256
    const int pl = tid % L, pr = tid / L;
    const T* const kg = static_cast<const T*>(p.k) + static_cast<int64_t>(kvh) * D + pl * 8;
    const T* const vg = static_cast<const T*>(p.v) + static_cast<int64_t>(kvh) * D + pl * 8;
    int32_t* const s_table = reinterpret_cast<int32_t*>(sv + kStages * kStageElems);  // [kSlots][kTile]
    const bool paged = p.block_table != nullptr;
    int bad_i = -1, bad_page = 0;

    // The block-table entries of tile ft into ring slot ft % kSlots: entry r is the page of token row r (a division
    // per entry, once per tile). Rows past the chunk fetch nothing. The sequence's table row is read from shared
    // memory at each fetch rather than held in registers through the loop.
    const int32_t** const s_table_row = reinterpret_cast<const int32_t**>(s_table + kSlots * kTile);
    auto fetch_table = [&](int ft) {
        if (paged && ft < tiles) {
            const int32_t* const table_row = *s_table_row;
            int32_t* const slot = s_table + (ft % kSlots) * kTile;
#pragma unroll
            for (int k = 0; k < kTablePerThread; ++k) {
                const int r = tid + k * kThreads, t = t_begin + ft * kTile + r;
                if ((kTile % kThreads == 0 || r < kTile) && t < t_end)
                    ptx::cp_async_4(slot + r, table_row + t / p.page_size);
            }
        }
    };

    // Copies tile `tile` (when it exists) into its stage, fetches the table entries of tile + kStages, and commits a
    // group (an empty one past the last tile, so that the wait counts stay uniform). The tile's table entries (fetched
    // with tile - 1, or before the prologue) must have landed and be visible to the block.
    auto copy_tile = [&](int tile) {
        if (tile < tiles) {
            const int st = tile % kStages;
            const int t0 = t_begin + tile * kTile + pr;  // the token of row pr
            const int32_t* const slot = s_table + (tile % kSlots) * kTile;
            uint32_t own[kOwn];
#pragma unroll
            for (int j = 0; j < kOwn; ++j) {
                const int i = pl + j * L, r = pr + i * kRowStride;
                own[j] = 0;
                const int t = t0 + i * kRowStride;
                if (i < kRows && t < t_end) {
                    const int page_i = paged ? t / p.page_size : 0;  // a contiguous cache: page b, slot t
                    int page = b;
                    if (paged) {
                        page = slot[r];
                        if (static_cast<unsigned>(page) >= static_cast<unsigned>(p.num_pages)) {
                            bad_i = page_i;
                            bad_page = page;
                            page = 0;
                        }
                    }
                    own[j] = static_cast<uint32_t>(page) * static_cast<uint32_t>(p.page_size) +
                             static_cast<uint32_t>(t - page_i * p.page_size);
                }
            }
#pragma unroll
            for (int i = 0; i < kRows; ++i) {
                const int r = pr + i * kRowStride;
                const bool valid = t0 + i * kRowStride < t_end;
                const uint32_t row = __shfl_sync(0xffffffffu, own[i / L], i % L, L);
                const uint64_t off = valid ? static_cast<uint64_t>(row) * row_elems : 0;
                const int s_off = st * kStageElems + r * D + ((pl ^ (r & 7)) << 3);
                ptx::cp_async_16_zfill(sk + s_off, kg + off, valid);
                ptx::cp_async_16_zfill(sv + s_off, vg + off, valid);
            }
            fetch_table(tile + kStages);
        }
        ptx::cp_async_commit();
    };

    const bool capped = p.softcap > 0.f;
    // Pipeline: the table entries of tiles 0 ... kStages - 1 first (waited for), then tiles 0 ... kStages - 2 in flight
    // before the loop; iteration it refills the stage that iteration it - 1 consumed with tile it + kStages - 1 (once
    // every warp is done with it: a barrier), waits for tile it (this thread's copies, then everyone's: a barrier) and
    // consumes it. A refill is issued before the wait, so kStages tiles are in flight while the block waits.
    if (paged) {
        if (tid == 0) *s_table_row = p.block_table + static_cast<int64_t>(b) * p.max_pages;
        __syncthreads();
#pragma unroll
        for (int s = 0; s < kStages; ++s) fetch_table(s);
        ptx::cp_async_commit();
        ptx::cp_async_wait<0>();
        __syncthreads();
    }
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) copy_tile(s);

    // The partial states, written to shared memory after the loop: [kHeadSplit][kParts][kH] of (m, l) and of acc[D].
    float* const s_acc = reinterpret_cast<float*>(smem);  // [kHeadSplit][kParts][kH][D]
    float* const s_m = s_acc + kHeadSplit * kParts * kH * D;
    float* const s_l = s_m + kHeadSplit * kParts * kH;

    if constexpr (kMma == 0) {
        const int hs = tid / 128, u = tid % 128, tg = u / L, li = u % L;  // half, token lane, 16-byte lane
        // This lane's 8 elements of its half's query heads, pre-scaled (by scale x log2 e, or by scale before a
        // soft-cap).
        const float qscale = capped ? p.scale : p.scale_log2;
        float q[kH][8];
        const T* qp = static_cast<const T*>(p.q) + (row0 + hs * kH) * D + li * 8;
#pragma unroll
        for (int g = 0; g < kH; ++g) {
            if (hs * kH + g < nh) {
                to_float8<T>(ptx::ld_v4_nc(qp + g * D), q[g]);
#pragma unroll
                for (int e = 0; e < 8; ++e) q[g][e] *= qscale;
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) q[g][e] = 0.f;
            }
        }
        float m[kH], l[kH], acc[kH][8];
#pragma unroll
        for (int g = 0; g < kH; ++g) {
            m[g] = neg_inf();
            l[g] = 0.f;
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
        }
        for (int it = 0; it < tiles; ++it) {  // uniform over the block
            __syncthreads();                  // every warp is done with tile it - 1: its stage is free
            copy_tile(it + kStages - 1);
            ptx::cp_async_wait<kStages - 1>();
            __syncthreads();  // tile it has landed, for every thread's copies
            const int st = it % kStages;
            const int t0 = t_begin + it * kTile;
            const T* const kt = sk + st * kStageElems;
            const T* const vt = sv + st * kStageElems;
            // Scores (log2 domain) of this lane's tokens t0 + j x NG + tg, -inf past the chunk.
            float s[kSub][kH];
#pragma unroll
            for (int j = 0; j < kSub; ++j) {
                const int r = j * NG + tg;
                float kf[8];
                to_float8<T>(ptx::ld_shared_v4(kt + r * D + ((li ^ (r & 7)) << 3)), kf);
#pragma unroll
                for (int g = 0; g < kH; ++g) {
                    float d = 0.f;
#pragma unroll
                    for (int e = 0; e < 8; ++e) d = fmaf(q[g][e], kf[e], d);
                    s[j][g] = d;
                }
            }
#pragma unroll
            for (int j = 0; j < kSub; ++j) {
#pragma unroll
                for (int g = 0; g < kH; ++g) {
#pragma unroll
                    for (int o = L / 2; o > 0; o >>= 1) s[j][g] += __shfl_xor_sync(0xffffffffu, s[j][g], o);
                }
                const bool valid = t0 + j * NG + tg < t_end;
#pragma unroll
                for (int g = 0; g < kH; ++g) {
                    float x = s[j][g];
                    if (capped) x = p.softcap * tanhf(x / p.softcap) * kLog2e;
                    s[j][g] = valid ? x : neg_inf();
                }
            }
            // Online softmax per head.
#pragma unroll
            for (int g = 0; g < kH; ++g) {
                float mx = m[g];
#pragma unroll
                for (int j = 0; j < kSub; ++j) mx = fmaxf(mx, s[j][g]);
                const float ref = mx == neg_inf() ? 0.f : mx;
                const float c = fast_exp2(m[g] - ref);
                l[g] *= c;
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[g][e] *= c;
                m[g] = mx;
#pragma unroll
                for (int j = 0; j < kSub; ++j) s[j][g] = fast_exp2(s[j][g] - ref);  // now the weight
            }
#pragma unroll
            for (int j = 0; j < kSub; ++j) {
                const int r = j * NG + tg;
                float vf[8];
                to_float8<T>(ptx::ld_shared_v4(vt + r * D + ((li ^ (r & 7)) << 3)), vf);
#pragma unroll
                for (int g = 0; g < kH; ++g) {
                    l[g] += s[j][g];
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(s[j][g], vf[e], acc[g][e]);
                }
            }
        }
        ptx::cp_async_wait<0>();  // only empty groups remain; the pipeline's memory is reused below
        __syncthreads();
        // Each lane of a token row holds the row's m and l.
        const int part = hs * kParts + tg;
#pragma unroll
        for (int g = 0; g < kH; ++g) {
#pragma unroll
            for (int e = 0; e < 8; ++e) s_acc[(part * kH + g) * D + li * 8 + e] = acc[g][e];
        }
        if (li == 0) {
#pragma unroll
            for (int g = 0; g < kH; ++g) {
                s_m[part * kH + g] = m[g];
                s_l[part * kH + g] = l[g];
            }
        }
    } else {
        // Tensor cores. Warp w, lane (gq = lane / 4, tq = lane % 4): A rows gq (head gq), C columns 2 tq, 2 tq + 1.
        constexpr bool kBf16 = tile::kSameType<T, __nv_bfloat16>;
        const int w = tid / 32, lane = tid % 32, gq = lane / 4, tq = lane % 4;
        // Q as A fragments (unscaled, of T): per 16-wide k step, {row gq cols 2tq.., row gq cols 2tq + 8..}; rows 8 ...
        // 15 (a1, a3) are zero.
        uint32_t qa[D / 16][2];
        const bool head_ok = gq < nh;
        const T* qrow = static_cast<const T*>(p.q) + (row0 + (head_ok ? gq : 0)) * D + 2 * tq;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
            qa[ks][0] = head_ok ? __ldg(reinterpret_cast<const unsigned int*>(qrow + ks * 16)) : 0u;
            qa[ks][1] = head_ok ? __ldg(reinterpret_cast<const unsigned int*>(qrow + ks * 16 + 8)) : 0u;
        }
        const float sscale = capped ? p.scale : p.scale_log2;
        float m = neg_inf(), l = 0.f;  // head gq, this thread's columns
        float o[D / 8][4];             // C fragments of O: [n tile of 8 columns]; c2, c3 (rows 8 ... 15) stay 0
#pragma unroll
        for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
        // ldmatrix row addresses: lane i gives row i % 8 of matrix i / 8.
        const int mi = lane / 8, mr = lane % 8;
        for (int it = 0; it < tiles; ++it) {  // uniform over the block
            __syncthreads();                  // every warp is done with tile it - 1: its stage is free
            copy_tile(it + kStages - 1);
            ptx::cp_async_wait<kStages - 1>();
            __syncthreads();  // tile it has landed, for every thread's copies
            const int st = it % kStages;
            const T* const kt = sk + st * kStageElems;
            const T* const vt = sv + st * kStageElems;
#pragma unroll
            for (int rep = 0; rep < kTile / 64; ++rep) {
                const int rb = rep * 64 + w * 16;  // this warp's 16 rows
                // S = Q K^T for the 16 tokens: two n tiles of 8 tokens.
                float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
                for (int ks = 0; ks < D / 16; ++ks) {
                    // matrix mi: tokens rb + (mi / 2) x 8 + mr, chunk 2 ks + mi % 2 -> {b0, b1} of n tile 0, then 1.
                    const int r = rb + (mi >> 1) * 8 + mr, c = 2 * ks + (mi & 1);
                    uint32_t kb[4];
                    ptx::ldmatrix_x4(kb, kt + r * D + ((c ^ (r & 7)) << 3));
                    const uint32_t a[4] = {qa[ks][0], 0u, qa[ks][1], 0u};
                    const uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
                    ptx::mma_m16n8k16<kBf16>(sc[0], a, b0);
                    ptx::mma_m16n8k16<kBf16>(sc[1], a, b1);
                }
                // Scores (log2 domain) of head gq, tokens rb + n x 8 + 2 tq + e; -inf past the chunk.
                const int t0 = t_begin + it * kTile + rb;
                float x[2][2];
                float mx = m;
#pragma unroll
                for (int n = 0; n < 2; ++n) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float v = sc[n][e] * sscale;
                        if (capped) v = p.softcap * tanhf(v / p.softcap) * kLog2e;
                        x[n][e] = t0 + n * 8 + 2 * tq + e < t_end ? v : neg_inf();
                        mx = fmaxf(mx, x[n][e]);
                    }
                }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float ref = mx == neg_inf() ? 0.f : mx;
                const float cf = fast_exp2(m - ref);
                m = mx;
                l *= cf;
#pragma unroll
                for (int n = 0; n < D / 8; ++n) {
                    o[n][0] *= cf;
                    o[n][1] *= cf;
                }
                float pw[2][2];
#pragma unroll
                for (int n = 0; n < 2; ++n) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        pw[n][e] = fast_exp2(x[n][e] - ref);
                        l += pw[n][e];
                    }
                }
                // P as an A fragment (k = the 16 tokens): {row gq k 2tq.., 0, row gq k 2tq + 8.., 0}.
                const uint32_t a[4] = {pack2<T>(pw[0][0], pw[0][1]), 0u, pack2<T>(pw[1][0], pw[1][1]), 0u};
                // O += P V: per pair of 8-column n tiles, matrix mi: tokens rb + (mi % 2) x 8 + mr, chunk 2 dn + mi /
                // 2, transposed -> {b0, b1} of n tile 2 dn, then of 2 dn + 1.
#pragma unroll
                for (int dn = 0; dn < D / 16; ++dn) {
                    const int r = rb + (mi & 1) * 8 + mr, c = 2 * dn + (mi >> 1);
                    uint32_t vb[4];
                    ptx::ldmatrix_x4_trans(vb, vt + r * D + ((c ^ (r & 7)) << 3));
                    const uint32_t b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
                    ptx::mma_m16n8k16<kBf16>(o[2 * dn], a, b0);
                    ptx::mma_m16n8k16<kBf16>(o[2 * dn + 1], a, b1);
                }
            }
        }
        ptx::cp_async_wait<0>();  // only empty groups remain; the pipeline's memory is reused below
        __syncthreads();
        l += __shfl_xor_sync(0xffffffffu, l, 1);  // the quad's columns
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        if (gq < kHeads) {
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                s_acc[(w * kH + gq) * D + n * 8 + 2 * tq] = o[n][0];
                s_acc[(w * kH + gq) * D + n * 8 + 2 * tq + 1] = o[n][1];
            }
            if (tq == 0) {
                s_m[w * kH + gq] = m;
                s_l[w * kH + gq] = l;
            }
        }
    }
    __syncthreads();

    // Combine the partial states of each head.
    for (int i = tid; i < kHeads * D; i += kThreads) {
        const int g = i / D, d = i - g * D;
        if (g >= nh) break;  // i grows: every later i is past nh too
        const int h = g / kH, gl = g - h * kH;
        float mx = neg_inf();
#pragma unroll
        for (int n = 0; n < kParts; ++n) mx = fmaxf(mx, s_m[(h * kParts + n) * kH + gl]);
        const float ref = mx == neg_inf() ? 0.f : mx;
        float sum = 0.f, o = 0.f;
#pragma unroll
        for (int n = 0; n < kParts; ++n) {
            const int r = (h * kParts + n) * kH + gl;
            const float c = fast_exp2(s_m[r] - ref);
            sum = fmaf(s_l[r], c, sum);
            o = fmaf(s_acc[r * D + d], c, o);
        }
        const bool any = sum > 0.f;
        const float out = any ? o / sum : 0.f;
        const float lse2 = any ? ref + log2f(sum) : neg_inf();
        const int64_t row = row0 + g;
        if (p.o != nullptr && p.splits == 1) {
            static_cast<T*>(p.o)[row * D + d] = from_float<T>(out);
            if (d == 0 && p.lse != nullptr) p.lse[row] = any ? lse2 * kLn2 : neg_inf();
        } else {
            p.part_o[(row * p.splits + split) * D + d] = out;
            if (d == 0) p.part_lse[row * p.splits + split] = lse2;
        }
    }

    // Fused merge (p.merge_counters set, more than one split): the last split block of this (sequence, kv head, head
    // chunk) to finish combines the splits' partials into O and LSE. Every thread's partial stores are released at
    // gpu scope before the ticket; the last block acquires them through the ticket (atom.inc wraps the counter back
    // to 0 for the next call).
    if (p.merge_counters != nullptr && p.splits > 1) {
        ptx::fence_acq_rel_gpu();
        __syncthreads();
        bool last = false;  // thread 0's ticket, broadcast by the barrier's reduction
        if (tid == 0) {
            uint32_t* const counter = p.merge_counters + static_cast<int64_t>(blockIdx.z) * gridDim.x + blockIdx.x;
            last = ptx::atom_inc_acq_rel_gpu(counter, static_cast<uint32_t>(p.splits - 1)) ==
                   static_cast<uint32_t>(p.splits - 1);
        }
        if (__syncthreads_or(last)) {
            ptx::fence_acq_rel_gpu();
            // Each head's split weights 2^(lse_s - lse) (lse: the merged log2 LSE) into shared memory (the pipeline's,
            // free now), a warp per head; then each thread's 4 columns of a head (items tid, tid + kThreads, ...): the
            // weighted sum of the splits' partials, 8 independent 16-byte loads in flight at a time. The merge is the
            // launch's tail (it starts when every split is done), so the first item's first kPrefetch partials are
            // loaded before the LSEs: their round trip overlaps the weights'.
            constexpr int kPrefetch = 16;
            const int splits = p.splits;
            const int items = nh * (D / 4);
            float4 pre[kPrefetch];
            {
                const int g = tid < items ? tid / (D / 4) : 0, d = (tid - g * (D / 4)) * 4;
                const float* const po = p.part_o + (row0 + g) * splits * D + d;
#pragma unroll
                for (int sp = 0; sp < kPrefetch; ++sp)
                    pre[sp] = tid < items && sp < splits
                                  ? __ldcg(reinterpret_cast<const float4*>(po + static_cast<int64_t>(sp) * D))
                                  : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            float* const s_w = reinterpret_cast<float*>(smem);  // [nh][splits]
            float* const s_lse = s_w + nh * splits;             // [nh]
            const float* const lse_rows = p.part_lse + row0 * splits;
            for (int i = tid; i < nh * splits; i += kThreads) s_w[i] = __ldcg(lse_rows + i);
            __syncthreads();
            const int w = tid / 32, lane = tid % 32;
            for (int g = w; g < nh; g += kThreads / 32) {
                float mx = neg_inf();
                for (int sp = lane; sp < splits; sp += 32) mx = fmaxf(mx, s_w[g * splits + sp]);
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                const float ref = mx == neg_inf() ? 0.f : mx;
                float sum = 0.f;
                for (int sp = lane; sp < splits; sp += 32) sum += fast_exp2(s_w[g * splits + sp] - ref);
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
                const bool any = sum > 0.f;
                const float lse2 = any ? ref + log2f(sum) : neg_inf();
                for (int sp = lane; sp < splits; sp += 32)
                    s_w[g * splits + sp] = any ? fast_exp2(s_w[g * splits + sp] - lse2) : 0.f;
                if (lane == 0) s_lse[g] = lse2;
            }
            __syncthreads();
            for (int i = tid; i < items; i += kThreads) {
                const int g = i / (D / 4), d = (i - g * (D / 4)) * 4;
                const int64_t row = row0 + g;
                const float* const po = p.part_o + row * splits * D + d;
                const float* const wg = s_w + g * splits;
                float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
                int sp0 = 0;
                if (i == tid) {  // the prefetched partials, in split order as the rest
#pragma unroll
                    for (int sp = 0; sp < kPrefetch; ++sp) {
                        if (sp < splits) {
                            const float wt = wg[sp];
                            acc.x = fmaf(wt, pre[sp].x, acc.x);
                            acc.y = fmaf(wt, pre[sp].y, acc.y);
                            acc.z = fmaf(wt, pre[sp].z, acc.z);
                            acc.w = fmaf(wt, pre[sp].w, acc.w);
                        }
                    }
                    sp0 = kPrefetch;
                }
#pragma unroll 8
                for (int sp = sp0; sp < splits; ++sp) {
                    const float4 v = __ldcg(reinterpret_cast<const float4*>(po + static_cast<int64_t>(sp) * D));
                    const float wt = wg[sp];
                    acc.x = fmaf(wt, v.x, acc.x);
                    acc.y = fmaf(wt, v.y, acc.y);
                    acc.z = fmaf(wt, v.z, acc.z);
                    acc.w = fmaf(wt, v.w, acc.w);
                }
                uint2 out;
                out.x = pack2<T>(acc.x, acc.y);
                out.y = pack2<T>(acc.z, acc.w);
                *reinterpret_cast<uint2*>(static_cast<T*>(p.o) + row * D + d) = out;
                if (d == 0 && p.lse != nullptr) p.lse[row] = s_lse[g] == neg_inf() ? neg_inf() : s_lse[g] * kLn2;
            }
        }
    }
    if (bad_len || bad_i >= 0) trap_bad_input(b, len_in, p.max_seq_len, bad_i, bad_page, p.num_pages);
}

template <class T, int D>
__global__ void __launch_bounds__(128) decode_merge(MergeParams p) {
    const int64_t row = blockIdx.x;
    const float* po = p.part_o + row * p.splits * D;
    const float* pl = p.part_lse + row * p.splits;
    for (int d = static_cast<int>(threadIdx.x); d < D; d += 128) {
        float o[1];
        const float lse2 = merge_splits<1>(po, pl, p.splits, D, d, o);
        static_cast<T*>(p.o)[row * D + d] = from_float<T>(o[0]);
        if (d == 0 && p.lse != nullptr) p.lse[row] = lse2 == neg_inf() ? lse2 : lse2 * kLn2;
    }
}

}  // namespace loom::kernels::attention
