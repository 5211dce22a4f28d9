// Expert-parallel combine, throughput mode, on the device (host side: src/ops/moe/ep/combine.cpp; data: ep_params.hpp).
// Per call, on every rank, in stream order after the dispatch it belongs to:
//
//   ep_combine_send    call number c (the launch's, kept on the device: lang/launch_epoch.cuh); a warp per received
//                      pair q: its partial sum p_q = sum over the pair's slots s on this rank, in slot order, of
//                      w_s x expert_out[row_s] (fp32, fmaf from 0), stored as bf16 into this rank's combine rows[q];
//                      the last block sets combined[me] := c at every rank
//   ep_combine_reduce  every block waits for combined[d] >= c of every rank d; a warp per token t: y[t] = bf16 of the
//                      fp32 sum, over the ranks d it went to in ascending order, of the partial p read (pulled) from
//                      d's combine rows at the token's pair record index; zero for a token with no slot
//
// The reduce pulls, so each partial is produced once at the expert's rank and crosses NVLink once, as bf16 (half the
// bytes of fp32; y's sum itself is fp32). Reuse of the combine rows: rank d overwrites them in its next combine, after
// its next dispatch's scan, which waits for every rank's next scan, which follows that rank's reduce (stream order).
#pragma once

#include <cuda_bf16.h>

#include "loom/kernels/moe/ep_dispatch.cuh"

namespace loom::kernels::moe {

// 8 bf16 in a 16-byte word <-> 8 floats.
LOOM_DEVICE LOOM_FORCEINLINE void ep_unpack(const uint4& v, float (&f)[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
LOOM_DEVICE LOOM_FORCEINLINE uint4 ep_pack(const float (&f)[8]) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const __nv_bfloat162 b = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
        w[i] = *reinterpret_cast<const uint32_t*>(&b);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// A warp per received pair (grid-strided).
__global__ void __launch_bounds__(kEpThreads) ep_combine_send(Ctx ctx, EpParams p) {
    __shared__ uint64_t s_epoch;
    __shared__ int32_t s_row[kEpThreads / 32][32];  // per warp: its pair's row and weight of every slot
    __shared__ float s_w[kEpThreads / 32][32];
    const int W = ctx.local_world, me = ctx.local_rank;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (threadIdx.x == 0) s_epoch = lang::launch_epoch_enter(&p.dev->combine);
    const int32_t pairs = p.dev->overflow == 0 ? p.dev->recv_pairs : 0;
    const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
    const uint4* const out = static_cast<const uint4*>(p.expert_out);
    uint4* const partial = static_cast<uint4*>(p.combine_rows);
    for (int64_t q = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; q < pairs; q += warps) {
        int32_t row = -1;
        float w = 0.f;
        if (lane < p.topk) {
            row = p.pair_rows[q * p.topk + lane];
            w = p.pair_weights[q * p.topk + lane];
            if (row >= p.capacity) bad_index("ep_combine pair_rows", p.pair_rows + q * p.topk + lane, row, p.capacity);
        }
        const unsigned slots = __ballot_sync(0xffffffffu, row >= 0);
        __syncwarp();  // the previous pair's slots are read
        s_row[warp][lane] = row;
        s_w[warp][lane] = w;
        __syncwarp();
        for (int64_t i = lane; i < p.row_words; i += 32) {
            float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
            for (unsigned m = slots; m != 0; m &= m - 1) {
                const int s = __ffs(m) - 1;
                const float ws = s_w[warp][s];
                float v[8];
                ep_unpack(out[static_cast<int64_t>(s_row[warp][s]) * p.out_ld_words + i], v);
#pragma unroll
                for (int c = 0; c < 8; ++c) acc[c] = __fmaf_rn(ws, v[c], acc[c]);
            }
            partial[q * p.row_words + i] = ep_pack(acc);
        }
    }
    if (ep_last_block(&p.dev->send_ticket))
        for (int d = 0; d < W; ++d) ptx::st_release_sys(ep_peer(ctx, p.sig->combined + me, d), s_epoch);
}

// A warp per token (grid-strided), after every rank's partial rows are ready.
__global__ void __launch_bounds__(kEpThreads) ep_combine_reduce(Ctx ctx, EpParams p) {
    __shared__ int32_t s_q[kEpThreads / 32][kMaxLocalPeers];  // per warp: its token's record index at every rank
    const int W = ctx.local_world;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const uint64_t epoch = p.dev->combine.calls;  // the send kernel before this one on the stream advanced it
    if (threadIdx.x < static_cast<unsigned>(W))
        ep_wait(ctx.wait_timeout_ns, p.sig->combined + threadIdx.x, epoch,
                "ep_combine: waits for a rank's partial sums");
    __syncthreads();
    if (p.dev->overflow != 0) return;  // the dispatch moved nothing: y is left as it was
    const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
    uint4* const y = static_cast<uint4*>(p.y);
    for (int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; t < p.tokens;
         t += warps) {
        const int32_t q = lane < W ? p.token_pair[t * W + lane] : -1;
        const unsigned ranks = __ballot_sync(0xffffffffu, q >= 0);
        __syncwarp();  // the previous token's records are read
        if (lane < W) s_q[warp][lane] = q;
        __syncwarp();
        for (int64_t i = lane; i < p.row_words; i += 32) {
            float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
            for (unsigned m = ranks; m != 0; m &= m - 1) {
                const int d = __ffs(m) - 1;
                const uint4* src = static_cast<const uint4*>(ep_peer(ctx, p.combine_rows, d));
                float v[8];
                ep_unpack(src[static_cast<int64_t>(s_q[warp][d]) * p.row_words + i], v);
#pragma unroll
                for (int c = 0; c < 8; ++c) acc[c] += v[c];
            }
            y[t * p.y_ld_words + i] = ep_pack(acc);
        }
    }
}

}  // namespace loom::kernels::moe
