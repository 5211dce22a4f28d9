#include "ops/collectives/hier/hier.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "loom/jit/jit.hpp"
#include "loom/kernels/collectives/coll_params.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/profile.hpp"
#include "ops/collectives/coll_check.hpp"
#include "ops/collectives/coll_launch.hpp"
#include "ops/collectives/coll_state.hpp"
#include "runtime/remote_kernels.hpp"
#include "runtime/symmetric_zeroed.hpp"

namespace loom::coll::hier {

using kernels::coll::HierParams;
using kernels::coll::kHierMaxBlocks;

namespace {

constexpr const char* kHeader = "loom/kernels/collectives/hier.cuh";
constexpr int kThreads = 512;

// One kernel of an op's sequence: its name in kernels/collectives/hier.cuh, template arguments, and blocks (0: the
// op's).
struct Kernel {
    const char* name;
    std::vector<std::string> targs;
    int blocks = 0;
};

// Loads the kernels (compiled with remote peers: nvcc, linked with NVSHMEM's device library; detail::load_kernel: the
// first load of each meets every rank on the host); launch() then launches them in order on `stream`.
std::vector<const jit::Kernel*> load(World& world, State& st, const std::vector<Kernel>& ks) {
    std::vector<const jit::Kernel*> loaded;
    for (const Kernel& k : ks) {
        std::string key = k.name;
        for (const std::string& a : k.targs) key += "," + a;
        // While the profiler is on jit::get_kernel gives the profiled instantiation: another kernel, another slot.
        if (profile::enabled()) key += ",profiled";
        const jit::Kernel*& slot = st.kernels[key];
        if (!slot) {
            jit::KernelSpec spec;
            spec.header = kHeader;
            spec.name = std::string("loom::kernels::coll::") + k.name;
            spec.template_args = k.targs;
            spec.remote_peers = true;
            slot = &detail::load_kernel(world, spec);
        }
        loaded.push_back(slot);
    }
    return loaded;
}

void launch(World& world, State& st, const std::vector<Kernel>& ks, int blocks, const HierParams& p,
            cudaStream_t stream) {
    const std::vector<const jit::Kernel*> loaded = load(world, st, ks);
    jit::LaunchConfig cfg;
    cfg.block = dim3(kThreads);
    cfg.stream = stream;
    const Ctx ctx = world.ctx();
    for (std::size_t i = 0; i < ks.size(); ++i) {
        cfg.grid = dim3(static_cast<unsigned>(ks[i].blocks > 0 ? ks[i].blocks : blocks));
        (*loaded[i])(cfg, ctx, p);
    }
}

// Blocks for `bytes` moved per peer: one per 256 KiB, at least 1, at most kHierMaxBlocks and the num_sms option. A
// function of the call's counts and options only: the same on every rank (block b pairs with block b of each peer).
int blocks_for(std::size_t bytes, const CollOptions& opts) {
    LOOM_CHECK(opts.num_sms >= 0, "CollOptions::num_sms: expected >= 0, given {}", opts.num_sms);
    std::size_t n = (bytes + (std::size_t(256) << 10) - 1) / (std::size_t(256) << 10);
    int cap = kHierMaxBlocks;
    if (opts.num_sms > 0) cap = std::min(cap, opts.num_sms);
    return static_cast<int>(std::clamp<std::size_t>(n, 1, static_cast<std::size_t>(cap)));
}

// The options a World of several nodes takes: the hierarchical form is the only algorithm, over ld/st and NVSHMEM.
void check_options(const char* op, const CollOptions& opts) {
    LOOM_CHECK(opts.algo == CollAlgo::Auto,
               "{}: expected CollOptions::algo auto in a World of several nodes (the hierarchical form is the only "
               "algorithm there), given {}",
               op, loom::to_string(opts.algo));
    LOOM_CHECK(opts.path == DataPath::Auto || opts.path == DataPath::LdSt,
               "{}: expected CollOptions::path auto or ldst in a World of several nodes (node peers by load/store, "
               "other nodes through NVSHMEM), given {}",
               op, loom::to_string(opts.path));
}

HierParams base(State& s) {
    HierParams p{};
    p.epoch = s.epoch;
    p.sig = s.sig;
    return p;
}

// The collective scratch (coll::Scratch), checked to hold `need` bytes.
char* scratch(World& world, const char* op, std::size_t need, const char* what) {
    Scratch& s = world.state<Scratch>();
    LOOM_CHECK(need <= s.bytes,
               "{}: in a World of several nodes the call needs {} bytes of the collective scratch ({}), which holds {} "
               "(WorldOptions::coll_scratch): split the call or raise it",
               op, need, what, s.bytes);
    return s.data;
}

std::string reduce_template(ReduceOp op) {
    return std::to_string(op == ReduceOp::Max ? kernels::coll::kOpMax : kernels::coll::kOpSum);
}

bool runs_intra(Steps s) { return s != Steps::Inter; }
bool runs_inter(Steps s) { return s != Steps::Intra; }

}  // namespace

const char* to_string(Steps s) {
    switch (s) {
        case Steps::All:
            return "all";
        case Steps::Intra:
            return "intra";
        case Steps::Inter:
            return "inter";
    }
    return "?";
}

State::State(World& world) {
    LOOM_CHECK(world.local_world_size() <= kMaxLocalPeers, "collectives: expected at most {} ranks per node, given {}",
               kMaxLocalPeers, world.local_world_size());
    const std::size_t W = static_cast<std::size_t>(world.world_size());
    const std::size_t n = std::size_t(kHierMaxBlocks) * (1 + W) + W * W;
    epoch = detail::alloc_zeroed<std::uint64_t>(world, n);
    sig = epoch + kHierMaxBlocks;
    counts = reinterpret_cast<std::int64_t*>(sig + std::size_t(kHierMaxBlocks) * W);
}

void State::release(World& world) { world.free(epoch); }

BesideState::BesideState(World& world) {
    const std::size_t n = std::size_t(kHierMaxBlocks) * (1 + static_cast<std::size_t>(world.world_size()));
    epoch = detail::alloc_zeroed<std::uint64_t>(world, n);
    sig = epoch + kHierMaxBlocks;
}

void BesideState::release(World& world) { world.free(epoch); }

void all_gather(World& world, const BufferView& in, const BufferView& out, const CollOptions& opts, cudaStream_t stream,
                Steps steps) {
    const char* op = "all_gather";
    check_options(op, opts);
    coll::check_symmetric(op, "hierarchical", "out", world, out);
    State& st = coll::state<State>(world, stream, op);
    HierParams p = base(st);
    p.in = in.data;
    p.out = out.data;
    p.count = in.bytes();
    const int blocks = blocks_for(p.count, opts);
    std::vector<Kernel> ks;
    if (runs_inter(steps)) ks.push_back({"hier_all_gather_inter", {}});
    if (runs_intra(steps)) ks.push_back({"hier_all_gather_intra", {}});
    launch(world, st, ks, blocks, p, stream);
}

namespace {
const std::vector<Kernel> kAllGather = {{"hier_all_gather_inter", {}}, {"hier_all_gather_intra", {}}};
}  // namespace

void prepare_all_gather(World& world, cudaStream_t stream) {
    (void)load(world, coll::state<State>(world, stream, "all_gather"), kAllGather);
}

void all_gather_other_nodes(World& world, const BufferView& in, const BufferView& out, int num_sms,
                            cudaStream_t stream) {
    const char* op = "all_gather";
    LOOM_CHECK(out.count == in.count * static_cast<std::size_t>(world.world_size()) && out.dtype == in.dtype,
               "{}: internal: out of {} elements for {} ranks of {}", op, out.count, world.world_size(), in.count);
    coll::check_symmetric(op, "hierarchical", "out", world, out);
    State& st = coll::state<State>(world, stream, op);
    HierParams p = base(st);
    p.in = in.data;
    p.out = out.data;
    p.count = in.bytes();
    p.node_subset = kernels::coll::kHierNodesOther;
    CollOptions opts;
    opts.num_sms = num_sms;
    launch(world, st, kAllGather, blocks_for(p.count, opts), p, stream);
}

void reduce_scatter(World& world, const BufferView& in, const BufferView& out, const CollOptions& opts,
                    cudaStream_t stream, Steps steps) {
    const char* op = "reduce_scatter";
    check_options(op, opts);
    coll::check_symmetric(op, "hierarchical", "in", world, in);
    const std::size_t N = static_cast<std::size_t>(world.num_nodes());
    State& st = coll::state<State>(world, stream, op);
    HierParams p = base(st);
    p.in = in.data;
    p.out = out.data;
    p.count = out.count;
    p.stride = out.count;
    p.scratch = scratch(world, op, 2 * N * out.bytes(), "2 x nodes x out.count elements");
    const int blocks = blocks_for(out.bytes(), opts);
    const std::vector<std::string> t = {cuda_type(in.dtype), reduce_template(opts.op)};
    std::vector<Kernel> ks;
    if (runs_intra(steps)) ks.push_back({"hier_reduce_scatter_intra", t});
    if (runs_inter(steps)) ks.push_back({"hier_reduce_scatter_inter", t});
    launch(world, st, ks, blocks, p, stream);
}

namespace {

std::vector<Kernel> reduce_scatter_kernels(DType t) {
    const std::vector<std::string> targs = {cuda_type(t), reduce_template(ReduceOp::Sum)};
    return {{"hier_reduce_scatter_intra", targs}, {"hier_reduce_scatter_inter", targs}};
}

}  // namespace

void prepare_reduce_scatter(World& world, const BufferView& in, const BufferView& out, cudaStream_t stream) {
    const char* op = "reduce_scatter";
    coll::check_symmetric(op, "hierarchical", "in", world, in);
    (void)scratch(world, op, 2 * static_cast<std::size_t>(world.num_nodes()) * out.bytes(),
                  "2 x nodes x out.count elements");
    (void)coll::state<BesideState>(world, stream, op);
    (void)load(world, coll::state<State>(world, stream, op), reduce_scatter_kernels(in.dtype));
}

void reduce_scatter_part(World& world, const BufferView& in, const BufferView& out, RsPart part, cudaStream_t stream) {
    const char* op = "reduce_scatter";
    State& st = coll::state<State>(world, stream, op);
    HierParams p{};
    if (part == RsPart::OtherNodes) {
        p = base(st);
    } else {
        const BesideState& b = coll::state<BesideState>(world, stream, op);
        p.epoch = b.epoch;
        p.sig = b.sig;
    }
    p.in = in.data;
    p.out = out.data;
    p.count = out.count;
    p.stride = out.count;
    p.scratch = scratch(world, op, 2 * static_cast<std::size_t>(world.num_nodes()) * out.bytes(),
                        "2 x nodes x out.count elements");
    const std::vector<Kernel> ks = reduce_scatter_kernels(in.dtype);
    std::vector<Kernel> run;
    if (part == RsPart::OtherNodes) {
        p.node_subset = kernels::coll::kHierNodesOther;
        p.inter_part = kernels::coll::kHierInterExchange;
        run = ks;
    } else if (part == RsPart::OwnNode) {
        p.node_subset = kernels::coll::kHierNodesOwn;
        run = {ks[0]};
    } else {
        p.inter_part = kernels::coll::kHierInterCombine;
        run = {ks[1]};
    }
    launch(world, st, run, blocks_for(out.bytes(), CollOptions{}), p, stream);
}

void all_reduce(World& world, const BufferView& in, const BufferView& out, const CollOptions& opts, cudaStream_t stream,
                Steps steps) {
    const char* op = "all_reduce";
    check_options(op, opts);
    coll::check_symmetric(op, "hierarchical", "in", world, in);
    coll::check_symmetric(op, "hierarchical", "out", world, out);
    const std::size_t N = static_cast<std::size_t>(world.num_nodes());
    const std::size_t L = static_cast<std::size_t>(world.local_world_size());
    // Range l of L (local rank l's), 16-byte aligned so that each range starts on a vector.
    const std::size_t es = static_cast<std::size_t>(dtype_size(in.dtype)), vec = 16 / es;
    const std::size_t S = ((in.count + L - 1) / L + vec - 1) / vec * vec;
    State& st = coll::state<State>(world, stream, op);
    HierParams p = base(st);
    p.in = in.data;
    p.out = out.data;
    p.count = in.count;
    p.stride = S;
    p.scratch = scratch(world, op, (N + 1) * S * es, "(nodes + 1) x ceil(count / ranks per node) elements");
    const int blocks = blocks_for(S * es, opts);
    const std::string T = cuda_type(in.dtype);
    const std::vector<std::string> t = {T, reduce_template(opts.op)};
    std::vector<Kernel> ks;
    if (runs_intra(steps)) ks.push_back({"hier_all_reduce_intra", t});
    if (runs_inter(steps)) ks.push_back({"hier_all_reduce_inter", t});
    if (runs_intra(steps)) ks.push_back({"hier_all_reduce_gather", {T}});
    launch(world, st, ks, blocks, p, stream);
}

void all_to_all(World& world, const BufferView& in, const BufferView& out, const CollOptions& opts, cudaStream_t stream,
                Steps steps) {
    const char* op = "all_to_all";
    check_options(op, opts);
    coll::check_symmetric(op, "hierarchical", "in", world, in);
    coll::check_symmetric(op, "hierarchical", "out", world, out);
    State& st = coll::state<State>(world, stream, op);
    HierParams p = base(st);
    p.in = in.data;
    p.out = out.data;
    p.count = in.bytes() / static_cast<std::size_t>(world.world_size());
    const int blocks = blocks_for(p.count, opts);
    std::vector<Kernel> ks;
    if (runs_intra(steps)) ks.push_back({"hier_all_to_all_intra", {}});
    if (runs_inter(steps)) ks.push_back({"hier_all_to_all_inter", {}});
    launch(world, st, ks, blocks, p, stream);
}

void check_all_to_all_v(World& world, const BufferView& in, const BufferView& out, const CollOptions& opts) {
    const char* op = "all_to_all_v";
    check_options(op, opts);
    coll::check_symmetric(op, "hierarchical", "in", world, in);
    coll::check_symmetric(op, "hierarchical", "out", world, out);
}

void all_to_all_v(World& world, const BufferView& in, const BufferView& out, const int64_t* send_counts,
                  const int64_t* send_offsets, int64_t* recv_counts, const CollOptions& opts, cudaStream_t stream) {
    const char* op = "all_to_all_v";
    check_all_to_all_v(world, in, out, opts);
    State& st = coll::state<State>(world, stream, op);
    HierParams p = base(st);
    p.in = in.data;
    p.out = out.data;
    p.count = out.count;
    p.send_counts = send_counts;
    p.send_offsets = send_offsets;
    p.recv_counts = recv_counts;
    p.counts = st.counts;
    p.in_count = in.count;
    p.elem_bytes = dtype_size(in.dtype);
    // The counts are on the device: the grid follows the capacity per rank (an upper bound of each block), the same on
    // every rank.
    const int blocks = blocks_for(out.bytes() / static_cast<std::size_t>(world.world_size()), opts);
    launch(world, st, {{"hier_all_to_all_v_counts", {}, 1}, {"hier_all_to_all_v_data", {}}}, blocks, p, stream);
}

}  // namespace loom::coll::hier
