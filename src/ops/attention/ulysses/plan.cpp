// The Ulysses ops' planning: head layout, algorithm choice, chunks, the fused GEMM's config, the kernels' parameters.
#include <algorithm>

#include "loom/runtime/error.hpp"
#include "ops/attention/ulysses/ulysses.hpp"
#include "ops/overlap/common/checks.hpp"

namespace loom {

const char* to_string(UlyssesAlgo a) {
    switch (a) {
        case UlyssesAlgo::Auto:
            return "Auto";
        case UlyssesAlgo::Fused:
            return "Fused";
        case UlyssesAlgo::Sequential:
            return "Sequential";
    }
    return "?";
}

void release_ulysses_state(World& world) { world.release_states("attention/ulysses/"); }

}  // namespace loom

namespace loom::ulysses {

QkvLayout qkv_layout(const char* op, int world, const UlyssesHeads& h) {
    LOOM_CHECK(world >= 1, "{}: expected a world of >= 1 ranks, given {}", op, world);
    LOOM_CHECK(h.q > 0 && h.kv > 0 && h.dim > 0, "{}: expected heads.q, heads.kv, heads.dim > 0, given {}, {}, {}", op,
               h.q, h.kv, h.dim);
    LOOM_CHECK(h.dim % 8 == 0, "{}: expected heads.dim a multiple of 8 (16-byte rows), given {}", op, h.dim);
    LOOM_CHECK(h.q % h.kv == 0, "{}: expected heads.kv dividing heads.q (query groups), given q {} kv {}", op, h.q,
               h.kv);
    LOOM_CHECK(h.q % world == 0, "{}: expected the {} ranks to divide heads.q, given {} query heads", op, world, h.q);
    LOOM_CHECK(h.kv % world == 0 || world % h.kv == 0,
               "{}: expected heads.kv a multiple of the {} ranks (each its own kv heads) or a divisor of it (each "
               "rank the kv head of its query heads, replicated), given {} kv heads",
               op, world, h.kv);
    QkvLayout l;
    l.world = world;
    l.hq = h.q;
    l.hkv = h.kv;
    l.d = h.dim;
    l.hq_loc = h.q / world;
    l.hkv_loc = kernels::attention::ulysses_kv_count(h.kv, world);
    return l;
}

UlyssesAlgo choose_algo(UlyssesAlgo requested, int world, bool shared_gpu) {
    if (requested != UlyssesAlgo::Auto) return requested;
    return world > 1 && !shared_gpu ? UlyssesAlgo::Fused : UlyssesAlgo::Sequential;
}

int32_t o_chunks(const char* op, int64_t rows_per_rank) {
    const int64_t chunks = (rows_per_rank + kChunkRows - 1) / kChunkRows;
    LOOM_CHECK(chunks <= kernels::attention::kUlyssesMaxChunks,
               "{}: expected at most {} rows per rank ({} chunks of {}), given S / W = {}", op,
               int64_t(kernels::attention::kUlyssesMaxChunks) * kChunkRows, kernels::attention::kUlyssesMaxChunks,
               kChunkRows, rows_per_rank);
    return static_cast<int32_t>(chunks);
}

OverlapPlan fused_plan(const char* op, int64_t m, int64_t n, int64_t k, DType in, int arch, int num_sms, int comm_sms,
                       const GemmConfig* config) {
    OverlapPlan plan;
    plan.comm_blocks = overlap::comm_blocks(comm_sms, kDefaultCommBlocks, num_sms);
    plan.gemm = overlap::gemm_config(m, n, k, arch, num_sms - plan.comm_blocks, false, in);
    overlap::use_config(op, plan, config, m, n, num_sms, in);
    overlap::check_tile_count(op, m, n, plan.gemm);
    return plan;
}

kernels::attention::UlyssesQkvParams qkv_params(const QkvCall& x, QkvState& st) {
    const int64_t es = dtype_size(x.dtype);
    const QkvLayout& l = x.layout;
    kernels::attention::UlyssesQkvParams p{};
    const int64_t cols[3] = {l.q_col(x.me), l.k_col(x.me), l.v_col(x.me)};
    const int64_t widths[3] = {l.q_width(), l.kv_width(), l.kv_width()};
    for (int s = 0; s < 3; ++s) {
        p.out[s] = static_cast<uint8_t*>(x.out[s].data);
        p.out_ld_bytes[s] = x.out[s].stride() * es;
        p.col_bytes[s] = cols[s] * es;
        p.width_bytes[s] = widths[s] * es;
    }
    p.row_bytes = l.cols() * es;
    p.sig = st.sig.p;
    p.rows_per_rank = static_cast<int32_t>(x.R);
    return p;
}

kernels::attention::UlyssesOParams o_params(const OCall& x, OState& st) {
    const int64_t es = dtype_size(x.dtype);
    kernels::attention::UlyssesOParams p{};
    p.o = static_cast<const uint8_t*>(x.o.data);
    p.sig = st.sig.p;
    p.o_ld_bytes = x.o.stride() * es;
    p.width_bytes = x.width * es;
    p.rows_per_rank = static_cast<int32_t>(x.R);
    p.chunk_rows = static_cast<int32_t>(kChunkRows);
    p.num_chunks = x.chunks;
    return p;
}

}  // namespace loom::ulysses
