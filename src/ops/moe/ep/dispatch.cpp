// loom::ep_dispatch and ep_check: validate, size the buffers, launch kernels/moe/ep_dispatch.cuh (count -> scan and
// exchange -> index -> push -> arrive). Auto capacity reads the needed rows on the host between the scan and the index
// kernels (one stream synchronisation) and grows the symmetric buffer there (collective: every rank computes the
// same need from the same counts).
#include <algorithm>
#include <atomic>
#include <limits>
#include <string>

#include "loom/jit/jit.hpp"
#include "loom/kernels/moe/ep_params.hpp"
#include "loom/runtime/error.hpp"
#include "ops/moe/ep/ep.hpp"
#include "runtime/call_agreement.hpp"
#include "runtime/nvtx_range.hpp"
#include "runtime/remote_kernels.hpp"

namespace loom {

namespace kmoe = kernels::moe;

namespace moe::ep {

const jit::Kernel& kernel(World& world, const char* header, const char* name) {
    jit::KernelSpec spec;
    spec.header = header;
    spec.name = name;
    spec.remote_peers = multi_node(world);
    return detail::load_kernel(world, spec);
}

jit::LaunchConfig launch_config(unsigned blocks, unsigned threads, std::size_t smem, cudaStream_t stream) {
    jit::LaunchConfig c;
    c.grid = dim3(std::max(blocks, 1u));
    c.block = dim3(threads);
    c.smem = smem;
    c.stream = stream;
    return c;
}

void check_rows(const char* op, const char* arg, const MatrixView& m) {
    LOOM_CHECK(m.dtype == DType::BF16, "{}: {}: expected dtype bf16, given {}", op, arg, dtype_name(m.dtype));
    LOOM_CHECK(m.rows >= 0, "{}: {}: expected rows >= 0, given {}", op, arg, m.rows);
    LOOM_CHECK(m.cols >= 8 && m.cols % 8 == 0, "{}: {}: expected columns (H) a positive multiple of 8, given {}", op,
               arg, m.cols);
    LOOM_CHECK(m.stride() >= m.cols && m.stride() % 8 == 0,
               "{}: {}: expected a row stride >= H ({}) and a multiple of 8 elements (16-byte rows), given {}", op, arg,
               m.cols, m.stride());
    LOOM_CHECK(m.data != nullptr || m.rows == 0, "{}: {}: expected device memory, given null", op, arg);
    LOOM_CHECK(reinterpret_cast<std::uintptr_t>(m.data) % 16 == 0, "{}: {}: expected 16-byte alignment, given {}", op,
               arg, m.data);
}

}  // namespace moe::ep

namespace {

constexpr const char* kOp = "ep_dispatch";
constexpr const char* kHeader = "loom/kernels/moe/ep_dispatch.cuh";

}  // namespace

namespace moe::ep {

constexpr const char* kDispatchOp = "ep_dispatch";

void check_dispatch(World& world, const MatrixView& x, const int32_t* topk_idx, int topk, int num_experts,
                    const EpOptions& opts) {
    const int W = world.world_size();
    moe::ep::check_rows(kDispatchOp, "x", x);
    LOOM_CHECK(topk >= 1 && topk <= kmoe::kEpMaxTopk, "{}: topk: expected 1..{}, given {}", kDispatchOp,
               kmoe::kEpMaxTopk, topk);
    LOOM_CHECK(num_experts >= 1 && num_experts <= kmoe::kEpMaxExperts, "{}: num_experts: expected 1..{}, given {}",
               kDispatchOp, kmoe::kEpMaxExperts, num_experts);
    LOOM_CHECK(num_experts % W == 0, "{}: num_experts: expected a multiple of the world size {}, given {}", kDispatchOp,
               W, num_experts);
    LOOM_CHECK(topk_idx != nullptr || x.rows == 0, "{}: topk_idx: expected device int32 [{}, {}], given null",
               kDispatchOp, x.rows, topk);
    LOOM_CHECK(x.rows * topk < (int64_t{1} << 31), "{}: x: expected tokens x topk < 2^31, given {} x {}", kDispatchOp,
               x.rows, topk);
    LOOM_CHECK(opts.capacity >= 0 && opts.capacity < (int64_t{1} << 31),
               "{}: opts.capacity: expected 0 (auto) or a row count < 2^31, given {}", kDispatchOp, opts.capacity);
    LOOM_CHECK(opts.num_blocks >= 0, "{}: opts.num_blocks: expected >= 0, given {}", kDispatchOp, opts.num_blocks);
}

detail::CallSignature dispatch_signature(const char* op, const MatrixView& x, int topk, int num_experts,
                                         const EpOptions& opts) {
    detail::CallSignature s(op);
    s.add("x.cols", x.cols).add("x.dtype", detail::dtype_field(x.dtype)).add("topk", topk);
    s.add("num_experts", num_experts).add("EpOptions::capacity", opts.capacity);  // sizes a collective allocation
    return s;  // EpOptions::num_blocks is this rank's grid only
}

}  // namespace moe::ep

EpHandle ep_dispatch(World& world, const MatrixView& x, const int32_t* topk_idx, const float* topk_weights, int topk,
                     int num_experts, cudaStream_t stream, const EpOptions& opts) {
    const detail::NvtxRange nvtx("loom::ep_dispatch T={} H={} k={} E={}", x.rows, x.cols, topk, num_experts);
    // Checking mode: the ranks' checks and calls agree before the count exchange (each rank's T is its own).
    const detail::AgreedCall agreed(
        world, [&] { return moe::ep::dispatch_signature(kOp, x, topk, num_experts, opts); },
        [&] { moe::ep::check_dispatch(world, x, topk_idx, topk, num_experts, opts); });
    return moe::ep::dispatch(world, x, topk_idx, topk_weights, topk, num_experts, stream, opts, false);
}

namespace moe::ep {

void launch_arrived_wait(World& world, cudaStream_t stream) {
    State& st = *world.find_state<State>();
    const jit::Kernel& wait = kernel(world, kHeader, "loom::kernels::moe::ep_dispatch_arrived_wait");
    wait(launch_config(1, 32, 0, stream), world.ctx(), st.params);
}

EpHandle dispatch(World& world, const MatrixView& x, const int32_t* topk_idx, const float* topk_weights, int topk,
                  int num_experts, cudaStream_t stream, const EpOptions& opts, bool per_expert) {
    check_dispatch(world, x, topk_idx, topk, num_experts, opts);
    const bool captured = moe::ep::capturing(stream);
    LOOM_CHECK(!captured || opts.capacity > 0,
               "{}: opts.capacity: a CUDA graph capture needs a fixed capacity (0, auto, reads the needed rows on the "
               "host), given 0",
               kOp);
    moe::ep::State& st = moe::ep::state(world, kOp, captured);
    const bool staged = moe::ep::multi_node(world);
    const int W = world.world_size();
    const int L = num_experts / W;
    const int64_t T = x.rows, H = x.cols;

    // Local layout arrays of this call (growing synchronises the device: not inside a capture).
    const moe::ep::LocalLayout ll = moe::ep::local_layout(T, topk, num_experts, W);
    LOOM_CHECK(!captured || ll.bytes <= st.layout.bytes,
               "{}: a CUDA graph capture needs the layout buffer of {} bytes (it has {}): call once outside the "
               "capture with as many tokens first",
               kOp, ll.bytes, st.layout.bytes);
    char* const lb = static_cast<char*>(overlap::ensure_local(st.layout, ll.bytes));
    // The symmetric data buffer: the given capacity now; auto's after the count exchange.
    int64_t capacity = opts.capacity > 0 ? opts.capacity : st.auto_rows;
    if (opts.capacity > 0)
        overlap::ensure_symmetric(world, st.data, moe::ep::data_layout(capacity, H, topk, staged).bytes, captured);

    const jit::Kernel& count = moe::ep::kernel(world, kHeader, "loom::kernels::moe::ep_layout_count");
    const jit::Kernel& scan = moe::ep::kernel(world, kHeader, "loom::kernels::moe::ep_layout_scan");
    const jit::Kernel& index = moe::ep::kernel(world, kHeader, "loom::kernels::moe::ep_layout_index");
    const jit::Kernel& push = moe::ep::kernel(
        world, kHeader,
        per_expert ? "loom::kernels::moe::ep_dispatch_push_experts" : "loom::kernels::moe::ep_dispatch_push");
    const jit::Kernel& arrive = moe::ep::kernel(world, kHeader, "loom::kernels::moe::ep_dispatch_arrive");

    kmoe::EpParams p{};
    p.x = x.data;
    p.topk_idx = topk_idx;
    p.topk_weights = topk_weights;
    p.dev = st.dev;
    p.chunk_counts = reinterpret_cast<int32_t*>(lb + ll.chunk_counts);
    p.recv_offsets = reinterpret_cast<int32_t*>(lb + ll.recv_offsets);
    p.recv_counts = reinterpret_cast<int32_t*>(lb + ll.recv_counts);
    p.send_base = reinterpret_cast<int32_t*>(lb + ll.send_base);
    p.pair_base = reinterpret_cast<int32_t*>(lb + ll.pair_base);
    p.entry_row = reinterpret_cast<int32_t*>(lb + ll.entry_row);
    p.token_pair = reinterpret_cast<int32_t*>(lb + ll.token_pair);
    if (per_expert) {
        p.send_prefix = reinterpret_cast<int32_t*>(lb + ll.send_prefix);
        p.send_entry = reinterpret_cast<int32_t*>(lb + ll.send_entry);
    }
    if (staged) {
        p.stage_base = reinterpret_cast<int32_t*>(lb + ll.stage_base);
        p.ret_base = reinterpret_cast<int32_t*>(lb + ll.ret_base);
        p.src_pair_base = reinterpret_cast<int32_t*>(lb + ll.src_pair_base);
    }
    p.sig = st.sig;
    p.counts_all = st.counts_all;
    p.x_ld_words = x.stride() / 8;
    p.row_words = H / 8;
    p.tokens = static_cast<int32_t>(T);
    p.topk = topk;
    p.num_experts = num_experts;
    p.local_experts = num_experts / W;
    p.chunks = moe::ep::layout_chunks(T, topk);
    // Auto: no overflow at the scan (the buffer grows to what it needs below).
    p.capacity = opts.capacity > 0 ? static_cast<int32_t>(capacity) : std::numeric_limits<int32_t>::max();
    p.pair_capacity = p.capacity;

    const Ctx ctx = world.ctx();
    const auto chunks = static_cast<unsigned>(p.chunks);
    if (per_expert) {
        // This call's per-expert counters start from 0 (every source adds 1 per local expert: the GEMM waits for W).
        // No peer writes them now: the previous per-expert push's signals all preceded its arrival, which this rank's
        // previous arrived-wait acquired; this call's follow the peers' scans, which wait for this rank's, after this
        // memset in stream order. Counters kept across calls instead fall behind for the local experts a call with
        // fewer of them (a smaller E) leaves out.
        LOOM_CHECK_CUDA(
            cudaMemsetAsync(st.sig->expert_ready, 0, sizeof(uint64_t) * static_cast<std::size_t>(L), stream));
    }
    const std::size_t cols_smem = static_cast<std::size_t>(num_experts + W) * 4;
    count(moe::ep::launch_config(chunks, kmoe::kEpChunk, cols_smem, stream), ctx, p);
    scan(moe::ep::launch_config(1, kmoe::kEpScanThreads, 0, stream), ctx, p);
    if (opts.capacity == 0) {
        // need_rows, need_pairs, need_stage
        LOOM_CHECK_CUDA(
            cudaMemcpyAsync(st.host, &st.dev->need_rows, 3 * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
        LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
        capacity = moe::ep::auto_capacity(std::max({st.host[0], st.host[1], st.host[2]}));
        st.auto_rows = capacity;
        overlap::ensure_symmetric(world, st.data, moe::ep::data_layout(capacity, H, topk, staged).bytes, false);
        p.capacity = static_cast<int32_t>(capacity);
        p.pair_capacity = p.capacity;
    }
    const moe::ep::DataLayout dl = moe::ep::data_layout(capacity, H, topk, staged);
    char* const db = static_cast<char*>(st.data.p);
    p.recv_x = db + dl.recv_x;
    p.combine_rows = db + dl.combine_rows;
    p.pair_rows = reinterpret_cast<int32_t*>(db + dl.pair_rows);
    p.pair_weights = reinterpret_cast<float*>(db + dl.pair_weights);
    if (staged) {
        p.stage_x = db + dl.stage_x;
        p.stage_rows = reinterpret_cast<int32_t*>(db + dl.stage_rows);
        p.stage_weights = reinterpret_cast<float*>(db + dl.stage_weights);
    }

    index(moe::ep::launch_config(chunks, kmoe::kEpChunk, 0, stream), ctx, p);
    const int sms = st.device_sms;
    if (per_expert) {
        // At least a block per expert's work item while the SMs last (a block pushes one expert's rows at a time).
        const int blocks = opts.num_blocks > 0 ? opts.num_blocks
                                               : std::max(moe::ep::data_blocks(T, sms, 0), std::min(num_experts, sms));
        push(moe::ep::launch_config(static_cast<unsigned>(blocks), kmoe::kEpThreads, 0, stream), ctx, p);
    } else {
        push(moe::ep::launch_config(static_cast<unsigned>(moe::ep::data_blocks(T, sms, opts.num_blocks)),
                                    kmoe::kEpThreads, 0, stream),
             ctx, p);
        // Received pairs are at most the capacity; the grid is sized for it (the count is on the device).
        arrive(moe::ep::launch_config(static_cast<unsigned>(moe::ep::data_blocks(std::min<int64_t>(capacity, 1 << 20),
                                                                                 sms, opts.num_blocks)),
                                      kmoe::kEpThreads, 0, stream),
               ctx, p);
    }

    // A number no other dispatch of the process has (of this World before a release, or of another World): a
    // handle names its own dispatch only.
    static std::atomic<uint64_t> dispatches{0};
    st.calls = dispatches.fetch_add(1, std::memory_order_relaxed) + 1;
    st.combined = false;
    st.params = p;
    EpHandle h;
    h.tokens = T;
    h.hidden = H;
    h.topk = topk;
    h.num_experts = num_experts;
    h.local_experts = num_experts / W;
    h.capacity = capacity;
    h.recv_x = MatrixView{p.recv_x, DType::BF16, capacity, H, 0};
    h.recv_offsets = p.recv_offsets;
    h.recv_counts = p.recv_counts;
    h.call = st.calls;
    return h;
}

}  // namespace moe::ep

void ep_check(World& world, const EpHandle& handle, cudaStream_t stream) {
    moe::ep::State* st = world.find_state<moe::ep::State>();
    LOOM_CHECK(st != nullptr && handle.call != 0,
               "ep_check: handle: expected one returned by ep_dispatch, given one "
               "that is not (no dispatch ran on this World)");
    LOOM_CHECK(handle.call == st->calls,
               "ep_check: handle: expected the World's latest dispatch (number {}), given dispatch number {}",
               st->calls, handle.call);
    // overflow, need_rows, need_pairs, need_stage
    LOOM_CHECK_CUDA(cudaMemcpyAsync(st->host, &st->dev->overflow, 4 * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
    LOOM_CHECK_CUDA(cudaStreamSynchronize(stream));
    LOOM_CHECK(st->host[0] == 0,
               "ep_dispatch: capacity overflow: a rank receives {} rows (token, expert entries) and stages {} rows for "
               "other nodes, the capacity is {} (EpOptions::capacity); the dispatch and its combine moved no data",
               std::max(st->host[1], st->host[2]), st->host[3], handle.capacity);
}

int64_t ep_dispatch_bytes(World& world, const EpHandle& handle, cudaStream_t stream) {
    ep_check(world, handle, stream);
    moe::ep::State& st = *world.find_state<moe::ep::State>();
    const int W = world.world_size(), me = world.rank(), C = handle.num_experts + W;
    int32_t* const pairs = st.host + 4;
    LOOM_CHECK_CUDA(cudaMemcpy(pairs, st.counts_all + static_cast<int64_t>(me) * C + handle.num_experts,
                               sizeof(int32_t) * W, cudaMemcpyDeviceToHost));
    int64_t n = 0;
    for (int d = 0; d < W; ++d)
        if (d != me) n += pairs[d];
    return n * handle.hidden * 2;
}

}  // namespace loom
