#include "ops/overlap/overlap_state.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "loom/ops/collectives.hpp"
#include "loom/runtime/env.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/stream_ops.hpp"

namespace loom::overlap {

static_assert(std::is_trivially_copyable_v<kernels::overlap::AgGemmHookArgs>);
static_assert(std::is_trivially_copyable_v<kernels::overlap::TileNotifyHookArgs>);
static_assert(std::is_trivially_copyable_v<kernels::overlap::RsParams>);

DeviceFacts::DeviceFacts(World& world) : device(world.device()) {
    int major = 0, minor = 0;
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&device_sms, cudaDevAttrMultiProcessorCount, device));
    // Under MPS the attribute reports this client's share of the SMs; the GEMM grids and comm-block counts are
    // planned on it (see overlap_usable_sms and docs/overlap.md "Deadlock freedom").
    num_sms = overlap_usable_sms(device_sms);
    arch = major * 10 + minor;
    shared_gpu = collective_topology(world).shared_gpu;
}

void check_state_outside_capture(const char* op, bool captured) {
    LOOM_CHECK(!captured,
               "{}: a CUDA graph capture needs the op's state: call {} once outside the capture with the same shape "
               "and options first (creating it synchronises the device, which a capture forbids)",
               op, op);
}

const DeviceFacts& device_facts(World& world, const char* op, bool captured) {
    LOOM_CHECK(world.world_size() == world.local_world_size(),
               "{}: expected a single-node world (world size == local world size), given world size {} with {} ranks "
               "on this node",
               op, world.world_size(), world.local_world_size());
    LOOM_CHECK(world.local_world_size() <= kMaxLocalPeers, "{}: expected at most {} ranks per node, given {}", op,
               kMaxLocalPeers, world.local_world_size());
    const DeviceFacts& d = op_state<DeviceFacts>(world, op, captured);
    LOOM_CHECK(d.num_sms >= 2,
               "{}: expected at least 2 usable SMs (one for the GEMM, one for the communication blocks), given {} "
               "(device {} SMs; CUDA_MPS_ACTIVE_THREAD_PERCENTAGE / LOOM_OVERLAP_SMS)",
               op, d.num_sms, d.device_sms);
    LOOM_CHECK(d.arch >= 90,
               "{}: expected a GPU of compute capability >= 9.0 (Hopper GEMM with overlap hooks), "
               "given {}.{}",
               op, d.arch / 10, d.arch % 10);
    return d;
}

void zero_symmetric_signals(World& world, void* p, std::size_t bytes, const char* key) {
    LOOM_CHECK_CUDA(cudaMemset(p, 0, bytes));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    world.barrier(std::string("loom/overlap/state/") + key);  // every rank's signals are zero before any peer writes
}

void SymmetricBuffer::release(World& world) {
    if (p) world.free(p);
    p = nullptr;
    bytes = 0;
}

LocalBuffer::~LocalBuffer() {
    if (p) cudaFree(p);
}

SideStream::SideStream() {
    LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    LOOM_CHECK_CUDA(cudaEventCreateWithFlags(&forked, cudaEventDisableTiming));
    LOOM_CHECK_CUDA(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming));
}

SideStream::~SideStream() {
    if (stream) cudaStreamDestroy(stream);
    if (forked) cudaEventDestroy(forked);
    if (joined) cudaEventDestroy(joined);
}

std::string whole_tile_unfit(const GemmConfig& cfg, int out_bytes) {
    if ((cfg.block_n * out_bytes) % 128 != 0)
        return fmt::format("BLOCK_N x {} bytes a multiple of 128 (whole staging slabs), given BLOCK_N = {}", out_bytes,
                           cfg.block_n);
    const uint32_t smem = kernels::gemm_sm90_smem_bytes(cfg.block_m, cfg.block_n, cfg.stages, out_bytes);
    if (smem > kernels::kGemmSm90MaxSmem)
        return fmt::format("{} stages of {}x{} beside the whole staged tile within {} bytes of shared memory, given {}",
                           cfg.stages, cfg.block_m, cfg.block_n, kernels::kGemmSm90MaxSmem, smem);
    return "";
}

