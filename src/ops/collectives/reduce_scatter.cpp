// Host launcher of include/loom/kernels/collectives/reduce_scatter.cuh: validate, choose, launch.
#include "loom/runtime/error.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "ops/collectives/coll_state.hpp"

namespace loom {

namespace {

// Scatter through the copy engine, reduce locally, in rounds (no SM moves data between GPUs). After an entry barrier
// (every peer finished its earlier calls, so every scratch buffer is free), round k of the call pushes, for every
// peer d, elements [off, off + n) of in's chunk d into slot `me` of buffer k % 2 of d's scratch (cudaMemcpyAsync on
// side stream d; from round 2 on after d freed that buffer: freed[d] >= k - 1) and raises ready[me] = k + 1 at d;
// the caller's stream waits for ready[q] >= k + 1 from every peer, reduces the round into out[off, off + n)
// (reduce_scatter_ce_reduce) and, where a later round of the call refills the buffer, raises freed[me] = k + 1 at
// every peer. Two buffers, so the pushes of round k + 1 run under the reduce of round k. At the end the stream
// resets this rank's ready and freed to 0: every write a peer makes to them in this call was waited for, and the
// peers' next writes follow the next call's entry barrier. The values depend only on the round within the call, so
// a captured graph replays correctly (CollState::ce_sig). Any in and out; only the scratch is symmetric.
void reduce_scatter_copy_engine(World& world, coll::CollState& st, const BufferView& in, const BufferView& out,
                                cudaStream_t stream, const CollOptions& opts) {
    const int W = world.world_size(), me = world.rank();
    const std::size_t es = dtype_size(in.dtype), S = out.count;
    std::size_t C = st.scratch_bytes / (2 * static_cast<std::size_t>(W) * es) / 16 * 16;  // per slot per buffer
    if (C > S) C = S;
    std::uint64_t* const ready = st.ce_sig;
    std::uint64_t* const freed = st.ce_sig + kMaxLocalPeers;
    const char* const src = static_cast<const char*>(in.data);
    char* const dst = static_cast<char*>(out.data);
    // Entry barrier: every peer finished its earlier collectives, whose kernels may still have used the scratch.
    coll::launch_barrier(world, st, stream);
    coll::ce_fork(st, stream, static_cast<std::size_t>(W - 1));
    coll::Launch l;
    l.header = "loom/kernels/collectives/reduce_scatter.cuh";
    l.name = "loom::kernels::coll::reduce_scatter_ce_reduce";
    l.template_args = {coll::cuda_type(in.dtype), opts.op == ReduceOp::Max ? "1" : "0"};
    l.params = coll::base_params(st);
    l.params.round_elems = C;
    const std::size_t rounds = (S + C - 1) / C;
    for (std::size_t k = 0; k < rounds; ++k) {
        const std::size_t off = k * C, n = S - off < C ? S - off : C;
        char* const buf = st.scratch + (k % 2) * static_cast<std::size_t>(W) * C * es;
        for (int i = 1; i < W; ++i) {
            const int d = (me + i) % W;
            cudaStream_t side = coll::ce_stream(st, i - 1);
            if (k >= 2) stream_ops::wait_value(side, &freed[d], k - 1);
            stream_ops::put_ce(world, buf + static_cast<std::size_t>(me) * C * es, src + (d * S + off) * es, n * es, d,
                               side);
            stream_ops::signal_ce(world, &ready[me], k + 1, d, side);
        }
        for (int q = 0; q < W; ++q)
            if (q != me) stream_ops::wait_value(stream, &ready[q], k + 1);
        l.params.in = src + (me * S + off) * es;
        l.params.out = dst + off * es;
        l.params.count = n;
        l.params.scratch = buf;
        l.blocks = coll::pick_blocks(n * es * W, 256 * 1024, 64, opts, st);
        coll::launch(world, l, stream);
        if (k + 2 < rounds)
            for (int d = 0; d < W; ++d)
                if (d != me) stream_ops::signal_ce(world, &freed[me], k + 1, d, stream);
    }
    // Join the side streams (their last waits on freed are in stream order before the reset), then reset.
    coll::ce_join(st, stream, static_cast<std::size_t>(W - 1));
    LOOM_CHECK_CUDA(cudaMemsetAsync(ready, 0, 2 * kMaxLocalPeers * sizeof(std::uint64_t), stream));  // ready, freed
}

}  // namespace

void reduce_scatter(World& world, BufferView in, BufferView out, cudaStream_t stream, const CollOptions& opts) {
    const char* op = "reduce_scatter";
    coll::CollState& st = coll::coll_state(world);
    const coll::PlanKey key = coll::plan_key(CollKind::ReduceScatter, in, out, opts);
    if (coll::launch_cached(st, key, stream)) return;  // this exact call was validated and resolved before
    coll::check_buffer(op, "in", in);
    coll::check_buffer(op, "out", out);
    coll::check_same_dtype(op, in, out);
    coll::check_float_dtype(op, in);
    const int W = world.world_size(), me = world.rank();
    LOOM_CHECK(in.count % static_cast<std::size_t>(W) == 0,
               "{}: expected in.count divisible by the world size {}, given {}", op, W, in.count);
    LOOM_CHECK(out.count == in.count / W, "{}: expected out.count == in.count / world size = {} / {} = {}, given {}",
               op, in.count, W, in.count / W, out.count);
    const std::size_t es = dtype_size(in.dtype);
    char* const my_chunk = static_cast<char*>(in.data) + me * out.count * es;
    LOOM_CHECK(out.data == my_chunk || !coll::overlaps(in.data, in.bytes(), out.data, out.bytes()),
               "{}: out overlaps in but is not in's chunk of this rank (in-place needs out == in + rank x out.count)",
               op);
    const bool in_sym = world.is_symmetric(in.data, in.bytes()), out_sym = world.is_symmetric(out.data, out.bytes());
    const CollChoice c = coll::resolve(CollKind::ReduceScatter, out.bytes(), world, st, opts, in_sym, out_sym);
    if (c.algo == CollAlgo::Scatter && c.path == DataPath::CopyEngine) {
        reduce_scatter_copy_engine(world, st, in, out, stream, opts);
        return;
    }
    coll::Launch l;
    l.header = "loom/kernels/collectives/reduce_scatter.cuh";
    l.params = coll::base_params(st);
    l.params.in = in.data;
    l.params.out = out.data;
    l.params.count = out.count;
    const std::string T = coll::cuda_type(in.dtype), kop = opts.op == ReduceOp::Max ? "1" : "0";
    if (c.algo == CollAlgo::LL) {
        l.template_args = {T, kop};
        coll::setup_ll(l, op, out.bytes(), opts, st);
    } else if (c.algo == CollAlgo::Pull) {
        coll::check_symmetric(op, "pull", "in", world, in);
        l.name = "loom::kernels::coll::reduce_scatter_pull";
        // Ranks sharing a GPU: the grid sweeps the chunks together (kernels/coll_common.cuh: thread_share), with two
        // vectors in flight per source and the world size compiled in (its pointers only in registers).
        l.template_args = {T, kop};
        if (st.topo.shared_gpu) {
            l.template_args.push_back(std::to_string(kernels::coll::kDepthGrid));
            l.template_args.push_back(std::to_string(W));
            l.params.flags |= kernels::coll::kFlagGridStride;
        }
        l.blocks = coll::pick_blocks(out.bytes() * W, 128 * 1024, coll::grid_stride_block_cap(st, 64, false), opts, st);
    } else if (c.algo == CollAlgo::Scatter) {
        LOOM_CHECK(out.data != my_chunk,
                   "{}: the scatter algorithm is not in-place (out == in + rank x out.count): use pull with a "
                   "symmetric in",
                   op);
        l.name = "loom::kernels::coll::reduce_scatter_scatter";
        l.template_args = {T, kop, std::to_string(coll::path_arg(c.path))};
        // Rounds of C elements per peer: W x C fits the scratch; C a multiple of 16 bytes.
        std::size_t C = st.scratch_bytes / (W * es);
        C = C / 16 * 16;
        if (C > out.count) C = out.count;
        l.params.round_elems = C;
        if (c.path == DataPath::Tma) l.smem = coll::tma_staging(l.params);
        l.blocks = coll::pick_blocks(C * es * W, 128 * 1024, 64, opts, st);
    } else if (c.algo == CollAlgo::Ring) {
        l.name = "loom::kernels::coll::reduce_scatter_ring";
        l.template_args = {T, kop};
        // Rounds of C elements: W-1 slots of C fit the scratch; C a multiple of 16 elements.
        std::size_t C = st.scratch_bytes / (static_cast<std::size_t>(W > 1 ? W - 1 : 1) * es);
        C = C / 16 * 16;
        if (C > out.count) C = out.count;
        l.params.round_elems = C;
        // Each block moves its share of one chunk per step: W-1 sequential steps, so fewer bytes per block.
        l.blocks = coll::pick_blocks(C * es, 64 * 1024, 64, opts, st);
    } else {
        LOOM_FAIL("{}: the {} algorithm is not offered", op, to_string(c.algo));
    }
    coll::launch(world, st, key, l, stream);
}

}  // namespace loom
