// NVSHMEM from host code, without a link-time dependency.
//
// libloom never links libnvshmem_host.so.3: init() dlopens it from the NVSHMEM home (LOOM_NVSHMEM_HOME, the
// build-time LOOM_NVSHMEM_HOME, or the nvidia-nvshmem-cu13 pip wheel) and resolves the entry points it uses.
// NVSHMEM is initialised "host library only" (nvshmemx_hostlib_init_attr): device code reaches NVSHMEM through
// kernels compiled by Loom's JIT with KernelSpec::needs_nvshmem, whose device state get_kernel() sets up with
// init_library() right after loading them.
//
// Contract: init() and finalize() are collective over the World (every rank calls them, in the same order,
// from one thread); the other functions may be called between them from any thread that has the rank's device
// current. The on-stream collectives act on NVSHMEM_TEAM_WORLD and take symmetric pointers (nvshmem::malloc).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "loom/tensor.hpp"

namespace loom {
class World;
}

namespace loom::nvshmem {

// Bootstraps NVSHMEM over the World's store with NVSHMEM's unique-id bootstrap: rank 0 creates the id and
// publishes it in the store, every rank reads it, then all call nvshmemx_hostlib_init_attr with
// NVSHMEMX_INIT_WITH_UNIQUEID (PE = world rank). Sets NVSHMEM_DISABLE_NVLS=1 first (never NVLink multicast).
// The calling thread's current device must be the rank's device. Raises on a second init without finalize.
void init(World& world);
bool initialized();
void finalize();  // collective; idempotent

// Sets up NVSHMEM's device state in a loaded JIT library / module (nvshmemx_culibrary_init /
// nvshmemx_cumodule_init). get_kernel() calls init_library for kernels compiled with needs_nvshmem.
void init_library(CUlibrary library);
void init_module(CUmodule module);

int my_pe();
int n_pes();
void* malloc(std::size_t bytes);  // collective (same size on every PE); symmetric
void free(void* p);               // collective
// Collective (same size on every PE): maps `bytes` of a cuMem allocation (cuMemCreate, POSIX file-descriptor handle;
// `buf` its start) into NVSHMEM's symmetric address space and registers it with the transports. Returns its symmetric
// address, which NVSHMEM's device calls take; the same offset names the same byte on every PE. Raises on failure.
void* register_symmetric(void* buf, std::size_t bytes);
void unregister_symmetric(void* symmetric, std::size_t bytes);  // collective
// Registers local memory as a source / destination of NVSHMEM's network transports (nvshmemx_buffer_register; P2P
// needs none). Local, not collective. False when NVSHMEM refuses it.
bool register_local(void* buf, std::size_t bytes);
void unregister_local(void* buf);
void barrier_all();
void barrier_all_on_stream(cudaStream_t stream);
void quiet_on_stream(cudaStream_t stream);

// On-stream collectives over all PEs (baselines for Loom's own kernels). Sizes are per PE:
// fcollect: dest[pe * bytes ...] = src of pe (all-gather); alltoall: `bytes` from each PE to each PE.
void fcollect_on_stream(void* dest, const void* src, std::size_t bytes, cudaStream_t stream);
void alltoall_on_stream(void* dest, const void* src, std::size_t bytes, cudaStream_t stream);
// Sum all-reduce of `count` elements; reduce-scatter leaves `count` summed elements per PE (src holds
// count * n_pes()). dtype: F32, F16 or BF16.
void sum_reduce_on_stream(DType dtype, void* dest, const void* src, std::size_t count, cudaStream_t stream);
void sum_reducescatter_on_stream(DType dtype, void* dest, const void* src, std::size_t count, cudaStream_t stream);

std::string library_path();  // the libnvshmem_host.so.3 that was loaded ("" before init)
std::string version();       // "3.4.5" of the NVSHMEM home (no init needed)

}  // namespace loom::nvshmem
