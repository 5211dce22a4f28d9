// bench-ep-ll's NVSHMEM baseline: Loom's low-latency dispatch / combine algorithm (kernels/moe/ep_ll.cuh) with its
// transport written against NVSHMEM's device API, as DeepEP's low-latency kernels are: the send warp casts a token
// once into a local symmetric staging row and puts it to each slot's rank (nvshmemx_putmem_nbi_warp + the header by
// nvshmem_int_p), completes its puts (nvshmem_quiet) and counts the entries sent; the expert's warp then sets the
// count signal (nvshmemx_signal_op); receivers wait with nvshmem_signal_wait_until. Combine puts each expert row to
// its token's rank, then nvshmem_fence + the flag. nvshmem_combine_pull is Loom's combine of rows in the symmetric
// heap: the expert's warp puts each row's index into the token rank's table (nvshmem_int64_p), then the flag; the
// token rank reads the rows through nvshmem_ptr and, once every block is done, signals done to every rank, which
// waits for all of them. Both combines sum with Loom's ep_ll_reduce_token. The call number comes from the host
// (parity half e & 1, flags e).
// Compiled by the JIT's nvcc path with KernelSpec::needs_nvshmem.
#pragma once

#include <nvshmem.h>
#include <nvshmemx.h>

#include "loom/kernels/moe/ep_ll.cuh"

