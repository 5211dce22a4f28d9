// bench-ep's NVSHMEM baseline (ep_nvshmem.hpp).
#include "ep_nvshmem.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "harness.hpp"
#include "loom/jit/jit.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/nvshmem.hpp"

namespace loom::bench {
namespace {

namespace km = kernels::moe;

std::size_t up(std::size_t b) { return (b + 255) / 256 * 256; }

// Loom's block counts (src/ops/moe/ep/plan.cpp, data_blocks): a warp per item, 16 items per block, up to 2 per SM.
unsigned data_blocks(int64_t items, int sms) {
    return static_cast<unsigned>(std::clamp<int64_t>((items + 15) / 16, 1, 2 * static_cast<int64_t>(sms)));
}

const jit::Kernel& nv_kernel(const char* name) {
    const std::string header =
        (std::filesystem::path(source_file("bench/kernels/peer_copy.cuh")).parent_path() / "ep_nvshmem.cuh").string();
    return jit::get_kernel({.header = header, .name = name, .needs_nvshmem = true});
}

const jit::Kernel& loom_kernel(const char* name) {
    return jit::get_kernel({.header = "loom/kernels/moe/ep_dispatch.cuh", .name = name});
}

jit::LaunchConfig cfg(unsigned blocks, unsigned threads, std::size_t smem, cudaStream_t s) {
    return {.grid = dim3(std::max(blocks, 1u)), .block = dim3(threads), .smem = smem, .stream = s};
}

}  // namespace

EpNvshmem::EpNvshmem(World& world, const EpNvshmemInputs& in, int64_t capacity) : world_(world) {
    LOOM_CHECK(world.num_nodes() == 1, "bench-ep NVSHMEM baseline: expected one node, given {}", world.num_nodes());
    const int W = world.world_size(), E = in.num_experts, L = E / W, C = E + W, k = in.topk;
    const auto T = static_cast<std::size_t>(std::max(in.tokens, 1));
    const std::size_t row = static_cast<std::size_t>(in.hidden) * 2, R = static_cast<std::size_t>(capacity);
    const int chunks =
        static_cast<int>(std::max<int64_t>(1, (int64_t(in.tokens) * k + km::kEpChunk - 1) / km::kEpChunk));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, world.device()));

    // NVSHMEM's heap: signals, every rank's totals, then the receive, partial and pair-record rows.
    std::size_t at = 0;
    const std::size_t o_sig = at;
    at += up(sizeof(km::EpSignals));
    const std::size_t o_counts = at;
    at += up(static_cast<std::size_t>(W) * C * 4);
    const std::size_t o_recv = at;
    at += up(R * row);
    const std::size_t o_part = at;
    at += up(R * row);
    const std::size_t o_prow = at;
    at += up(R * k * 4);
    const std::size_t o_pw = at;
    at += up(R * k * 4);
    const std::size_t heap_bytes = at;
    if (std::getenv("NVSHMEM_SYMMETRIC_SIZE") == nullptr)
        ::setenv("NVSHMEM_SYMMETRIC_SIZE", std::to_string(heap_bytes + (std::size_t{64} << 20)).c_str(), 1);
    own_nvshmem_ = !nvshmem::initialized();
    if (own_nvshmem_) nvshmem::init(world);
    heap_ = nvshmem::malloc(heap_bytes);
    LOOM_CHECK_CUDA(cudaMemset(heap_, 0, heap_bytes));

    // Local: the device state (zeroed once), then the layout arrays.
    std::size_t lat = up(sizeof(km::EpDeviceState));
    const std::size_t o_chunk = lat;
    lat += up(static_cast<std::size_t>(chunks) * C * 4);
    const std::size_t o_roff = lat;
    lat += up((L + 1) * 4);
    const std::size_t o_rcnt = lat;
    lat += up(L * 4);
    const std::size_t o_sbase = lat;
    lat += up(E * 4);
    const std::size_t o_pbase = lat;
    lat += up(W * 4);
    const std::size_t o_erow = lat;
    lat += up(T * k * 4);
    const std::size_t o_tpair = lat;
    lat += up(T * W * 4);
    LOOM_CHECK_CUDA(cudaMalloc(&local_, lat));
    LOOM_CHECK_CUDA(cudaMemset(local_, 0, lat));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    nvshmem::barrier_all();

    char* const lb = static_cast<char*>(local_);
    char* const hb = static_cast<char*>(heap_);
    p_.x = in.x;
    p_.topk_idx = in.topk_idx;
    p_.topk_weights = in.topk_weights;
    p_.y = in.y;
    p_.dev = reinterpret_cast<km::EpDeviceState*>(lb);
    p_.chunk_counts = reinterpret_cast<int32_t*>(lb + o_chunk);
    p_.recv_offsets = reinterpret_cast<int32_t*>(lb + o_roff);
    p_.recv_counts = reinterpret_cast<int32_t*>(lb + o_rcnt);
    p_.send_base = reinterpret_cast<int32_t*>(lb + o_sbase);
    p_.pair_base = reinterpret_cast<int32_t*>(lb + o_pbase);
    p_.entry_row = reinterpret_cast<int32_t*>(lb + o_erow);
    p_.token_pair = reinterpret_cast<int32_t*>(lb + o_tpair);
    p_.sig = reinterpret_cast<km::EpSignals*>(hb + o_sig);
    p_.counts_all = reinterpret_cast<int32_t*>(hb + o_counts);
    p_.recv_x = hb + o_recv;
    p_.combine_rows = hb + o_part;
    p_.pair_rows = reinterpret_cast<int32_t*>(hb + o_prow);
    p_.pair_weights = reinterpret_cast<float*>(hb + o_pw);
    p_.x_ld_words = in.hidden / 8;
    p_.out_ld_words = in.hidden / 8;
    p_.y_ld_words = in.hidden / 8;
    p_.row_words = in.hidden / 8;
    p_.tokens = in.tokens;
    p_.topk = k;
    p_.num_experts = E;
    p_.local_experts = L;
    p_.chunks = chunks;
    p_.capacity = static_cast<int32_t>(capacity);
    p_.pair_capacity = p_.capacity;

    // Compile and load every kernel now, outside the timing.
    count_ = &loom_kernel("loom::kernels::moe::ep_layout_count");
    scan_ = &nv_kernel("ep_bench::nv_ep_layout_scan");
    index_ = &loom_kernel("loom::kernels::moe::ep_layout_index");
    push_ = &nv_kernel("ep_bench::nv_ep_dispatch_push");
    arrive_ = &loom_kernel("loom::kernels::moe::ep_dispatch_arrive");
    send_ = &nv_kernel("ep_bench::nv_ep_combine_send");
    reduce_ = &nv_kernel("ep_bench::nv_ep_combine_reduce");
}

