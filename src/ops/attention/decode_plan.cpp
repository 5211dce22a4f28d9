#include "ops/attention/decode_plan.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "loom/runtime/error.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "runtime/pointer_check.hpp"
#include "runtime/stream_key.hpp"

namespace loom::attention {

namespace ka = kernels::attention;

namespace {

struct DeviceInfo {
    int device = 0, arch = 0, num_sms = 0, smem_per_block = 0;
};

DeviceInfo device_info() {
    static std::mutex mu;
    static std::map<int, DeviceInfo> cache;
    int dev = 0;
    LOOM_CHECK_CUDA(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(dev); it != cache.end()) return it->second;
    DeviceInfo d;
    int major = 0, minor = 0;
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&d.num_sms, cudaDevAttrMultiProcessorCount, dev));
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&d.smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    d.device = dev;
    d.arch = major * 10 + minor;
    cache.emplace(dev, d);
    return d;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_shapes(const char* op, const DecodeQuery& q, const KvCache& kv, const DecodeOptions& opts) {
    LOOM_CHECK(q.dtype == DType::BF16 || q.dtype == DType::F16, "{}: expected q bf16 or f16, given {}", op,
               dtype_name(q.dtype));
    LOOM_CHECK(q.head_dim == 64 || q.head_dim == 128 || q.head_dim == 256,
               "{}: expected head_dim 64, 128 or 256, given {}", op, q.head_dim);
    LOOM_CHECK(q.batch >= 1, "{}: expected batch >= 1, given {}", op, q.batch);
    LOOM_CHECK(q.num_heads >= 1, "{}: expected q num_heads >= 1, given {}", op, q.num_heads);
    LOOM_CHECK(kv.num_kv_heads >= 1, "{}: expected kv num_kv_heads >= 1, given {}", op, kv.num_kv_heads);
    LOOM_CHECK(q.num_heads % kv.num_kv_heads == 0,
               "{}: expected q num_heads a multiple of kv num_kv_heads (an integral GQA group), given {} and {}", op,
               q.num_heads, kv.num_kv_heads);
    LOOM_CHECK(int64_t(q.batch) * q.num_heads <= INT32_MAX, "{}: expected batch x num_heads < 2^31, given {} x {}", op,
               q.batch, q.num_heads);
    LOOM_CHECK(int64_t(q.batch) * kv.num_kv_heads <= 65535,
               "{}: expected batch x num_kv_heads <= 65535 (the grid's z), given {} x {}", op, q.batch,
               kv.num_kv_heads);
    if (kv.block_table == nullptr) {
        LOOM_CHECK(kv.max_seq_len >= 0 && kv.max_seq_len <= INT32_MAX,
                   "{}: expected kv max_seq_len in [0, 2^31) for a contiguous cache, given {}", op, kv.max_seq_len);
        LOOM_CHECK(kv.max_pages == 0 && kv.num_pages == 0 && kv.page_size == 0,
                   "{}: a contiguous cache (kv block_table null) expects max_pages, num_pages and page_size 0, given "
                   "{}, {}, {}",
                   op, kv.max_pages, kv.num_pages, kv.page_size);
    } else {
        LOOM_CHECK(kv.page_size >= 1 && kv.page_size <= 256, "{}: expected kv page_size in [1, 256], given {}", op,
                   kv.page_size);
        LOOM_CHECK(kv.num_pages >= 1, "{}: expected kv num_pages >= 1 for a paged cache, given {}", op, kv.num_pages);
        LOOM_CHECK(kv.max_pages >= 1, "{}: expected kv max_pages >= 1 for a paged cache, given {}", op, kv.max_pages);
        LOOM_CHECK(int64_t(kv.max_pages) * kv.page_size <= INT32_MAX,
                   "{}: expected kv max_pages x page_size < 2^31, given {} x {}", op, kv.max_pages, kv.page_size);
    }
    LOOM_CHECK(opts.max_seq_len >= 0, "{}: expected DecodeOptions::max_seq_len >= 0, given {}", op, opts.max_seq_len);
    LOOM_CHECK(opts.num_splits >= 0 && opts.num_splits <= kMaxSplits,
               "{}: expected DecodeOptions::num_splits in [0, {}], given {}", op, kMaxSplits, opts.num_splits);
    LOOM_CHECK(std::isfinite(opts.scale) && opts.scale >= 0.f,
               "{}: expected DecodeOptions::scale >= 0 (0: 1/sqrt(D)), given {}", op, opts.scale);
    LOOM_CHECK(std::isfinite(opts.softcap) && opts.softcap >= 0.f,
               "{}: expected DecodeOptions::softcap >= 0 (0: none), given {}", op, opts.softcap);
}

void check_pointer(const World* world, int device, const char* op, const char* which, const void* p, std::size_t bytes,
                   std::size_t align) {
    LOOM_CHECK(p != nullptr, "{}: expected {} non-null", op, which);
    LOOM_CHECK(reinterpret_cast<std::uintptr_t>(p) % align == 0, "{}: expected {} {}-byte aligned, given {}", op, which,
               align, p);
    detail::check_memory(world, device, op, which, p, bytes);
}

// Blocks of the split kernel of shape c one SM holds at once (the driver's occupancy).
int resident_blocks(DType dtype, int head_dim, int heads_per_block, const DecodeConfig& c) {
    const jit::Kernel& k = jit::get_kernel(decode_split_spec(dtype, head_dim, heads_per_block, c));
    return k.max_blocks_per_sm(128 * c.head_split, std::size_t(ka::decode_split_smem_bytes(head_dim, heads_per_block,
                                                                                           c.stages, c.tile_tokens)));
}

}  // namespace

