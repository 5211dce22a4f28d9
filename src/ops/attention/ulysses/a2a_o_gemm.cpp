// loom::a2a_o_gemm: attention's output, sequence <-> heads, then the output projection (ulysses.hpp: the algorithms;
// o_fused.cpp, o_sequential.cpp).
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

constexpr const char* kOp = "a2a_o_gemm";

void check_args(World& world, const MatrixView& o, const MatrixView& w, const MatrixView& out,
                const UlyssesOptions& opt) {
    ulysses::check_options(kOp, opt);
    ulysses::check_world(world, kOp);
    const int W = world.world_size();
    ulysses::check_input_dtype(kOp, "o", o.dtype);
    LOOM_CHECK(o.rows > 0 && o.cols > 0, "{}: expected a non-empty o [S, Hq / W x D], given [{}, {}]", kOp, o.rows,
               o.cols);
    LOOM_CHECK(o.rows % W == 0, "{}: expected o's rows S a multiple of the {} ranks, given {}", kOp, W, o.rows);
    LOOM_CHECK(o.cols % 8 == 0, "{}: expected o's columns Hq / W x D a multiple of 8, given {}", kOp, o.cols);
    LOOM_CHECK(o.rows <= std::numeric_limits<int32_t>::max(), "{}: expected S to fit in int32, given {}", kOp, o.rows);
    ulysses::check_view(world, kOp, "o", o, o.dtype, o.rows, o.cols, "S, Hq / W x D");
    LOOM_CHECK(w.rows > 0 && w.rows % 8 == 0, "{}: expected w_o's rows (hidden) > 0 and a multiple of 8, given {}", kOp,
               w.rows);
    ulysses::check_view(world, kOp, "w_o", w, o.dtype, w.rows, W * o.cols, "hidden, Hq x D = W x o's columns");
    LOOM_CHECK(out.dtype == DType::BF16 || out.dtype == DType::F16 || out.dtype == DType::F32,
               "{}: expected out bf16, f16 or f32, given {}", kOp, dtype_name(out.dtype));
    ulysses::check_view(world, kOp, "out", out, out.dtype, o.rows / W, w.rows, "S / W, hidden = w_o's rows");
    // The all-to-all still reads o while the GEMM stores out's tiles.
    detail::check_disjoint(kOp, "out", out, "o", o);
    detail::check_disjoint(kOp, "out", out, "w_o", w);
}

detail::CallSignature signature(const MatrixView& o, const MatrixView& w, const MatrixView& out,
                                const UlyssesOptions& opt) {
    detail::CallSignature s(kOp);
    for (const auto& [name, m] : {std::pair<std::string, const MatrixView*>{"o", &o}, {"w_o", &w}, {"out", &out}})
        s.add(name + ".rows", m->rows).add(name + ".cols", m->cols).add(name + ".dtype", detail::dtype_field(m->dtype));
    s.add("UlyssesOptions::algo", to_string(opt.algo))
        .add("UlyssesOptions::comm_sms", opt.comm_sms)
        .add("UlyssesOptions::config", opt.config ? opt.config->str() : std::string("heuristic"))
        .add("UlyssesOptions::num_sms", opt.num_sms);
    return s;
}

}  // namespace

void a2a_o_gemm(World& world, const MatrixView& o, const MatrixView& w_o, const MatrixView& out, cudaStream_t stream,
                const UlyssesOptions& opt) {
    const detail::NvtxRange nvtx("loom::a2a_o_gemm S={} width={} hidden={}", o.rows, o.cols, w_o.rows);
    const detail::AgreedCall agreed(
        world, [&] { return signature(o, w_o, out, opt); }, [&] { check_args(world, o, w_o, out, opt); });
    ulysses::check_not_capturing(kOp, stream);
    check_args(world, o, w_o, out, opt);
    ulysses::OCall c;
    c.world = &world;
    c.stream = stream;
    c.W = world.world_size();
    c.me = world.local_rank();
    const overlap::DeviceFacts& dev = overlap::device_facts(world, kOp);
    c.arch = dev.arch;
    c.num_sms = overlap::plan_sms(dev, opt.num_sms, kOp);
    c.dtype = o.dtype;
    c.R = o.rows / c.W;
    c.o = o;
    c.w = w_o;
    c.out = out;
    c.width = o.cols;
    c.chunks = ulysses::o_chunks(kOp, c.R);
    c.algo = ulysses::choose_algo(opt.algo, c.W, dev.shared_gpu);
    if (c.algo == UlyssesAlgo::Sequential) return ulysses::o_sequential(c);
    c.plan = ulysses::fused_plan(kOp, c.R, w_o.rows, w_o.cols, o.dtype, c.arch, c.num_sms, opt.comm_sms, opt.config);
    ulysses::o_fused(c);
}

}  // namespace loom
