#include "loom/runtime/driver.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <mutex>

#include "loom/runtime/error.hpp"

namespace loom::driver {
namespace {

struct State {
    Api api;
    std::string reason;  // empty when usable
};

const State& state() {
    static const State s = [] {
        State st;
        int count = 0;
        cudaError_t err = cudaGetDeviceCount(&count);
        if (err != cudaSuccess) {
            // Say plainly whether the driver library is missing (CI, containers without GPUs) or present but unusable.
            void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
            if (lib) dlclose(lib);
            st.reason = lib ? fmt::format("CUDA driver present but unusable ({}: {})", cudaGetErrorName(err),
                                          cudaGetErrorString(err))
                            : std::string("no CUDA driver on this machine (libcuda.so.1 not found)");
            cudaGetLastError();
            return st;
        }
        if (count == 0) {
            st.reason = "no CUDA device found";
            return st;
        }
        std::string missing;
        auto resolve = [&](const char* name, int version, void** slot) {
            cudaDriverEntryPointQueryResult q{};
            cudaError_t e = cudaGetDriverEntryPointByVersion(name, slot, version, cudaEnableDefault, &q);
            if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || *slot == nullptr) {
                missing += missing.empty() ? name : fmt::format(", {}", name);
                *slot = nullptr;
            }
        };
#define LOOM_DRIVER_RESOLVE(name, version) resolve(#name, version, reinterpret_cast<void**>(&st.api.name));
        LOOM_DRIVER_FUNCTIONS(LOOM_DRIVER_RESOLVE)
#undef LOOM_DRIVER_RESOLVE
        if (!missing.empty()) st.reason = fmt::format("CUDA driver lacks entry points: {}", missing);
        return st;
    }();
    return s;
}

}  // namespace

bool available() { return state().reason.empty(); }

std::string unavailable_reason() { return state().reason; }

const Api& api() {
    const State& s = state();
    if (!s.reason.empty()) throw Error("cuda-driver", s.reason, __FILE__, __LINE__);
    return s.api;
}

}  // namespace loom::driver