DecodeConfig decode_resident_config(DecodeConfig c, int64_t per_sm,
                                    const std::function<int(const DecodeConfig&)>& resident) {
    if (resident(c) >= per_sm) return c;
    for (DecodeConfig s = c; s.stages > 2;) {
        --s.stages;
        if (resident(s) >= per_sm) return s;
    }
    return c;
}

int decode_heads_per_block(int group) {
    int h = 1;
    while (h < group && h < ka::kDecodeMaxHeads) h *= 2;
    return h;
}

DecodeConfig decode_default_config(int head_dim, int heads_per_block, int smem_per_block) {
    DecodeConfig c;
    c.head_split = 1;
    c.mma = heads_per_block >= kDecodeMmaMinHeads && head_dim <= 128 &&
            ka::decode_split_smem_bytes(head_dim, heads_per_block, 2, 64) <= smem_per_block;
    c.tile_tokens = c.mma ? 64 : 4096 / head_dim;
    c.stages = c.mma && head_dim == 128 ? 3 : 4;
    while (c.stages > 2 &&
           ka::decode_split_smem_bytes(head_dim, heads_per_block, c.stages, c.tile_tokens) > smem_per_block)
        --c.stages;
    return c;
}

void check_decode_config(const char* op, const DecodeConfig& c, int head_dim, int heads_per_block, int smem_per_block) {
    const int lanes = ka::decode_token_lanes(head_dim);
    LOOM_CHECK(c.head_split == 1 || (c.head_split == 2 && heads_per_block % 2 == 0),
               "{}: expected DecodeConfig::head_split 1, or 2 with an even number of heads per block ({}), given {}",
               op, heads_per_block, c.head_split);
    LOOM_CHECK(c.stages >= 2 && c.stages <= 8, "{}: expected DecodeConfig::stages in [2, 8], given {}", op, c.stages);
    if (c.mma) {
        LOOM_CHECK(c.head_split == 1 && head_dim <= 128 && c.tile_tokens >= 64 && c.tile_tokens % 64 == 0 &&
                       c.tile_tokens <= kMaxMmaTileTokens,
                   "{}: expected DecodeConfig::mma with head_split 1, head_dim 64 or 128 and tile_tokens a multiple of "
                   "64 in [64, {}], given head_split {}, head_dim {}, tile_tokens {}",
                   op, kMaxMmaTileTokens, c.head_split, head_dim, c.tile_tokens);
    } else {
        LOOM_CHECK(c.tile_tokens >= 1 && c.tile_tokens % (lanes * c.head_split) == 0 && c.tile_tokens <= 8 * lanes,
                   "{}: expected DecodeConfig::tile_tokens a multiple of {} (128 / (D / 8) x head_split) and at most "
                   "{} for head_dim {}, given {}",
                   op, lanes * c.head_split, 8 * lanes, head_dim, c.tile_tokens);
    }
    LOOM_CHECK(c.splits >= 0 && c.splits <= kMaxSplits, "{}: expected DecodeConfig::splits in [0, {}], given {}", op,
               kMaxSplits, c.splits);
    const int smem = ka::decode_split_smem_bytes(head_dim, heads_per_block, c.stages, c.tile_tokens);
    LOOM_CHECK(smem <= smem_per_block,
               "{}: DecodeConfig {} needs {} bytes of shared memory per block, the device has {}", op, c.str(), smem,
               smem_per_block);
}

