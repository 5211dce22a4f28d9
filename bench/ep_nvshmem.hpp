// bench-ep's NVSHMEM baseline on the host: Loom's throughput-mode dispatch / combine algorithm with its transfers
// written against NVSHMEM's device API (bench/kernels/ep_nvshmem.cuh). It keeps its own layout state, signals and
// buffers (the ones peers write in NVSHMEM's heap), launches the same kernel sequence with the same grids as
// loom::ep_dispatch / ep_combine, and sums in the same order: its y equals Loom's bit for bit.
//
// Contract: the constructor and destructor are collective over the World (NVSHMEM's heap is); one node only; the
// capacity is fixed (rows any rank receives; an overflow moves no data, as Loom's does). Throws loom::Error when
// NVSHMEM or its kernels are unavailable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "loom/jit/jit.hpp"
#include "loom/kernels/moe/ep_params.hpp"
#include "loom/runtime/world.hpp"

namespace loom::bench {

struct EpNvshmemInputs {
    const void* x;  // [tokens, hidden] bf16, dense rows
    const int32_t* topk_idx;
    const float* topk_weights;
    void* y;  // [tokens, hidden] bf16: the combine's output
    int tokens, hidden, topk, num_experts;
};

class EpNvshmem {
  public:
    EpNvshmem(World& world, const EpNvshmemInputs& in, int64_t capacity);
    ~EpNvshmem();
    EpNvshmem(const EpNvshmem&) = delete;
    EpNvshmem& operator=(const EpNvshmem&) = delete;

    void dispatch(cudaStream_t stream);
    // expert_out: [capacity, hidden] bf16 dense rows aligned with recv_x(), in NVSHMEM's heap at the same offset on
    // every rank (identity experts: recv_x() itself).
    void combine(const void* expert_out, cudaStream_t stream);
    void* recv_x() const { return p_.recv_x; }

  private:
    World& world_;
    kernels::moe::EpParams p_{};
    // count, scan, index, push, arrive (dispatch); send, reduce (combine)
    const jit::Kernel *count_ = nullptr, *scan_ = nullptr, *index_ = nullptr, *push_ = nullptr, *arrive_ = nullptr,
                      *send_ = nullptr, *reduce_ = nullptr;
    void* local_ = nullptr;  // EpDeviceState and the layout arrays
    void* heap_ = nullptr;   // NVSHMEM: signals, counts_all, recv_x, combine_rows, pair records
    bool own_nvshmem_ = false;
    int sms_ = 0;
};

}  // namespace loom::bench
