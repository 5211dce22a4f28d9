// Host <-> device helpers of the collective tests, complete on return: cudaMemcpy from pageable memory may return
// before its DMA lands and cudaMemset is asynchronous, both on the legacy stream, which a test's non-blocking stream
// does not wait for. A CUDA error here is fatal for the rank (the context is likely sticky-broken): loomrun then
// stops all.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/reference.hpp"

namespace loom::test {

inline void cuda_or_die(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    std::fprintf(stderr, "test: %s failed: %s\n", what, cudaGetErrorString(e));
    std::abort();
}

// `count` elements from host memory to dst, landed on return (any stream may read them).
template <class T>
inline void upload(void* dst, const T* src, std::size_t count) {
    if (count) cuda_or_die(cudaMemcpy(dst, src, count * sizeof(T), cudaMemcpyHostToDevice), "upload");
    cuda_or_die(cudaDeviceSynchronize(), "upload sync");
}
template <class T>
inline void upload(void* dst, const std::vector<T>& src) {
    upload(dst, src.data(), src.size());
}

inline std::vector<char> download(const void* src, std::size_t bytes) {
    std::vector<char> v(bytes);
    cuda_or_die(cudaMemcpy(v.data(), src, bytes, cudaMemcpyDeviceToHost), "download");
    return v;
}

inline constexpr unsigned char kPoison = 0xA5;  // every byte of an output before the op writes it

// Both poisons wait for every earlier call first (on any stream) and land before they return.
inline void poison(void* p, std::size_t bytes) {
    cuda_or_die(cudaDeviceSynchronize(), "poison sync");
    cuda_or_die(cudaMemset(p, kPoison, bytes), "poison");
    cuda_or_die(cudaDeviceSynchronize(), "poison sync");
}

// NaN in bf16, f16 and f32 (0xFF bytes): an output element the op leaves unwritten fails any tolerance.
inline void poison_nan(void* p, std::size_t bytes) {
    cuda_or_die(cudaDeviceSynchronize(), "poison sync");
    cuda_or_die(cudaMemset(p, 0xFF, bytes), "poison");
    cuda_or_die(cudaDeviceSynchronize(), "poison sync");
}

inline void sync_or_die(cudaStream_t s) { cuda_or_die(cudaStreamSynchronize(s), "stream sync"); }

// Device memory of one test, freed at the end of its scope; at least 256 bytes, so that an empty operand has an
// address.
struct DevMem {
    void* p = nullptr;
    explicit DevMem(std::size_t bytes) { cuda_or_die(cudaMalloc(&p, bytes < 256 ? 256 : bytes), "cudaMalloc"); }
    ~DevMem() { cudaFree(p); }
    DevMem(const DevMem&) = delete;
    DevMem& operator=(const DevMem&) = delete;
};

// n bf16 values in [-1, 1) (random_floats of `seed`), uploaded to dst.
inline void upload_random_bf16(void* dst, std::size_t n, std::uint64_t seed) {
    const auto f = random_floats(n, seed);
    std::vector<std::uint16_t> h(n);
    for (std::size_t i = 0; i < n; ++i) h[i] = float_to_bf16(f[i]);
    upload(dst, h);
}

}  // namespace loom::test
