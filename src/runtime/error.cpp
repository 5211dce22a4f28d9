#include "loom/runtime/error.hpp"

#include <cuda_runtime_api.h>
#include <nvJitLink.h>
#include <nvrtc.h>

#include <cstring>

#include "loom/runtime/driver.hpp"
#include "runtime/diag_mailbox.hpp"

namespace loom {

Error::Error(std::string api, std::string detail, const char* file, int line)
    : std::runtime_error(fmt::format("[{}] {} ({}:{})", api, detail, file, line)),
      api_(std::move(api)),
      detail_(std::move(detail)),
      file_(file),
      line_(line) {}

namespace detail {

void throw_cuda(int err, const char* expr, const char* file, int line) {
    auto e = static_cast<cudaError_t>(err);
    // A sticky device error may come from a kernel that timed out in a bounded wait: append its mailbox record.
    throw Error("cuda-runtime",
                fmt::format("{} failed: {} ({}){}", expr, cudaGetErrorName(e), cudaGetErrorString(e),
                            diag::report_for_error(err)),
                file, line);
}

void throw_cu(int err, const char* expr, const char* file, int line) {
    const char* name = nullptr;
    const char* text = nullptr;
    if (driver::available()) {
        driver::api().cuGetErrorName(static_cast<CUresult>(err), &name);
        driver::api().cuGetErrorString(static_cast<CUresult>(err), &text);
    }
    throw Error("cuda-driver",
                fmt::format("{} failed: {} ({}){}", expr, name ? name : fmt::format("CUresult {}", err),
                            text ? text : "no description", diag::report_for_error(err)),
                file, line);
}

void throw_nvrtc(int err, const char* expr, const char* file, int line) {
    throw Error("nvrtc", fmt::format("{} failed: {}", expr, nvrtcGetErrorString(static_cast<nvrtcResult>(err))), file,
                line);
}

void throw_nvjitlink(int err, const char* expr, const char* file, int line) {
    throw Error("nvjitlink", fmt::format("{} failed: nvJitLinkResult {}", expr, err), file, line);
}

void throw_errno(int err, const char* expr, const char* file, int line) {
    throw Error("posix", fmt::format("{} failed: {} (errno {})", expr, std::strerror(err), err), file, line);
}

}  // namespace detail
}  // namespace loom
