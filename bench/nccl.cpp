#include "nccl.hpp"

#include <cstring>

#include "loom/runtime/error.hpp"

#if LOOM_HAVE_NCCL
#include <nccl.h>

#define BENCH_NCCL(call)                                                                     \
    do {                                                                                     \
        const ncclResult_t r_ = (call);                                                      \
        LOOM_CHECK(r_ == ncclSuccess, "NCCL: {} failed: {}", #call, ncclGetErrorString(r_)); \
    } while (0)
#endif

namespace loom::bench {

#if LOOM_HAVE_NCCL
namespace {
ncclDataType_t nccl_type(DType dt) {
    switch (dt) {
        case DType::BF16:
            return ncclBfloat16;
        case DType::F16:
            return ncclFloat16;
        case DType::F32:
            return ncclFloat32;
        case DType::U8:  // bytes: all_gather / all_to_all of any type (fp8 inputs)
            return ncclUint8;
        default:
            LOOM_FAIL("NCCL baseline: dtype {} is not one of bf16, fp16, fp32, u8", dtype_name(dt));
    }
}
ncclComm_t as_comm(void* c) { return static_cast<ncclComm_t>(c); }
}  // namespace

NcclBaseline::NcclBaseline(World& w, bool enabled, bool shared_gpu) {
    if (!enabled) {
        note_ = "NCCL baseline disabled (--no-nccl)";
        return;
    }
    if (shared_gpu) {
        note_ = "NCCL baseline skipped: ranks share a GPU (NCCL needs one GPU per rank)";
        return;
    }
    ncclUniqueId id{};
    if (w.rank() == 0) BENCH_NCCL(ncclGetUniqueId(&id));
    Bytes b(sizeof id);
    std::memcpy(b.data(), &id, sizeof id);
    const auto all = w.store().all_gather("bench/nccl-id", b);
    std::memcpy(&id, all[0].data(), sizeof id);
    ncclComm_t c = nullptr;
    BENCH_NCCL(ncclCommInitRank(&c, w.world_size(), id, w.rank()));
    comm_ = c;
}

NcclBaseline::~NcclBaseline() {
    if (comm_) ncclCommDestroy(as_comm(comm_));
}

void NcclBaseline::all_gather(const void* in, void* out, std::size_t n, DType dt, cudaStream_t s) {
    BENCH_NCCL(ncclAllGather(in, out, n, nccl_type(dt), as_comm(comm_), s));
}
void NcclBaseline::reduce_scatter(const void* in, void* out, std::size_t n, DType dt, cudaStream_t s) {
    BENCH_NCCL(ncclReduceScatter(in, out, n, nccl_type(dt), ncclSum, as_comm(comm_), s));
}
void NcclBaseline::all_reduce(const void* in, void* out, std::size_t n, DType dt, cudaStream_t s) {
    BENCH_NCCL(ncclAllReduce(in, out, n, nccl_type(dt), ncclSum, as_comm(comm_), s));
}
void NcclBaseline::all_to_all(const void* in, void* out, std::size_t n, DType dt, cudaStream_t s) {
    BENCH_NCCL(ncclAlltoAll(in, out, n, nccl_type(dt), as_comm(comm_), s));
}

#else  // built without NCCL

NcclBaseline::NcclBaseline(World&, bool, bool) {
    note_ = "NCCL baseline unavailable: the benchmarks were built without nccl.h / libnccl";
}
NcclBaseline::~NcclBaseline() = default;
void NcclBaseline::all_gather(const void*, void*, std::size_t, DType, cudaStream_t) { LOOM_FAIL("{}", note_); }
void NcclBaseline::reduce_scatter(const void*, void*, std::size_t, DType, cudaStream_t) { LOOM_FAIL("{}", note_); }
void NcclBaseline::all_reduce(const void*, void*, std::size_t, DType, cudaStream_t) { LOOM_FAIL("{}", note_); }
void NcclBaseline::all_to_all(const void*, void*, std::size_t, DType, cudaStream_t) { LOOM_FAIL("{}", note_); }

#endif

}  // namespace loom::bench
