// The World's record of the kernels with remote peers it has loaded (remote_kernels.hpp).
#include "runtime/remote_kernels.hpp"

#include <set>

#include "loom/runtime/world_state.hpp"

namespace loom::detail {

namespace {
struct RemoteKernels final : WorldState {
    static constexpr const char* kKey = "runtime/remote_kernels";
    explicit RemoteKernels(World&) {}
    std::set<const jit::Kernel*> loaded;  // their first load met every rank
};
}  // namespace

const jit::Kernel& load_kernel(World& world, const jit::KernelSpec& spec) {
    const jit::Kernel& k = jit::get_kernel(spec);
    if (spec.remote_peers && world.state<RemoteKernels>().loaded.insert(&k).second)
        world.barrier("runtime/remote_kernels/loaded");
    return k;
}

}  // namespace loom::detail
