// Expert-parallel dispatch / combine, low-latency mode (decode): every rank sends each (token, expert) entry of its
// top-k routing straight into the expert's rank, at a fixed slot, and gets the expert outputs back the same way.
//
//   ep_ll_dispatch<kFp8>   send: warp per token t (or per group of t's slots, when there are fewer tokens than
//                          warps): lane s takes a slot i of expert topk_idx[t, s] (a per-expert atomic counter of
//                          this rank) and the warp writes the token's row — cast to fp8 e4m3 with one fp32 scale per
//                          128 elements when kFp8, read once for the warp's slots — and the source entry
//                          t x k + s into message [le][me][i] of the expert's rank, then counts the entry sent
//                          (release). Warp per expert ex: waits until its entries (a per-block histogram of topk_idx)
//                          are all sent, then one 8-byte release store of {count, flag} to [le][me] of ex's rank's
//                          counts. The order of an expert's slots is therefore not the token order.
//                          recv: warp per (local expert le, source rank s): waits for the count of (le, s), then
//                          copies its messages into recv_x / recv_scales / recv_src_info [le][s x M + i] and writes
//                          recv_counts[le][s].
//                          Direct receive (p.direct, one node: every rank's recv arrays in the symmetric heap): each
//                          rank first stores its recv arrays' heap offsets and the call's flag into free[me] of every
//                          rank (EpLlFree), and every block waits for every rank's before it sends; the warp then
//                          writes an entry's row, scales and source entry straight into [le][me x M + i] of the
//                          expert rank's recv arrays, and the receive only waits for the counts and writes
//                          recv_counts. A rank's free slot is written when its call starts, after (stream order)
//                          every reader of its recv of earlier calls, so no write lands on data still in use.
//   ep_ll_combine          send: warp per (local expert le, token rank s): for i < recv_counts[le][s], entry
//                          e = recv_src_info[le][s x M + i] of rank s gets its row expert_out[le][s x M + i]: with
//                          p.pull (expert_out in the symmetric heap) only the row's heap offset goes to rank s's
//                          table[e]; else the bf16 row goes to rank s's rows[e] and table[e] = -1. Then one release
//                          store of the flag to rank s's flag of expert (me, le).
//                          recv: every flag of every expert is waited for by some thread; warp per token t: waits for
//                          the flags of t's experts and writes y[t] = sum_slot w[t, slot] x row(t, slot) (fp32, slot
//                          order) as bf16, reading each row where the table says (the expert rank's heap, or rows).
//                          Then the grid's last block (a per-rank arrival count) stores the flag to done[me] of every
//                          rank on the node, and a rank that let its rows be read waits for every done[s]: expert_out
//                          is not read after the call.
//
// Launches: one kernel with both phases (kEpLlSend | kEpLlRecv); its grid keeps to the rank's SM share so every block
// is resident beside every peer's (a receiving warp waits for peers' sending warps). Or the send phase alone and the
// receive phase in a later launch (return without waiting), which needs no co-residency.
//
// Flags and the double buffer (the argument of kernels/collectives/coll_ll.cuh): each block advances its send and its
// receive epoch once per launch of that phase (epochs[0][b], epochs[1][b], this rank's, never reset); every rank
// launches the same grid the same number of times, so every block of every rank has the same epoch e in call e.
// Call e uses parity half e & 1 of the area, and its flags are the low 32 bits of e (a stale value never matches:
// that would take 2^32 calls). Overwriting is safe without a barrier: rank s writes half p of rank r in its send of
// call e only after its receive of call e - 1 completed, which waited for every count (every flag) of call e - 1,
// among them r's; r sends those only after its receive of call e - 2 — the last reader of half p — completed (same
// stream, and the receive of a call precedes the next call's send, which the host enforces for the hooked form). The
// receive waits for *every* count / flag, also where no entry came (count 0), so that chain holds on every rank.
//
// Ranks are global (W = ctx.world, me = ctx.rank, expert ex lives on rank ex / L). A peer on this node is written
// by load/store as above. A World of several nodes compiles the kernels with remote peers (LOOM_REMOTE_PEERS), and a
// peer on another node gets the same bytes at the same offsets through NVSHMEM, staged in this rank's symmetric area
// after the two halves (a network put's source must be in the symmetric heap):
//   dispatch   the warp writes a remote entry's message (the same quantised row, the same header) into staging
//              message t x k + slot, then puts it (put_nbi, warp) to the message's place in the expert's rank; the
//              entry counts as sent once the put is issued. The count to a remote expert's rank is a signal_op, a
//              release that first completes every NVSHMEM operation of this rank (nvshmem_quiet), so the expert's
//              messages land before its count. Staging reuse: every remote entry's expert is remote, and its count
//              is signalled only after the entry was counted sent (acquire) and then a quiet, so when the send phase
//              ends every put of the call has completed and read its staging; the next call's send starts after it
//              (the stream's order, griddep_wait). Within a call each entry has its own staging message.
//   combine    the warp copies each row for a remote token rank into its own staging row (global warp id) and puts
//              it (blocking: the staging row is reusable when the put returns), then signals the flag with
//              signal_op (quiet first: the rows land before the flag).
// The waits are the same local polls whoever writes the signal; the double-buffer argument above is unchanged (a
// remote write is issued after the same receive, and lands before the count / flag that follows it).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "loom/config.hpp"
#include "loom/kernels/moe/ep_ll_params.hpp"
#include "loom/lang/context.cuh"
#include "loom/lang/diag.cuh"
#include "loom/lang/profile.cuh"
#include "loom/lang/rank.cuh"
#include "loom/lang/spin.cuh"
#include "loom/ptx/memory.cuh"
#include "loom/ptx/special.cuh"
#if LOOM_REMOTE_PEERS  // only there: the group objects' device globals change the one-node build's register allocation
#include "loom/lang/copy.cuh"
#include "loom/lang/group.cuh"
#include "loom/lang/signal.cuh"
#endif
#if !LOOM_NVRTC && !LOOM_NO_DEVICE_PRINTF
#include <cstdio>
#endif

