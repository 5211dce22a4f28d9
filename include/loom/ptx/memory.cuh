// One-instruction wrappers for memory operations, named by their semantics.
//
// Every wrapper is one PTX instruction (plus the register moves the compiler adds). Orders and scopes are
// spelled in the name: `ld_acquire_sys` is `ld.acquire.sys`, `red_add_release_gpu` is `red.release.gpu.add`.
// Pointers are generic addresses of global memory (the symmetric heap of this rank or of a mapped peer) unless
// the name says otherwise. These are the only place in Loom where memory-model inline asm is written; the
// language layer (loom/lang) builds every ordering guarantee from them.
//
// Available on sm_70 and later (ld/st/atom/red with .acquire/.release/.relaxed and a scope).
#pragma once

#include "loom/config.hpp"

namespace loom::ptx {

// ---- scalar loads --------------------------------------------------------------------------------------------
// acquire: later loads/stores of this thread are not performed before this load (and see what the releasing
// writer published). relaxed: single-copy atomic, no ordering. volatile: ld.volatile (a relaxed.sys load that
// the compiler may not elide or merge); kept for polling LL packets, prefer relaxed/acquire elsewhere.
#define LOOM_PTX_LD(NAME, QUAL, TYPE, PTXT, CONSTRAINT)                                                \
    LOOM_DEVICE LOOM_FORCEINLINE TYPE NAME(const TYPE* p) {                                            \
        TYPE v;                                                                                        \
        asm volatile("ld." QUAL ".global." PTXT " %0, [%1];" : "=" CONSTRAINT(v) : "l"(p) : "memory"); \
        return v;                                                                                      \
    }
LOOM_PTX_LD(ld_acquire_gpu, "acquire.gpu", uint32_t, "b32", "r")
LOOM_PTX_LD(ld_acquire_gpu, "acquire.gpu", uint64_t, "b64", "l")
LOOM_PTX_LD(ld_acquire_sys, "acquire.sys", uint32_t, "b32", "r")
LOOM_PTX_LD(ld_acquire_sys, "acquire.sys", uint64_t, "b64", "l")
LOOM_PTX_LD(ld_relaxed_gpu, "relaxed.gpu", uint32_t, "b32", "r")
LOOM_PTX_LD(ld_relaxed_gpu, "relaxed.gpu", uint64_t, "b64", "l")
LOOM_PTX_LD(ld_relaxed_sys, "relaxed.sys", uint32_t, "b32", "r")
LOOM_PTX_LD(ld_relaxed_sys, "relaxed.sys", uint64_t, "b64", "l")
LOOM_PTX_LD(ld_volatile, "volatile", uint32_t, "b32", "r")
LOOM_PTX_LD(ld_volatile, "volatile", uint64_t, "b64", "l")
#undef LOOM_PTX_LD

// ---- scalar stores -------------------------------------------------------------------------------------------
// release: every load/store this thread performed before (and, cumulatively, every write it observed) is
// visible to a thread that acquires this value at the same or wider scope.
#define LOOM_PTX_ST(NAME, QUAL, TYPE, PTXT, CONSTRAINT)                                           \
    LOOM_DEVICE LOOM_FORCEINLINE void NAME(TYPE* p, TYPE v) {                                     \
        asm volatile("st." QUAL ".global." PTXT " [%0], %1;" ::"l"(p), CONSTRAINT(v) : "memory"); \
    }
LOOM_PTX_ST(st_release_gpu, "release.gpu", uint32_t, "b32", "r")
LOOM_PTX_ST(st_release_gpu, "release.gpu", uint64_t, "b64", "l")
LOOM_PTX_ST(st_release_sys, "release.sys", uint32_t, "b32", "r")
LOOM_PTX_ST(st_release_sys, "release.sys", uint64_t, "b64", "l")
LOOM_PTX_ST(st_relaxed_gpu, "relaxed.gpu", uint32_t, "b32", "r")
LOOM_PTX_ST(st_relaxed_gpu, "relaxed.gpu", uint64_t, "b64", "l")
LOOM_PTX_ST(st_relaxed_sys, "relaxed.sys", uint32_t, "b32", "r")
LOOM_PTX_ST(st_relaxed_sys, "relaxed.sys", uint64_t, "b64", "l")
LOOM_PTX_ST(st_volatile, "volatile", uint32_t, "b32", "r")
LOOM_PTX_ST(st_volatile, "volatile", uint64_t, "b64", "l")
#undef LOOM_PTX_ST

// ---- atomics (return the old value) and reductions (no return) -----------------------------------------------
// atom_<op>_<order>_<scope>: order in {relaxed, acquire, release, acq_rel}, scope in {gpu, sys}.
#define LOOM_PTX_ATOM2(OP, ORDER, SCOPE, TYPE, PTXT, C)                                 \
    LOOM_DEVICE LOOM_FORCEINLINE TYPE atom_##OP##_##ORDER##_##SCOPE(TYPE* p, TYPE v) {  \
        TYPE old;                                                                       \
        asm volatile("atom." #ORDER "." #SCOPE ".global." #OP "." PTXT " %0, [%1], %2;" \
                     : "=" C(old)                                                       \
                     : "l"(p), C(v)                                                     \
                     : "memory");                                                       \
        return old;                                                                     \
    }
