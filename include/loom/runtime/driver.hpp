// Lazily resolved CUDA driver API.
//
// Loom never links libcuda: the library, the tools and the CPU tests must load on machines with no driver
// (CI). Driver entry points are resolved on first use through cudaGetDriverEntryPointByVersion; on a machine
// without a driver or GPU, api() raises a loom::Error saying so.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>

namespace loom::driver {

// Every driver function Loom calls, with the ABI version whose signature Loom uses (cudaTypedefs.h's
// PFN_<name>_v<version>); to add one, take the largest version whose PFN signature is cuda.h's declaration of the
// unversioned name. The version matters: asking for "cuCtxGetDevice" at CUDA_VERSION 13000 returns the
// two-argument cuCtxGetDevice_v2, not the one-argument function that cuda.h declares under that name.
#define LOOM_DRIVER_FUNCTIONS(X)                         \
    X(cuGetErrorString, 6000)                            \
    X(cuGetErrorName, 6000)                              \
    X(cuDriverGetVersion, 2020)                          \
    X(cuDeviceGet, 2000)                                 \
    X(cuDeviceGetAttribute, 2000)                        \
    X(cuCtxGetCurrent, 4000)                             \
    X(cuCtxGetDevice, 2000)                              \
    X(cuMemGetAllocationGranularity, 10020)              \
    X(cuMemCreate, 10020)                                \
    X(cuMemRelease, 10020)                               \
    X(cuMemExportToShareableHandle, 10020)               \
    X(cuMemImportFromShareableHandle, 10020)             \
    X(cuMemAddressReserve, 10020)                        \
    X(cuMemAddressFree, 10020)                           \
    X(cuMemMap, 10020)                                   \
    X(cuMemUnmap, 10020)                                 \
    X(cuMemSetAccess, 10020)                             \
    X(cuPointerGetAttributes, 7000)                      \
    X(cuLibraryLoadData, 12000)                          \
    X(cuLibraryUnload, 12000)                            \
    X(cuLibraryGetGlobal, 12000)                         \
    X(cuLibraryGetKernel, 12000)                         \
    X(cuLibraryGetModule, 12000)                         \
    X(cuKernelGetFunction, 12000)                        \
    X(cuKernelSetAttribute, 12000)                       \
    X(cuFuncGetAttribute, 2020)                          \
    X(cuFuncGetParamInfo, 12040)                         \
    X(cuFuncSetAttribute, 9000)                          \
    X(cuLaunchKernelEx, 11060)                           \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, 6050) \
    X(cuOccupancyMaxActiveClusters, 11070)               \
    X(cuStreamWriteValue64, 11070)                       \
    X(cuStreamWaitValue64, 11070)                        \
    X(cuTensorMapEncodeTiled, 12000)

struct Api {
#define LOOM_DRIVER_DECLARE(name, version) PFN_##name##_v##version name = nullptr;
    LOOM_DRIVER_FUNCTIONS(LOOM_DRIVER_DECLARE)
#undef LOOM_DRIVER_DECLARE
};

// Is there a usable CUDA driver with at least one device? Never throws.
bool available();
// Why available() is false ("libcuda.so.1 not found", "no CUDA device"), or "" when it is true.
std::string unavailable_reason();
// The resolved table. Raises loom::Error("cuda-driver", reason) when no driver/GPU is present.
const Api& api();

}  // namespace loom::driver

// Call a driver function through the lazy table and check its result: LOOM_CU(cuMemCreate, &h, size, &prop, 0).
#define LOOM_CU(fn, ...) LOOM_CHECK_CU(::loom::driver::api().fn(__VA_ARGS__))