std::vector<DecodeConfig> decode_sweep_configs(int head_dim, int heads_per_block, int smem_per_block) {
    const int lanes = ka::decode_token_lanes(head_dim);
    std::vector<DecodeConfig> out;
    // (head_split, stages, tokens per token lane): 16 KiB stages at 2 ... 6 deep, 8 KiB stages 4 and 8 deep; the
    // two-half block (256 threads, at most 128 registers each) at 16 KiB stages 4 and 6 deep.
    const int shapes[][3] = {{1, 2, 4}, {1, 3, 4}, {1, 4, 4}, {1, 6, 4}, {1, 4, 2}, {1, 8, 2}, {2, 4, 4}, {2, 6, 4}};
    for (const auto& sh : shapes) {
        DecodeConfig c;
        c.head_split = sh[0];
        c.stages = sh[1];
        c.tile_tokens = sh[2] * lanes;
        if (c.head_split == 2 && heads_per_block % 2 != 0) continue;
        if (ka::decode_split_smem_bytes(head_dim, heads_per_block, c.stages, c.tile_tokens) > smem_per_block) continue;
        out.push_back(c);
    }
    if (head_dim <= 128) {  // tensor cores: 64 or 128-token tiles, 2 ... 4 stages
        const int mma_shapes[][2] = {{2, 64}, {3, 64}, {4, 64}, {2, 128}};
        for (const auto& sh : mma_shapes) {
            DecodeConfig c;
            c.mma = true;
            c.stages = sh[0];
            c.tile_tokens = sh[1];
            if (ka::decode_split_smem_bytes(head_dim, heads_per_block, c.stages, c.tile_tokens) > smem_per_block)
                continue;
            out.push_back(c);
        }
    }
    // The heuristic's shape with the merge as a second launch.
    DecodeConfig c = decode_default_config(head_dim, heads_per_block, smem_per_block);
    c.fused_merge = false;
    out.push_back(c);
    return out;
}

int decode_splits(int64_t base_blocks, int64_t max_len, int tile, int head_dim, int heads, int num_sms, int requested) {
    if (requested > 0) return std::clamp(requested, 1, kMaxSplits);
    if (max_len <= 0) return 1;
    tile = std::max(tile, 1);
    const int64_t max_s = std::min<int64_t>(kMaxSplits, ceil_div(max_len, tile));
    const int64_t sms = std::max(num_sms, 1);
    const double overhead = double(kDecodeBlockOverheadBytes) / (4.0 * head_dim);  // tokens of K + V
    int best = 1;
    double best_cost = 0;
    for (int64_t s = 1; s <= max_s; ++s) {
        const int64_t chunk = ceil_div(ceil_div(max_len, s), tile) * tile;
        const int64_t used = ceil_div(max_len, chunk);
        if (used != s) continue;  // the same split as a smaller count
        // The busiest SM's blocks, one after the other.
        double cost = double(ceil_div(base_blocks * s, sms)) * (double(chunk) + overhead);
        if (s > 1) cost += double(s) * heads;  // the fused merge's reads
        if (s == 1 || cost < best_cost * (1.0 - kDecodeSplitGain)) {
            best = static_cast<int>(s);
            best_cost = cost;
        }
    }
    return best;
}

