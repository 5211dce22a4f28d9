#include "ops/collectives/coll_state.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "loom/jit/jit.hpp"
#include "loom/runtime/error.hpp"
#include "runtime/env_vars.hpp"

namespace loom::coll {

using kernels::coll::kLLPacketsPerBlock;
using kernels::coll::kMaxBlocks;
using kernels::coll::kMaxLLBlocks;
using kernels::coll::Params;
using kernels::coll::SyncState;

namespace {

struct Registry {
    std::mutex mu;
    // Keyed by the World and the base of its heap (a World destroyed and another created at the same address
    // has a different heap mapping, so a stale entry is never reused).
    std::map<std::pair<const World*, const void*>, std::unique_ptr<CollState>> states;
};
Registry& registry() {
    static Registry r;
    return r;
}

std::pair<const World*, const void*> key_of(World& world) {
    const Ctx c = world.ctx();
    return {&world, c.heap[c.local_rank]};
}

std::unique_ptr<CollState> create(World& world) {
    LOOM_CHECK(world.world_size() == world.local_world_size(),
               "collectives: expected a single-node world (world size == local world size), given world size {} "
               "with {} ranks on this node",
               world.world_size(), world.local_world_size());
    LOOM_CHECK(world.local_world_size() <= kMaxLocalPeers, "collectives: expected at most {} ranks per node, given {}",
               kMaxLocalPeers, world.local_world_size());
    auto st = std::make_unique<CollState>();
    const int W = world.world_size();
    st->scratch_bytes = env_bytes("LOOM_COLL_SCRATCH", std::size_t(64) << 20);
    LOOM_CHECK(st->scratch_bytes >= (std::size_t(1) << 20), "LOOM_COLL_SCRATCH: expected at least 1 MiB, given {}",
               st->scratch_bytes);
    st->ll_bytes = std::size_t(2) * kMaxLLBlocks * W * kLLPacketsPerBlock * 16;
    st->sync = world.alloc<SyncState>(1);
    st->scratch = world.alloc<char>(st->scratch_bytes);
    st->ll = world.alloc<char>(st->ll_bytes);
    st->ce_sig = world.alloc<std::uint64_t>(kCeSignals * kMaxLocalPeers);
    LOOM_CHECK_CUDA(cudaMemset(st->ce_sig, 0, kCeSignals * kMaxLocalPeers * sizeof(std::uint64_t)));
    LOOM_CHECK_CUDA(cudaMemset(st->sync, 0, sizeof(SyncState)));
    LOOM_CHECK_CUDA(cudaMemset(st->ll, 0, st->ll_bytes));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());

    st->topo = collective_topology(world);
    LOOM_CHECK_CUDA(cudaDeviceGetAttribute(&st->num_sms, cudaDevAttrMultiProcessorCount, world.device()));
    if (st->topo.shared_gpu) {
        const char* pct = std::getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
        const int budget = shared_gpu_sm_budget(st->num_sms, st->topo.ranks_per_gpu, pct);
        if (budget != st->num_sms) {  // no MPS share per rank: every rank's kernels compete for every SM
            if (world.rank() == 0)
                std::fprintf(
                    stderr,
                    "loom: warning: %d ranks share a GPU without an MPS share each "
                    "(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%s): the collectives keep to %d of the %d SMs per "
                    "rank so that every rank's launches stay resident, but the overlapped GEMMs do not and "
                    "can wait for peers that do not get to run; give each rank its own share, at most 100 / ranks "
                    "%% (loomrun does)\n",
                    st->topo.ranks_per_gpu, pct ? pct : "unset", budget, st->num_sms);
            st->resident_blocks = budget;
            st->num_sms = budget;
        }
    }
    world.barrier("loom/coll/state");  // every rank's state is zeroed before any peer signals into it
    return st;
}

}  // namespace

CollState& coll_state(World& world) {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto& slot = r.states[key_of(world)];
    if (!slot) slot = create(world);
    return *slot;
}

void release_coll_state(World& world) {
    auto& r = registry();
    std::unique_ptr<CollState> st;
    {
        std::lock_guard<std::mutex> lock(r.mu);
        auto it = r.states.find(key_of(world));
        if (it == r.states.end()) return;
        st = std::move(it->second);
        r.states.erase(it);
    }
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    world.barrier("loom/coll/release");  // no peer still signals into our state
    for (cudaStream_t s : st->ce_streams) cudaStreamDestroy(s);
    for (cudaEvent_t e : st->ce_done) cudaEventDestroy(e);
    if (st->ce_fork) cudaEventDestroy(st->ce_fork);
    world.free(st->ce_sig);
    world.free(st->ll);
    world.free(st->scratch);
    world.free(st->sync);
}

