// Loom's public C++ API in one include: the World (ranks, symmetric heap, per-World op state), the process's
// settings, the error type, tensor views, the version (loom/version.hpp) and the ops (loom::gemm, the collectives,
// the overlapped GEMMs, the MoE ops tensor- and expert-parallel, attention).
// Device code (kernels written in the Loom language) includes loom/lang/lang.cuh instead.
#pragma once

#include "loom/bf16.hpp"
#include "loom/ops/attention.hpp"
#include "loom/ops/collectives.hpp"
#include "loom/ops/gemm.hpp"
#include "loom/ops/moe.hpp"
#include "loom/ops/moe_ep.hpp"
#include "loom/ops/moe_ep_ll.hpp"
#include "loom/ops/overlap.hpp"
#include "loom/runtime/device_memory.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "loom/runtime/world.hpp"
#include "loom/tensor.hpp"
#include "loom/version.hpp"
