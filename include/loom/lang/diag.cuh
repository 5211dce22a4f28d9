// The diagnostic mailbox: where a bounded wait that times out leaves its report without device printf.
//
// Why: any function call (printf is one) in a kernel that uses wgmma makes ptxas serialise every wgmma (warning
// C7510, ~20% of the GEMM). So a timed-out wait writes a DiagRecord into a small mailbox in host-mapped pinned
// memory and traps; when the host next sees the sticky launch error, the runtime decodes the mailbox into the
// loom::Error message (src/runtime/diag_mailbox.cpp). Kernels that may call printf also print (lang/spin.cuh).
//
// Who owns it: one mailbox per process, created by the first loom::World (pinned, mapped, portable; it lives
// until process exit so a late trap never writes freed memory). Device code finds it through
//   - Ctx::diag (set by World::ctx()), for the lang waits, which have a Ctx;
//   - the module global `loom_diag_mailbox`, which the JIT sets when it loads a module (and again when a World
//     is created later), for waits with no Ctx (tile/pipeline.cuh's mbarrier waits) and for hand-built Ctx.
// Without a World both are null: a timeout then only traps (and prints, where printf is allowed).
//
// Layout contract (host decoder and device writer compile this same header): the host reads a record only
// after its `state` is kDiagRecordComplete; the writer stores every other field first, then `state` with a
// release.sys store, then fence.sc.sys, then traps. Records are claimed with one relaxed atomic add on
// `claimed` (gpu scope: only this process's GPU writes this mailbox; atomics on mapped host memory are atomic
// from the device's own point of view); waiters past kDiagRecords only bump `claimed`, so the host can say how
// many timeouts it could not record.
//
// Kernels that must not call printf: `#define LOOM_NO_DEVICE_PRINTF 1` before including any Loom header.
#pragma once

#include "loom/config.hpp"

#ifndef LOOM_NO_DEVICE_PRINTF
#define LOOM_NO_DEVICE_PRINTF 0
#endif

namespace loom {

inline constexpr uint32_t kDiagRecords = 8;
inline constexpr uint32_t kDiagTagBytes = 56;                 // tag text, NUL-terminated, truncated to 55 bytes
inline constexpr uint32_t kDiagMagic = 0x4c4f4f4du;           // "LOOM": the host initialised this mailbox
inline constexpr uint32_t kDiagRecordComplete = 0x444f4e45u;  // "DONE": every field of the record is written

// What kind of wait timed out; decides how expected / observed / elapsed read.
enum class DiagKind : uint32_t {
    Signal = 1,    // lang spin_until: 64-bit compare (cmp = lang::Cmp), elapsed in ns (globaltimer)
    Mbarrier = 2,  // tile pipeline: expected = phase parity, observed = raw mbarrier word, elapsed in SM cycles
    BadPeer =
        3,  // lang symm_at: addr = the pointer, expected = the peer, observed = local_base_rank | local_world << 32
    BadIndex = 4,  // an index read from memory is out of range: addr = the array, expected = the bound (valid
                   // indices are [0, expected)), observed = the index (sign-extended), tag = what the array is
};

struct DiagRecord {
    uint32_t state;     // 0 empty, kDiagRecordComplete when the rest is valid (written last)
    int32_t rank;       // global rank, -1 when the wait had no Ctx (the host fills in its World's rank)
    uint32_t block[3];  // blockIdx
    uint32_t thread;    // linear thread index in the block
    uint32_t kind;      // DiagKind
    uint32_t cmp;       // lang::Cmp (Signal only)
    uint64_t addr;      // the waited-on address (generic; shared memory for Mbarrier)
    uint64_t expected;
    uint64_t observed;
    uint64_t elapsed;  // ns (Signal) or cycles (Mbarrier)
    uint32_t smid;
    uint32_t reserved;
    char tag[kDiagTagBytes];
};
static_assert(sizeof(DiagRecord) == 128, "DiagRecord layout is shared by host and device");

struct DiagMailbox {
    uint32_t magic;     // kDiagMagic
    uint32_t capacity;  // kDiagRecords
    uint32_t claimed;   // records claimed so far (may exceed capacity: overflowing waiters only count)
    uint32_t reserved[29];
    DiagRecord records[kDiagRecords];
};
static_assert(sizeof(DiagMailbox) == 128 + kDiagRecords * sizeof(DiagRecord), "DiagMailbox layout");

}  // namespace loom

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#include "loom/ptx/memory.cuh"
#include "loom/ptx/special.cuh"