EpNvshmem::~EpNvshmem() {
    cudaDeviceSynchronize();
    if (heap_ != nullptr) nvshmem::free(heap_);
    if (own_nvshmem_) nvshmem::finalize();
    cudaFree(local_);
}

void EpNvshmem::dispatch(cudaStream_t s) {
    const Ctx ctx = world_.ctx();
    const auto chunks = static_cast<unsigned>(p_.chunks);
    const std::size_t cols_smem = static_cast<std::size_t>(p_.num_experts + ctx.world) * 4;
    (*count_)(cfg(chunks, km::kEpChunk, cols_smem, s), ctx, p_);
    (*scan_)(cfg(1, km::kEpScanThreads, 0, s), ctx, p_);
    (*index_)(cfg(chunks, km::kEpChunk, 0, s), ctx, p_);
    (*push_)(cfg(data_blocks(p_.tokens, sms_), km::kEpThreads, 0, s), ctx, p_);
    (*arrive_)(cfg(data_blocks(std::min<int64_t>(p_.capacity, 1 << 20), sms_), km::kEpThreads, 0, s), ctx, p_);
}

void EpNvshmem::combine(const void* expert_out, cudaStream_t s) {
    const Ctx ctx = world_.ctx();
    km::EpParams p = p_;
    p.expert_out = expert_out;
    (*send_)(cfg(data_blocks(std::min<int64_t>(p.capacity, 1 << 20), sms_), km::kEpThreads, 0, s), ctx, p);
    (*reduce_)(cfg(data_blocks(p.tokens, sms_), km::kEpThreads, 0, s), ctx, p);
}

}  // namespace loom::bench
