// Loom's NVTX domain, through NVTX3's header-only C API (the CUDA toolkit's nvtx3/nvToolsExt.h): with no tool
// attached every NVTX call is a no-op and nvtxDomainCreateA returns null, which is how nvtx_enabled() tells.
#include "runtime/nvtx_range.hpp"

#include <nvtx3/nvToolsExt.h>

namespace loom::detail {

namespace {

nvtxDomainHandle_t domain() noexcept {
    static const nvtxDomainHandle_t d = nvtxDomainCreateA("loom");
    return d;
}

}  // namespace

bool nvtx_enabled() noexcept { return domain() != nullptr; }

void nvtx_push(const char* name) noexcept {
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = name;
    nvtxDomainRangePushEx(domain(), &a);
}

void nvtx_pop() noexcept { nvtxDomainRangePop(domain()); }

}  // namespace loom::detail
