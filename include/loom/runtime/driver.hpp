// Lazily resolved CUDA driver API.
//
// Loom never links libcuda: the library, the tools and the CPU tests must load on machines with no driver
// (CI). Driver entry points are resolved on first use through cudaGetDriverEntryPointByVersion; on a machine
// without a driver or GPU, api() raises a loom::Error saying so.
#pragma once

#include <cuda.h>

#include <string>

namespace loom::driver {

// Every driver function Loom calls. The string passed to the resolver is the unversioned name; the
// declaration (and so the ABI) is the one of the cuda.h we build against.
#define LOOM_DRIVER_FUNCTIONS(X)                                                                                  \
    X(cuGetErrorString)                                                                                           \
    X(cuGetErrorName)                                                                                             \
    X(cuDriverGetVersion)                                                                                         \
    X(cuDeviceGet)                                                                                                \
    X(cuDeviceGetAttribute)                                                                                       \
    X(cuCtxGetCurrent)                                                                                            \
    X(cuCtxGetDevice)                                                                                             \
    X(cuMemGetAllocationGranularity)                                                                              \
    X(cuMemCreate)                                                                                                \
    X(cuMemRelease)                                                                                               \
    X(cuMemExportToShareableHandle)                                                                               \
    X(cuMemImportFromShareableHandle)                                                                             \
    X(cuMemAddressReserve)                                                                                        \
    X(cuMemAddressFree)                                                                                           \
    X(cuMemMap)                                                                                                   \
    X(cuMemUnmap)                                                                                                 \
    X(cuMemSetAccess)                                                                                             \
    X(cuLibraryLoadData)                                                                                          \
    X(cuLibraryUnload)                                                                                            \
    X(cuLibraryGetKernel)                                                                                         \
    X(cuLibraryGetModule)                                                                                         \
    X(cuKernelGetFunction)                                                                                        \
    X(cuKernelSetAttribute)                                                                                       \
    X(cuFuncGetAttribute)                                                                                         \
    X(cuFuncSetAttribute)                                                                                         \
    X(cuLaunchKernelEx)                                                                                           \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor)                                                                \
    X(cuStreamWriteValue64)                                                                                       \
    X(cuStreamWaitValue64)                                                                                        \
    X(cuTensorMapEncodeTiled)

struct Api {
#define LOOM_DRIVER_DECLARE(name) decltype(&::name) name = nullptr;
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