namespace loom::kernels::moe {

// Cold path: an index read from `where` is outside [0, bound) (a bad routing id, a source entry or count the dispatch
// did not write, or more entries for one expert than its max_tokens slots). Takes the Ctx's fields by value: a
// reference to the kernel's Ctx parameter would make the compiler copy it to local memory.
__noinline__ LOOM_DEVICE inline void ep_ll_bad_index(DiagMailbox* diag, int rank, const char* tag, const void* where,
                                                     int64_t value, int64_t bound) {
    lang::detail::diag_post(diag, DiagKind::BadIndex, rank, tag, where, 0, static_cast<uint64_t>(bound),
                            static_cast<uint64_t>(value), 0);
#if !LOOM_NO_DEVICE_PRINTF
    printf("loom: rank %d: %s: block %u thread %u: index %lld at %p is out of range [0, %lld)\n", rank, tag, blockIdx.x,
           threadIdx.x, static_cast<long long>(value), where, static_cast<long long>(bound));
#endif
    __trap();
}

// This block's next epoch of one phase (epochs[b] += 1), shared with the block's threads.
LOOM_DEVICE LOOM_FORCEINLINE uint64_t ep_ll_next_epoch(uint64_t* epochs, uint64_t* shared) {
    __syncthreads();  // a previous phase's readers of *shared are done
    if (threadIdx.x == 0) {
        const uint64_t e = epochs[blockIdx.x] + 1;
        epochs[blockIdx.x] = e;
        *shared = e;
    }
    __syncthreads();
    return *shared;
}

LOOM_DEVICE LOOM_FORCEINLINE float ep_ll_bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
LOOM_DEVICE LOOM_FORCEINLINE float ep_ll_bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
LOOM_DEVICE LOOM_FORCEINLINE uint32_t ep_ll_pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- dispatch -----------------------------------------------------------------------------------------------------

// The warp sends token row `src` (H bf16, H a multiple of 128) to the rows `dst` of the lanes in `used` (lane s:
// slot s's row in a peer's memory; fp8: its H / 128 scales at `sdst`), every row store 16 bytes, kEpLlBatch loads in
// flight per lane.
//   fp8: lane l quantises 16 elements per step (two 16-byte loads) into one 16-byte store per slot; the 8 lanes of a
//        scale block (128 elements) reduce its amax with shuffles, and the block's first lane stores the fp32 scale.
//   bf16: lane l moves 8 elements (16 bytes) per step as they are.
// Steps are warp-uniform (the row's steps need not be a multiple of 32).
template <bool kFp8>
LOOM_DEVICE LOOM_FORCEINLINE void ep_ll_send_row(const __nv_bfloat16* src, char* dst, float* sdst, unsigned used,
                                                 int hidden) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    if constexpr (kFp8) {
        constexpr int kPairs = kEpLlBatch / 2;  // 2 loads per step
        const int steps = hidden / 16;
        for (int base = 0; base < steps; base += 32 * kPairs) {
            uint4 v[kPairs][2];
#pragma unroll
            for (int u = 0; u < kPairs; ++u) {
                const int c = base + u * 32 + lane;
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    v[u][h] = c < steps ? ptx::ld_v4_nc(s4 + 2 * c + h) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < kPairs; ++u) {
                if (base + u * 32 >= steps) break;  // warp-uniform
                const int c = base + u * 32 + lane;
                float f[16];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const uint32_t w[4] = {v[u][h].x, v[u][h].y, v[u][h].z, v[u][h].w};
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        f[8 * h + 2 * j] = ep_ll_bf16_lo(w[j]);
                        f[8 * h + 2 * j + 1] = ep_ll_bf16_hi(w[j]);
                    }
                }
                float amax = 0.f;
#pragma unroll
                for (int j = 0; j < 16; ++j) amax = fmaxf(amax, fabsf(f[j]));
#pragma unroll
                for (int m = 4; m >= 1; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
                amax = fmaxf(amax, 1e-4f);  // an all-zero block: any scale, its codes are 0
                const float inv = 448.f / amax;
                uint32_t q[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const __nv_fp8x2_storage_t a = __nv_cvt_float2_to_fp8x2(
                        make_float2(f[4 * j] * inv, f[4 * j + 1] * inv), __NV_SATFINITE, __NV_E4M3);
                    const __nv_fp8x2_storage_t b = __nv_cvt_float2_to_fp8x2(
                        make_float2(f[4 * j + 2] * inv, f[4 * j + 3] * inv), __NV_SATFINITE, __NV_E4M3);
                    q[j] = static_cast<uint32_t>(a) | (static_cast<uint32_t>(b) << 16);
                }
                const float scale = amax / 448.f;
                const bool on = c < steps;
                for (unsigned m = used; m != 0u; m &= m - 1) {
                    char* d = reinterpret_cast<char*>(
                        __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(dst), __ffs(m) - 1));
                    float* sd = reinterpret_cast<float*>(
                        __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(sdst), __ffs(m) - 1));
                    if (on) {
                        reinterpret_cast<uint4*>(d)[c] = make_uint4(q[0], q[1], q[2], q[3]);
                        if ((c & 7) == 0) sd[c >> 3] = scale;
                    }
                }
            }
        }
    } else {
        const int chunks = hidden / 8;
        for (int base = 0; base < chunks; base += 32 * kEpLlBatch) {
            uint4 v[kEpLlBatch];
#pragma unroll
            for (int u = 0; u < kEpLlBatch; ++u) {
                const int c = base + u * 32 + lane;
                v[u] = c < chunks ? ptx::ld_v4_nc(s4 + c) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < kEpLlBatch; ++u) {
                if (base + u * 32 >= chunks) break;  // warp-uniform
                const int c = base + u * 32 + lane;
                for (unsigned m = used; m != 0u; m &= m - 1) {
                    char* d = reinterpret_cast<char*>(
                        __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(dst), __ffs(m) - 1));
                    if (c < chunks) reinterpret_cast<uint4*>(d)[c] = v[u];
                }
            }
        }
    }
}

