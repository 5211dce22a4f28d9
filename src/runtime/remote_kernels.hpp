// Loading kernels built with remote peers (jit::KernelSpec::remote_peers) in a World of several nodes.
#pragma once

#include "loom/jit/jit.hpp"
#include "loom/runtime/world.hpp"

namespace loom::detail {

// jit::get_kernel(spec); the first load of a kernel with remote peers in this World meets every rank on the host.
// nvcc takes seconds per such kernel, and a rank still compiling would hold its peers, already launched, in their
// bounded waits meanwhile. Collective on a first load: every rank must load the same kernels at the same calls, as the
// ops do (they all take each barrier or none).
const jit::Kernel& load_kernel(World& world, const jit::KernelSpec& spec);

}  // namespace loom::detail
