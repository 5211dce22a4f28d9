// ag_gemm's direct producer (ranks sharing a GPU; AgDirectState: staging halves and signals). Per call e on every
// rank, on the stream:
//   stage kernel (kernels/overlap/ag_gemm.cuh ag_gemm_direct_stage: read_done[me] := e - 1 at every peer, wait
//   read_done[q] >= e - 2 of every peer q, copy the shard into staging half e % 2, chunk[me] += 1 per block at every
//   rank) ── GEMM (own rows from the shard; rank r's rows from r's half e % 2 through a_peer[r], after chunk[r] >= T).
#include <algorithm>
#include <cstring>

#include "loom/jit/jit.hpp"
#include "loom/runtime/tma.hpp"
#include "ops/overlap/ag_gemm/ag_gemm.hpp"
#include "ops/overlap/common/hooked_gemm.hpp"

namespace loom::overlap {

void ag_gemm_direct(const AgCall& x, kernels::overlap::AgGemmHookArgs h) {
    World& world = *x.world;
    AgDirectState& st = op_state<AgDirectState>(world, "ag_gemm");
    const int W = x.W;
    const std::size_t shard_bytes = x.chunk_bytes;
    const std::size_t half_stride = ensure_parity_halves(world, st.buf, shard_bytes);
    jit::KernelSpec spec;
    spec.header = kAgHeader;
    spec.name = "loom::kernels::overlap::ag_gemm_direct_stage";
    // Compiled before the counters advance (a JIT error leaves them as they were).
    const jit::Kernel& stage = jit::get_kernel(spec);
    const uint64_t epoch = ++st.calls;
    char* const staging = static_cast<char*>(st.buf.p) + (epoch % 2) * half_stride;
    auto* const sig = st.sig.p;
    // Blocks: ~256 KiB of the shard each, at most 32 (the same count on every rank: the GEMM's target).
    const auto blocks = static_cast<unsigned>(std::clamp<std::size_t>(shard_bytes >> 18, 1, 32));
    st.chunk_total += blocks;
    kernels::overlap::AgDirectParams p{x.a.data, staging, sig, shard_bytes, epoch};
    jit::LaunchConfig lc;
    lc.grid = dim3(blocks);
    lc.block = dim3(512);
    lc.stream = x.stream;
    stage(lc, world.ctx(), p);
    const GemmConfig& cfg = x.plan.gemm;
    h.direct = 1;
    h.world = W;
    for (int r = 0; r < W; ++r) {
        const CUtensorMap m =
            make_tma_2d(MatrixView{world.peer_ptr(staging, r), x.a.dtype, x.R, x.K, 0}, cfg.block_m, cfg.block_k);
        std::memcpy(&h.a_peer[r], &m, sizeof(m));
    }
    h.chunk = sig->chunk;
    h.target = st.chunk_total;
    // The gather map is never read (every tile is own or a peer's): a map of A's shape over A's address does.
    launch_gemm(kAgHooks, kAgHeader, MatrixView{x.a.data, x.a.dtype, x.R * W, x.K, 0}, x.b, x.c, cfg, x.num_sms,
                x.stream, h, x.sc, ScaleAt::Accumulators);
}

}  // namespace loom::overlap