template <bool kFp8>
LOOM_DEVICE inline void ep_ll_dispatch_send(const Ctx& ctx, const EpLlParams& p, uint32_t flag, char* half,
                                            uint32_t* hist) {
    const int W = ctx.world, me = ctx.rank;
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int gw = static_cast<int>(blockIdx.x) * kEpLlWarps + static_cast<int>(threadIdx.x) / 32;
    const int nw = static_cast<int>(gridDim.x) * kEpLlWarps;
    const int L = p.local_experts, M = p.max_tokens, E = p.num_experts, k = p.topk;
    const int64_t msg_bytes = ep_ll_msg_bytes(p.hidden, kFp8);
    const int64_t count_off = ep_ll_dispatch_count_offset(L, W, M, msg_bytes);
    const int entries = p.tokens * k;
    uint32_t* const slots = p.counters;     // [E] slots taken
    uint32_t* const sent = p.counters + E;  // [E] entries whose message is written

    // Every block's histogram of the routing: the count each expert's signal carries.
    for (int i = static_cast<int>(threadIdx.x); i < E; i += kEpLlThreads) hist[i] = 0;
    __syncthreads();
    for (int j = static_cast<int>(threadIdx.x); j < entries; j += kEpLlThreads) {
        const int32_t id = p.topk_idx[j];
        if (id < -1 || id >= E) ep_ll_bad_index(ctx.diag, ctx.rank, "ep_ll_dispatch topk_idx", p.topk_idx + j, id, E);
        if (id >= 0) atomicAdd(hist + id, 1u);
    }
    __syncthreads();

#if !LOOM_REMOTE_PEERS
    // Direct receive (one node): this rank's receive layout for the call goes to every rank (block 0), then every
    // block waits for every rank's and keeps it in shared memory; a rank's layout arrives once its call started, that
    // is once its stream is past every reader of its recv of earlier calls.
    __shared__ int64_t s_free[kMaxLocalPeers][3];
    if (p.direct) {
        const int64_t free_off = ep_ll_dispatch_free_offset(L, W, M, msg_bytes);
        if (blockIdx.x == 0) {
            for (int r = static_cast<int>(threadIdx.x); r < W; r += kEpLlThreads) {
                auto* f = reinterpret_cast<EpLlFree*>(lang::symm_at(ctx, half, r) + free_off) + me;
                f->x = static_cast<int64_t>(ctx.own_offset(p.recv_x));
                f->scales = kFp8 ? static_cast<int64_t>(ctx.own_offset(p.recv_scales)) : 0;
                f->src_info = static_cast<int64_t>(ctx.own_offset(p.recv_src_info));
                ptx::st_release_sys(&f->flag, static_cast<uint64_t>(flag));
            }
        }
        const int64_t rows = static_cast<int64_t>(L) * W * M;
        for (int r = static_cast<int>(threadIdx.x); r < W; r += kEpLlThreads) {
            const auto* f = reinterpret_cast<const EpLlFree*>(half + free_off) + r;
            lang::spin_until(ctx, "ep_ll_dispatch: a receiver's layout (direct receive)", r, &f->flag, lang::Cmp::EQ,
                             flag, [&](uint64_t& observed) {
                                 observed = ptx::ld_acquire_sys(&f->flag);
                                 return static_cast<uint32_t>(observed) == flag;
                             });
            const int64_t at[3] = {f->x, f->scales, f->src_info};
            const int64_t need[3] = {rows * ep_ll_payload_bytes(p.hidden, kFp8),
                                     kFp8 ? rows * (p.hidden / kEpLlScaleBlock) * 4 : 0, rows * 4};
            for (int i = 0; i < 3; ++i) {
                if (at[i] < 0 || static_cast<uint64_t>(at[i] + need[i]) > ctx.heap_size)
                    ep_ll_bad_index(ctx.diag, ctx.rank, "ep_ll_dispatch direct receive layout (heap offset)", f, at[i],
                                    static_cast<int64_t>(ctx.heap_size));
                s_free[r][i] = at[i];
            }
        }
        __syncthreads();
    }
#endif

    // Warp per (token, group of its slots): a slot per (token, expert) entry, the row to every slot's message. With
    // fewer tokens than warps a token's slots are split over several warps (each reads and casts the row), so that
    // every warp sends.
    const int groups = p.tokens > 0 ? max(1, min(k, nw / p.tokens)) : 1;
    const int per_group = (k + groups - 1) / groups;
    for (int item = gw; item < p.tokens * groups; item += nw) {
        const int t = item / groups, g = item % groups;
        int32_t id = -1;
        char* dst = nullptr;    // the entry's row: in a message, or (direct receive) in the receiver's recv_x
        char* hdr = nullptr;    // its source entry: the message's header, or the receiver's recv_src_info
        float* sdst = nullptr;  // fp8: its scales
#if LOOM_REMOTE_PEERS
        bool remote = false;  // the expert's rank is on another node: dst is this entry's staging message
        int64_t off = 0;      // the message's offset in the half
#endif
        if (lane < k && lane >= g * per_group && lane < (g + 1) * per_group) {
            id = p.topk_idx[static_cast<int64_t>(t) * k + lane];
            if (id >= 0) {
                const uint32_t slot = atomicAdd(slots + id, 1u);
                if (slot >= static_cast<uint32_t>(M))
                    ep_ll_bad_index(ctx.diag, ctx.rank, "ep_ll_dispatch expert capacity (max_tokens) topk_idx",
                                    p.topk_idx + static_cast<int64_t>(t) * k + lane, slot, M);
                const int le = id % L;
#if LOOM_REMOTE_PEERS
                off = ((static_cast<int64_t>(le) * W + me) * M + slot) * msg_bytes;
                remote = !ctx.reachable(id / L);
                dst = remote ? p.area + 2 * p.half_bytes + (static_cast<int64_t>(t) * k + lane) * msg_bytes
                             : lang::symm_at(ctx, half, id / L) + off;
                sdst = reinterpret_cast<float*>(dst + ep_ll_payload_bytes(p.hidden, kFp8));
                hdr = dst + msg_bytes - 16;
#else
                const int64_t row = (static_cast<int64_t>(le) * W + me) * M + slot;
                if (p.direct) {
                    char* const base = ctx.heap_of(id / L);
                    dst = base + s_free[id / L][0] + row * ep_ll_payload_bytes(p.hidden, kFp8);
                    sdst = reinterpret_cast<float*>(base + s_free[id / L][1]) + row * (p.hidden / kEpLlScaleBlock);
                    hdr = base + s_free[id / L][2] + row * 4;
                } else {
                    dst = lang::symm_at(ctx, half, id / L) + row * msg_bytes;
                    sdst = reinterpret_cast<float*>(dst + ep_ll_payload_bytes(p.hidden, kFp8));
                    hdr = dst + msg_bytes - 16;
                }
#endif
            }
        }
        const unsigned used = __ballot_sync(0xffffffffu, id >= 0);
        ep_ll_send_row<kFp8>(static_cast<const __nv_bfloat16*>(p.x) + static_cast<int64_t>(t) * p.x_ld, dst, sdst, used,
                             p.hidden);
        if (id >= 0) {
            if (p.direct)
                *reinterpret_cast<int32_t*>(hdr) = t * k + lane;
            else
                *reinterpret_cast<int4*>(hdr) = make_int4(t * k + lane, 0, 0, 0);
        }
        __syncwarp();  // every lane's stores of the row precede the release of each slot's lane (and the puts)
#if LOOM_REMOTE_PEERS
        // The staged messages to other nodes, one warp put each (warp-uniform loop over the remote lanes), after a
        // sys-scope fence: the staged bytes are visible to a network transport's reads.
        const unsigned remote_lanes = __ballot_sync(0xffffffffu, remote);
        if (remote_lanes != 0u) __threadfence_system();
        for (unsigned m = remote_lanes; m != 0u; m &= m - 1) {
            const int l = __ffs(m) - 1;
            const int peer = __shfl_sync(0xffffffffu, id, l) / L;
            const char* staged =
                reinterpret_cast<const char*>(__shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(dst), l));
            const int64_t at = __shfl_sync(0xffffffffu, off, l);
            lang::put_nbi(lang::warp, ctx, half + at, staged, static_cast<uint64_t>(msg_bytes), peer);
        }
        __syncwarp();  // every lane's part of the puts is issued before a lane counts its entry sent
#endif
        if (id >= 0) ptx::red_add_release_sys(sent + id, 1u);
    }

    // Warp per expert: once all its entries are written, the count to its rank; then the counters are zero again for
    // the next call (every taker of a slot has counted its entry sent).
    for (int ex = gw; ex < E; ex += nw) {
        if (lane != 0) continue;
        const uint32_t expected = hist[ex];
        lang::spin_until(ctx, "ep_ll_dispatch: local sends of an expert", sent + ex, lang::Cmp::GE, expected,
                         [&](uint64_t& observed) {
                             observed = ptx::ld_acquire_sys(sent + ex);
                             return observed >= expected;
                         });
        const int le = ex % L, peer = ex / L;
        const uint64_t value = (static_cast<uint64_t>(flag) << 32) | expected;
#if LOOM_REMOTE_PEERS
        if (!ctx.reachable(peer)) {
            // Release through NVSHMEM: every put of this rank issued so far (this expert's among them: counted sent
            // before the acquire above) completes, then the count is set.
            auto* own = reinterpret_cast<uint64_t*>(half + count_off) + static_cast<int64_t>(le) * W + me;
            lang::signal_op(ctx, own, value, lang::SignalOp::Set, peer);
        } else
#endif
        {
            auto* sig = reinterpret_cast<uint64_t*>(lang::symm_at(ctx, half, peer) + count_off) +
                        static_cast<int64_t>(le) * W + me;
            ptx::st_release_sys(sig, value);
        }
        sent[ex] = 0;
        slots[ex] = 0;
    }
}