std::size_t DecodePlan::workspace_bytes(bool partial) const {
    if (params.splits <= 1 && !partial) return 0;
    return rows * params.splits * (head_dim + 1) * sizeof(float);
}

std::size_t DecodePlan::counters() const { return std::size_t(params.batch) * params.num_kv_heads * head_chunks; }

DecodePlan plan_decode(const char* op, const DecodeQuery& q, const KvCache& kv, void* o, float* lse,
                       const DecodeOptions& opts, const World* world) {
    check_shapes(op, q, kv, opts);
    const DeviceInfo dev = device_info();
    LOOM_CHECK(dev.arch >= 80, "{}: expected a GPU of compute capability >= 8.0, given {}.{}", op, dev.arch / 10,
               dev.arch % 10);
    const bool paged = kv.block_table != nullptr;
    const int64_t capacity = paged ? int64_t(kv.max_pages) * kv.page_size : kv.max_seq_len;
    // SP decode (a World): every rank passes the same options with its own shard, whose capacity may be smaller (0
    // tokens): the bound on a rank is its shard's. A lone decode's bound past its cache is a mistake.
    LOOM_CHECK(world != nullptr || opts.max_seq_len <= capacity,
               "{}: expected DecodeOptions::max_seq_len <= the cache's capacity {} ({}), given {}", op, capacity,
               paged ? "max_pages x page_size" : "max_seq_len", opts.max_seq_len);
    const int64_t max_len = opts.max_seq_len > 0 ? std::min<int64_t>(opts.max_seq_len, capacity) : capacity;

    const std::size_t el = dtype_size(q.dtype);
    const std::size_t rows = std::size_t(q.batch) * q.num_heads;
    const std::size_t row_bytes = std::size_t(kv.num_kv_heads) * q.head_dim * el;
    const std::size_t kv_rows = paged ? std::size_t(kv.num_pages) * kv.page_size : std::size_t(q.batch) * capacity;
    check_pointer(world, dev.device, op, "q", q.data, rows * q.head_dim * el, 16);
    check_pointer(world, dev.device, op, "o", o, rows * q.head_dim * el, 16);
    if (lse != nullptr) check_pointer(world, dev.device, op, "lse", lse, rows * sizeof(float), 4);
    check_pointer(world, dev.device, op, "kv seq_lens", kv.seq_lens, std::size_t(q.batch) * 4, 4);
    if (kv_rows > 0) {
        const std::size_t kv_bytes = detail::checked_mul(op, "kv bytes", kv_rows, row_bytes);
        check_pointer(world, dev.device, op, "kv k", kv.k, kv_bytes, 16);
        check_pointer(world, dev.device, op, "kv v", kv.v, kv_bytes, 16);
    }
    LOOM_CHECK(kv_rows <= UINT32_MAX,
               "{}: expected the KV cache's token rows ({}) < 2^32, given {} (the kernel indexes rows with 32 bits)",
               op, paged ? "num_pages x page_size" : "batch x max_seq_len", kv_rows);
    if (paged)
        check_pointer(world, dev.device, op, "kv block_table", kv.block_table, std::size_t(q.batch) * kv.max_pages * 4,
                      4);

    DecodePlan plan;
    plan.dtype = q.dtype;
    plan.head_dim = q.head_dim;
    plan.rows = rows;
    const int group = q.num_heads / kv.num_kv_heads;
    plan.heads_per_block = decode_heads_per_block(group);
    plan.head_chunks = static_cast<int>(ceil_div(group, plan.heads_per_block));
    plan.config = opts.config != nullptr ? *opts.config
                                         : decode_default_config(q.head_dim, plan.heads_per_block, dev.smem_per_block);
    if (plan.config.tile_tokens == 0) plan.config.tile_tokens = plan.config.mma ? 64 : 4096 / q.head_dim;
    check_decode_config(op, plan.config, q.head_dim, plan.heads_per_block, dev.smem_per_block);
    const int tile = plan.config.tile_tokens;
    plan.smem_bytes = ka::decode_split_smem_bytes(q.head_dim, plan.heads_per_block, plan.config.stages, tile);
    const int64_t blocks = int64_t(q.batch) * kv.num_kv_heads * plan.head_chunks;
    const int requested = plan.config.splits > 0 ? plan.config.splits : opts.num_splits;
    auto resident = [&](const DecodeConfig& c) {
        return resident_blocks(q.dtype, q.head_dim, plan.heads_per_block, c);
    };
    if (requested == 0)
        LOOM_CHECK(resident(plan.config) >= 1,
                   "{}: the decode kernel {} does not fit on an SM ({} bytes of shared memory)", op, plan.config.str(),
                   plan.smem_bytes);
    int splits = decode_splits(blocks, max_len, tile, q.head_dim, plan.heads_per_block, dev.num_sms, requested);
    int64_t chunk = max_len > 0 ? ceil_div(ceil_div(max_len, splits), tile) * tile : tile;
    splits = static_cast<int>(std::max<int64_t>(1, ceil_div(max_len, chunk)));
    // The kernel walks a split's tokens [split x chunk, (split + 1) x chunk) in int32.
    LOOM_CHECK(chunk * splits <= INT32_MAX,
               "{}: expected the sequence bound (DecodeOptions::max_seq_len, or the cache's capacity when 0) at most "
               "{} with {} splits of {}-token tiles, given {}",
               op, INT32_MAX - int64_t(splits) * tile, splits, tile, max_len);
    // The heuristic's shape: as deep a pipeline as keeps the busiest SM's blocks resident at once.
    if (opts.config == nullptr) {
        plan.config = decode_resident_config(plan.config, ceil_div(blocks * splits, dev.num_sms), resident);
        plan.smem_bytes = ka::decode_split_smem_bytes(q.head_dim, plan.heads_per_block, plan.config.stages, tile);
    }
    plan.config.splits = splits;

    ka::DecodeParams& p = plan.params;
    p.q = q.data;
    p.k = kv.k;
    p.v = kv.v;
    p.block_table = kv.block_table;
    p.seq_lens = kv.seq_lens;
    p.o = o;
    p.lse = lse;
    p.batch = q.batch;
    p.num_q_heads = q.num_heads;
    p.num_kv_heads = kv.num_kv_heads;
    p.group = group;
    p.max_pages = paged ? kv.max_pages : 1;
    p.page_size = paged ? kv.page_size : static_cast<int32_t>(std::max<int64_t>(capacity, 1));
    p.num_pages = paged ? kv.num_pages : q.batch;
    p.splits = splits;
    p.chunk = static_cast<int32_t>(chunk);
    p.max_seq_len = static_cast<int32_t>(max_len);
    const float scale = opts.scale > 0.f ? opts.scale : 1.f / std::sqrt(static_cast<float>(q.head_dim));
    p.scale = scale;
    p.scale_log2 = scale * ka::kLog2e;
    p.softcap = opts.softcap;
    return plan;
}