cudaStream_t ce_stream(CollState& st, std::size_t i) {
    while (st.ce_streams.size() <= i) {
        cudaStream_t s = nullptr;
        cudaEvent_t e = nullptr;
        LOOM_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        LOOM_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        st.ce_streams.push_back(s);
        st.ce_done.push_back(e);
    }
    return st.ce_streams[i];
}

void ce_fork(CollState& st, cudaStream_t stream, std::size_t n) {
    if (!st.ce_fork) LOOM_CHECK_CUDA(cudaEventCreateWithFlags(&st.ce_fork, cudaEventDisableTiming));
    LOOM_CHECK_CUDA(cudaEventRecord(st.ce_fork, stream));
    for (std::size_t i = 0; i < n; ++i) LOOM_CHECK_CUDA(cudaStreamWaitEvent(ce_stream(st, i), st.ce_fork, 0));
}

void ce_join(CollState& st, cudaStream_t stream, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
        LOOM_CHECK_CUDA(cudaEventRecord(st.ce_done[i], ce_stream(st, i)));
        LOOM_CHECK_CUDA(cudaStreamWaitEvent(stream, st.ce_done[i], 0));
    }
}

void copy_engine_fanout(CollState& st, cudaStream_t stream, const std::vector<CopyJob>& jobs) {
    ce_fork(st, stream, jobs.size());
    for (std::size_t i = 0; i < jobs.size(); ++i)
        LOOM_CHECK_CUDA(cudaMemcpyAsync(jobs[i].dst, jobs[i].src, jobs[i].bytes, cudaMemcpyDefault, ce_stream(st, i)));
    ce_join(st, stream, jobs.size());
}

Params base_params(const CollState& st) {
    Params p{};
    p.sync = st.sync;
    p.scratch = st.scratch;
    p.scratch_bytes = st.scratch_bytes;
    p.ll = st.ll;
    return p;
}

std::size_t tma_staging(Params& p) {
    p.stages = 4;
    p.stage_bytes = 16 * 1024;                           // 4 x 16 KiB in flight per block
    return 128 + std::size_t(p.stages) * p.stage_bytes;  // lang::tma_staging_bytes (device header)
}

int pick_blocks(std::size_t work_bytes, std::size_t bytes_per_block, int cap, const CollOptions& opts,
                const CollState& st) {
    LOOM_CHECK(opts.num_sms >= 0, "CollOptions::num_sms: expected >= 0, given {}", opts.num_sms);
    std::size_t b = (work_bytes + bytes_per_block - 1) / bytes_per_block;
    if (b < 1) b = 1;
    // LOOM_COLL_MAX_BLOCKS (tuning): replaces every algorithm's own cap (still <= kMaxBlocks and the SMs).
    static const long long forced_cap = [] {
        const long long v = env_int("LOOM_COLL_MAX_BLOCKS", 0);
        LOOM_CHECK(v >= 0, "LOOM_COLL_MAX_BLOCKS: expected a block count >= 0 (0: each algorithm's own), given {}", v);
        return v;
    }();
    int limit = forced_cap > 0 ? static_cast<int>(std::min<long long>(forced_cap, kMaxBlocks)) : cap;
    if (opts.num_sms > 0 && opts.num_sms < limit) limit = opts.num_sms;
    if (limit > kMaxBlocks) limit = kMaxBlocks;
    if (limit > st.num_sms && st.num_sms > 0) limit = st.num_sms;
    return static_cast<int>(b < static_cast<std::size_t>(limit) ? b : limit);
}

int shared_gpu_sm_budget(int attr_sms, int ranks_per_gpu, const char* mps_percentage) {
    const int ranks = std::max(ranks_per_gpu, 1);
    const long long pct = mps_percentage && *mps_percentage ? std::atoll(mps_percentage) : 0;
    if (pct > 0 && pct * ranks <= 100) return attr_sms;  // a share per rank: the attribute already is the share
    return std::max(1, attr_sms / ranks);
}

