// Flash-decode: one query token per sequence against its KV cache, split over the KV length.
//
//   decode_split<T, D, kHeads>   grid (head_chunks, splits, batch x num_kv_heads), kDecodeThreads threads. Block
//                                (c, s, b x Hkv + h) reads tokens [s x chunk, min(len, (s + 1) x chunk)) of KV head h
//                                of sequence b once, for the query heads [c x kHeads, +kHeads) of h's group (every
//                                query head of the group when it has at most kDecodeMaxHeads).
//   decode_merge<T, D>           one block per (b, q head): the softmax-weighted mean of the splits' partials.
//
// Data path of decode_split: a token's head row (D elements, 2D bytes) is read by D / 8 lanes with one 16-byte
// load each (ld.global.nc, no L1 allocation); the block's 128 / (D / 8) token lanes each load kTok tokens of K and
// V before any arithmetic, so 128 x kTok x 32 bytes are in flight per block (16 KiB at kTok 4). Scores: each lane
// dots its 8 elements with every query head's, a butterfly over the D / 8 lanes sums them. Softmax online in the
// log2 domain (scores pre-multiplied by scale x log2 e; ex2.approx), per token lane; the lanes' (max, sum, acc)
// are combined through shared memory at the end.
//
// Results: with one split the block writes O (of T) and LSE = ln(sum_j exp(s_j)) directly; with more, each split
// writes its normalised partial O (fp32) and its log2-domain LSE, and decode_merge combines them. A split (or a
// sequence) without tokens has LSE -inf and O = 0; a sequence of length 0 therefore gets O = 0, LSE = -inf.
//
// Bad device data traps, naming itself: a length outside [0, max_seq_len], a block-table entry outside
// [0, num_pages).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "loom/config.hpp"
#include "loom/kernels/attention/decode_params.hpp"
#include "loom/ptx/memory.cuh"

namespace loom::kernels::attention {

LOOM_DEVICE LOOM_FORCEINLINE float neg_inf() { return __int_as_float(0xff800000u); }
// 2^x, approximate (2 ulp); 2^-inf = 0.
LOOM_DEVICE LOOM_FORCEINLINE float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

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
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE T from_float(float v);
template <>
LOOM_DEVICE LOOM_FORCEINLINE __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <>
LOOM_DEVICE LOOM_FORCEINLINE __half from_float<__half>(float v) {
    return __float2half_rn(v);
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

// Row of token t of sequence b in K / V viewed as [rows, num_kv_heads, D] (rows = num_pages x page_size). A
// block-table entry out of range reads row 0 instead and is remembered in bad_i / bad_page: the kernel traps on it
// after its loop (a call inside the loop would make ptxas save the loop's registers around it).
LOOM_DEVICE LOOM_FORCEINLINE int64_t token_row(const DecodeParams& p, int b, int t, int& bad_i, int& bad_page) {
    if (p.block_table == nullptr) return static_cast<int64_t>(b) * p.page_size + t;
    const int i = t / p.page_size;
    const int page = __ldg(p.block_table + static_cast<int64_t>(b) * p.max_pages + i);
    if (static_cast<unsigned>(page) >= static_cast<unsigned>(p.num_pages)) {
        bad_i = i;
        bad_page = page;
        return 0;
    }
    return static_cast<int64_t>(page) * p.page_size + (t - i * p.page_size);
}

template <class T, int D, int kHeads>
__global__ void __launch_bounds__(kDecodeThreads, 2) decode_split(DecodeParams p) {
    static_assert(D == 64 || D == 128 || D == 256, "head_dim 64, 128 or 256");
    static_assert(kHeads >= 1 && kHeads <= kDecodeMaxHeads, "heads per block");
    constexpr int L = D / 8;                // lanes per token row (16 bytes each)
    constexpr int NG = kDecodeThreads / L;  // token lanes
    constexpr int kTok = decode_tokens_per_thread(kHeads);
    constexpr int kStep = NG * kTok;  // tokens per step
    // (NG, kHeads, D) fp32 = 32 KiB at kHeads 8, whatever D.
    __shared__ float s_acc[NG][kHeads][D];
    __shared__ float s_m[NG][kHeads], s_l[NG][kHeads];

    const int tid = static_cast<int>(threadIdx.x), tg = tid / L, li = tid % L;
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

    // This lane's 8 elements of every query head, pre-scaled (by scale x log2 e, or by scale before a soft-cap).
    const bool capped = p.softcap > 0.f;
    const float qscale = capped ? p.scale : p.scale_log2;
    float q[kHeads][8];
    const T* qp = static_cast<const T*>(p.q) + row0 * D + li * 8;
#pragma unroll
    for (int g = 0; g < kHeads; ++g) {
        if (g < nh) {
            to_float8<T>(ptx::ld_v4_nc(qp + g * D), q[g]);
#pragma unroll
            for (int e = 0; e < 8; ++e) q[g][e] *= qscale;
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) q[g][e] = 0.f;
        }
    }

    float m[kHeads], l[kHeads], acc[kHeads][8];
#pragma unroll
    for (int g = 0; g < kHeads; ++g) {
        m[g] = neg_inf();
        l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
    }

    const int64_t row_elems = static_cast<int64_t>(p.num_kv_heads) * D;
    const T* const kbase = static_cast<const T*>(p.k) + static_cast<int64_t>(kvh) * D + li * 8;
    const T* const vbase = static_cast<const T*>(p.v) + static_cast<int64_t>(kvh) * D + li * 8;
    int bad_i = -1, bad_page = 0;
    for (int t0 = t_begin; t0 < t_end; t0 += kStep) {  // uniform over the block
        // Every load of the step first.
        uint4 kr[kTok], vr[kTok];
#pragma unroll
        for (int j = 0; j < kTok; ++j) {
            const int t = t0 + j * NG + tg;
            if (t < t_end) {
                const int64_t off = token_row(p, b, t, bad_i, bad_page) * row_elems;
                kr[j] = ptx::ld_v4_nc(kbase + off);
                vr[j] = ptx::ld_v4_nc(vbase + off);
            } else {
                kr[j] = make_uint4(0, 0, 0, 0);
                vr[j] = make_uint4(0, 0, 0, 0);
            }
        }
        // Scores (log2 domain), -inf past the chunk.
        float s[kTok][kHeads];
#pragma unroll
        for (int j = 0; j < kTok; ++j) {
            float kf[8];
            to_float8<T>(kr[j], kf);
#pragma unroll
            for (int g = 0; g < kHeads; ++g) {
                float d = 0.f;
#pragma unroll
                for (int e = 0; e < 8; ++e) d = fmaf(q[g][e], kf[e], d);
                s[j][g] = d;
            }
        }
#pragma unroll
        for (int j = 0; j < kTok; ++j) {
#pragma unroll
            for (int g = 0; g < kHeads; ++g) {
#pragma unroll
                for (int o = L / 2; o > 0; o >>= 1) s[j][g] += __shfl_xor_sync(0xffffffffu, s[j][g], o);
            }
            const bool valid = t0 + j * NG + tg < t_end;
#pragma unroll
            for (int g = 0; g < kHeads; ++g) {
                float x = s[j][g];
                if (capped) x = p.softcap * tanhf(x / p.softcap) * kLog2e;
                s[j][g] = valid ? x : neg_inf();
            }
        }
        // Online softmax per head.
#pragma unroll
        for (int g = 0; g < kHeads; ++g) {
            float mx = m[g];
#pragma unroll
            for (int j = 0; j < kTok; ++j) mx = fmaxf(mx, s[j][g]);
            const float ref = mx == neg_inf() ? 0.f : mx;
            const float c = fast_exp2(m[g] - ref);
            l[g] *= c;
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][e] *= c;
            m[g] = mx;
#pragma unroll
            for (int j = 0; j < kTok; ++j) s[j][g] = fast_exp2(s[j][g] - ref);  // now the weight
        }
#pragma unroll
        for (int j = 0; j < kTok; ++j) {
            float vf[8];
            to_float8<T>(vr[j], vf);
#pragma unroll
            for (int g = 0; g < kHeads; ++g) {
                l[g] += s[j][g];
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(s[j][g], vf[e], acc[g][e]);
            }
        }
    }