jit::KernelSpec decode_split_spec(DType dtype, int head_dim, int heads_per_block, const DecodeConfig& c) {
    jit::KernelSpec s;
    s.header = "loom/kernels/attention/decode.cuh";
    s.name = "loom::kernels::attention::decode_split";
    s.template_args = {dtype_cuda_name(dtype),
                       std::to_string(head_dim),
                       std::to_string(heads_per_block),
                       std::to_string(c.head_split),
                       std::to_string(c.stages),
                       std::to_string(c.tile_tokens),
                       c.mma ? "1" : "0"};
    return s;
}

jit::KernelSpec decode_merge_spec(DType dtype, int head_dim) {
    jit::KernelSpec s;
    s.header = "loom/kernels/attention/decode.cuh";
    s.name = "loom::kernels::attention::decode_merge";
    s.template_args = {dtype_cuda_name(dtype), std::to_string(head_dim)};
    return s;
}

std::vector<jit::CompileResult> decode_precompile(DType dtype, int head_dim, int heads_per_block,
                                                  const std::vector<DecodeConfig>& configs, int arch) {
    std::vector<jit::CompileResult> out(configs.size());
    std::vector<std::exception_ptr> errors(configs.size());
    std::atomic<std::size_t> next{0};
    auto worker = [&] {
        for (std::size_t i; (i = next++) < configs.size();) {
            try {
                out[i] = jit::compile(decode_split_spec(dtype, head_dim, heads_per_block, configs[i]), arch);
            } catch (...) {
                errors[i] = std::current_exception();
            }
        }
    };
    const unsigned n = std::clamp<unsigned>(std::thread::hardware_concurrency(), 1u, 16u);
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < std::min<std::size_t>(n, configs.size()); ++t) threads.emplace_back(worker);
    for (auto& t : threads) t.join();
    for (const auto& e : errors)
        if (e) std::rethrow_exception(e);
    return out;
}