namespace ep_ll_bench {

using namespace loom::kernels::moe;

struct NvParams {
    int32_t tokens, hidden, topk, num_experts, local_experts, max_tokens, me, world;
    const int32_t* topk_idx;
    const float* topk_weights;
    const void* x;
    void* y;
    const void* expert_out;
    void* recv_x;
    float* recv_scales;
    int32_t* recv_src_info;
    int32_t* recv_counts;
    char* staging;  // symmetric [M] messages (dispatch)
    char* area;     // symmetric, two halves of half_bytes (dispatch messages / combine rows)
    int64_t half_bytes;
    uint64_t* sig;  // symmetric [2][sig_count]: dispatch counts [L][W] / combine flags [E]
    int32_t sig_count;
    uint32_t* counters;   // [2][E], zero between calls
    uint64_t epoch;       // call number, >= 1
    uint64_t timeout_ns;  // bound on the wait for this rank's own sends (Ctx::wait_timeout_ns)
    // nvshmem_combine_pull: expert_out in NVSHMEM's heap, the done signals [2][W] (symmetric), this rank's count of
    // blocks that finished a pull (over all calls).
    const void* expert_out_sym;
    uint64_t* done;
    unsigned long long* arrivals;
};

__global__ void __launch_bounds__(kEpLlThreads) nvshmem_dispatch(NvParams p) {
    __shared__ uint32_t hist[kEpLlMaxExperts];
    const int lane = threadIdx.x & 31;
    const int gw = blockIdx.x * kEpLlWarps + threadIdx.x / 32, nw = gridDim.x * kEpLlWarps;
    const int W = p.world, me = p.me, L = p.local_experts, M = p.max_tokens, E = p.num_experts, k = p.topk;
    const int64_t msg_bytes = ep_ll_msg_bytes(p.hidden, true), payload = ep_ll_payload_bytes(p.hidden, true);
    const int entries = p.tokens * k;
    char* const half = p.area + (p.epoch & 1) * p.half_bytes;
    uint64_t* const sig = p.sig + (p.epoch & 1) * p.sig_count;
    uint32_t* const slots = p.counters;
    uint32_t* const sent = p.counters + E;

    for (int i = threadIdx.x; i < E; i += kEpLlThreads) hist[i] = 0;
    __syncthreads();
    for (int j = threadIdx.x; j < entries; j += kEpLlThreads)
        if (p.topk_idx[j] >= 0) atomicAdd(hist + p.topk_idx[j], 1u);
    __syncthreads();

    for (int t = gw; t < p.tokens; t += nw) {
        char* const stage = p.staging + static_cast<int64_t>(t) * msg_bytes;
        ep_ll_send_row<true>(static_cast<const __nv_bfloat16*>(p.x) + static_cast<int64_t>(t) * p.hidden, stage,
                             reinterpret_cast<float*>(stage + payload), 1u, p.hidden);
        __syncwarp();
        for (int s = 0; s < k; ++s) {
            const int id = p.topk_idx[t * k + s];
            if (id < 0) continue;
            uint32_t slot = 0;
            if (lane == 0) slot = atomicAdd(slots + id, 1u);
            slot = __shfl_sync(0xffffffffu, slot, 0);
            char* dst = half + ((static_cast<int64_t>(id % L) * W + me) * M + slot) * msg_bytes;
            nvshmemx_putmem_nbi_warp(dst, stage, msg_bytes - 16, id / L);
            if (lane == 0) nvshmem_int_p(reinterpret_cast<int*>(dst + msg_bytes - 16), t * k + s, id / L);
        }
        __syncwarp();
        if (lane == 0) nvshmem_quiet();
        __syncwarp();
        if (lane < k && p.topk_idx[t * k + lane] >= 0)
            loom::ptx::red_add_release_gpu(sent + p.topk_idx[t * k + lane], 1u);
    }
    for (int ex = gw; ex < E; ex += nw) {
        if (lane != 0) continue;
        loom::lang::spin_or_trap(
            p.timeout_ns, "ep_ll_bench: local sends of an expert", sent + ex, loom::lang::Cmp::GE,
            [&] { return loom::ptx::ld_acquire_gpu(sent + ex) >= hist[ex]; },
            [&] {
                return loom::lang::WaitValues{hist[ex], loom::ptx::ld_acquire_gpu(sent + ex)};
            });
        nvshmemx_signal_op(sig + (ex % L) * W + me, (p.epoch << 32) | hist[ex], NVSHMEM_SIGNAL_SET, ex / L);
        sent[ex] = 0;
        slots[ex] = 0;
    }

    // Receive: as Loom's.
    const int cpm = static_cast<int>(payload / 16), sb = p.hidden / kEpLlScaleBlock;
    for (int pr = gw; pr < L * W; pr += nw) {
        uint32_t count = 0;
        if (lane == 0) {
            count = static_cast<uint32_t>(nvshmem_signal_wait_until(sig + pr, NVSHMEM_CMP_GE, p.epoch << 32));
            p.recv_counts[pr] = static_cast<int32_t>(count);
        }
        __syncwarp();
        count = __shfl_sync(0xffffffffu, count, 0);
        const char* const msgs = half + static_cast<int64_t>(pr) * M * msg_bytes;
        char* const out = static_cast<char*>(p.recv_x) + static_cast<int64_t>(pr) * M * payload;
        const int total = static_cast<int>(count) * cpm;
        for (int base = 0; base < total; base += 32 * kEpLlBatch) {
            uint4 v[kEpLlBatch];
#pragma unroll
            for (int u = 0; u < kEpLlBatch; ++u) {
                const int f = base + u * 32 + lane;
                if (f < total) v[u] = loom::ptx::ld_v4(msgs + (f / cpm) * msg_bytes + (f % cpm) * 16);
            }
#pragma unroll
            for (int u = 0; u < kEpLlBatch; ++u) {
                const int f = base + u * 32 + lane;
                if (f < total) loom::ptx::st_v4(out + static_cast<int64_t>(f) * 16, v[u]);
            }
        }
        for (int f = lane; f < static_cast<int>(count) * (sb + 1); f += 32) {
            const int i = f / (sb + 1), c = f % (sb + 1);
            const char* m = msgs + static_cast<int64_t>(i) * msg_bytes;
            const int64_t slot = static_cast<int64_t>(pr) * M + i;
            if (c < sb) {
                p.recv_scales[slot * sb + c] = *reinterpret_cast<const float*>(m + payload + c * 4);
            } else {
                p.recv_src_info[slot] = *reinterpret_cast<const int32_t*>(m + msg_bytes - 16);
            }
        }
    }
}

// Token t's y row: Loom's weighted sum of its slots' rows (rows[s]); the warp's reads of rows precede its return.
__device__ inline void reduce_token(const NvParams& p, int t, const char* const* rows, unsigned used) {
    ep_ll_reduce_token(rows, used, p.topk, p.topk_weights + static_cast<int64_t>(t) * p.topk,
                       reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p.y) + static_cast<int64_t>(t) * p.hidden),
                       p.hidden / 8);
    __syncwarp();
}