int grid_stride_block_cap(const CollState& st, int cap, bool fanout) {
    if (!st.topo.shared_gpu) return cap;
    const int sms = std::max(st.num_sms, 1);
    return std::min(fanout ? std::min(sms, std::max(sms / 2, 32)) : sms, kMaxBlocks);
}

void setup_ll(Launch& l, const char* op, std::size_t chunk_bytes, const CollOptions& opts, const CollState& st) {
    using kernels::coll::kLLPacketsPerBlock;
    using kernels::coll::kMaxLLBlocks;
    LOOM_CHECK(chunk_bytes <= ll_capacity_bytes(),
               "{}: the ll algorithm holds at most {} bytes per chunk ({} blocks x {} packets x 8 bytes), given {}: "
               "use CollAlgo::Auto or another algorithm",
               op, ll_capacity_bytes(), kMaxLLBlocks, kLLPacketsPerBlock, chunk_bytes);
    const std::size_t packets = std::max<std::size_t>(1, (chunk_bytes + 7) / 8);
    // Spread the packets over blocks (>= 1 packet each: every block must exchange with every peer).
    int blocks = pick_blocks(packets, 64, kMaxLLBlocks, opts, st);
    std::size_t per = (packets + blocks - 1) / blocks;
    if (per > std::size_t(kLLPacketsPerBlock)) per = kLLPacketsPerBlock;
    blocks = static_cast<int>((packets + per - 1) / per);
    LOOM_CHECK(blocks <= kMaxLLBlocks, "{}: ll needs {} blocks of {} packets; at most {} blocks (num_sms {})", op,
               blocks, per, kMaxLLBlocks, opts.num_sms);
    l.header = "loom/kernels/collectives/coll_ll.cuh";
    l.name = std::string("loom::kernels::coll::") + op + "_ll";
    l.params.ll_packets = static_cast<uint32_t>(per);
    l.params.ll_blocks = static_cast<uint32_t>(blocks);
    // Packet blocks beyond what may be resident beside every peer's launch are dealt over fewer blocks
    // (coll_ll.cuh: ll_exchange): at 8 ranks on one GPU at 100 % each, 59 packet blocks per rank left some ranks'
    // blocks unscheduled while the others' waited for their packets (wait timeout in ll_recv).
    l.blocks = st.resident_blocks > 0 ? std::min(blocks, st.resident_blocks) : blocks;
    l.threads = per < 512 ? static_cast<int>((per + 31) / 32 * 32) : 512;
    // LOOM_COLL_PDL (tuning): 0 launches the LL kernels plainly, to time what the programmatic launch saves.
    static const bool pdl = [] {
        const long long v = env_int("LOOM_COLL_PDL", 1);
        LOOM_CHECK(v == 0 || v == 1, "LOOM_COLL_PDL: expected 0 or 1, given {}", v);
        return v == 1;
    }();
    l.programmatic = pdl;
}

namespace {
const jit::Kernel& kernel_of(const Launch& l) {
    jit::KernelSpec spec;
    spec.header = l.header;
    spec.name = l.name;
    spec.template_args = l.template_args;
    return jit::get_kernel(spec);
}
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

void launch(World& world, const Launch& l, cudaStream_t stream) {
    launch_kernel(world.ctx(), kernel_of(l), l.blocks, l.threads, l.smem, l.programmatic, l.params, stream);
}

void launch(World& world, CollState& st, const PlanKey& key, const Launch& l, cudaStream_t stream) {
    const jit::Kernel& k = kernel_of(l);
    const Ctx ctx = world.ctx();
    launch_kernel(ctx, k, l.blocks, l.threads, l.smem, l.programmatic, l.params, stream);
    if (st.plans.size() >= CollState::kMaxPlans) st.plans.clear();
    st.plans[key] = Plan{&k, ctx, l.blocks, l.threads, l.smem, l.programmatic, l.params};
}

bool launch_cached(CollState& st, const PlanKey& key, cudaStream_t stream) {
    const auto it = st.plans.find(key);
    if (it == st.plans.end()) return false;
    const Plan& p = it->second;
    launch_kernel(p.ctx, *p.kernel, p.blocks, p.threads, p.smem, p.programmatic, p.params, stream);
    return true;
}

void launch_ll_bytes(World& world, CollState& st, const PlanKey& key, const char* op, const void* in, void* out,
                     std::size_t chunk_bytes, const CollOptions& opts, cudaStream_t stream) {
    Launch l;
    l.params = base_params(st);
    l.params.in = in;
    l.params.out = out;
    l.params.count = chunk_bytes;
    l.template_args = {"unsigned char"};
    setup_ll(l, op, chunk_bytes, opts, st);
    launch(world, st, key, l, stream);
}

PlanKey plan_key(CollKind kind, const BufferView& in, const BufferView& out, const CollOptions& opts) {
    return PlanKey{static_cast<int>(kind),
                   in.data,
                   out.data,
                   in.count,
                   out.count,
                   static_cast<int>(in.dtype),
                   static_cast<int>(opts.algo),
                   static_cast<int>(opts.path),
                   static_cast<int>(opts.op),
                   opts.num_sms};
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
    mix((static_cast<std::uint64_t>(k.dtype) << 32) | static_cast<std::uint32_t>(k.algo));
    mix((static_cast<std::uint64_t>(k.path) << 32) | static_cast<std::uint32_t>(k.reduce_op));
    mix(static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.num_sms)));
    return static_cast<std::size_t>(h);
}

}  // namespace loom::coll