#define LOOM_PTX_CAS(ORDER, SCOPE, TYPE, PTXT, C)                                                        \
    LOOM_DEVICE LOOM_FORCEINLINE TYPE atom_cas_##ORDER##_##SCOPE(TYPE* p, TYPE expected, TYPE desired) { \
        TYPE old;                                                                                        \
        asm volatile("atom." #ORDER "." #SCOPE ".global.cas." PTXT " %0, [%1], %2, %3;"                  \
                     : "=" C(old)                                                                        \
                     : "l"(p), C(expected), C(desired)                                                   \
                     : "memory");                                                                        \
        return old;                                                                                      \
    }
#define LOOM_PTX_ATOM_ORDER_SCOPE(ORDER, SCOPE)              \
    LOOM_PTX_ATOM2(add, ORDER, SCOPE, uint32_t, "u32", "r")  \
    LOOM_PTX_ATOM2(add, ORDER, SCOPE, uint64_t, "u64", "l")  \
    LOOM_PTX_ATOM2(exch, ORDER, SCOPE, uint32_t, "b32", "r") \
    LOOM_PTX_ATOM2(exch, ORDER, SCOPE, uint64_t, "b64", "l") \
    LOOM_PTX_CAS(ORDER, SCOPE, uint32_t, "b32", "r")         \
    LOOM_PTX_CAS(ORDER, SCOPE, uint64_t, "b64", "l")
LOOM_PTX_ATOM_ORDER_SCOPE(relaxed, gpu)
LOOM_PTX_ATOM_ORDER_SCOPE(relaxed, sys)
LOOM_PTX_ATOM_ORDER_SCOPE(acquire, gpu)
LOOM_PTX_ATOM_ORDER_SCOPE(acquire, sys)
LOOM_PTX_ATOM_ORDER_SCOPE(release, gpu)
LOOM_PTX_ATOM_ORDER_SCOPE(release, sys)
LOOM_PTX_ATOM_ORDER_SCOPE(acq_rel, gpu)
LOOM_PTX_ATOM_ORDER_SCOPE(acq_rel, sys)
// atom_inc_<order>_<scope>(p, limit): *p = (*p >= limit) ? 0 : *p + 1, returns the old value. A counter of n
// arrivals with limit n - 1 wraps back to 0 on the n-th: the last arriver sees n - 1 and leaves it reset.
LOOM_PTX_ATOM2(inc, acq_rel, gpu, uint32_t, "u32", "r")
#undef LOOM_PTX_ATOM_ORDER_SCOPE
#undef LOOM_PTX_CAS
#undef LOOM_PTX_ATOM2

#define LOOM_PTX_RED(ORDER, SCOPE, TYPE, PTXT, C)                                                          \
    LOOM_DEVICE LOOM_FORCEINLINE void red_add_##ORDER##_##SCOPE(TYPE* p, TYPE v) {                         \
        asm volatile("red." #ORDER "." #SCOPE ".global.add." PTXT " [%0], %1;" ::"l"(p), C(v) : "memory"); \
    }
LOOM_PTX_RED(release, gpu, uint32_t, "u32", "r")
LOOM_PTX_RED(release, gpu, uint64_t, "u64", "l")
LOOM_PTX_RED(release, sys, uint32_t, "u32", "r")
LOOM_PTX_RED(release, sys, uint64_t, "u64", "l")
LOOM_PTX_RED(relaxed, gpu, uint32_t, "u32", "r")
LOOM_PTX_RED(relaxed, gpu, uint64_t, "u64", "l")
LOOM_PTX_RED(relaxed, sys, uint32_t, "u32", "r")
LOOM_PTX_RED(relaxed, sys, uint64_t, "u64", "l")
#undef LOOM_PTX_RED

// ---- shared memory, CTA scope: a counter one group of threads raises and another polls ------------------------
// p: a generic address of this CTA's shared memory.
LOOM_DEVICE LOOM_FORCEINLINE void red_add_release_cta_shared(uint32_t* p, uint32_t v) {
    const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    asm volatile("red.release.cta.shared::cta.add.u32 [%0], %1;" ::"r"(a), "r"(v) : "memory");
}
LOOM_DEVICE LOOM_FORCEINLINE uint32_t ld_acquire_cta_shared(const uint32_t* p) {
    const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    uint32_t v;
    asm volatile("ld.acquire.cta.shared::cta.u32 %0, [%1];" : "=r"(v) : "r"(a) : "memory");
    return v;
}