template <bool kFp8>
LOOM_DEVICE inline void ep_ll_dispatch_recv(const Ctx& ctx, const EpLlParams& p, uint32_t flag, const char* half) {
    const int W = ctx.world;
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int gw = static_cast<int>(blockIdx.x) * kEpLlWarps + static_cast<int>(threadIdx.x) / 32;
    const int nw = static_cast<int>(gridDim.x) * kEpLlWarps;
    const int L = p.local_experts, M = p.max_tokens;
    const int64_t msg_bytes = ep_ll_msg_bytes(p.hidden, kFp8);
    const int64_t payload = ep_ll_payload_bytes(p.hidden, kFp8);
    const int64_t count_off = ep_ll_dispatch_count_offset(L, W, M, msg_bytes);
    const int cpm = static_cast<int>(payload / 16);  // 16-byte chunks per message payload
    const int sb = p.hidden / kEpLlScaleBlock;
    // Warp per (local expert le, source rank s), pr = le x W + s.
    for (int pr = gw; pr < L * W; pr += nw) {
        const int s = pr % W;
        const uint64_t* sig = reinterpret_cast<const uint64_t*>(half + count_off) + pr;
        uint32_t count = 0;
        if (lane == 0) {
            uint64_t v = 0;
            lang::spin_until(ctx, "ep_ll_dispatch: count", s, sig, lang::Cmp::EQ, flag, [&](uint64_t& observed) {
                v = ptx::ld_acquire_sys(sig);
                observed = v >> 32;
                return static_cast<uint32_t>(v >> 32) == flag;
            });
            count = static_cast<uint32_t>(v);
            if (count > static_cast<uint32_t>(M))
                ep_ll_bad_index(ctx.diag, ctx.rank, "ep_ll_dispatch count", sig, count, M + 1);
            p.recv_counts[pr] = static_cast<int32_t>(count);
        }
        __syncwarp();  // lane 0's acquire orders the warp's reads of the messages
        count = __shfl_sync(0xffffffffu, count, 0);
        if (p.direct) continue;  // the entries were written into recv itself
        const char* const msgs = half + static_cast<int64_t>(pr) * M * msg_bytes;
        char* const out = static_cast<char*>(p.recv_x) + static_cast<int64_t>(pr) * M * payload;
        // The payloads, flattened over the messages: kEpLlBatch loads in flight per lane.
        const int total = static_cast<int>(count) * cpm;
        for (int base = 0; base < total; base += 32 * kEpLlBatch) {
            uint4 v[kEpLlBatch];
#pragma unroll
            for (int u = 0; u < kEpLlBatch; ++u) {
                const int f = base + u * 32 + lane;
                if (f < total) v[u] = ptx::ld_v4(msgs + (f / cpm) * msg_bytes + (f % cpm) * 16);
            }
#pragma unroll
            for (int u = 0; u < kEpLlBatch; ++u) {
                const int f = base + u * 32 + lane;
                if (f < total) ptx::st_v4(out + static_cast<int64_t>(f) * 16, v[u]);
            }
        }
        for (int f = lane; f < static_cast<int>(count) * (kFp8 ? sb + 1 : 1); f += 32) {
            const int i = kFp8 ? f / (sb + 1) : f, c = kFp8 ? f % (sb + 1) : 0;
            const char* m = msgs + static_cast<int64_t>(i) * msg_bytes;
            const int64_t slot = static_cast<int64_t>(pr) * M + i;
            if (kFp8 && c < sb) {
                p.recv_scales[slot * sb + c] = *reinterpret_cast<const float*>(m + payload + c * 4);
            } else {
                p.recv_src_info[slot] = *reinterpret_cast<const int32_t*>(m + msg_bytes - 16);
            }
        }
    }
}

