// One-sided data movement to and from mapped peers: put / get / put_signal, their non-blocking forms, and
// fence / quiet. Two data paths, chosen by the trailing path argument:
//
//   LdSt{}  every thread of the group moves 16-byte vectors with ordinary loads and stores (any arch). Best for
//           small and medium transfers and when the group has nothing else to do.
//   Tma{..} the group's leader drives a pipeline of cp.async.bulk copies through shared-memory staging
//           (global -> smem -> peer global; sm_90). One thread keeps `stages * stage_bytes` in flight, so a few
//           SMs saturate the link and the other threads stay free. Needs a staging area (make_tma_staging).
//
// Bytes that are not 16-byte aligned (heads, tails, odd sizes, mismatched alignment) are moved by the group
// with the widest ordinary access the alignment allows, on either path.
//
// Contracts (all threads of the group call with the same arguments):
//   put / get          on return the transfer is complete from the group's point of view: the source may be
//                      reused, and (get) the destination may be read by any thread of the group. A put's data
//                      is published to the peer by a later release: notify / put_signal / quiet + signal.
//   put_nbi / get_nbi  on return the source may be reused (TMA staging too); the writes may still be in flight
//                      and other threads' shares may not be done: call quiet(g, ctx) with the same group before
//                      publishing or reading them.
//   put_signal         put, then the leader applies the signal with release semantics: the data is visible to
//                      whoever observes the signal.
//   fence / quiet      order / complete this group's earlier puts (both wait for outstanding bulk copies).
// Remote peers (kernels compiled with remote peers, lang/remote.cuh): a peer on another node goes through NVSHMEM's
// put / get of the same scope (the path argument is ignored). A blocking remote put returns when the source may be
// reused; its data is delivered by the next quiet, put_signal or notify to that peer (each completes it first).
// Generic-proxy writes to a source that TMA reads, and TMA writes that generic loads read, are fenced inside
// (fence.proxy.async): callers never fence proxies.
#pragma once

#include "loom/config.hpp"
#include "loom/lang/context.cuh"
#include "loom/lang/group.cuh"
#include "loom/lang/rank.cuh"
#include "loom/lang/remote.cuh"
#include "loom/lang/signal.cuh"
#include "loom/lang/spin.cuh"
#include "loom/ptx/async.cuh"
#include "loom/ptx/memory.cuh"