GemmConfig whole_tile_config(GemmConfig c, int out_bytes) {
    const int step = 128 / std::max(out_bytes, 1);
    c.block_n = std::min(256, (c.block_n + step - 1) / step * step);
    for (;;) {
        c.stages = kernels::gemm_sm90_plan_stages(c.block_m, c.block_n, out_bytes);
        if (c.stages >= 3 || c.block_n - 64 < step) break;
        c.block_n -= 64;
    }
    return c;
}

}  // namespace loom::overlap

// Declared in loom/ops/overlap.hpp (namespace loom).
void loom::release_overlap_state(World& world) { world.release_states("overlap/"); }

namespace loom::overlap {

void* ensure_symmetric(World& world, SymmetricBuffer& buf, std::size_t bytes, bool captured) {
    if (bytes <= buf.bytes) return buf.p;
    LOOM_CHECK(!captured,
               "overlap: a CUDA graph capture needs the op's buffer of {} bytes (it has {}): call the op once outside "
               "the capture with the same shape and options first (growing it synchronises the device)",
               bytes, buf.bytes);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    world.barrier("loom/overlap/grow");  // every rank's device is done with the old buffer
    buf.release(world);
    buf.p = world.alloc_bytes(bytes, 1024);
    buf.bytes = bytes;
    return buf.p;
}

std::size_t ensure_parity_halves(World& world, SymmetricBuffer& buf, std::size_t half_bytes, bool captured) {
    half_bytes = (half_bytes + 1023) / 1024 * 1024;
    ensure_symmetric(world, buf, 2 * half_bytes, captured);
    const std::size_t stride = buf.bytes / 2 / 1024 * 1024;
    LOOM_CHECK(stride >= half_bytes, "overlap: internal: parity half {} B < {} B", stride, half_bytes);
    return stride;
}

void* ensure_local(LocalBuffer& buf, std::size_t bytes) {
    if (bytes <= buf.bytes) return buf.p;
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    if (buf.p) LOOM_CHECK_CUDA(cudaFree(buf.p));
    buf.p = nullptr;
    buf.bytes = 0;
    LOOM_CHECK_CUDA(cudaMalloc(&buf.p, bytes));
    buf.bytes = bytes;
    return buf.p;
}

void fork(SideStream& side, cudaStream_t stream) {
    LOOM_CHECK_CUDA(cudaEventRecord(side.forked, stream));
    LOOM_CHECK_CUDA(cudaStreamWaitEvent(side.stream, side.forked, 0));
}

void join(SideStream& side, cudaStream_t stream) {
    LOOM_CHECK_CUDA(cudaEventRecord(side.joined, side.stream));
    LOOM_CHECK_CUDA(cudaStreamWaitEvent(stream, side.joined, 0));
}

void check_inputs(const char* op, const MatrixView& a, const MatrixView& b, const MatrixView& c) {
    LOOM_CHECK(a.dtype == DType::BF16 || a.dtype == DType::F16 || a.dtype == DType::F8E4M3,
               "{}: expected A bf16, f16 or f8e4m3, given {}", op, dtype_name(a.dtype));
    LOOM_CHECK(b.dtype == a.dtype, "{}: expected B of A's dtype {}, given {}", op, dtype_name(a.dtype),
               dtype_name(b.dtype));
    LOOM_CHECK(c.dtype == DType::BF16 || c.dtype == DType::F16 || c.dtype == DType::F32,
               "{}: expected C bf16, f16 or f32, given {}", op, dtype_name(c.dtype));
    for (const auto* v : {&a, &b, &c}) {
        const char* name = v == &a ? "A" : v == &b ? "B" : "C";
        LOOM_CHECK(v->data != nullptr, "{}: expected a device pointer for {}, given nullptr", op, name);
        LOOM_CHECK(v->rows > 0 && v->cols > 0, "{}: expected a non-empty {}, given {} x {}", op, name, v->rows,
                   v->cols);
        LOOM_CHECK(reinterpret_cast<std::uintptr_t>(v->data) % 16 == 0,
                   "{}: expected {} 16-byte aligned, given address {}", op, name, v->data);
        LOOM_CHECK((v->stride() * dtype_size(v->dtype)) % 16 == 0 && v->stride() >= v->cols,
                   "{}: expected {}'s leading dimension >= {} and a multiple of 16 bytes, given {}", op, name, v->cols,
                   v->stride());
    }
    LOOM_CHECK(a.cols % 8 == 0 && b.rows % 8 == 0, "{}: expected K and N multiples of 8, given K={} N={}", op, a.cols,
               b.rows);
    LOOM_CHECK(b.cols == a.cols, "{}: expected B as [N, K] with K = {} (A's columns), given {} x {}", op, a.cols,
               b.rows, b.cols);
    LOOM_CHECK(a.dtype != DType::F8E4M3 || a.cols % 16 == 0,
               "{}: f8e4m3 inputs expect K a multiple of 16 (16-byte rows), given K={}", op, a.cols);
}

void check_scale(const char* op, const OpScale& s) {
    LOOM_CHECK(std::isfinite(s.alpha), "{}: expected a finite alpha, given {}", op, s.alpha);
    gemm_check_device_scale(op, "scale_a", s.a);
    gemm_check_device_scale(op, "scale_b", s.b);
}

GemmOptions gemm_options(const OpScale& s) {
    GemmOptions o;
    o.alpha = s.alpha;
    o.scale_a = s.a;
    o.scale_b = s.b;
    return o;
}

void check_config(const char* op, const GemmConfig& cfg, DType in, bool split_tail_ok) {
    LOOM_CHECK(!cfg.sm80, "{}: expected the Hopper GEMM config (sm80 = false)", op);
    LOOM_CHECK(cfg.cluster_m == 1, "{}: expected cluster_m 1 (the overlap hooks order single-CTA tiles), given {}", op,
               cfg.cluster_m);
    LOOM_CHECK(cfg.tma_store, "{}: expected tma_store = true (after_store publishes completed TMA stores)", op);
    LOOM_CHECK(cfg.tail_splits == 1 || split_tail_ok,
               "{}: expected tail_splits 1 (its hooks publish every tile: no split-K tail), given {}", op,
               cfg.tail_splits);
    gemm_validate_config(cfg, false, in);
}

void use_config(const char* op, OverlapPlan& plan, const GemmConfig* config, int64_t m, int64_t n, int num_sms,
                DType in, bool split_tail_ok) {
    if (config) {
        plan.gemm = *config;
        if (plan.gemm.grid == 0)
            plan.gemm.grid =
                static_cast<int>(gemm_sm90_grid(m, n, plan.gemm, num_sms - plan.comm_blocks - plan.reserved_sms));
    }
    check_config(op, plan.gemm, in, split_tail_ok);
}

int64_t tile_count(int64_t m, int64_t n, const GemmConfig& cfg) {
    return ((m + cfg.block_m - 1) / cfg.block_m) * ((n + cfg.block_n - 1) / cfg.block_n);
}

void check_tile_count(const char* op, int64_t m, int64_t n, const GemmConfig& cfg) {
    const int64_t num_m = (m + cfg.block_m - 1) / cfg.block_m, num_n = (n + cfg.block_n - 1) / cfg.block_n;
    LOOM_CHECK(num_m * num_n <= kernels::overlap::kMaxTileSignals,
               "{}: expected at most {} output tiles, given {} x {} (M={} N={} with {})", op,
               kernels::overlap::kMaxTileSignals, num_m, num_n, m, n, cfg.str());
}

char* gemm_into_parity_half(World& world, PartialHalves& partials, const MatrixView& a, const MatrixView& b,
                            DType dtype, const OpScale& sc, cudaStream_t stream, bool captured) {
    const int64_t M = a.rows, N = b.rows;
    const std::size_t half_stride =
        ensure_parity_halves(world, partials.buf, static_cast<std::size_t>(M * N) * dtype_size(dtype), captured);
    const uint64_t epoch = ++partials.calls;
    char* const half = static_cast<char*>(partials.buf.p) + (epoch % 2) * half_stride;
    gemm(a, b, MatrixView{half, dtype, M, N, 0}, gemm_options(sc), stream);
    return half;
}

bool check_capture(cudaStream_t stream, const char* op, bool replayable) {
    const bool captured = stream_ops::capturing(stream);
    LOOM_CHECK(!captured || replayable,
               "{}: expected a stream that is not capturing a CUDA graph, or an algorithm that replays: this one "
               "computes its signal targets and buffer halves on the host per call, so a replayed graph would reuse "
               "one call's (wrong results or a hang). Call {} outside the capture, or pass its Sequential algorithm "
               "(loom::gemm and a collective), or for gemm_ar FusedEpilogue, for gemm_rs FusedEpilogue with the Sm "
               "transport (their call numbers are the device's)",
               op, op);
    return captured;
}

bool debug() { return env_flag("LOOM_OVERLAP_DEBUG"); }

void prepare_gemm(const char* hooks, const char* header, const MatrixView& a, const MatrixView& c,
                  const GemmConfig& cfg, const OpScale& sc, ScaleAt at) {
    const GemmOptions epilogue = at == ScaleAt::Epilogue ? gemm_options(sc) : GemmOptions{};
    (void)jit::get_kernel(
        gemm_kernel_spec(cfg, a.dtype, c.dtype, gemm_kernel_bias(cfg, c.dtype, epilogue), false, hooks, header));
}

GemmConfig gemm_config(int64_t m, int64_t n, int64_t k, int arch, int gemm_sms, bool split_tail, DType in) {
    // 128-row tiles, weighed as the plain GEMM weighs them (GemmTiles::Overlap): the hooks align M-blocks with
    // the ranks' row chunks (ag_gemm's direct producer and gemm_rs's fused epilogue need M / W a multiple of BLOCK_M,
    // which 192 rarely divides), and the 192-row kernel has not been run with hooks.
    GemmConfig cfg = gemm_heuristic(m, n, k, false, arch, gemm_sms, split_tail, GemmTiles::Overlap, in);
    cfg.cluster_m = 1;
    cfg.tma_store = true;
    // cfg.grid: the heuristic's, planned on gemm_sms (one CTA per SM, or a skinny GEMM's split units).
    return cfg;
}

void groups_inside_bands(GemmConfig& cfg, int64_t blocks_per_rank) {
    LOOM_CHECK(blocks_per_rank >= 1, "groups_inside_bands: expected >= 1 M-block per rank, given {}", blocks_per_rank);
    cfg.group_m = static_cast<int>(std::clamp<int64_t>(cfg.group_m, 1, blocks_per_rank));
    while (blocks_per_rank % cfg.group_m != 0) --cfg.group_m;
}

int comm_blocks(int requested, int dflt, int num_sms) {
    const int p = requested > 0 ? requested : std::min(dflt, std::max(1, num_sms / 4));
    return std::max(1, std::min({p, kernels::overlap::kMaxCommBlocks, num_sms - 1}));
}

}  // namespace loom::overlap

// Declared in loom/ops/overlap.hpp (namespace loom).
int loom::overlap_usable_sms(int device_sms, const EnvLookup& env) {
    LOOM_CHECK(device_sms >= 1, "overlap_usable_sms: expected the device's SM count >= 1, given {}", device_sms);
    const long long forced = env_int(env, "LOOM_OVERLAP_SMS", 0);
    LOOM_CHECK(forced >= 0, "LOOM_OVERLAP_SMS: expected a number of SMs >= 0 (0: derive it), given {}", forced);
    if (forced > 0) return static_cast<int>(std::min<long long>(forced, device_sms));
    // Under MPS the attribute already reports the client's share (seen on the H200: 14 SMs at
    // CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=12), so it is used as is.
    return device_sms;
}