template <bool kFp8>
__global__ void __launch_bounds__(kEpLlThreads) ep_ll_dispatch(Ctx ctx, EpLlParams p) {
    __shared__ uint64_t s_epoch;
    __shared__ uint32_t s_hist[kEpLlMaxExperts];
    ptx::griddep_wait();  // the stream's previous kernel (e.g. the previous call's receive) has completed
    ptx::griddep_launch_dependents();
    if (p.phases & kEpLlSend) {
        const uint64_t e = ep_ll_next_epoch(p.epochs, &s_epoch);
        LOOM_PROF_BLOCK_SPAN(lang::kTagEpLlPhase, lang::kEpLlDispatchSend);
        ep_ll_dispatch_send<kFp8>(ctx, p, static_cast<uint32_t>(e), p.area + (e & 1) * p.half_bytes, s_hist);
    }
    if (p.phases & kEpLlRecv) {
        const uint64_t e = ep_ll_next_epoch(p.epochs + kEpLlMaxBlocks, &s_epoch);
        LOOM_PROF_BLOCK_SPAN(lang::kTagEpLlPhase, lang::kEpLlDispatchRecv);
        ep_ll_dispatch_recv<kFp8>(ctx, p, static_cast<uint32_t>(e), p.area + (e & 1) * p.half_bytes);
    }
}