    // Combine the token lanes (each lane of a token row holds the row's m and l).
#pragma unroll
    for (int g = 0; g < kHeads; ++g) {
#pragma unroll
        for (int e = 0; e < 8; ++e) s_acc[tg][g][li * 8 + e] = acc[g][e];
    }
    if (li == 0) {
#pragma unroll
        for (int g = 0; g < kHeads; ++g) {
            s_m[tg][g] = m[g];
            s_l[tg][g] = l[g];
        }
    }
    __syncthreads();
    for (int i = tid; i < kHeads * D; i += kDecodeThreads) {
        const int g = i / D, d = i - g * D;
        if (g >= nh) break;  // i grows: every later i is past nh too
        float mx = neg_inf();
#pragma unroll
        for (int n = 0; n < NG; ++n) mx = fmaxf(mx, s_m[n][g]);
        const float ref = mx == neg_inf() ? 0.f : mx;
        float sum = 0.f, o = 0.f;
#pragma unroll
        for (int n = 0; n < NG; ++n) {
            const float c = fast_exp2(s_m[n][g] - ref);
            sum = fmaf(s_l[n][g], c, sum);
            o = fmaf(s_acc[n][g][d], c, o);
        }
        const bool any = sum > 0.f;
        const float out = any ? o / sum : 0.f;
        const float lse2 = any ? ref + log2f(sum) : neg_inf();
        const int64_t row = row0 + g;
        if (p.o != nullptr) {
            static_cast<T*>(p.o)[row * D + d] = from_float<T>(out);
            if (d == 0 && p.lse != nullptr) p.lse[row] = any ? lse2 * kLn2 : neg_inf();
        } else {
            p.part_o[(row * p.splits + split) * D + d] = out;
            if (d == 0) p.part_lse[row * p.splits + split] = lse2;
        }
    }
    if (bad_len || bad_i >= 0) trap_bad_input(b, len_in, p.max_seq_len, bad_i, bad_page, p.num_pages);
}

// The softmax-weighted mean of one row's split partials at columns [d, d + N): writes o[0, N), returns the row's
// log2-domain LSE (-inf when no split has tokens; o is then 0). part_o / part_lse point at the row.
template <int N>
LOOM_DEVICE LOOM_FORCEINLINE float merge_splits(const float* part_o, const float* part_lse, int splits, int D, int d,
                                                float (&o)[N]) {
    float mx = neg_inf();
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, part_lse[s]);
    const float ref = mx == neg_inf() ? 0.f : mx;
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = 0.f;
    for (int s = 0; s < splits; ++s) {
        const float w = fast_exp2(part_lse[s] - ref);
        sum += w;
#pragma unroll
        for (int k = 0; k < N; ++k) o[k] = fmaf(w, part_o[static_cast<int64_t>(s) * D + d + k], o[k]);
    }
    const bool any = sum > 0.f;
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = any ? o[k] / sum : 0.f;
    return any ? ref + log2f(sum) : neg_inf();
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
