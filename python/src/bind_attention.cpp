// loom._C: the attention ops on DLPack tensors (docs/attention.md): decode_attention, sp_decode_attention and the
// Ulysses ops. Each binding converts its tensors (convert.hpp: ValueError on a wrong device, dtype, layout or shape),
// releases the GIL and calls the C++ op on the given stream.
#include <fmt/format.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <optional>
#include <string>

#include "bindings.hpp"
#include "convert.hpp"
#include "loom/ops/attention.hpp"
#include "world_handle.hpp"

namespace loom::py {

namespace nb = nanobind;
using nb::arg;
using OptArray = std::optional<AnyArray>;

namespace {

void expect_ndim(const AnyArray& t, std::size_t ndim, const char* op, const char* arg, const char* shape) {
    if (t.ndim() != ndim)
        value_error(fmt::format("{}: {} must be {}-D {}; given {} dimensions", op, arg, ndim, shape, t.ndim()));
}

void expect_dim(const AnyArray& t, std::size_t i, int64_t want, const char* op, const char* arg, const char* what) {
    if (static_cast<int64_t>(t.shape(i)) != want)
        value_error(fmt::format("{}: {} dimension {} must be {} = {}; given {}", op, arg, i, what, want, t.shape(i)));
}

// The decode ops' arguments as Loom's views: q [batch, heads, D]; k, v [batch, max_seq_len, kv heads, D] (no
// block_table) or [num_pages, page_size, kv heads, D]; seq_lens int32 [batch]; block_table int32 [batch, max_pages];
// o like q; lse fp32 [batch, heads] or None. Each tensor contiguous on the current CUDA device (ValueError otherwise).
struct DecodeArgs {
    DecodeQuery q;
    KvCache kv;
    void* o = nullptr;
    float* lse = nullptr;
};

DecodeArgs decode_args(const char* op, const AnyArray& q, const AnyArray& k, const AnyArray& v,
                       const AnyArray& seq_lens, const OptArray& block_table, const AnyArray& o, const OptArray& lse) {
    DecodeArgs a;
    const BufferView bq = as_buffer(q, op, "q");
    expect_ndim(q, 3, op, "q", "[batch, num_heads, head_dim]");
    a.q = DecodeQuery{bq.data, bq.dtype, static_cast<int>(q.shape(0)), static_cast<int>(q.shape(1)),
                      static_cast<int>(q.shape(2))};
    const BufferView bk = as_buffer(k, op, "k_cache", bq.dtype), bv = as_buffer(v, op, "v_cache", bq.dtype);
    expect_ndim(k, 4, op, "k_cache", "[batch or pages, tokens, num_kv_heads, head_dim]");
    expect_ndim(v, 4, op, "v_cache", "[batch or pages, tokens, num_kv_heads, head_dim]");
    for (std::size_t i = 0; i < 4; ++i) expect_dim(v, i, static_cast<int64_t>(k.shape(i)), op, "v_cache", "k_cache's");
    expect_dim(k, 3, a.q.head_dim, op, "k_cache", "q's head_dim");
    const BufferView bl = as_buffer(seq_lens, op, "seq_lens", DType::I32);
    expect_ndim(seq_lens, 1, op, "seq_lens", "[batch]");
    expect_dim(seq_lens, 0, a.q.batch, op, "seq_lens", "q's batch");
    a.kv.k = bk.data;
    a.kv.v = bv.data;
    a.kv.num_kv_heads = static_cast<int>(k.shape(2));
    a.kv.seq_lens = static_cast<const int32_t*>(bl.data);
    if (block_table) {
        const BufferView bt = as_buffer(*block_table, op, "block_table", DType::I32);
        expect_ndim(*block_table, 2, op, "block_table", "[batch, max_pages]");
        expect_dim(*block_table, 0, a.q.batch, op, "block_table", "q's batch");
        a.kv.block_table = static_cast<const int32_t*>(bt.data);
        a.kv.max_pages = static_cast<int>(block_table->shape(1));
        a.kv.num_pages = static_cast<int>(k.shape(0));
        a.kv.page_size = static_cast<int>(k.shape(1));
    } else {
        expect_dim(k, 0, a.q.batch, op, "k_cache (contiguous: no block_table)", "q's batch");
        a.kv.max_seq_len = static_cast<int64_t>(k.shape(1));
    }
    a.o = as_buffer(o, op, "out", bq.dtype).data;
    expect_ndim(o, 3, op, "out", "[batch, num_heads, head_dim]");
    for (std::size_t i = 0; i < 3; ++i) expect_dim(o, i, static_cast<int64_t>(q.shape(i)), op, "out", "q's");
    if (lse) {
        a.lse = static_cast<float*>(as_buffer(*lse, op, "lse", DType::F32).data);
        expect_ndim(*lse, 2, op, "lse", "[batch, num_heads]");
        expect_dim(*lse, 0, a.q.batch, op, "lse", "q's batch");
        expect_dim(*lse, 1, a.q.num_heads, op, "lse", "q's num_heads");
    }
    return a;
}

DecodeOptions decode_options(float scale, float softcap, int64_t max_seq_len, int num_splits) {
    DecodeOptions o;
    o.scale = scale;
    o.softcap = softcap;
    o.max_seq_len = max_seq_len;
    o.num_splits = num_splits;
    return o;
}

UlyssesOptions ulysses_options(UlyssesAlgo algo, int comm_sms, int num_sms) {
    UlyssesOptions o;
    o.algo = algo;
    o.comm_sms = comm_sms;
    o.num_sms = num_sms;
    return o;
}

void bind_decode(nb::module_& m) {
    m.def(
        "decode_attention",
        [](const AnyArray& q, const AnyArray& k, const AnyArray& v, const AnyArray& seq_lens,
           const OptArray& block_table, const AnyArray& o, const OptArray& lse, std::uintptr_t stream, float scale,
           float softcap, int64_t max_seq_len, int num_splits) {
            const DecodeArgs a = decode_args("decode_attention", q, k, v, seq_lens, block_table, o, lse);
            const DecodeOptions opts = decode_options(scale, softcap, max_seq_len, num_splits);
            nb::gil_scoped_release unlocked;
            decode_attention(a.q, a.kv, a.o, a.lse, as_stream(stream), opts);
        },
        arg("q"), arg("k_cache"), arg("v_cache"), arg("seq_lens"), arg("block_table").none(), arg("out"),
        arg("lse").none(), arg("stream"), arg("scale") = 0.f, arg("softcap") = 0.f, arg("max_seq_len") = 0,
        arg("num_splits") = 0);
    m.def(
        "sp_decode_attention",
        [](WorldHandle& h, const AnyArray& q, const AnyArray& k, const AnyArray& v, const AnyArray& seq_lens,
           const OptArray& block_table, const AnyArray& o, const OptArray& lse, std::uintptr_t stream, float scale,
           float softcap, int64_t max_seq_len, int num_splits) {
            const DecodeArgs a = decode_args("sp_decode_attention", q, k, v, seq_lens, block_table, o, lse);
            const DecodeOptions opts = decode_options(scale, softcap, max_seq_len, num_splits);
            nb::gil_scoped_release unlocked;
            sp_decode_attention(h.world, a.q, a.kv, a.o, a.lse, as_stream(stream), opts);
        },
        arg("world"), arg("q"), arg("k_cache"), arg("v_cache"), arg("seq_lens"), arg("block_table").none(), arg("out"),
        arg("lse").none(), arg("stream"), arg("scale") = 0.f, arg("softcap") = 0.f, arg("max_seq_len") = 0,
        arg("num_splits") = 0);
    m.def(
        "release_attention_state", [](WorldHandle& h) { release_attention_state(h.world); }, arg("world"));
}

}  // namespace

void bind_attention(nb::module_& m) {
    bind_decode(m);
    nb::enum_<UlyssesAlgo>(m, "UlyssesAlgo")
        .value("Auto", UlyssesAlgo::Auto)
        .value("Fused", UlyssesAlgo::Fused)
        .value("Sequential", UlyssesAlgo::Sequential);
    m.def(
        "qkv_gemm_a2a",
        [](WorldHandle& h, const AnyArray& x, const AnyArray& w, int64_t heads_q, int64_t heads_kv, int64_t head_dim,
           const AnyArray& q, const AnyArray& k, const AnyArray& v, std::uintptr_t stream, UlyssesAlgo algo,
           int comm_sms, int num_sms) {
            constexpr const char* op = "qkv_gemm_a2a";
            const MatrixView vx = as_matrix(x, op, "x"), vw = as_matrix(w, op, "w_qkv"), vq = as_matrix(q, op, "q"),
                             vk = as_matrix(k, op, "k"), vv = as_matrix(v, op, "v");
            const UlyssesOptions o = ulysses_options(algo, comm_sms, num_sms);
            nb::gil_scoped_release unlocked;
            qkv_gemm_a2a(h.world, vx, vw, UlyssesHeads{heads_q, heads_kv, head_dim}, vq, vk, vv, as_stream(stream), o);
        },
        arg("world"), arg("x"), arg("w_qkv"), arg("heads_q"), arg("heads_kv"), arg("head_dim"), arg("q"), arg("k"),
        arg("v"), arg("stream"), arg("algo") = UlyssesAlgo::Auto, arg("comm_sms") = 0, arg("num_sms") = 0);
    m.def(
        "a2a_o_gemm",
        [](WorldHandle& h, const AnyArray& o, const AnyArray& w, const AnyArray& out, std::uintptr_t stream,
           UlyssesAlgo algo, int comm_sms, int num_sms) {
            constexpr const char* op = "a2a_o_gemm";
            const MatrixView vo = as_matrix(o, op, "o"), vw = as_matrix(w, op, "w_o"), vout = as_matrix(out, op, "out");
            const UlyssesOptions opt = ulysses_options(algo, comm_sms, num_sms);
            nb::gil_scoped_release unlocked;
            a2a_o_gemm(h.world, vo, vw, vout, as_stream(stream), opt);
        },
        arg("world"), arg("o"), arg("w_o"), arg("out"), arg("stream"), arg("algo") = UlyssesAlgo::Auto,
        arg("comm_sms") = 0, arg("num_sms") = 0);
    m.def(
        "release_ulysses_state", [](WorldHandle& h) { release_ulysses_state(h.world); }, arg("world"));
}

}  // namespace loom::py
