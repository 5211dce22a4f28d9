#include "ops/collectives/coll_launch.hpp"

#include <algorithm>

#include "loom/jit/jit.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/profile.hpp"
#include "runtime/pointer_check.hpp"

namespace loom::coll {

using kernels::coll::kMaxBlocks;
using kernels::coll::Params;

namespace {

void launch_kernel(const Ctx& ctx, const jit::Kernel& k, int blocks, int threads, std::size_t smem, bool programmatic,
                   const Params& p, cudaStream_t stream) {
    jit::LaunchConfig cfg;
    cfg.grid = dim3(static_cast<unsigned>(blocks));
    cfg.block = dim3(static_cast<unsigned>(threads));
    cfg.smem = smem;
    cfg.stream = stream;
    cfg.programmatic = programmatic;
    k(cfg, ctx, p);
}

}  // namespace

const jit::Kernel& load(const Launch& l) {
    jit::KernelSpec spec;
    spec.header = l.header;
    spec.name = l.name;
    spec.template_args = l.template_args;
    return jit::get_kernel(spec);
}

void launch(World& world, const jit::Kernel& k, const Launch& l, cudaStream_t stream) {
    launch_kernel(world.ctx(), k, l.blocks, l.threads, l.smem, l.programmatic, l.params, stream);
}

void launch(World& world, const Launch& l, cudaStream_t stream) { launch(world, load(l), l, stream); }

void PlanCache::launch(World& world, const PlanKey& key, const Launch& l, cudaStream_t stream) {
    const jit::Kernel& k = load(l);
    const Ctx ctx = world.ctx();
    launch_kernel(ctx, k, l.blocks, l.threads, l.smem, l.programmatic, l.params, stream);
    if (plans_.size() >= kMaxPlans) plans_.clear();
    plans_[key] = Plan{&k, ctx, l.blocks, l.threads, l.smem, l.programmatic, l.params};
}

bool PlanCache::replay(const PlanKey& key, cudaStream_t stream) const {
    const auto it = plans_.find(key);
    if (it == plans_.end()) return false;
    const Plan& p = it->second;
    launch_kernel(p.ctx, *p.kernel, p.blocks, p.threads, p.smem, p.programmatic, p.params, stream);
    return true;
}

PlanKey plan_key(CollKind kind, const BufferView& in, const BufferView& out, const CollOptions& opts) {
    return PlanKey{static_cast<int>(kind),
                   in.data,
                   out.data,
                   in.count,
                   out.count,
                   static_cast<int>(in.dtype),
                   static_cast<int>(out.dtype),
                   static_cast<int>(opts.algo),
                   static_cast<int>(opts.path),
                   static_cast<int>(opts.op),
                   opts.num_sms,
                   profile::enabled(),
                   detail::memory_generation()};
}

std::size_t PlanKeyHash::operator()(const PlanKey& k) const {
    std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    auto mix = [&h](std::uint64_t v) {
        for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xff)) * 1099511628211ull;
    };
    mix(static_cast<std::uint64_t>(k.op));
    mix(reinterpret_cast<std::uintptr_t>(k.in));
    mix(reinterpret_cast<std::uintptr_t>(k.out));
    mix(k.in_count);
    mix(k.out_count);
    mix((static_cast<std::uint64_t>(k.dtype) << 32) | static_cast<std::uint32_t>(k.out_dtype));
    mix(static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.algo)));
    mix((static_cast<std::uint64_t>(k.path) << 32) | static_cast<std::uint32_t>(k.reduce_op));
    mix(static_cast<std::uint64_t>(k.profiled));
    mix(static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.num_sms)));
    mix(k.memory_generation);
    return static_cast<std::size_t>(h);
}

int grid_stride_block_cap(const Budget& b, int cap, bool fanout) {
    if (!b.topo.shared_gpu) return cap;
    const int sms = std::max(b.num_sms, 1);
    return std::min(fanout ? std::min(sms, std::max(sms / 2, 32)) : sms, kMaxBlocks);
}

int pick_blocks(std::size_t work_bytes, std::size_t bytes_per_block, int cap, const CollOptions& opts,
                const Budget& b) {
    LOOM_CHECK(opts.num_sms >= 0, "CollOptions::num_sms: expected >= 0, given {}", opts.num_sms);
    std::size_t n = (work_bytes + bytes_per_block - 1) / bytes_per_block;
    if (n < 1) n = 1;
    int limit = cap;
    if (opts.num_sms > 0 && opts.num_sms < limit) limit = opts.num_sms;
    if (limit > kMaxBlocks) limit = kMaxBlocks;
    if (limit > b.num_sms && b.num_sms > 0) limit = b.num_sms;
    return static_cast<int>(n < static_cast<std::size_t>(limit) ? n : limit);
}

std::size_t tma_staging(Params& p) {
    p.stages = 4;
    p.stage_bytes = 16 * 1024;                           // 4 x 16 KiB in flight per block
    return 128 + std::size_t(p.stages) * p.stage_bytes;  // lang::tma_staging_bytes (device header)
}

Launch staged_pull_launch(const char* op, const CollChoice& c, const char* header, const char* name, const Params& base,
                          void* scratch, std::size_t stride, std::size_t round_bytes, const CollOptions& opts,
                          const Budget& budget) {
    LOOM_CHECK(c.algo == CollAlgo::Pull && c.path != DataPath::CopyEngine,
               "{}: staged through the scratch runs pull over ld/st or tma, given {}/{}", op, to_string(c.algo),
               to_string(c.path));
    const bool tma = c.path == DataPath::Tma;
    Launch l;
    l.header = header;
    l.name = name;
    l.template_args = {"unsigned char", std::to_string(path_arg(c.path))};
    l.params = base;
    l.params.in = scratch;
    l.params.count = stride;
    if (tma) l.smem = tma_staging(l.params);
    l.blocks = pick_blocks(round_bytes, tma ? 512 * 1024 : 64 * 1024, tma ? 32 : 64, opts, budget);
    return l;
}

void pack_round(char* dst, const char* src, std::size_t pitch, std::size_t off, std::size_t n, int W,
                cudaStream_t stream) {
    // cudaMemcpy2DAsync takes pitches below 2^31 (cudaDevAttrMaxPitch on Hopper); one copy per row beyond.
    if (pitch < (std::size_t(1) << 31)) {
        LOOM_CHECK_CUDA(cudaMemcpy2DAsync(dst, n, src + off, pitch, n, static_cast<std::size_t>(W),
                                          cudaMemcpyDeviceToDevice, stream));
        return;
    }
    for (int j = 0; j < W; ++j)
        LOOM_CHECK_CUDA(cudaMemcpyAsync(dst + j * n, src + j * pitch + off, n, cudaMemcpyDeviceToDevice, stream));
}

const char* cuda_type(DType t) {
    switch (t) {
        case DType::F32:
        case DType::F16:
        case DType::BF16:
            return dtype_cuda_name(t);
        default:
            break;
    }
    // Data movement only: any element is moved as bytes of its size.
    switch (dtype_size(t)) {
        case 1:
            return "unsigned char";
        case 2:
            return "unsigned short";
        case 4:
            return "unsigned int";
        default:
            return "unsigned long long";
    }
}

int path_arg(DataPath p) { return p == DataPath::Tma ? kernels::coll::kPathTma : kernels::coll::kPathLdSt; }

}  // namespace loom::coll