// ---- combine ------------------------------------------------------------------------------------------------------

#if LOOM_REMOTE_PEERS
// The warp copies one row of `chunks` 16-byte chunks, kEpLlBatch loads in flight per lane. Out of line: inlined
// beside the NVSHMEM calls, its loads in flight would not fit the launch's 128 registers.
__noinline__ LOOM_DEVICE inline void ep_ll_copy_row(char* dst, const char* src, int chunks) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    for (int base = 0; base < chunks; base += 32 * kEpLlBatch) {
        uint4 v[kEpLlBatch];
#pragma unroll
        for (int u = 0; u < kEpLlBatch; ++u) {
            const int c = base + u * 32 + lane;
            if (c < chunks) v[u] = ptx::ld_v4_nc(src + static_cast<int64_t>(c) * 16);
        }
#pragma unroll
        for (int u = 0; u < kEpLlBatch; ++u) {
            const int c = base + u * 32 + lane;
            if (c < chunks) ptx::st_v4(dst + static_cast<int64_t>(c) * 16, v[u]);
        }
    }
}

// The rows of (local expert le, token rank s) for a token rank on another node: each row copied into this warp's
// staging row, then put (blocking: the staging row is free again when it returns) to its source entry's row at s;
// then the flag, a release that completes the puts first. `info` is checked by the caller.
LOOM_DEVICE inline void ep_ll_combine_send_remote(const Ctx& ctx, const EpLlParams& p, uint32_t flag, char* half,
                                                  int le, int s, int count, const int32_t* info, const char* src) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int gw = static_cast<int>(blockIdx.x) * kEpLlWarps + static_cast<int>(threadIdx.x) / 32;
    const int64_t row_bytes = static_cast<int64_t>(p.hidden) * 2;
    const int cpr = p.hidden / 8;  // 16-byte chunks per row
    char* const stage = p.area + 2 * p.half_bytes + static_cast<int64_t>(gw) * row_bytes;
    for (int i = 0; i < count; ++i) {
        ep_ll_copy_row(stage, src + static_cast<int64_t>(i) * row_bytes, cpr);
        __threadfence_system();  // the staged row is visible to a network transport's reads
        __syncwarp();            // every lane's part of the staging row precedes the put
        lang::put(lang::warp, ctx, half + static_cast<int64_t>(info[i]) * row_bytes, stage,
                  static_cast<uint64_t>(row_bytes), s);
    }
    if (lane == 0) {
        auto* own = reinterpret_cast<uint64_t*>(half + ep_ll_combine_flag_offset(p.max_tokens, p.topk, p.hidden)) +
                    static_cast<int64_t>(ctx.rank) * p.local_experts + le;
        lang::signal_op(ctx, own, static_cast<uint64_t>(flag), lang::SignalOp::Set, s);
    }
}
#endif