__global__ void __launch_bounds__(kEpLlThreads) nvshmem_combine(NvParams p) {
    const int lane = threadIdx.x & 31;
    const int gw = blockIdx.x * kEpLlWarps + threadIdx.x / 32, nw = gridDim.x * kEpLlWarps;
    const int W = p.world, me = p.me, L = p.local_experts, M = p.max_tokens, E = p.num_experts, k = p.topk;
    const int64_t row_bytes = static_cast<int64_t>(p.hidden) * 2;
    char* const half = p.area + (p.epoch & 1) * p.half_bytes;
    uint64_t* const sig = p.sig + (p.epoch & 1) * p.sig_count;

    for (int pr = gw; pr < L * W; pr += nw) {
        const int s = pr % W, le = pr / W;
        const int count = p.recv_counts[pr];
        const int32_t* info = p.recv_src_info + static_cast<int64_t>(pr) * M;
        const char* src = static_cast<const char*>(p.expert_out) + static_cast<int64_t>(pr) * M * row_bytes;
        for (int i = 0; i < count; ++i)
            nvshmemx_putmem_nbi_warp(half + static_cast<int64_t>(info[i]) * row_bytes, src + i * row_bytes, row_bytes,
                                     s);
        __syncwarp();
        if (lane == 0) {
            nvshmem_fence();
            nvshmemx_signal_op(sig + me * L + le, p.epoch, NVSHMEM_SIGNAL_SET, s);
        }
    }

    for (int ex = blockIdx.x * kEpLlThreads + threadIdx.x; ex < E; ex += gridDim.x * kEpLlThreads)
        nvshmem_signal_wait_until(sig + ex, NVSHMEM_CMP_GE, p.epoch);
    // Warp per token: each slot's row (slot_rows), then Loom's weighted sum.
    __shared__ const char* s_rows[kEpLlWarps][kEpLlMaxTopk];
    const char** const slot_rows = s_rows[threadIdx.x / 32];
    for (int t = gw; t < p.tokens; t += nw) {
        int32_t id = -1;
        if (lane < k) {
            id = p.topk_idx[t * k + lane];
            if (id >= 0) nvshmem_signal_wait_until(sig + id, NVSHMEM_CMP_GE, p.epoch);
        }
        if (lane < k) slot_rows[lane] = half + (static_cast<int64_t>(t) * k + lane) * row_bytes;
        __syncwarp();
        reduce_token(p, t, slot_rows, __ballot_sync(0xffffffffu, id >= 0));
    }
}

__global__ void __launch_bounds__(kEpLlThreads) nvshmem_combine_pull(NvParams p) {
    const int lane = threadIdx.x & 31;
    const int gw = blockIdx.x * kEpLlWarps + threadIdx.x / 32, nw = gridDim.x * kEpLlWarps;
    const int W = p.world, me = p.me, L = p.local_experts, M = p.max_tokens, E = p.num_experts, k = p.topk;
    const int64_t row_bytes = static_cast<int64_t>(p.hidden) * 2;
    char* const half = p.area + (p.epoch & 1) * p.half_bytes;
    int64_t* const table = reinterpret_cast<int64_t*>(half + ep_ll_combine_table_offset(M, k, p.hidden));
    uint64_t* const sig = p.sig + (p.epoch & 1) * p.sig_count;
    uint64_t* const done = p.done + (p.epoch & 1) * W;

    for (int pr = gw; pr < L * W; pr += nw) {
        const int s = pr % W, le = pr / W;
        const int count = p.recv_counts[pr];
        const int32_t* info = p.recv_src_info + static_cast<int64_t>(pr) * M;
        for (int i = lane; i < count; i += 32) nvshmem_int64_p(table + info[i], static_cast<int64_t>(pr) * M + i, s);
        __syncwarp();
        if (lane == 0) {
            nvshmem_fence();
            nvshmemx_signal_op(sig + me * L + le, p.epoch, NVSHMEM_SIGNAL_SET, s);
        }
    }

    for (int ex = blockIdx.x * kEpLlThreads + threadIdx.x; ex < E; ex += gridDim.x * kEpLlThreads)
        nvshmem_signal_wait_until(sig + ex, NVSHMEM_CMP_GE, p.epoch);
    // Warp per token: each slot's row (slot_rows), then Loom's weighted sum.
    __shared__ const char* s_rows[kEpLlWarps][kEpLlMaxTopk];
    const char** const slot_rows = s_rows[threadIdx.x / 32];
    for (int t = gw; t < p.tokens; t += nw) {
        int32_t id = -1;
        const char* src = nullptr;
        if (lane < k) {
            id = p.topk_idx[t * k + lane];
            if (id >= 0) {
                nvshmem_signal_wait_until(sig + id, NVSHMEM_CMP_GE, p.epoch);
                const char* base = static_cast<const char*>(nvshmem_ptr(p.expert_out_sym, id / L));
                if (base == nullptr) __trap();  // not load/store reachable: the bench runs on one node
                src = base + table[t * k + lane] * row_bytes;
            }
        }
        if (lane < k) slot_rows[lane] = src;
        __syncwarp();
        reduce_token(p, t, slot_rows, __ballot_sync(0xffffffffu, id >= 0));
    }

    __syncthreads();
    __shared__ bool last;
    if (threadIdx.x == 0) {
        __threadfence();
        last = (atomicAdd(p.arrivals, 1ull) + 1) % gridDim.x == 0;
        __threadfence();
    }
    __syncthreads();
    if (last)
        for (int r = threadIdx.x; r < W; r += kEpLlThreads)
            nvshmemx_signal_op(done + me, p.epoch, NVSHMEM_SIGNAL_SET, r);
    for (int r = blockIdx.x * kEpLlThreads + threadIdx.x; r < W; r += gridDim.x * kEpLlThreads)
        nvshmem_signal_wait_until(done + r, NVSHMEM_CMP_GE, p.epoch);
}

}  // namespace ep_ll_bench
