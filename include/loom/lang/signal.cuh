// Signals: 64-bit monotonic counters in symmetric memory, set or added with release semantics and waited on
// with acquire semantics (Triton-distributed's notify / wait / consume_token; NVSHMEM's signal_op /
// signal_wait_until).
//
// Memory model. A notify by a group is a release at `scope`: every write the group made before the call
// (including, cumulatively, writes it observed) is visible to any thread that observes the new value through
// a wait (acquire at the same scope). Counters are never reset in the hot path: the n-th use of a signal
// waits for `>= n` (GE, wrap-safe), so no reset kernel and no ABA. Scope::Sys (default) is required when the
// other side runs on another GPU; Scope::Gpu is enough when every party runs on this GPU (e.g. ranks sharing
// one GPU under MPS, or blocks of one kernel).
#pragma once

#include "loom/config.hpp"
#include "loom/lang/context.cuh"
#include "loom/lang/group.cuh"
#include "loom/lang/rank.cuh"
#include "loom/lang/remote.cuh"
#include "loom/lang/spin.cuh"
#include "loom/ptx/memory.cuh"

namespace loom::lang {

enum class SignalOp : int { Set, Add };
enum class Scope : int { Gpu, Sys };

// What a wait returns: feed it to consume_token so later loads depend on the wait. Opaque.
struct Token {
    uint64_t dep;
};

// ---- single-thread building blocks ---------------------------------------------------------------------------
LOOM_DEVICE LOOM_FORCEINLINE void signal_release(uint64_t* addr, uint64_t value, SignalOp op, Scope scope) {
    if (op == SignalOp::Set) {
        scope == Scope::Sys ? ptx::st_release_sys(addr, value) : ptx::st_release_gpu(addr, value);
    } else {
        scope == Scope::Sys ? ptx::red_add_release_sys(addr, value) : ptx::red_add_release_gpu(addr, value);
    }
}
LOOM_DEVICE LOOM_FORCEINLINE void signal_relaxed(uint64_t* addr, uint64_t value, SignalOp op, Scope scope) {
    if (op == SignalOp::Set) {
        scope == Scope::Sys ? ptx::st_relaxed_sys(addr, value) : ptx::st_relaxed_gpu(addr, value);
    } else {
        scope == Scope::Sys ? ptx::red_add_relaxed_sys(addr, value) : ptx::red_add_relaxed_gpu(addr, value);
    }
}
LOOM_DEVICE LOOM_FORCEINLINE uint64_t load_acquire(const uint64_t* addr, Scope scope) {
    return scope == Scope::Sys ? ptx::ld_acquire_sys(addr) : ptx::ld_acquire_gpu(addr);
}
LOOM_DEVICE LOOM_FORCEINLINE uint64_t load_relaxed(const uint64_t* addr, Scope scope) {
    return scope == Scope::Sys ? ptx::ld_relaxed_sys(addr) : ptx::ld_relaxed_gpu(addr);
}
// The bounded spin of one thread; returns the observed value that satisfied the compare, with acquire semantics
// at `scope`: an acquire load per poll. Measured against relaxed polls ended by one fence.acquire
// (docs/perf/lang_signal.json), bench-lang ping-pong with the mode a compile-time constant, 3 interleaved passes, two
// calls (two H200s / 2 ranks sharing GPU 0 under MPS): 1.314 / 1.388 against 1.303 / 1.382 us per round trip on two
// GPUs (equal), 0.542 / 0.563 against 0.630 / 0.621 us on one GPU (the fence cost ~40 ns per wait there).
// `peer` (optional): the rank whose notify completes the wait, named in the timeout diagnostic.
LOOM_DEVICE LOOM_FORCEINLINE uint64_t spin_wait(const Ctx& ctx, const char* tag, const uint64_t* sig, Cmp cmp,
                                                uint64_t value, Scope scope, int peer = -1) {
    return spin_until(ctx, tag, peer, sig, cmp, value, [&](uint64_t& observed) {
        observed = load_acquire(sig, scope);
        return compare(observed, cmp, value);
    });
}
// ---- group primitives ----------------------------------------------------------------------------------------
// notify: every thread of `g` calls; the group synchronises (so the writes of all its threads are ordered
// before), then its leader applies `op value` to `peer`'s copy of `sig` with release semantics at `scope`.
// `sig` is a symmetric pointer of this rank; `peer` may be this rank.
template <class G>
LOOM_DEVICE LOOM_FORCEINLINE void notify(G g, const Ctx& ctx, uint64_t* sig, int peer, uint64_t value,
                                         SignalOp op = SignalOp::Set, Scope scope = Scope::Sys) {
    g.sync();
#if LOOM_REMOTE_PEERS
    if (!ctx.reachable(peer)) {  // another node: NVSHMEM's signal after this rank's operations complete
        if (g.leader()) remote::signal_release(ctx, sig, value, op == SignalOp::Add, peer);
        return;
    }
#endif
    if (g.leader()) signal_release(symm_at(ctx, sig, peer), value, op, scope);
}
// notify without ordering: for counters that publish no data (statistics, progress). Spelled out on purpose.
template <class G>
LOOM_DEVICE LOOM_FORCEINLINE void notify_relaxed(G g, const Ctx& ctx, uint64_t* sig, int peer, uint64_t value,
                                                 SignalOp op = SignalOp::Set, Scope scope = Scope::Sys) {
    g.sync();
#if LOOM_REMOTE_PEERS
    if (!ctx.reachable(peer)) {
        if (g.leader()) remote::signal_relaxed(ctx, sig, value, op == SignalOp::Add, peer);
        return;
    }
#endif
    if (g.leader()) signal_relaxed(symm_at(ctx, sig, peer), value, op, scope);
}

// wait: every thread of `g` calls; the leader spins (bounded, acquire at `scope`) on this rank's `sig` until
// `sig <cmp> value` holds (wrap-safe), then the group synchronises: every thread's later accesses are ordered
// after the producer's release. Returns a Token for consume_token.
template <class G>
LOOM_DEVICE LOOM_FORCEINLINE Token wait(G g, const Ctx& ctx, const uint64_t* sig, Cmp cmp, uint64_t value,
                                        Scope scope = Scope::Sys) {
    uint64_t observed = value;
    if (g.leader()) observed = spin_wait(ctx, "wait", sig, cmp, value, scope);
    g.sync();
    return Token{observed};
}

// Returns `p`, made to depend on the wait that produced `token`: loads through the result cannot be hoisted
// above the wait by the compiler (the hardware ordering comes from the wait's acquire).
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE T* consume_token(T* p, Token token) {
    return ptx::depend(p, token.dep);
}

// ---- NVSHMEM-flavoured single-thread forms -------------------------------------------------------------------
// nvshmemx_signal_op(sig, value, op, pe): release at `scope`, called by one thread.
LOOM_DEVICE LOOM_FORCEINLINE void signal_op(const Ctx& ctx, uint64_t* sig, uint64_t value, SignalOp op, int peer,
                                            Scope scope = Scope::Sys) {
#if LOOM_REMOTE_PEERS
    if (!ctx.reachable(peer)) return remote::signal_release(ctx, sig, value, op == SignalOp::Add, peer);
#endif
    signal_release(symm_at(ctx, sig, peer), value, op, scope);
}
// signal_op without ordering (what nvshmemx_signal_op guarantees: earlier puts are not ordered before it unless
// the caller fences). For flags that publish no data, or after an explicit fence/quiet.
LOOM_DEVICE LOOM_FORCEINLINE void signal_op_relaxed(const Ctx& ctx, uint64_t* sig, uint64_t value, SignalOp op,
                                                    int peer, Scope scope = Scope::Sys) {
#if LOOM_REMOTE_PEERS
    if (!ctx.reachable(peer)) return remote::signal_relaxed(ctx, sig, value, op == SignalOp::Add, peer);
#endif
    signal_relaxed(symm_at(ctx, sig, peer), value, op, scope);
}
// nvshmem_signal_wait_until(sig, cmp, value): one thread; acquire; returns the value that satisfied the compare.
// `tag` and `peer` (the rank whose notify completes it), when given, name the wait in the timeout diagnostic.
LOOM_DEVICE LOOM_FORCEINLINE uint64_t signal_wait_until(const Ctx& ctx, const uint64_t* sig, Cmp cmp, uint64_t value,
                                                        Scope scope = Scope::Sys, const char* tag = "signal_wait_until",
                                                        int peer = -1) {
    return spin_wait(ctx, tag, sig, cmp, value, scope, peer);
}
// signal_wait_until without ordering: relaxed polls, no acquire. For flags that order nothing after them (a ping-pong,
// progress, a count read only for its value), paired with signal_op_relaxed: NVSHMEM's own wait has these semantics.
// Where the next operation reaches a peer on another node it is faster: an acquire invalidates this SM's L1, so the
// NVSHMEM call after it reads NVSHMEM's peer table from L2 (docs/crossnode.md).
LOOM_DEVICE LOOM_FORCEINLINE uint64_t signal_wait_until_relaxed(const Ctx& ctx, const uint64_t* sig, Cmp cmp,
                                                                uint64_t value, Scope scope = Scope::Sys,
                                                                const char* tag = "signal_wait_until_relaxed",
                                                                int peer = -1) {
    return spin_until(ctx, tag, peer, sig, cmp, value, [&](uint64_t& observed) {
        observed = load_relaxed(sig, scope);
        return compare(observed, cmp, value);
    });
}

}  // namespace loom::lang
