// Kernels of the language's multi-rank tests (tests/dist/test_lang_*.cpp) and of the header-instantiation
// unit test. Every kernel gets the Ctx by value; buffers named *_symm are symmetric allocations.
#pragma once

#include "epoch_round.cuh"
#include "loom/lang/lang.cuh"

namespace loom_test {
using namespace loom;
using namespace loom::lang;

// Test pattern: word i of the message of `round` sent by `sender`.
LOOM_DEVICE LOOM_FORCEINLINE uint32_t pattern(uint32_t sender, uint64_t round, uint32_t i) {
    uint32_t x = sender * 0x9E3779B9u ^ static_cast<uint32_t>(round) * 0x85EBCA6Bu ^ i * 0xC2B2AE35u;
    x ^= x >> 16;
    return x * 0x7FEB352Du;
}

// Message passing: each rank writes `words` words into its partner's data (plain stores), notifies (release),
// the partner waits (acquire) and checks every word, then acks so the buffer can be reused. `rounds` rounds.
// Block scope; errors[0] counts mismatches.
__global__ void mp_litmus(Ctx ctx, uint32_t* data_symm, uint64_t* sig_symm, uint64_t* ack_symm, uint32_t words,
                          uint32_t rounds, int partner, Scope scope, uint32_t* errors) {
    uint32_t* remote = symm_at(ctx, data_symm, partner);
    const uint32_t me = static_cast<uint32_t>(ctx.rank), them = static_cast<uint32_t>(partner);
    uint32_t bad = 0;
    for (uint64_t r = 1; r <= rounds; ++r) {
        for (uint32_t i = threadIdx.x; i < words; i += blockDim.x) remote[i] = pattern(me, r, i);
        notify(block, ctx, sig_symm, partner, r, SignalOp::Set, scope);
        const Token t = wait(block, ctx, sig_symm, Cmp::GE, r, scope);
        const uint32_t* mine = consume_token(data_symm, t);
        for (uint32_t i = threadIdx.x; i < words; i += blockDim.x) bad += mine[i] != pattern(them, r, i);
        notify(block, ctx, ack_symm, partner, r, SignalOp::Set, scope);  // my buffer may be overwritten now
        wait(block, ctx, ack_symm, Cmp::GE, r, scope);                   // partner has read what I wrote
    }
    if (bad) atomicAdd(errors, bad);
}

// Many blocks notify one counter: every thread of every block adds 1 to `target`'s counter `adds` times.
__global__ void many_notify(Ctx ctx, uint64_t* counter_symm, int target, uint32_t adds) {
    for (uint32_t k = 0; k < adds; ++k) notify(thread, ctx, counter_symm, target, 1, SignalOp::Add, Scope::Sys);
}
// Waits (block scope) until this rank's counter reaches `expected` exactly, then records what it saw.
__global__ void wait_count(Ctx ctx, uint64_t* counter_symm, uint64_t expected, uint64_t* observed) {
    wait(block, ctx, counter_symm, Cmp::GE, expected);
    if (threadIdx.x == 0) *observed = ptx::ld_acquire_sys(counter_symm);
}

// Epochs: `iters` notify/wait rounds with a partner on a counter that starts at `base` (chosen near 2^64 so that
// the compares cross the wrap). Round k sets the partner's counter to base + k and waits for base + k on mine;
// warp scope. rounds[k - 1] records what the wait returned and the answers of lang::compare around the target
// (epoch_round.cuh); the host checks them against the answers on epoch indices, which do not wrap.
__global__ void epochs(Ctx ctx, uint64_t* sig_symm, uint64_t base, uint32_t iters, int partner, EpochRound* rounds) {
    for (uint32_t k = 1; k <= iters; ++k) {
        const uint64_t target = base + k;
        notify(warp, ctx, sig_symm, partner, target, SignalOp::Set, Scope::Sys);
        const Token t = wait(warp, ctx, sig_symm, Cmp::GE, target);
        if (threadIdx.x == 0) {
            const uint32_t answers = epoch_answers(
                target, t.dep, [](uint64_t v, int cmp, uint64_t tg) { return compare(v, static_cast<Cmp>(cmp), tg); });
            rounds[k - 1] = EpochRound{t.dep, answers, 0};
        }
    }
}

// ---- put / get variants --------------------------------------------------------------------------------------
enum class Op : int { Put, PutNbi, PutSignal, Get, GetNbi };

// Moves `bytes` between this rank and `peer` with group G on data path P (0 = LdSt, 1 = Tma), then publishes:
//   Put/PutNbi/PutSignal: dst_symm on `peer` <- src; then sig on peer = epoch (put_signal, or quiet + notify).
//   Get/GetNbi:           dst <- src_symm on `peer` (the host made sure peer's src is ready).
// After a put, waits for its own sig >= epoch, i.e. for the rank that puts into it. Only the first group of
// block 0 participates (one warp for Warp, one thread for Thread). Dynamic smem: the TMA staging.
template <class G, class Path>
LOOM_DEVICE void move_with(G g, const Ctx& ctx, Op op, char* dst, const char* src, uint64_t bytes, int peer,
                           uint64_t* sig_symm, uint64_t epoch, const Path& path) {
    switch (op) {
        case Op::Put:
            put(g, ctx, dst, src, bytes, peer, path);
            break;
        case Op::PutNbi:
            put_nbi(g, ctx, dst, src, bytes, peer, path);
            quiet(g, ctx);
            break;
        case Op::PutSignal:
            put_signal(g, ctx, dst, src, bytes, sig_symm, epoch, SignalOp::Set, peer, path);
            break;
        case Op::Get:
            get(g, ctx, dst, src, bytes, peer, path);
            return;
        case Op::GetNbi:
            get_nbi(g, ctx, dst, src, bytes, peer, path);
            quiet(g, ctx);
            return;
    }
    if (op != Op::PutSignal) notify(g, ctx, sig_symm, peer, epoch);
    wait(g, ctx, sig_symm, Cmp::GE, epoch);
}

template <class G, int P>
__global__ void move(Ctx ctx, Op op, char* dst, const char* src, uint64_t bytes, int peer, uint64_t* sig_symm,
                     uint64_t epoch) {
    extern __shared__ __align__(128) char smem[];
    G g{};
    if (blockIdx.x != 0 || threadIdx.x >= g.size()) return;  // Thread/Warp: only the first group of block 0
    if constexpr (P == 1) {
        move_with(g, ctx, op, dst, src, bytes, peer, sig_symm, epoch, make_tma_staging(g, smem, 4, 8192));
    } else {
        move_with(g, ctx, op, dst, src, bytes, peer, sig_symm, epoch, LdSt{});
    }
}

// ---- LL packets ----------------------------------------------------------------------------------------------
// `iters` rounds: send n words (LL8) or n 8-byte elements (LL16) to `to`, receive from `from`, check, ack.
template <class Packet>
__global__ void ll_pingpong(Ctx ctx, Packet* packets_symm, uint64_t* ack_symm, uint32_t n, uint32_t iters, int to,
                            int from, uint32_t* scratch, uint32_t* errors) {
    const uint32_t me = static_cast<uint32_t>(ctx.rank);
    uint32_t bad = 0;
    for (uint32_t it = 1; it <= iters; ++it) {
        if constexpr (sizeof(Packet) == 8) {
            for (uint32_t i = threadIdx.x; i < n; i += 32) scratch[i] = pattern(me, it, i);
            __syncwarp();
            ll_send(warp, ctx, packets_symm, scratch, n, it, to);
            ll_recv(warp, ctx, packets_symm, scratch + n, n, it);
            for (uint32_t i = threadIdx.x; i < n; i += 32) bad += scratch[n + i] != pattern(from, it, i);
        } else {
            uint64_t* s = reinterpret_cast<uint64_t*>(scratch);
            for (uint32_t i = threadIdx.x; i < n; i += 32)
                s[i] = pattern(me, it, 2 * i) | (uint64_t(pattern(me, it, 2 * i + 1)) << 32);
            __syncwarp();
            ll_send(warp, ctx, packets_symm, s, n, it, to);
            ll_recv(warp, ctx, packets_symm, s + n, n, it);
            for (uint32_t i = threadIdx.x; i < n; i += 32)
                bad += s[n + i] != (pattern(from, it, 2 * i) | (uint64_t(pattern(from, it, 2 * i + 1)) << 32));
        }
        // The sender may reuse my packets (next flag) only after I read them.
        notify(warp, ctx, ack_symm, from, it, SignalOp::Set);
        wait(warp, ctx, ack_symm, Cmp::GE, it);
    }
    if (bad) atomicAdd(errors, bad);
}

// ---- barriers ------------------------------------------------------------------------------------------------
// `rounds` barriers. Before barrier r every rank writes r into slot[me] of every peer; after it, every slot of
// mine must be >= r (no rank passed early, and writes before the barrier are visible after it).
// grid_mode: every block calls the grid barrier (launch cooperatively); otherwise only block 0 calls it.
__global__ void barrier_rounds(Ctx ctx, BarrierState* st, uint64_t* slots_symm, uint32_t rounds, int grid_mode,
                               uint32_t* errors) {
    uint32_t bad = 0;
    if (!grid_mode && blockIdx.x != 0) return;
    for (uint64_t r = 1; r <= rounds; ++r) {
        if (blockIdx.x == 0 && threadIdx.x < static_cast<uint32_t>(ctx.local_world)) {
            uint64_t* remote = symm_at(ctx, slots_symm, ctx.local_base_rank + static_cast<int>(threadIdx.x));
            ptx::st_relaxed_sys(&remote[ctx.local_rank], r);
        }
        if (grid_mode)
            barrier_all(grid, ctx, st);
        else
            barrier_all(block, ctx, st);
        if (threadIdx.x < static_cast<uint32_t>(ctx.local_world))
            bad += ptx::ld_relaxed_sys(&slots_symm[threadIdx.x]) < r;
    }
    if (bad) atomicAdd(errors, bad);
}

// ---- timeout -------------------------------------------------------------------------------------------------
// Waits for a signal nobody sends: must end in the timeout diagnostic.
__global__ void missing_notify(Ctx ctx, uint64_t* sig) { wait(block, ctx, sig, Cmp::GE, 1); }

// ---- one instantiation per primitive family (compile test only; never launched) ------------------------------
template <class G, class Path>
LOOM_DEVICE void instantiate_moves(G g, const Ctx& ctx, char* buf, uint64_t bytes, uint64_t* sig, int peer,
                                   const Path& path) {
    put(g, ctx, buf, buf + bytes, bytes, peer, path);
    put_nbi(g, ctx, buf, buf + bytes, bytes, peer, path);
    get(g, ctx, buf, buf + bytes, bytes, peer, path);
    get_nbi(g, ctx, buf, buf + bytes, bytes, peer, path);
    put_signal(g, ctx, buf, buf + bytes, bytes, sig, 1, SignalOp::Add, peer, path);
}

template <class G, int P>
__global__ void instantiate_all(Ctx ctx, char* buf, uint64_t* sig, BarrierState* st, LL8* p8, LL16* p16,
                                uint64_t bytes) {
    extern __shared__ __align__(128) char smem[];
    G g{};
    const int peer = (ctx.rank + 1) % ctx.world;
    if constexpr (P == 1) {
        instantiate_moves(g, ctx, buf, bytes, sig, peer, make_tma_staging(g, smem, 2, 4096));
    } else {
        instantiate_moves(g, ctx, buf, bytes, sig, peer, LdSt{});
    }
    fence(g, ctx);
    quiet(g, ctx);
    fence(ctx);
    quiet(ctx);
    notify(g, ctx, sig, peer, 2, SignalOp::Set, Scope::Gpu);
    notify_relaxed(g, ctx, sig, peer, 1, SignalOp::Add);
    const Token t = wait(g, ctx, sig, Cmp::GE, 2, Scope::Gpu);
    buf = consume_token(buf, t);
    signal_op(ctx, sig, 1, SignalOp::Add, peer);
    signal_op_relaxed(ctx, sig, 1, SignalOp::Add, peer, Scope::Gpu);
    const uint64_t v = signal_wait_until(ctx, sig, Cmp::NE, 0);
    const uint64_t v_relaxed = signal_wait_until_relaxed(ctx, sig, Cmp::NE, 0, Scope::Gpu);
    barrier_all(g, ctx, st);
    barrier_all(grid, ctx, st);
    ll_send(warp, ctx, p8, reinterpret_cast<const uint32_t*>(buf), 8, 1, peer);
    ll_recv(warp, ctx, p8, reinterpret_cast<uint32_t*>(buf), 8, 1);
    ll_send(warp, ctx, p16, reinterpret_cast<const uint64_t*>(buf), 8, 1, peer);
    ll_recv(warp, ctx, p16, reinterpret_cast<uint64_t*>(buf), 8, 1);
    buf[0] = static_cast<char>(v + v_relaxed + rank(ctx) + num_ranks(ctx) + local_rank(ctx) + reachable(ctx, peer) +
                               ptx::smid() + ptx::lane_id() + ptx::warp_id() + ptx::globaltimer());
}

}  // namespace loom_test