LOOM_DEVICE inline void ep_ll_combine_send(const Ctx& ctx, const EpLlParams& p, uint32_t flag, char* half) {
    const int W = ctx.world, me = ctx.rank;
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int gw = static_cast<int>(blockIdx.x) * kEpLlWarps + static_cast<int>(threadIdx.x) / 32;
    const int nw = static_cast<int>(gridDim.x) * kEpLlWarps;
    const int L = p.local_experts, M = p.max_tokens, k = p.topk;
    const int64_t row_bytes = static_cast<int64_t>(p.hidden) * 2;
    const int64_t table_off = ep_ll_combine_table_offset(M, k, p.hidden);
    const int64_t flag_off = ep_ll_combine_flag_offset(M, k, p.hidden);
    const int cpr = p.hidden / 8;  // 16-byte chunks per row
    // Warp per (local expert le, token rank s), pr = le x W + s.
    for (int pr = gw; pr < L * W; pr += nw) {
        const int s = pr % W, le = pr / W;
#if !LOOM_REMOTE_PEERS  // here, before the checks: this order keeps the one-node build at its fewest registers
        char* const rows = lang::symm_at(ctx, half, s);
#endif
        const int32_t count = p.recv_counts[pr];
        if (count < 0 || count > M)
            ep_ll_bad_index(ctx.diag, ctx.rank, "ep_ll_combine recv_counts", p.recv_counts + pr, count, M + 1);
        const int32_t* const info = p.recv_src_info + static_cast<int64_t>(pr) * M;
        for (int i = lane; i < count; i += 32)
            if (info[i] < 0 || info[i] >= M * k)
                ep_ll_bad_index(ctx.diag, ctx.rank, "ep_ll_combine recv_src_info", info + i, info[i], M * k);
        const char* const src = static_cast<const char*>(p.expert_out) + static_cast<int64_t>(pr) * M * row_bytes;
#if LOOM_REMOTE_PEERS
        if (!ctx.reachable(s)) {
            ep_ll_combine_send_remote(ctx, p, flag, half, le, s, count, info, src);
            continue;
        }
        char* const rows = lang::symm_at(ctx, half, s);
#endif
        int64_t* const table = reinterpret_cast<int64_t*>(rows + table_off);
        if (p.pull) {
            // Pull: token rank s reads each row from this rank's heap; its table gets the row's heap offset.
            for (int i = lane; i < count; i += 32)
                table[info[i]] = static_cast<int64_t>(ctx.own_offset(src + static_cast<int64_t>(i) * row_bytes));
        } else {
            const int total = count * cpr;
            for (int base = 0; base < total; base += 32 * kEpLlBatch) {
                uint4 v[kEpLlBatch];
#pragma unroll
                for (int u = 0; u < kEpLlBatch; ++u) {
                    const int f = base + u * 32 + lane;
                    if (f < total) v[u] = ptx::ld_v4_nc(src + static_cast<int64_t>(f) * 16);
                }
#pragma unroll
                for (int u = 0; u < kEpLlBatch; ++u) {
                    const int f = base + u * 32 + lane;
                    if (f < total) {
                        const int i = f / cpr, c = f % cpr;
                        ptx::st_v4(rows + static_cast<int64_t>(info[i]) * row_bytes + c * 16, v[u]);
                    }
                }
            }
            for (int i = lane; i < count; i += 32) table[info[i]] = -1;
        }
        __syncwarp();  // every lane's rows and table entries precede the flag
        if (lane == 0) {
            auto* sig = reinterpret_cast<uint64_t*>(rows + flag_off) + static_cast<int64_t>(me) * L + le;
            ptx::st_release_sys(sig, static_cast<uint64_t>(flag));
        }
    }
}

// Lane l of the warp writes chunks l, l + 32, ... of y (`cpr` 16-byte chunks of bf16) as sum_slot w[slot] x
// rows[slot] over the slots in `used`, fp32 in slot order, kEpLlReduceBatch loads in flight per lane (half as many
// with remote peers: beside the NVSHMEM paths more would not fit the launch's 128 registers).
inline constexpr int kEpLlReduceBatch = LOOM_REMOTE_PEERS ? kEpLlBatch / 2 : kEpLlBatch;
LOOM_DEVICE LOOM_FORCEINLINE void ep_ll_reduce_token(const char* const* rows, unsigned used, int k, const float* w,
                                                     uint4* y, int cpr) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    for (int c = lane; c < cpr; c += 32) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        // Slots in order.
        for (int s0 = 0; s0 < k; s0 += kEpLlReduceBatch) {
            uint4 v[kEpLlReduceBatch];
#pragma unroll
            for (int u = 0; u < kEpLlReduceBatch; ++u) {
                const int s = s0 + u;
                if (s < k && ((used >> s) & 1u)) v[u] = ptx::ld_v4(rows[s] + c * 16);
            }
#pragma unroll
            for (int u = 0; u < kEpLlReduceBatch; ++u) {
                const int s = s0 + u;
                if (s >= k || ((used >> s) & 1u) == 0u) continue;
                const float ws = w[s];
                const uint32_t q[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    acc[2 * j] += ws * ep_ll_bf16_lo(q[j]);
                    acc[2 * j + 1] += ws * ep_ll_bf16_hi(q[j]);
                }
            }
        }
        y[c] = make_uint4(ep_ll_pack_bf16(acc[0], acc[1]), ep_ll_pack_bf16(acc[2], acc[3]),
                          ep_ll_pack_bf16(acc[4], acc[5]), ep_ll_pack_bf16(acc[6], acc[7]));
    }
}

