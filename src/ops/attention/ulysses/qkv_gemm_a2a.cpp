// loom::qkv_gemm_a2a: the QKV projection of a sequence shard, then heads <-> sequence (ulysses.hpp: the algorithms;
// qkv_fused.cpp, qkv_sequential.cpp).
#include <limits>
#include <string>
#include <utility>

#include "loom/ops/attention.hpp"
#include "loom/runtime/error.hpp"
#include "ops/attention/ulysses/ulysses.hpp"
#include "ops/overlap/common/state.hpp"
#include "runtime/call_agreement.hpp"
#include "runtime/nvtx_range.hpp"
#include "runtime/pointer_check.hpp"

namespace loom {
namespace {

constexpr const char* kOp = "qkv_gemm_a2a";

// Every argument on its own (no collective step): the heads, then x, w_qkv, q, k, v against them.
ulysses::QkvLayout check_args(World& world, const MatrixView& x, const MatrixView& w, const UlyssesHeads& heads,
                              const MatrixView& q, const MatrixView& k, const MatrixView& v, const UlyssesOptions& o) {
    ulysses::check_options(kOp, o);
    ulysses::check_world(world, kOp);
    const int W = world.world_size();
    const ulysses::QkvLayout l = ulysses::qkv_layout(kOp, W, heads);
    ulysses::check_input_dtype(kOp, "x", x.dtype);
    LOOM_CHECK(x.rows > 0 && x.cols > 0, "{}: expected a non-empty x [S / W, hidden], given [{}, {}]", kOp, x.rows,
               x.cols);
    LOOM_CHECK(x.cols % 8 == 0, "{}: expected hidden (x's columns) a multiple of 8, given {}", kOp, x.cols);
    LOOM_CHECK(x.rows <= std::numeric_limits<int32_t>::max() / W, "{}: expected S = {} ranks x {} rows to fit in int32",
               kOp, W, x.rows);
    const int64_t S = x.rows * W;
    ulysses::check_view(world, kOp, "x", x, x.dtype, x.rows, x.cols, "S / W rows, hidden");
    ulysses::check_view(world, kOp, "w_qkv", w, x.dtype, l.cols(), x.cols, "(Hq + 2 Hkv) x D rows, hidden");
    ulysses::check_view(world, kOp, "q", q, x.dtype, S, l.q_width(), "S = W x x's rows, Hq / W x D");
    ulysses::check_view(world, kOp, "k", k, x.dtype, S, l.kv_width(), "S = W x x's rows, max(Hkv / W, 1) x D");
    ulysses::check_view(world, kOp, "v", v, x.dtype, S, l.kv_width(), "S = W x x's rows, max(Hkv / W, 1) x D");
    // The GEMM still reads x and w_qkv while the all-to-all stores q, k and v (on every rank).
    const std::pair<const char*, const MatrixView*> outs[] = {{"q", &q}, {"k", &k}, {"v", &v}};
    for (std::size_t i = 0; i < 3; ++i) {
        detail::check_disjoint(kOp, outs[i].first, *outs[i].second, "x", x);
        detail::check_disjoint(kOp, outs[i].first, *outs[i].second, "w_qkv", w);
        for (std::size_t j = i + 1; j < 3; ++j)
            detail::check_disjoint(kOp, outs[i].first, *outs[i].second, outs[j].first, *outs[j].second);
    }
    return l;
}

detail::CallSignature signature(World& world, const MatrixView& x, const MatrixView& w, const UlyssesHeads& heads,
                                const UlyssesOptions& o) {
    detail::CallSignature s(kOp);
    s.add("x.rows", x.rows).add("x.cols", x.cols).add("x.dtype", detail::dtype_field(x.dtype));
    s.add("w_qkv.rows", w.rows).add("w_qkv.cols", w.cols).add("w_qkv.dtype", detail::dtype_field(w.dtype));
    s.add("heads.q", heads.q).add("heads.kv", heads.kv).add("heads.dim", heads.dim);
    s.add("UlyssesOptions::algo", to_string(o.algo))
        .add("UlyssesOptions::comm_sms", o.comm_sms)
        .add("UlyssesOptions::config", o.config ? o.config->str() : std::string("heuristic"))
        .add("UlyssesOptions::num_sms", o.num_sms);
    (void)world;
    return s;
}

}  // namespace

void qkv_gemm_a2a(World& world, const MatrixView& x, const MatrixView& w_qkv, const UlyssesHeads& heads,
                  const MatrixView& q, const MatrixView& k, const MatrixView& v, cudaStream_t stream,
                  const UlyssesOptions& o) {
    const detail::NvtxRange nvtx("loom::qkv_gemm_a2a S/W={} hidden={} Hq={} Hkv={} D={}", x.rows, x.cols, heads.q,
                                 heads.kv, heads.dim);
    const detail::AgreedCall agreed(
        world, [&] { return signature(world, x, w_qkv, heads, o); },
        [&] { (void)check_args(world, x, w_qkv, heads, q, k, v, o); });
    ulysses::check_not_capturing(kOp, stream);
    ulysses::QkvCall c;
    c.layout = check_args(world, x, w_qkv, heads, q, k, v, o);
    c.world = &world;
    c.stream = stream;
    c.W = world.world_size();
    c.me = world.local_rank();
    const overlap::DeviceFacts& dev = overlap::device_facts(world, kOp);
    c.arch = dev.arch;
    c.num_sms = overlap::plan_sms(dev, o.num_sms, kOp);
    c.dtype = x.dtype;
    c.R = x.rows;
    c.x = x;
    c.w = w_qkv;
    c.out[0] = q;
    c.out[1] = k;
    c.out[2] = v;
    c.algo = ulysses::choose_algo(o.algo, c.W, dev.shared_gpu);
    if (c.algo == UlyssesAlgo::Sequential) return ulysses::qkv_sequential(c);
    c.plan = ulysses::fused_plan(kOp, c.R, c.layout.cols(), x.cols, x.dtype, c.arch, c.num_sms, o.comm_sms, o.config);
    ulysses::qkv_fused(c);
}

}  // namespace loom