// ---- fences --------------------------------------------------------------------------------------------------
// acq_rel: orders this thread's earlier accesses before its later ones for observers at the scope (a light
// fence; with a relaxed store after it, it forms a release pattern). sc: additionally a single total order of
// sc fences (needed for store->load ordering, e.g. Dekker-style flags).
LOOM_DEVICE LOOM_FORCEINLINE void fence_acq_rel_cta() { asm volatile("fence.acq_rel.cta;" ::: "memory"); }
LOOM_DEVICE LOOM_FORCEINLINE void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
LOOM_DEVICE LOOM_FORCEINLINE void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
// acquire / release only (PTX ISA 8.6, sm_90; acq_rel below): after a strong read, fence.acquire forms an acquire
// pattern (later accesses are ordered after the read); before a strong write, fence.release forms a release
// pattern. Lighter than acq_rel, which orders both ways.
LOOM_DEVICE LOOM_FORCEINLINE void fence_acquire_gpu() {
#if LOOM_ARCH >= 900
    asm volatile("fence.acquire.gpu;" ::: "memory");
#else
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
#endif
}
LOOM_DEVICE LOOM_FORCEINLINE void fence_acquire_sys() {
#if LOOM_ARCH >= 900
    asm volatile("fence.acquire.sys;" ::: "memory");
#else
    asm volatile("fence.acq_rel.sys;" ::: "memory");
#endif
}
LOOM_DEVICE LOOM_FORCEINLINE void fence_release_sys() {
#if LOOM_ARCH >= 900
    asm volatile("fence.release.sys;" ::: "memory");
#else
    asm volatile("fence.acq_rel.sys;" ::: "memory");
#endif
}
LOOM_DEVICE LOOM_FORCEINLINE void fence_sc_gpu() { asm volatile("fence.sc.gpu;" ::: "memory"); }
LOOM_DEVICE LOOM_FORCEINLINE void fence_sc_sys() { asm volatile("fence.sc.sys;" ::: "memory"); }

// Prefetch the 128-byte line holding p into L2 (no register, no completion): for data read a little later.
LOOM_DEVICE LOOM_FORCEINLINE void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
// ---- 16-byte vector loads/stores -----------------------------------------------------------------------------
// Addresses must be 16-byte aligned. ld_v4 is a weak coherent load (ordered by an earlier acquire of this
// thread). ld_v4_na does not allocate in L1 (streaming sources read once). ld_v4_nc goes through the read-only
// (non-coherent) path: only for data that no thread writes during the kernel.
LOOM_DEVICE LOOM_FORCEINLINE uint4 ld_v4(const void* p) {
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
LOOM_DEVICE LOOM_FORCEINLINE uint4 ld_v4_na(const void* p) {
    uint4 v;
    asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
LOOM_DEVICE LOOM_FORCEINLINE uint4 ld_v4_nc(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
// ld.volatile of 16 bytes: used to poll 16-byte LL packets (each 8-byte half is single-copy atomic).
LOOM_DEVICE LOOM_FORCEINLINE uint4 ld_volatile_v4(const void* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}
LOOM_DEVICE LOOM_FORCEINLINE void st_v4(void* p, uint4 v) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}
LOOM_DEVICE LOOM_FORCEINLINE void st_v4_na(void* p, uint4 v) {
    asm volatile("st.global.L1::no_allocate.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
                 "r"(v.w)
                 : "memory");
}
LOOM_DEVICE LOOM_FORCEINLINE void st_volatile_v4(void* p, uint4 v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}
// 8-byte volatile store of two words in one instruction (single-copy atomic): LL8 packets.
LOOM_DEVICE LOOM_FORCEINLINE void st_volatile_v2(void* p, uint32_t a, uint32_t b) {
    asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(a), "r"(b) : "memory");
}
LOOM_DEVICE LOOM_FORCEINLINE void ld_volatile_v2(const void* p, uint32_t& a, uint32_t& b) {
    asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(a), "=r"(b) : "l"(p) : "memory");
}

// ---- compiler-level dependency -------------------------------------------------------------------------------
// Returns `p` unchanged, but the compiler must assume it depends on `dep`: loads through the result cannot be
// scheduled before `dep` was produced (e.g. by an acquire load). Emits no instruction.
template <class T>
LOOM_DEVICE LOOM_FORCEINLINE T* depend(T* p, uint64_t dep) {
    asm volatile("" : "+l"(p) : "l"(dep));
    return p;
}

}  // namespace loom::ptx
