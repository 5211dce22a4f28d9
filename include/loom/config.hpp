// Compiler environment for Loom's headers.
//
// Device headers (ptx/, lang/, tile/, kernels/) must compile under nvcc, NVRTC and (for the plain structs
// they declare) the host C++ compiler. Everything host-only is gated on LOOM_HOST_COMPILE.
#pragma once

#if defined(__CUDACC_RTC__)
#define LOOM_NVRTC 1
#else
#define LOOM_NVRTC 0
#endif

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define LOOM_HOST_DEVICE __host__ __device__
#define LOOM_DEVICE __device__
#define LOOM_FORCEINLINE __forceinline__
#else
#define LOOM_HOST_DEVICE
#define LOOM_DEVICE
#define LOOM_FORCEINLINE inline
#endif

// True when the translation unit may use the host standard library (<string>, <vector>, iostream).
#if !LOOM_NVRTC
#define LOOM_HOST_COMPILE 1
#else
#define LOOM_HOST_COMPILE 0
#endif

// Device architecture of the current compilation pass (0 on the host pass).
#if defined(__CUDA_ARCH__)
#define LOOM_ARCH __CUDA_ARCH__
#else
#define LOOM_ARCH 0
#endif

// sm_90a features (wgmma, setmaxnreg) are only legal in an arch-specific compile.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LOOM_SM90A 1
#else
#define LOOM_SM90A 0
#endif

// Kernels that may reach peers on other nodes (jit::KernelSpec::remote_peers sets it): the language's remote column,
// NVSHMEM's device calls, compiled by nvcc and linked with libnvshmem_device. 0: node-local peers only (NVRTC).
#ifndef LOOM_REMOTE_PEERS
#define LOOM_REMOTE_PEERS 0
#endif
#if LOOM_REMOTE_PEERS && LOOM_NVRTC
#error "LOOM_REMOTE_PEERS needs nvcc and NVSHMEM: compile the kernel with jit::KernelSpec::remote_peers"
#endif

// Fixed-width integer types without <cstdint> under NVRTC.
#if LOOM_NVRTC
namespace loom {
using int8_t = signed char;
using uint8_t = unsigned char;
using int16_t = short;
using uint16_t = unsigned short;
using int32_t = int;
using uint32_t = unsigned int;
using int64_t = long long;
using uint64_t = unsigned long long;
using size_t = decltype(sizeof(0));
}  // namespace loom
#else
#include <cstddef>
#include <cstdint>
namespace loom {
using std::int16_t;
using std::int32_t;
using std::int64_t;
using std::int8_t;
using std::size_t;
using std::uint16_t;
using std::uint32_t;
using std::uint64_t;
using std::uint8_t;
}  // namespace loom
#endif

namespace loom {
// Largest world a single Ctx can address by load/store (one node). Peers beyond it go through NVSHMEM.
inline constexpr int kMaxLocalPeers = 8;
// Largest world size Loom's bootstrap accepts.
inline constexpr int kMaxWorld = 1024;
}  // namespace loom