LOOM_DEVICE inline void ep_ll_combine_recv(const Ctx& ctx, const EpLlParams& p, uint32_t flag, char* half) {
    const int me = ctx.rank;
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int gw = static_cast<int>(blockIdx.x) * kEpLlWarps + static_cast<int>(threadIdx.x) / 32;
    const int nw = static_cast<int>(gridDim.x) * kEpLlWarps;
    const int L = p.local_experts, M = p.max_tokens, E = p.num_experts, k = p.topk;
    const int64_t row_bytes = static_cast<int64_t>(p.hidden) * 2;
    const int64_t* const table = reinterpret_cast<const int64_t*>(half + ep_ll_combine_table_offset(M, k, p.hidden));
    const uint64_t* const flags = reinterpret_cast<const uint64_t*>(half + ep_ll_combine_flag_offset(M, k, p.hidden));
    const int64_t done_off = ep_ll_combine_done_offset(M, k, p.hidden, E);
    auto wait_flag = [&](int ex) {
        lang::spin_until(ctx, "ep_ll_combine: expert rows", ex / L, flags + ex, lang::Cmp::EQ, flag,
                         [&](uint64_t& observed) {
                             observed = ptx::ld_acquire_sys(flags + ex);
                             return static_cast<uint32_t>(observed) == flag;
                         });
    };
    // Every expert's flag, also of experts no token of this rank chose (the double buffer's argument).
    for (int ex = static_cast<int>(blockIdx.x * kEpLlThreads + threadIdx.x); ex < E;
         ex += static_cast<int>(gridDim.x) * kEpLlThreads)
        wait_flag(ex);
    // Warp per token: lane s waits for slot s's expert and finds its row (in the expert rank's heap, or pushed into
    // this half: the warp's slot_rows[s]); then lane l reduces chunks l, l + 32, ... over the slots.
    __shared__ const char* s_rows[kEpLlWarps][kEpLlMaxTopk];
    const char** const slot_rows = s_rows[threadIdx.x / 32];
    const int cpr = p.hidden / 8;
    for (int t = gw; t < p.tokens; t += nw) {
        int32_t id = -1;
        const char* src = nullptr;
        if (lane < k) {
            const int64_t entry = static_cast<int64_t>(t) * k + lane;
            id = p.topk_idx[entry];
            if (id < -1 || id >= E)
                ep_ll_bad_index(ctx.diag, ctx.rank, "ep_ll_combine topk_idx", p.topk_idx + entry, id, E);
            if (id >= 0) {
                wait_flag(id);
                src = half + entry * row_bytes;  // pushed
                if (ctx.reachable(id / L)) {
                    const int64_t off = table[entry];  // ordered by the flag's acquire
                    if (off != -1 && (off < 0 || (off & 15) != 0 ||
                                      static_cast<uint64_t>(off) > ctx.heap_size - static_cast<uint64_t>(row_bytes)))
                        ep_ll_bad_index(ctx.diag, ctx.rank, "ep_ll_combine table (expert row offset)", table + entry,
                                        off, static_cast<int64_t>(ctx.heap_size));
                    if (off >= 0) src = ctx.heap_of(id / L) + off;
                }
            }
        }
        if (lane < k) slot_rows[lane] = src;
        __syncwarp();  // the lanes' acquires order the warp's reads of the rows; slot_rows is written
        const unsigned used = __ballot_sync(0xffffffffu, id >= 0);
        const float* const w = p.topk_weights + static_cast<int64_t>(t) * k;
        uint4* const y = reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p.y) + static_cast<int64_t>(t) * p.y_ld);
        ep_ll_reduce_token(slot_rows, used, k, w, y, cpr);
        __syncwarp();  // every lane's reads of slot_rows precede the next token's writes
    }

    // This rank's reads of its peers' heaps are over once every block got here: the grid's last block tells every
    // rank it reaches (done[me] of its half). Then, if token ranks read rows from this rank's heap, wait until each
    // has said so: when the call completes, expert_out is free again.
    __syncthreads();  // every load of the block has returned (its value is in y)
    __shared__ bool s_last;
    if (threadIdx.x == 0) {
        __threadfence();  // release: the block's reads precede its arrival
        const uint64_t arrived = atomicAdd(reinterpret_cast<unsigned long long*>(p.arrivals), 1ull) + 1;
        __threadfence();  // acquire: the last block's done marks follow every block's arrival
        s_last = arrived % gridDim.x == 0;
    }
    __syncthreads();
    if (s_last) {
        for (int r = static_cast<int>(threadIdx.x); r < ctx.local_world; r += kEpLlThreads) {
            auto* d = reinterpret_cast<uint64_t*>(lang::symm_at(ctx, half, ctx.local_base_rank + r) + done_off) + me;
            ptx::st_release_sys(d, static_cast<uint64_t>(flag));
        }
    }
    if (p.pull) {
        const uint64_t* const done = reinterpret_cast<const uint64_t*>(half + done_off);
        for (int r = static_cast<int>(blockIdx.x * kEpLlThreads + threadIdx.x); r < ctx.local_world;
             r += static_cast<int>(gridDim.x) * kEpLlThreads) {
            const int peer = ctx.local_base_rank + r;
            lang::spin_until(ctx, "ep_ll_combine: peers' reads of expert_out", peer, done + peer, lang::Cmp::EQ, flag,
                             [&](uint64_t& observed) {
                                 observed = ptx::ld_acquire_sys(done + peer);
                                 return static_cast<uint32_t>(observed) == flag;
                             });
        }
    }
}

__global__ void __launch_bounds__(kEpLlThreads) ep_ll_combine(Ctx ctx, EpLlParams p) {
    __shared__ uint64_t s_epoch;
    ptx::griddep_wait();
    ptx::griddep_launch_dependents();
    if (p.phases & kEpLlSend) {
        const uint64_t e = ep_ll_next_epoch(p.epochs, &s_epoch);
        LOOM_PROF_BLOCK_SPAN(lang::kTagEpLlPhase, lang::kEpLlCombineSend);
        ep_ll_combine_send(ctx, p, static_cast<uint32_t>(e), p.area + (e & 1) * p.half_bytes);
    }
    if (p.phases & kEpLlRecv) {
        const uint64_t e = ep_ll_next_epoch(p.epochs + kEpLlMaxBlocks, &s_epoch);
        LOOM_PROF_BLOCK_SPAN(lang::kTagEpLlPhase, lang::kEpLlCombineRecv);
        ep_ll_combine_recv(ctx, p, static_cast<uint32_t>(e), p.area + (e & 1) * p.half_bytes);
    }
}

}  // namespace loom::kernels::moe