// Declared in loom/ops/collectives.hpp.
void loom::release_collective_state(World& world) { coll::release_coll_state(world); }

loom::CollTopology loom::collective_topology(World& world) {
    // Shared GPU: another rank reports this rank's PCI bus id (through the store).
    char bus[64] = {};
    LOOM_CHECK_CUDA(cudaDeviceGetPCIBusId(bus, sizeof(bus), world.device()));
    const std::string mine(bus);
    const auto all = world.store().all_gather("loom/coll/busid", Bytes(mine.begin(), mine.end()));
    CollTopology t{world.world_size(), false, jit::current_arch()};
    for (int r = 0; r < world.world_size(); ++r)
        if (r != world.rank() && std::string(all[r].begin(), all[r].end()) == mine) {
            t.shared_gpu = true;
            ++t.ranks_per_gpu;
        }
    return t;
}

namespace loom::coll {

namespace {
Launch barrier_launch(CollState& st, uint32_t hold_ns) {
    Launch l;
    l.header = "loom/kernels/collectives/coll_common.cuh";
    l.name = "loom::kernels::coll::coll_barrier";
    l.blocks = 1;
    l.threads = 32;
    l.params = base_params(st);
    l.params.hold_ns = hold_ns;
    return l;
}
}  // namespace

void launch_barrier(World& world, CollState& st, cudaStream_t stream, uint32_t hold_ns) {
    launch(world, barrier_launch(st, hold_ns), stream);
}

void prepare_barrier(CollState& st) {
    if (st.barrier_loaded) return;
    kernel_of(barrier_launch(st, 0));
    st.barrier_loaded = true;
}

void check_buffer(const char* op, const char* which, const BufferView& b) {
    LOOM_CHECK(b.count > 0, "{}: expected {} to hold at least one element, given count 0", op, which);
    LOOM_CHECK(b.data != nullptr, "{}: expected a device pointer for {}, given nullptr", op, which);
    const auto a = reinterpret_cast<std::uintptr_t>(b.data);
    LOOM_CHECK(a % static_cast<std::uintptr_t>(dtype_size(b.dtype)) == 0,
               "{}: expected {} aligned to its element size ({} bytes for {}), given address {}", op, which,
               dtype_size(b.dtype), dtype_name(b.dtype), b.data);
}

void check_same_dtype(const char* op, const BufferView& in, const BufferView& out) {
    LOOM_CHECK(in.dtype == out.dtype, "{}: expected in and out of the same dtype, given in {} and out {}", op,
               dtype_name(in.dtype), dtype_name(out.dtype));
}

void check_float_dtype(const char* op, const BufferView& b) {
    LOOM_CHECK(b.dtype == DType::F32 || b.dtype == DType::F16 || b.dtype == DType::BF16,
               "{}: expected dtype f32, f16 or bf16, given {}", op, dtype_name(b.dtype));
}

void check_symmetric(const char* op, const char* algo, const char* which, World& world, const BufferView& b) {
    LOOM_CHECK(world.is_symmetric(b.data, b.bytes()),
               "{}: {} ({}, {} bytes) is not in the symmetric heap; the {} algorithm needs it there: allocate it "
               "with world.alloc",
               op, which, b.data, b.bytes(), algo);
}

bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) {
    const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
    return x < y + bn && y < x + an;
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
