// The EP throughput mode's internals: its state on the World, the layout of its buffers, the plan's pure functions
// (tests/unit/test_moe_ep_layout.cpp) and the launch plumbing shared by dispatch.cpp and combine.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "loom/jit/jit.hpp"
#include "loom/kernels/moe/ep_params.hpp"
#include "loom/ops/moe_ep.hpp"
#include "loom/runtime/world_state.hpp"
#include "ops/overlap/common/state.hpp"
#include "runtime/call_agreement.hpp"

namespace loom::moe::ep {

// Byte offsets of the symmetric data buffer's parts for `rows` rows of width `hidden` and `topk` slots: recv_x and the
// combine rows ([rows, H] bf16 each), the pair records' rows and weights ([rows, k] int32 / fp32; pairs <= rows); in a
// World of several nodes (`staged`) also the stage rows ([rows, H] bf16) and their records ([rows, k] int32 / fp32).
struct DataLayout {
    std::size_t recv_x = 0, combine_rows = 0, pair_rows = 0, pair_weights = 0;
    std::size_t stage_x = 0, stage_rows = 0, stage_weights = 0;  // staged only
    std::size_t bytes = 0;
};
DataLayout data_layout(int64_t rows, int64_t hidden, int topk, bool staged = false);

// Byte offsets of the local layout buffer's arrays for one call (T tokens, k slots, E experts, W ranks).
struct LocalLayout {
    std::size_t chunk_counts = 0, recv_offsets = 0, recv_counts = 0, send_base = 0, pair_base = 0, entry_row = 0,
                token_pair = 0, send_prefix = 0, send_entry = 0, stage_base = 0, ret_base = 0, src_pair_base = 0,
                bytes = 0;
};
int layout_chunks(int64_t tokens, int topk);  // blocks of the count / index kernels (at least 1)
LocalLayout local_layout(int64_t tokens, int topk, int num_experts, int world);

// Blocks of a data kernel with a warp per item (token or pair): one per 16 items, 1..2 x SMs; `requested` > 0 wins.
int data_blocks(int64_t items, int device_sms, int requested);
// Auto mode's capacity for a call that needs `need` rows: `need` rounded up to 256 (the symmetric buffer itself only
// grows, in bytes, so a smaller capacity after a larger call reuses it; rows are not carried over between calls,
// whose hidden size may differ).
int64_t auto_capacity(int64_t need);

// The per-World state (key "moe/ep/normal"): symmetric signals and counts (zeroed once), the symmetric data buffer
// grown on demand, the local layout buffer, the device counters, and the host's view of the latest dispatch.
struct State final : WorldState {
    static constexpr const char* kKey = "moe/ep/normal";
    explicit State(World& world);
    ~State() override;
    void release(World& world) override;

    kernels::moe::EpSignals* sig = nullptr;  // symmetric
    int32_t* counts_all = nullptr;           // symmetric [W, kEpMaxCols]
    overlap::SymmetricBuffer data;
    overlap::LocalBuffer layout;
    kernels::moe::EpDeviceState* dev = nullptr;  // local, zeroed once
    int32_t* host = nullptr;                     // pinned: the device state's read-backs
    int device_sms = 0;
    int64_t auto_rows = 0;  // auto mode's capacity of the last call
    uint64_t calls = 0;     // the latest dispatch's number (unique in the process; its handle's)
    bool combined = false;  // the latest dispatch's combine was enqueued
    // ep_moe_experts: the first GEMM's rows (with w_down) and the experts' outputs.
    overlap::LocalBuffer expert_mid, expert_out;
    // The latest dispatch's shape and parameters (the combine's).
    kernels::moe::EpParams params{};
};

// ep_dispatch's body. per_expert: the per-expert push (ep_moe_experts, Overlapped: kernels/moe/ep_dispatch.cuh)
// instead of push -> arrive; the caller then runs the hooked grouped GEMM and launch_arrived_wait before the combine.
EpHandle dispatch(World& world, const MatrixView& x, const int32_t* topk_idx, const float* topk_weights, int topk,
                  int num_experts, cudaStream_t stream, const EpOptions& opts, bool per_expert);
// ep_dispatch_arrived_wait for the World's latest dispatch.
void launch_arrived_wait(World& world, cudaStream_t stream);

// The World's state; created on first use (collective), never inside a CUDA graph capture.
State& state(World& world, const char* op, bool captured);
bool capturing(cudaStream_t stream);

// Whether the World spans nodes: the kernels are then built with remote peers and the data buffer has stage rows.
bool multi_node(const World& world);
// A kernel of `header` for this World (built with remote peers when it spans nodes; detail::load_kernel: the first
// load of such a kernel is collective).
const jit::Kernel& kernel(World& world, const char* header, const char* name);
jit::LaunchConfig launch_config(unsigned blocks, unsigned threads, std::size_t smem, cudaStream_t stream);
void check_rows(const char* op, const char* arg, const MatrixView& m);

// ep_dispatch's argument checks (this rank's), and what every rank must give alike (checking mode: the
// detail::AgreedCall of ep_dispatch and ep_moe_experts).
void check_dispatch(World& world, const MatrixView& x, const int32_t* topk_idx, int topk, int num_experts,
                    const EpOptions& opts);
detail::CallSignature dispatch_signature(const char* op, const MatrixView& x, int topk, int num_experts,
                                         const EpOptions& opts);

}  // namespace loom::moe::ep
