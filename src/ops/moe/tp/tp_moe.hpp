// The TP-MoE ops' internals: the validated call every algorithm takes, the checks, the algorithms.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "loom/ops/moe.hpp"
#include "loom/runtime/world.hpp"
#include "loom/runtime/world_state.hpp"

namespace loom::moe {

// One ag_moe call, validated: E experts, N the slice's product columns (w_up's rows / E with NK).
struct AgMoeCall {
    World* world = nullptr;
    MatrixView x, w_up, out;
    const int32_t* topk_idx = nullptr;
    const float* topk_weights = nullptr;
    MoeRouting routing;
    cudaStream_t stream = nullptr;
    TpMoeOptions opts;
    bool captured = false;  // the stream is capturing a CUDA graph
};
// One moe_rs / moe_ar call, validated: H = w_down's rows / E (NK).
struct MoeDownCall {
    World* world = nullptr;
    MatrixView rows, w_down, out;
    MoeRouting routing;
    cudaStream_t stream = nullptr;
    TpMoeOptions opts;
    bool captured = false;
};

// Argument checks (raise loom::Error naming the op, the argument, what was expected and what was given).
void check_ag_moe(const AgMoeCall& c);
void check_moe_rs(const MoeDownCall& c);
void check_moe_ar(const MoeDownCall& c);

// A symmetric buffer grown on demand (collective: every rank asks for the same sizes in the same order).
struct SymmetricBuffer {
    void* data = nullptr;
    std::size_t bytes = 0;
    // At least `need` bytes; growing inside a CUDA graph capture raises (it synchronises the device).
    void* ensure(World& world, std::size_t need, const char* op, bool captured);
    void release(World& world);
};

void ag_moe_sequential(const AgMoeCall& c);
void moe_rs_sequential(const MoeDownCall& c);
void moe_ar_sequential(const MoeDownCall& c);

}  // namespace loom::moe