namespace loom::lang {

namespace detail {
// Dependent on G so that the assertion fires only when the TMA path is instantiated for an older arch.
template <class G>
inline constexpr bool kHasTma = LOOM_ARCH == 0 || LOOM_ARCH >= 900;
}  // namespace detail

// ---- data paths ----------------------------------------------------------------------------------------------
struct LdSt {};

// TMA staging, all in shared memory: `stages` buffers of `stage_bytes` (16-byte multiple), one mbarrier per
// stage and the parity word of the leader's pipeline. One staging area per issuing group (per block for Block,
// per warp for Warp); built once per kernel with make_tma_staging.
struct Tma {
    char* buf;
    uint64_t* bars;
    uint32_t* phases;  // bit s: parity of the next completion of bars[s]
    uint32_t stage_bytes;
    uint32_t stages;
};

// Bytes of shared memory a staging area of `stages` x `stage_bytes` needs (round the base up to 128).
LOOM_HOST_DEVICE constexpr uint32_t tma_staging_bytes(uint32_t stages, uint32_t stage_bytes) {
    return 128 + stages * stage_bytes;
}

// Carve a staging area from `smem` (128-byte aligned, tma_staging_bytes(stages, stage_bytes) bytes). Every thread
// of `g` calls; the leader initialises the mbarriers. At most 14 stages are used; stage_bytes is rounded down to 16.
// A staging area of no stage or of stages under 16 bytes moves its copies by ld/st.
template <class G>
LOOM_DEVICE LOOM_FORCEINLINE Tma make_tma_staging(G g, void* smem, uint32_t stages, uint32_t stage_bytes) {
    static_assert(detail::kHasTma<G>, "the TMA data path needs sm_90");
    char* base = static_cast<char*>(smem);
    Tma t{base + 128, reinterpret_cast<uint64_t*>(base), reinterpret_cast<uint32_t*>(base + 8 * 15), stage_bytes & ~15u,
          stages > 14 ? 14u : stages};
    if (g.leader()) {
        for (uint32_t s = 0; s < t.stages; ++s) ptx::mbarrier_init(&t.bars[s], 1);
        *t.phases = 0;
        ptx::fence_mbarrier_init();
    }
    g.sync();
    return t;
}

namespace detail {

// Generic-proxy copy of [src, src+bytes) to dst by the threads of g; widest access the relative alignment of
// src and dst allows; four 16-byte loads in flight per thread.
template <class G>
LOOM_DEVICE LOOM_FORCEINLINE void copy_ldst(G g, char* dst, const char* src, uint64_t bytes) {
    const uint32_t tid = g.rank(), nt = g.size();
    const uint64_t d = reinterpret_cast<uint64_t>(dst), s = reinterpret_cast<uint64_t>(src);
    if (((d ^ s) & 15) == 0) {  // common 16-byte alignment: byte head, 16-byte body, byte tail
        uint64_t head = (16 - (d & 15)) & 15;
        if (head > bytes) head = bytes;
        const uint64_t nv = (bytes - head) / 16;
        for (uint64_t i = tid; i < head; i += nt) dst[i] = src[i];
        const uint4* vs = reinterpret_cast<const uint4*>(src + head);
        uint4* vd = reinterpret_cast<uint4*>(dst + head);
        uint64_t i = tid;
        for (; i + 3 * nt < nv; i += 4 * nt) {
            const uint4 a = ptx::ld_v4_na(vs + i), b = ptx::ld_v4_na(vs + i + nt);
            const uint4 c = ptx::ld_v4_na(vs + i + 2 * nt), e = ptx::ld_v4_na(vs + i + 3 * nt);
            ptx::st_v4(vd + i, a);
            ptx::st_v4(vd + i + nt, b);
            ptx::st_v4(vd + i + 2 * nt, c);
            ptx::st_v4(vd + i + 3 * nt, e);
        }
        for (; i < nv; i += nt) ptx::st_v4(vd + i, ptx::ld_v4_na(vs + i));
        for (uint64_t k = head + nv * 16 + tid; k < bytes; k += nt) dst[k] = src[k];
    } else if (((d ^ s) & 3) == 0) {  // common 4-byte alignment: words
        uint64_t head = (4 - (d & 3)) & 3;
        if (head > bytes) head = bytes;
        const uint64_t nw = (bytes - head) / 4;
        for (uint64_t k = tid; k < head; k += nt) dst[k] = src[k];
        const uint32_t* ws = reinterpret_cast<const uint32_t*>(src + head);
        uint32_t* wd = reinterpret_cast<uint32_t*>(dst + head);
        for (uint64_t k = tid; k < nw; k += nt) wd[k] = ws[k];
        for (uint64_t k = head + nw * 4 + tid; k < bytes; k += nt) dst[k] = src[k];
    } else {
        for (uint64_t k = tid; k < bytes; k += nt) dst[k] = src[k];
    }
}

// The leader's bulk-copy pipeline: global src -> smem stage -> global dst, 16-byte aligned, bytes % 16 == 0.
// Up to stages-1 loads in flight while stores drain. wait_writes: wait until the writes are complete and
// fenced for the generic proxy (blocking forms); otherwise only until the staging was read (nbi forms).
LOOM_DEVICE inline void bulk_pipeline(const Ctx& ctx, const Tma& t, char* dst, const char* src, uint64_t bytes,
                                      bool wait_writes) {
    const uint64_t sb = t.stage_bytes;
    const uint64_t n = (bytes + sb - 1) / sb;
    uint32_t phases = *t.phases;
    auto issue_load = [&](uint64_t c) {
        const uint32_t s = static_cast<uint32_t>(c % t.stages);
        const uint32_t len = static_cast<uint32_t>(bytes - c * sb < sb ? bytes - c * sb : sb);
        ptx::mbarrier_arrive_expect_tx(&t.bars[s], len);
        ptx::cp_async_bulk_g2s(t.buf + s * sb, src + c * sb, len, &t.bars[s]);
    };
    for (uint64_t c = 0; c < n && c < t.stages; ++c) issue_load(c);
    for (uint64_t c = 0; c < n; ++c) {
        const uint32_t s = static_cast<uint32_t>(c % t.stages);
        const uint32_t parity = (phases >> s) & 1u;
        spin_until(ctx, "tma_stage", &t.bars[s], Cmp::EQ, parity, [&](uint64_t& observed) {
            const bool done = ptx::mbarrier_try_wait_parity(&t.bars[s], parity);
            observed = done ? parity : parity ^ 1u;
            return done;
        });
        phases ^= 1u << s;
        const uint32_t len = static_cast<uint32_t>(bytes - c * sb < sb ? bytes - c * sb : sb);
        ptx::cp_async_bulk_s2g(dst + c * sb, t.buf + s * sb, len);
        ptx::cp_async_bulk_commit_group();
        // Refill the stage of chunk c-1 once its store has read it (the store of chunk c may still run).
        if (c >= 1 && c - 1 + t.stages < n) {
            ptx::cp_async_bulk_wait_group_read<1>();
            issue_load(c - 1 + t.stages);
        }
    }
    *t.phases = phases;
    if (wait_writes) {
        ptx::cp_async_bulk_wait_group<0>();
        ptx::fence_proxy_async_global();
    } else {
        ptx::cp_async_bulk_wait_group_read<0>();
    }
}

template <class G>
LOOM_DEVICE LOOM_FORCEINLINE void copy(G g, const Ctx&, char* dst, const char* src, uint64_t bytes, LdSt,
                                       bool /*wait_writes*/) {
    copy_ldst(g, dst, src, bytes);
}

template <class G>
LOOM_DEVICE LOOM_FORCEINLINE void copy(G g, const Ctx& ctx, char* dst, const char* src, uint64_t bytes, const Tma& t,
                                       bool wait_writes) {
    static_assert(kHasTma<G>, "the TMA data path needs sm_90");
    const uint64_t d = reinterpret_cast<uint64_t>(dst), s = reinterpret_cast<uint64_t>(src);
    if (((d ^ s) & 15) != 0 || t.stages == 0 || t.stage_bytes == 0) {  // bulk copies impossible: no common 16-byte
        copy_ldst(g, dst, src, bytes);                                 // alignment, or no usable staging
        return;
    }
    uint64_t head = (16 - (d & 15)) & 15;
    if (head > bytes) head = bytes;
    const uint64_t body = (bytes - head) & ~uint64_t(15);
    // Ordinary stores this thread made to src (or to dst, which the bulk copy overwrites) before the async
    // proxy touches them.
    ptx::fence_proxy_async_global();
    g.sync();
    if (body && g.leader()) bulk_pipeline(ctx, t, dst + head, src + head, body, wait_writes);
    const uint32_t tid = g.rank(), nt = g.size();
    for (uint64_t i = tid; i < head; i += nt) dst[i] = src[i];
    for (uint64_t i = head + body + tid; i < bytes; i += nt) dst[i] = src[i];
}

// symm_at for the `bytes` from p: the whole range must lie in this rank's heap (one past its end is the next rank's
// heap, or unmapped). A range that runs past the end is reported by its last byte.
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE T* symm_range_at(const Ctx& ctx, T* p, uint64_t bytes, int peer) {
    const uint64_t off = ctx.own_offset(p);
    if (off < ctx.heap_size && bytes > ctx.heap_size - off)
        bad_peer(ctx, static_cast<const char*>(static_cast<const void*>(p)) + (bytes - 1), peer);
    return symm_at(ctx, p, peer);
}

}  // namespace detail

// ---- put / get -----------------------------------------------------------------------------------------------
// dst (put) / src (get) is a symmetric pointer of this rank, addressed at `peer` through symm_at (the whole range of
// `bytes` checked to lie in the heap); the other pointer is any global memory of this rank.
template <class G, class Path = LdSt>
LOOM_DEVICE LOOM_FORCEINLINE void put(G g, const Ctx& ctx, void* dst, const void* src, uint64_t bytes, int peer,
                                      const Path& path = Path{}) {
#if LOOM_REMOTE_PEERS
    if (!ctx.reachable(peer)) {
        remote::put(g, ctx, dst, src, bytes, peer, false);
        g.sync();
        return;
    }
#endif
    detail::copy(g, ctx, static_cast<char*>(detail::symm_range_at(ctx, dst, bytes, peer)),
                 static_cast<const char*>(src), bytes, path, true);
    g.sync();
}
template <class G, class Path = LdSt>
LOOM_DEVICE LOOM_FORCEINLINE void put_nbi(G g, const Ctx& ctx, void* dst, const void* src, uint64_t bytes, int peer,
                                          const Path& path = Path{}) {
#if LOOM_REMOTE_PEERS
    if (!ctx.reachable(peer)) return remote::put(g, ctx, dst, src, bytes, peer, true);
#endif
    detail::copy(g, ctx, static_cast<char*>(detail::symm_range_at(ctx, dst, bytes, peer)),
                 static_cast<const char*>(src), bytes, path, false);
}
template <class G, class Path = LdSt>
LOOM_DEVICE LOOM_FORCEINLINE void get(G g, const Ctx& ctx, void* dst, const void* src, uint64_t bytes, int peer,
                                      const Path& path = Path{}) {
#if LOOM_REMOTE_PEERS
    if (!ctx.reachable(peer)) {
        remote::get(g, ctx, dst, src, bytes, peer, false);
        g.sync();
        return;
    }
#endif
    detail::copy(g, ctx, static_cast<char*>(dst),
                 static_cast<const char*>(detail::symm_range_at(ctx, src, bytes, peer)), bytes, path, true);
    g.sync();
}
template <class G, class Path = LdSt>
LOOM_DEVICE LOOM_FORCEINLINE void get_nbi(G g, const Ctx& ctx, void* dst, const void* src, uint64_t bytes, int peer,
                                          const Path& path = Path{}) {
#if LOOM_REMOTE_PEERS
    if (!ctx.reachable(peer)) return remote::get(g, ctx, dst, src, bytes, peer, true);
#endif
    detail::copy(g, ctx, static_cast<char*>(dst),
                 static_cast<const char*>(detail::symm_range_at(ctx, src, bytes, peer)), bytes, path, false);
}

// ---- fence / quiet -------------------------------------------------------------------------------------------
// fence: this group's earlier puts are ordered before its later puts and signals (NVSHMEM fence). Each thread
// fences its own stores (acq_rel.sys); the leader also waits for its outstanding bulk copies.
template <class G>
LOOM_DEVICE LOOM_FORCEINLINE void fence(G g, const Ctx& ctx) {
#if LOOM_REMOTE_PEERS
    if (g.leader()) remote::fence(ctx);  // this rank's NVSHMEM operations (remote peers)
#else
    (void)ctx;
#endif
#if LOOM_ARCH >= 900
    if (g.leader()) {
        ptx::cp_async_bulk_wait_group<0>();
        ptx::fence_proxy_async_global();
    }
#endif
    ptx::fence_acq_rel_sys();
}
// quiet: every earlier put / get (blocking or nbi) of this group is complete, so any thread may publish them (a
// relaxed signal after quiet is a release) or read gets. The group synchronises first (every thread's stores and
// NVSHMEM calls are issued), then its leader alone completes them: its bulk copies, then one sys-scope fence,
// cumulative over the stores the synchronisation ordered before it (the pattern of NVSHMEM's block puts + quiet). In
// a World of several nodes that fence is nvshmem_quiet's: it completes this rank's NVSHMEM operations and ends with a
// sys-scope fence on every transport (no separate nvshmem_fence). The group synchronises again.
template <class G>
LOOM_DEVICE LOOM_FORCEINLINE void quiet(G g, const Ctx& ctx) {
    g.sync();
    if (g.leader()) {
#if LOOM_ARCH >= 900
        ptx::cp_async_bulk_wait_group<0>();
        ptx::fence_proxy_async_global();
#endif
#if LOOM_REMOTE_PEERS
        if (ctx.remote_heap)
            remote::quiet(ctx);  // this rank's NVSHMEM operations complete, then NVSHMEM's own sys-scope fence
        else
#else
        (void)ctx;
#endif
            ptx::fence_acq_rel_sys();
    }
    g.sync();
}
LOOM_DEVICE LOOM_FORCEINLINE void fence(const Ctx& ctx) { fence(Thread{}, ctx); }
LOOM_DEVICE LOOM_FORCEINLINE void quiet(const Ctx& ctx) { quiet(Thread{}, ctx); }

// ---- put_signal ----------------------------------------------------------------------------------------------
// put, then the leader applies `op sig_value` to `peer`'s `sig` with release semantics at `scope`: a consumer
// that waits for the signal sees all the data.
template <class G, class Path = LdSt>
LOOM_DEVICE LOOM_FORCEINLINE void put_signal(G g, const Ctx& ctx, void* dst, const void* src, uint64_t bytes,
                                             uint64_t* sig, uint64_t sig_value, SignalOp op, int peer,
                                             const Path& path = Path{}, Scope scope = Scope::Sys) {
#if LOOM_REMOTE_PEERS
    if (!ctx.reachable(peer)) {
        remote::put_signal(g, ctx, dst, src, bytes, sig, sig_value, op == SignalOp::Add, peer);
        g.sync();
        return;
    }
#endif
    put(g, ctx, dst, src, bytes, peer, path);
    if (g.leader()) signal_release(symm_at(ctx, sig, peer), sig_value, op, scope);
}

}  // namespace loom::lang