void launch_decode_split(const DecodePlan& plan, const ka::DecodeParams& p, cudaStream_t stream) {
    const jit::Kernel& k =
        jit::get_kernel(decode_split_spec(plan.dtype, plan.head_dim, plan.heads_per_block, plan.config));
    jit::LaunchConfig cfg;
    cfg.grid = dim3(static_cast<unsigned>(plan.head_chunks), static_cast<unsigned>(p.splits),
                    static_cast<unsigned>(p.batch * p.num_kv_heads));
    cfg.block = dim3(128 * static_cast<unsigned>(plan.config.head_split));
    cfg.smem = static_cast<std::size_t>(plan.smem_bytes);
    cfg.stream = stream;
    k(cfg, p);
}

void launch_decode_merge(const DecodePlan& plan, const ka::DecodeParams& p, cudaStream_t stream) {
    const jit::Kernel& k = jit::get_kernel(decode_merge_spec(plan.dtype, plan.head_dim));
    ka::MergeParams m{};
    m.part_o = p.part_o;
    m.part_lse = p.part_lse;
    m.o = p.o;
    m.lse = p.lse;
    m.rows = static_cast<int32_t>(plan.rows);
    m.splits = p.splits;
    jit::LaunchConfig cfg;
    cfg.grid = dim3(static_cast<unsigned>(plan.rows));
    cfg.block = dim3(128);
    cfg.stream = stream;
    k(cfg, m);
}

void* decode_workspace(const char* op, std::size_t bytes, cudaStream_t stream, bool zeroed) {
    struct Buffer {
        void* data = nullptr;
        std::size_t bytes = 0;
    };
    static std::mutex mu;
    static std::map<std::tuple<int, std::uint64_t, bool>, Buffer> buffers;
    static std::vector<void*> retired;  // smaller buffers a captured graph may still use
    int dev = 0;
    LOOM_CHECK_CUDA(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(mu);
    Buffer& b = buffers[{dev, detail::stream_key(stream), zeroed}];
    if (b.bytes >= bytes) return b.data;
    LOOM_CHECK(!stream_ops::capturing(stream),
               "{}: the split workspace of this stream must grow to {} bytes (has {}), which a CUDA-graph capture does "
               "not allow: make a call of the same shape on this stream once without capturing first",
               op, bytes, b.bytes);
    const std::size_t grown = std::max(bytes, 2 * b.bytes);
    void* p = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(&p, grown));
    if (zeroed) LOOM_CHECK_CUDA(cudaMemsetAsync(p, 0, grown, stream));
    if (b.data != nullptr) retired.push_back(b.data);
    b = Buffer{p, grown};
    return p;
}

}  // namespace loom::attention