// The process's mailbox as this module sees it; zero until the JIT (or the user, for modules it loads itself)
// writes it. A definition: one per module. nvcc -rdc builds linking several Loom TUs define
// LOOM_DIAG_MAILBOX_EXTERN in all but one. The same holds for the two words of the printed diagnostics
// (lang/spin.cuh):
//   loom_wait_timeout_claimed  0 until the first timed-out wait of this module claims it (atomic CAS): that wait
//                              prints the rank's one summary line, the others print only at debug level;
//   loom_wait_verbose          1: every timed-out wait also prints its own line (the JIT writes it at load when
//                              LOOM_LOG_LEVEL is debug).
// (unsigned int, not uint32_t: these are in the global namespace, where NVRTC has no uint32_t.)
#if defined(LOOM_DIAG_MAILBOX_EXTERN)
extern "C" __device__ loom::DiagMailbox* loom_diag_mailbox;
extern "C" __device__ unsigned int loom_wait_timeout_claimed;
extern "C" __device__ unsigned int loom_wait_verbose;
#else
extern "C" {
__device__ loom::DiagMailbox* loom_diag_mailbox;
__device__ unsigned int loom_wait_timeout_claimed;
__device__ unsigned int loom_wait_verbose;
}
#endif

namespace loom::lang::detail {

// Cold path of a timed-out wait (any thread). Force-inlined on purpose: a call would serialise wgmma in the
// kernels that need the mailbox most. Writes nothing when `mb` is null. Does not trap: the caller does.
LOOM_DEVICE LOOM_FORCEINLINE void diag_post(DiagMailbox* mb, DiagKind kind, int32_t rank, const char* tag,
                                            const void* addr, uint32_t cmp, uint64_t expected, uint64_t observed,
                                            uint64_t elapsed) {
    if (mb == nullptr) mb = loom_diag_mailbox;
    if (mb == nullptr) return;
    const uint32_t slot = ptx::atom_add_relaxed_gpu(&mb->claimed, 1u);
    if (slot >= kDiagRecords) {
        // Mailbox full: give the record writers (each some dozens of stores to mapped host memory) 50 ms to
        // finish before this thread's trap ends the kernel. Without it, thousands of waiters timing out together
        // trapped first and left every record half-written (the W = 8 bench-overlap failure, 2026-11-29).
        const uint64_t t0 = ptx::globaltimer();
        while (ptx::globaltimer() - t0 < 50000000ull) {
        }
        return;
    }
    DiagRecord* r = &mb->records[slot];
    ptx::st_relaxed_sys(reinterpret_cast<uint32_t*>(&r->rank), static_cast<uint32_t>(rank));
    ptx::st_relaxed_sys(&r->block[0], static_cast<uint32_t>(blockIdx.x));
    ptx::st_relaxed_sys(&r->block[1], static_cast<uint32_t>(blockIdx.y));
    ptx::st_relaxed_sys(&r->block[2], static_cast<uint32_t>(blockIdx.z));
    ptx::st_relaxed_sys(&r->thread,
                        static_cast<uint32_t>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)));
    ptx::st_relaxed_sys(&r->kind, static_cast<uint32_t>(kind));
    ptx::st_relaxed_sys(&r->cmp, cmp);
    ptx::st_relaxed_sys(&r->addr, static_cast<uint64_t>(reinterpret_cast<size_t>(addr)));
    ptx::st_relaxed_sys(&r->expected, expected);
    ptx::st_relaxed_sys(&r->observed, observed);
    ptx::st_relaxed_sys(&r->elapsed, elapsed);
    ptx::st_relaxed_sys(&r->smid, ptx::smid());
    // The tag, four bytes per store (the ptx layer has no byte stores); stops after the NUL.
    uint32_t* words = reinterpret_cast<uint32_t*>(r->tag);
    bool ended = (tag == nullptr);
#pragma unroll 1
    for (uint32_t w = 0; w < kDiagTagBytes / 4; ++w) {
        uint32_t v = 0;
        for (uint32_t b = 0; b < 4; ++b) {
            const uint32_t i = w * 4 + b;
            const char c = (ended || i + 1 == kDiagTagBytes) ? '\0' : tag[i];
            ended = ended || c == '\0';
            v |= static_cast<uint32_t>(static_cast<unsigned char>(c)) << (8 * b);
        }
        ptx::st_relaxed_sys(&words[w], v);
        if (ended) break;
    }
    ptx::st_release_sys(&r->state, kDiagRecordComplete);
    ptx::fence_sc_sys();  // performed before the caller's trap tears the context down
}

}  // namespace loom::lang::detail
#endif
