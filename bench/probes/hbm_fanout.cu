// Probe (not part of the build): the memory rate one H200 reaches for the traffic shapes of the collectives when
// every rank shares the GPU — a plain copy (read 1 : write 1), a fan-out copy (read 1 : write W, all_gather's
// minimal traffic), a W-way sum (read W : write 1, reduce_scatter's), cudaMemcpyAsync and cudaMemsetAsync — for
// several grids and store hints. One process, whole GPU; rates count bytes read + bytes written.
//   nvcc -O3 -std=c++20 -arch=sm_90a -I include bench/probes/hbm_fanout.cu -o hbm_fanout && ./hbm_fanout
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "loom/ptx/memory.cuh"

#define CK(x)                                                                              \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                  \
        }                                                                                  \
    } while (0)

constexpr int kMaxDst = 8;
struct Dsts {
    uint4* p[kMaxDst];
};

// Loads as ptx::ld_v4_nc (ld.global.nc.L1::no_allocate); stores plain (kHint 0, ptx::st_v4), evict-first .cs (1, the
// one hint Loom's wrappers do not have), or L1::no_allocate (2, ptx::st_v4_na).
__device__ __forceinline__ uint4 ld_na(const uint4* p) { return loom::ptx::ld_v4_nc(p); }
template <int kHint>
__device__ __forceinline__ void st(uint4* p, uint4 v) {
    if constexpr (kHint == 0)
        loom::ptx::st_v4(p, v);
    else if constexpr (kHint == 1)
        asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                     : "memory");
    else
        loom::ptx::st_v4_na(p, v);
}

// Fan-out: vectors [0, nv) of src to ndst destinations, kU loads in flight per thread. Grid-stride when kContig = 0;
// kContig = 1: block b owns a contiguous slice (as the collectives' block_share does).
template <int kU, int kHint, int kContig>
__global__ void fanout(const uint4* src, Dsts d, int ndst, uint64_t nv) {
    uint64_t lo = 0, hi = nv, start = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x,
             stride = uint64_t(gridDim.x) * blockDim.x;
    if (kContig) {
        const uint64_t per = (nv + gridDim.x - 1) / gridDim.x;
        lo = blockIdx.x * per < nv ? blockIdx.x * per : nv;
        hi = lo + per < nv ? lo + per : nv;
        start = lo + threadIdx.x;
        stride = blockDim.x;
    }
    uint64_t i = start;
    for (; i + (kU - 1) * stride < hi; i += kU * stride) {
        uint4 v[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) v[u] = ld_na(src + i + u * stride);
#pragma unroll
        for (int q = 0; q < kMaxDst; ++q)
            if (q < ndst) {
#pragma unroll
                for (int u = 0; u < kU; ++u) st<kHint>(d.p[q] + i + u * stride, v[u]);
            }
    }
    for (; i < hi; i += stride) {
        const uint4 v = ld_na(src + i);
        for (int q = 0; q < ndst; ++q) st<kHint>(d.p[q] + i, v);
    }
}

// W-way bf16 sum of src[s] + s * nv, fp32 accumulate, one destination; kU vectors per source in flight.
template <int kU>
__global__ void sum_n(const uint4* src, int nsrc, uint4* dst, uint64_t nv) {
    const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
    for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < nv; i += kU * stride) {
        float acc[kU][8] = {};
        for (int s = 0; s < nsrc; ++s) {
            uint4 v[kU];
#pragma unroll
            for (int u = 0; u < kU; ++u) v[u] = i + u * stride < nv ? ld_na(src + s * nv + i + u * stride) : uint4{};
#pragma unroll
            for (int u = 0; u < kU; ++u) {
                const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v[u]);
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const float2 f = __bfloat1622float2(h[k]);
                    acc[u][2 * k] += f.x;
                    acc[u][2 * k + 1] += f.y;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < kU; ++u)
            if (i + u * stride < nv) {
                uint4 r;
                __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
                for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(acc[u][2 * k], acc[u][2 * k + 1]);
                st<0>(dst + i + u * stride, r);
            }
    }
}

template <class F>
double median_us(F&& f, int iters = 9) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    f();
    CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int i = 0; i < iters; ++i) {
        CK(cudaEventRecord(a));
        f();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1e3f);
    }
    std::sort(t.begin(), t.end());
    CK(cudaGetLastError());
    return t[t.size() / 2];
}

int main() {
    const uint64_t S = 256ull << 20;  // source bytes per fan-out; 8 destinations = 2 GiB written
    char *src, *dst;
    CK(cudaMalloc(&src, 8 * S));
    CK(cudaMalloc(&dst, 8 * S));
    CK(cudaMemset(src, 1, 8 * S));
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    auto rate = [](double bytes, double us) { return bytes / us / 1e6; };  // TB/s
    std::printf("memcpy  %llu MiB: %.2f TB/s (read+write)\n", (unsigned long long)(2 * S >> 20),
                rate(4.0 * S, median_us([&] { CK(cudaMemcpyAsync(dst, src, 2 * S, cudaMemcpyDeviceToDevice)); })));
    std::printf("memset  %llu MiB: %.2f TB/s (write)\n", (unsigned long long)(2 * S >> 20),
                rate(2.0 * S, median_us([&] { CK(cudaMemsetAsync(dst, 0, 2 * S)); })));
    const uint64_t nv = S / 16;
    for (int ndst : {1, 2, 8}) {
        Dsts d{};
        for (int q = 0; q < ndst; ++q) d.p[q] = reinterpret_cast<uint4*>(dst + q * S);
        const double bytes = double(S) * (1 + ndst);
        for (int blocks_per_sm : {1, 2, 4, 8})
            for (int threads : {256, 512}) {
                const int g = sms * blocks_per_sm;
                auto run = [&](auto kern) {
                    return rate(bytes, median_us([&] {
                                    kern<<<g, threads>>>(reinterpret_cast<const uint4*>(src), d, ndst, nv);
                                }));
                };
                std::printf(
                    "fanout 1->%d grid %4d x %3d: u4 wb %.2f  u4 cs %.2f  u4 na %.2f  u8 wb %.2f  contig u4 wb %.2f  "
                    "TB/s\n",
                    ndst, g, threads, run(fanout<4, 0, 0>), run(fanout<4, 1, 0>), run(fanout<4, 2, 0>),
                    run(fanout<8, 0, 0>), run(fanout<4, 0, 1>));
            }
    }
    for (int nsrc : {2, 4, 8}) {
        const uint64_t n = S / nsrc / 16;  // vectors per source: total read S
        for (int blocks_per_sm : {1, 2, 4})
            for (int threads : {256, 512}) {
                const int g = sms * blocks_per_sm;
                const double us2 = median_us([&] {
                    sum_n<2>
                        <<<g, threads>>>(reinterpret_cast<const uint4*>(src), nsrc, reinterpret_cast<uint4*>(dst), n);
                });
                const double us4 = median_us([&] {
                    sum_n<4>
                        <<<g, threads>>>(reinterpret_cast<const uint4*>(src), nsrc, reinterpret_cast<uint4*>(dst), n);
                });
                std::printf("sum %d->1 grid %4d x %3d: u2 %.2f  u4 %.2f TB/s\n", nsrc, g, threads,
                            rate(double(S) + double(S) / nsrc, us2), rate(double(S) + double(S) / nsrc, us4));
            }
    }
    return 0;
}
