// Low-latency (LL) packets: the flag travels inside the data, so a small message needs no separate signal and
// no fence — one store per packet on the sender, one poll per packet on the receiver.
//
//   LL8   8 bytes  = { data (4 B), flag (4 B) }, written by one 8-byte store (single-copy atomic).
//   LL16  16 bytes = { data0, flag, data1, flag }: two 8-byte halves, each carrying the flag (NCCL's LL layout).
//         A 16-byte store is not guaranteed single-copy atomic, but each aligned 8-byte half is, so a receiver
//         that sees the flag in both halves has both data words. (12 + 4 would rely on 16-byte atomicity.)
//
// Flags: the receiver waits for packet.flag == flag. Use a fresh, non-zero flag for every reuse of a buffer
// (e.g. the call count + 1): no reset between uses. Buffers are symmetric; the sender writes the peer's copy.
// send/recv are warp-scope: all 32 lanes call with the same arguments; lane l handles packets l, l+32, ...
#pragma once

#include "loom/config.hpp"
#include "loom/lang/context.cuh"
#include "loom/lang/group.cuh"
#include "loom/lang/rank.cuh"
#include "loom/lang/spin.cuh"
#include "loom/ptx/memory.cuh"

namespace loom::lang {

struct alignas(8) LL8 {
    uint32_t data;
    uint32_t flag;
};
struct alignas(16) LL16 {
    uint32_t data0, flag0, data1, flag1;
};

// Write words[0..n) into `peer`'s copy of packets[0..n) (LL8: one 4-byte word per packet).
LOOM_DEVICE LOOM_FORCEINLINE void ll_send(Warp w, const Ctx& ctx, LL8* packets, const uint32_t* words, uint32_t n,
                                          uint32_t flag, int peer) {
    LL8* remote = symm_at(ctx, packets, peer);
    for (uint32_t i = w.rank(); i < n; i += 32) ptx::st_volatile_v2(&remote[i], words[i], flag);
}
// Wait for packets[0..n) of this rank to carry `flag` and copy their data into words[0..n).
LOOM_DEVICE LOOM_FORCEINLINE void ll_recv(Warp w, const Ctx& ctx, const LL8* packets, uint32_t* words, uint32_t n,
                                          uint32_t flag) {
    for (uint32_t i = w.rank(); i < n; i += 32) {
        uint32_t data = 0;
        spin_until(ctx, "ll8_recv", &packets[i], Cmp::EQ, flag, [&](uint64_t& observed) {
            uint32_t f;
            ptx::ld_volatile_v2(&packets[i], data, f);
            observed = f;
            return f == flag;
        });
        words[i] = data;
    }
    w.sync();
}

// LL16: 8 bytes of data per packet (two 4-byte words); n counts 8-byte elements.
LOOM_DEVICE LOOM_FORCEINLINE void ll_send(Warp w, const Ctx& ctx, LL16* packets, const uint64_t* data, uint32_t n,
                                          uint32_t flag, int peer) {
    LL16* remote = symm_at(ctx, packets, peer);
    for (uint32_t i = w.rank(); i < n; i += 32) {
        const uint64_t v = data[i];
        ptx::st_volatile_v4(&remote[i],
                            make_uint4(static_cast<uint32_t>(v), flag, static_cast<uint32_t>(v >> 32), flag));
    }
}
LOOM_DEVICE LOOM_FORCEINLINE void ll_recv(Warp w, const Ctx& ctx, const LL16* packets, uint64_t* data, uint32_t n,
                                          uint32_t flag) {
    for (uint32_t i = w.rank(); i < n; i += 32) {
        uint4 p;
        spin_until(ctx, "ll16_recv", &packets[i], Cmp::EQ, flag, [&](uint64_t& observed) {
            p = ptx::ld_volatile_v4(&packets[i]);
            observed = p.y != flag ? p.y : p.w;
            return p.y == flag && p.w == flag;
        });
        data[i] = static_cast<uint64_t>(p.x) | (static_cast<uint64_t>(p.z) << 32);
    }
    w.sync();
}

}  // namespace loom::lang
