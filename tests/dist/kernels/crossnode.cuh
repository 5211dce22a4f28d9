// Kernels of the cross-node tests (tests/dist/test_crossnode.cpp): the language's remote column. Compiled with
// remote peers (jit::KernelSpec::remote_peers: nvcc + NVSHMEM), except touch_peer_undeclared, which is compiled
// without them and must trap when it names a peer on another node. Buffers named *_symm are symmetric allocations;
// every kernel runs one block, and only the first group of it takes part (one thread for Thread, one warp for Warp).
#pragma once

#include "loom/lang/lang.cuh"

namespace xnode_test {
using namespace loom;
using namespace loom::lang;

// Word i of the message of `round` from `sender` to `dest`.
LOOM_HOST_DEVICE inline uint32_t word(uint32_t sender, uint32_t dest, uint64_t round, uint32_t i) {
    uint32_t x =
        sender * 0x9E3779B9u ^ dest * 0x7F4A7C15u ^ static_cast<uint32_t>(round) * 0x85EBCA6Bu ^ i * 0xC2B2AE35u;
    x ^= x >> 15;
    return x * 0x2C1B3C6Du;
}

// Every rank puts its slot for each peer (send_symm + peer * slot_bytes) into that peer's recv_symm at
// me * slot_bytes, every peer alike (node-local ones by load/store, others through NVSHMEM). nbi: put_nbi then quiet;
// otherwise blocking puts then quiet (which delivers the remote ones). The host checks after the kernel and a barrier.
template <class G>
__global__ void put_all(Ctx ctx, char* recv_symm, const char* send_symm, uint64_t slot_bytes, int nbi) {
    G g{};
    if (threadIdx.x >= g.size()) return;
    for (int k = 0; k < ctx.world; ++k) {
        const int peer = (ctx.rank + k) % ctx.world;
        char* dst = recv_symm + static_cast<uint64_t>(ctx.rank) * slot_bytes;
        const char* src = send_symm + static_cast<uint64_t>(peer) * slot_bytes;
        if (nbi)
            put_nbi(g, ctx, dst, src, slot_bytes, peer);
        else
            put(g, ctx, dst, src, slot_bytes, peer);
    }
    quiet(g, ctx);
}

// Every rank gets, from each peer, the slot that peer prepared for it (send_symm + me * slot_bytes on the peer) into
// dst_symm + peer * slot_bytes. The host made sure every send buffer is ready (a barrier before the launch).
template <class G>
__global__ void get_all(Ctx ctx, char* dst_symm, const char* send_symm, uint64_t slot_bytes, int nbi) {
    G g{};
    if (threadIdx.x >= g.size()) return;
    for (int k = 0; k < ctx.world; ++k) {
        const int peer = (ctx.rank + k) % ctx.world;
        char* dst = dst_symm + static_cast<uint64_t>(peer) * slot_bytes;
        const char* src = send_symm + static_cast<uint64_t>(ctx.rank) * slot_bytes;
        if (nbi)
            get_nbi(g, ctx, dst, src, slot_bytes, peer);
        else
            get(g, ctx, dst, src, slot_bytes, peer);
    }
    quiet(g, ctx);
}

// Message passing with `to` (and from `from`), `rounds` rounds of `words` words. Round r: wait until `to` has
// acknowledged round r - 1, write the message into send_symm, send it to `to`'s recv_symm and publish it by `mode`:
//   0  put_signal(sig = r, Set)
//   1  put, then notify(sig = r, Set)
//   2  put_nbi, quiet, then signal_op_relaxed(sig += 1, Add)   (the quiet makes the relaxed signal a release)
//   3  put, then signal_op(sig += 1, Add)
// then wait for sig >= r (the message of `from`), check every word, and acknowledge it (notify ack = r at `from`).
// errors[0] counts wrong words.
template <class G>
__global__ void signal_ring(Ctx ctx, uint32_t* recv_symm, uint32_t* send_symm, uint32_t words, uint64_t* sig_symm,
                            uint64_t* ack_symm, int to, int from, uint32_t rounds, int mode, uint32_t* errors) {
    G g{};
    if (threadIdx.x >= g.size()) return;
    const uint32_t me = static_cast<uint32_t>(ctx.rank);
    uint32_t bad = 0;
    for (uint64_t r = 1; r <= rounds; ++r) {
        if (r > 1) wait(g, ctx, ack_symm, Cmp::GE, r - 1);  // `to` has read round r - 1: its buffer is free
        for (uint32_t i = g.rank(); i < words; i += g.size()) send_symm[i] = word(me, static_cast<uint32_t>(to), r, i);
        g.sync();
        const uint64_t bytes = static_cast<uint64_t>(words) * 4;
        switch (mode) {
            case 0:
                put_signal(g, ctx, recv_symm, send_symm, bytes, sig_symm, r, SignalOp::Set, to);
                break;
            case 1:
                put(g, ctx, recv_symm, send_symm, bytes, to);
                notify(g, ctx, sig_symm, to, r, SignalOp::Set);
                break;
            case 2:
                put_nbi(g, ctx, recv_symm, send_symm, bytes, to);
                quiet(g, ctx);
                if (g.leader()) signal_op_relaxed(ctx, sig_symm, 1, SignalOp::Add, to);
                g.sync();
                break;
            default:
                put(g, ctx, recv_symm, send_symm, bytes, to);
                if (g.leader()) signal_op(ctx, sig_symm, 1, SignalOp::Add, to);
                g.sync();
                break;
        }
        const Token t = wait(g, ctx, sig_symm, Cmp::GE, r);
        const uint32_t* in = consume_token(recv_symm, t);
        for (uint32_t i = g.rank(); i < words; i += g.size())
            bad += in[i] != word(static_cast<uint32_t>(from), me, r, i);
        notify(g, ctx, ack_symm, from, r, SignalOp::Set);
    }
    if (bad) atomicAdd(errors, bad);
}

// `rounds` trips of a token around the ring of `to` / `from` with relaxed signals only (signal_op_relaxed +
// signal_wait_until_relaxed: a message that carries nothing but its count). The `first` rank of the ring sends round
// r and waits for it to come back; every other rank waits for round r, then passes it on. No rank sees round r + 1
// before it has passed round r, so every wait must return exactly r: errors[0] counts those that did not.
__global__ void relaxed_token_ring(Ctx ctx, uint64_t* sig_symm, int to, int first, uint32_t rounds, uint32_t* errors) {
    if (threadIdx.x != 0) return;
    uint32_t bad = 0;
    for (uint64_t r = 1; r <= rounds; ++r) {
        if (!first) bad += signal_wait_until_relaxed(ctx, sig_symm, Cmp::GE, r) != r;
        signal_op_relaxed(ctx, sig_symm, r, SignalOp::Set, to);
        if (first) bad += signal_wait_until_relaxed(ctx, sig_symm, Cmp::GE, r) != r;
    }
    if (bad) atomicAdd(errors, bad);
}

// `rounds` barriers across every node. Before barrier r every rank puts r into slot[me] of every peer (remote
// peers through NVSHMEM); after it every slot of mine must hold r (no rank passed early, every put delivered);
// a second barrier keeps the next round's puts away until every rank has checked. errors[0] counts stale slots.
template <class G>
__global__ void barrier_rounds(Ctx ctx, BarrierState* st, uint64_t* slots_symm, uint64_t* value_symm, uint32_t rounds,
                               uint32_t* errors) {
    G g{};
    if (threadIdx.x >= g.size()) return;
    uint32_t bad = 0;
    for (uint64_t r = 1; r <= rounds; ++r) {
        if (g.leader()) *value_symm = r;
        g.sync();
        for (int p = 0; p < ctx.world; ++p) put_nbi(g, ctx, &slots_symm[ctx.rank], value_symm, 8, p);
        barrier_all(g, ctx, st);
        for (uint32_t s = g.rank(); s < static_cast<uint32_t>(ctx.world); s += g.size())
            bad += ptx::ld_relaxed_sys(&slots_symm[s]) != r;
        barrier_all(g, ctx, st);
    }
    if (bad) atomicAdd(errors, bad);
}

// Compiled WITHOUT remote peers: a notify to `peer`. For a peer on another node, symm_at traps with the diagnostic
// "peer P is on node N ...: compile the kernel with remote peers".
__global__ void touch_peer_undeclared(Ctx ctx, uint64_t* sig_symm, int peer) {
    notify(thread, ctx, sig_symm, peer, 1, SignalOp::Set);
}

}  // namespace xnode_test
