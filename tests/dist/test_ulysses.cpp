// Ulysses sequence parallelism (qkv_gemm_a2a, a2a_o_gemm) against an fp64 host reference on every rank: fresh random
// inputs per rank (every rank regenerates its peers' from their seeds), outputs poisoned with NaN, every element
// checked; both algorithms, GQA with Hkv >= W and Hkv < W (replicated kv heads), odd W where the heads allow, rows per
// rank not a multiple of the tile, 1000 back-to-back calls mixing the algorithms with inputs changing between calls,
// and bad inputs (raised on every rank, the World usable after). Run under loomrun at any rank count (ranks may
// share one GPU under MPS).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/device_io.hpp"
#include "common/reference.hpp"
#include "common/test_env.hpp"
#include "loom/ops/attention.hpp"
#include "loom/runtime/error.hpp"

namespace loom {
namespace {

std::uint64_t seed_of(int rank, int tc, int what) {
    return 0x9e3779b97f4a7c15ull * (rank + 1) + 1000003ull * tc + 7919ull * what + 31;
}

// bf16 values: the bytes for upload and the exact values for the reference.
struct HostMat {
    std::vector<std::uint16_t> raw;
    std::vector<double> val;
};
HostMat make_bf16(std::size_t n, std::uint64_t seed) {
    const auto f = test::random_floats(n, seed);
    HostMat m;
    m.raw.resize(n);
    m.val.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        m.raw[i] = test::float_to_bf16(f[i]);
        m.val[i] = test::bf16_to_float(m.raw[i]);
    }
    return m;
}

struct DevBuf {
    void* p = nullptr;
    explicit DevBuf(std::size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes < 256 ? 256 : bytes), cudaSuccess); }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
    ~DevBuf() { cudaFree(p); }
};
void upload(void* dst, const HostMat& m) { test::upload(dst, m.raw); }
// NaN in bf16 / f16 / f32, ordered after every earlier call and before the next (the calls' streams are
// non-blocking: a memset on the legacy stream is not ordered with them).
void poison(void* p, std::size_t bytes) {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemset(p, 0xFF, bytes), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}
// rows x cols of a bf16 matrix with row stride ld (elements).
std::vector<double> download(const void* src, int64_t rows, int64_t cols, int64_t ld) {
    std::vector<std::uint16_t> h(static_cast<std::size_t>(rows * ld));
    EXPECT_EQ(cudaMemcpy(h.data(), src, h.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<double> out(static_cast<std::size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = test::bf16_to_float(h[r * ld + c]);
    return out;
}

// got within |ref| sums' bf16 rounding (one rounding of the fp32 result) of want; "" or the first failures.
std::string compare(const char* what, const std::vector<double>& got, const std::vector<double>& want,
                    const std::vector<double>& mag, int64_t cols) {
    std::string s;
    int bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        const double tol = mag[i] * (1.0 / 128) + 1e-6;
        if (!(std::fabs(got[i] - want[i]) <= tol)) {
            if (++bad <= 5)
                s += std::string(what) + "[" + std::to_string(i / cols) + ", " + std::to_string(i % cols) + "]: got " +
                     std::to_string(got[i]) + " want " + std::to_string(want[i]) + "\n";
        }
    }
    if (bad) s += std::string(what) + ": " + std::to_string(bad) + " of " + std::to_string(got.size()) + " wrong\n";
    return s;
}

class Ulysses : public ::WorldStreamTest {
  protected:
    void TearDown() override {
        if (w && stream) release_ulysses_state(*w);
        WorldStreamTest::TearDown();
    }
};

// ---- qkv_gemm_a2a ------------------------------------------------------------------------------------------------

// One shape's inputs on this rank and its expected q, k, v.
struct QkvCase {
    int W, me;
    int64_t R, hidden;
    UlyssesHeads heads;
    int64_t hq_loc, hkv_loc, cols;
    int64_t q_col, k_col, v_col;  // this rank's slices
    HostMat x, w;                 // this rank's x, the shared weight
    std::vector<double> want[3], mag[3];
    DevBuf dx, dw, dq, dk, dv;
    QkvCase(int W_, int me_, int64_t R_, int64_t hidden_, UlyssesHeads h, int tc)
        : W(W_),
          me(me_),
          R(R_),
          hidden(hidden_),
          heads(h),
          hq_loc(h.q / W_),
          hkv_loc(h.kv >= W_ ? h.kv / W_ : 1),
          cols((h.q + 2 * h.kv) * h.dim),
          q_col(me_ * (h.q / W_) * h.dim),
          k_col((h.q + me_ * h.kv / W_) * h.dim),
          v_col((h.q + h.kv + me_ * h.kv / W_) * h.dim),
          x(make_bf16(static_cast<std::size_t>(R_ * hidden_), seed_of(me_, tc, 1))),
          w(make_bf16(static_cast<std::size_t>(cols * hidden_), seed_of(0, tc, 2))),
          dx(static_cast<std::size_t>(R_ * hidden_) * 2),
          dw(static_cast<std::size_t>(cols * hidden_) * 2),
          dq(static_cast<std::size_t>(W_ * R_ * hq_loc * h.dim) * 2),
          dk(static_cast<std::size_t>(W_ * R_ * hkv_loc * h.dim) * 2),
          dv(static_cast<std::size_t>(W_ * R_ * hkv_loc * h.dim) * 2) {
        upload(dx.p, x);
        upload(dw.p, w);
        reference(tc);
    }
    int64_t width(int s) const { return (s == 0 ? hq_loc : hkv_loc) * heads.dim; }
    void reference(int tc) {
        const int64_t first[3] = {q_col, k_col, v_col};
        for (int s = 0; s < 3; ++s) {
            want[s].assign(static_cast<std::size_t>(W * R * width(s)), 0.0);
            mag[s].assign(want[s].size(), 0.0);
        }
        for (int p = 0; p < W; ++p) {
            const HostMat xp = p == me ? x : make_bf16(static_cast<std::size_t>(R * hidden), seed_of(p, tc, 1));
            for (int s = 0; s < 3; ++s)
                for (int64_t i = 0; i < R; ++i)
                    for (int64_t c = 0; c < width(s); ++c) {
                        const double* a = &xp.val[i * hidden];
                        const double* b = &w.val[(first[s] + c) * hidden];
                        double sum = 0, abs = 0;
                        for (int64_t k = 0; k < hidden; ++k) {
                            sum += a[k] * b[k];
                            abs += std::fabs(a[k] * b[k]);
                        }
                        want[s][(p * R + i) * width(s) + c] = sum;
                        mag[s][(p * R + i) * width(s) + c] = abs;
                    }
        }
    }
    MatrixView view(int s) const {
        void* d = s == 0 ? dq.p : s == 1 ? dk.p : dv.p;
        return MatrixView{d, DType::BF16, W * R, width(s), 0};
    }
    void run(World& world, cudaStream_t stream, UlyssesAlgo algo) const {
        UlyssesOptions o;
        o.algo = algo;
        qkv_gemm_a2a(world, MatrixView{dx.p, DType::BF16, R, hidden, 0}, MatrixView{dw.p, DType::BF16, cols, hidden, 0},
                     heads, view(0), view(1), view(2), stream, o);
    }
    void poison_outputs() const {
        for (int s = 0; s < 3; ++s) poison(view(s).data, static_cast<std::size_t>(W * R * width(s)) * 2);
    }
    std::string check() const {
        std::string s;
        const char* names[3] = {"q", "k", "v"};
        for (int i = 0; i < 3; ++i)
            s += compare(names[i], download(view(i).data, W * R, width(i), width(i)), want[i], mag[i], width(i));
        return s;
    }
};

// Head counts for this world: GQA with Hkv >= W (Hkv = W) and Hkv < W (Hkv = 1: every rank one replicated kv head;
// Hkv = 2 where 2 divides W), with Hq = 2W query heads.
std::vector<UlyssesHeads> heads_for(int W) {
    std::vector<UlyssesHeads> v{{2 * W, W, 64}, {2 * W, 2 * W, 64}};
    if (W > 1) v.push_back({2 * W, 1, 64});
    if (W > 2 && W % 2 == 0) v.push_back({2 * W, 2, 64});
    return v;
}

TEST_F(Ulysses, QkvGemmA2aMatchesTheReference) {
    const int W = w->world_size(), me = w->rank();
    int tc = 0;
    for (const UlyssesHeads& h : heads_for(W))
        for (int64_t R : {200, 256, 77})  // 200, 77: not a multiple of the GEMM's 128-row tile
            for (UlyssesAlgo algo : {UlyssesAlgo::Fused, UlyssesAlgo::Sequential, UlyssesAlgo::Auto}) {
                QkvCase c(W, me, R, 256, h, ++tc);
                c.poison_outputs();
                c.run(*w, stream, algo);
                ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
                const std::string bad = test::agree(*w, c.check(), "ulysses_qkv_" + std::to_string(tc));
                ASSERT_EQ(bad, "") << "Hq " << h.q << " Hkv " << h.kv << " R " << R << " " << to_string(algo);
            }
}

// Strided outputs (row strides past the widths): the all-to-all writes only the slices' columns.
TEST_F(Ulysses, QkvGemmA2aWritesStridedOutputs) {
    const int W = w->world_size(), me = w->rank();
    const UlyssesHeads h{2 * W, W, 64};
    QkvCase c(W, me, 130, 128, h, 900);
    const int64_t pad = 24;
    DevBuf q(static_cast<std::size_t>(W * 130 * (c.width(0) + pad)) * 2),
        k(static_cast<std::size_t>(W * 130 * (c.width(1) + pad)) * 2),
        v(static_cast<std::size_t>(W * 130 * (c.width(2) + pad)) * 2);
    DevBuf* outs[3] = {&q, &k, &v};
    std::string bad;
    for (UlyssesAlgo algo : {UlyssesAlgo::Fused, UlyssesAlgo::Sequential}) {
        for (int s = 0; s < 3; ++s) poison(outs[s]->p, static_cast<std::size_t>(W * 130 * (c.width(s) + pad)) * 2);
        UlyssesOptions o;
        o.algo = algo;
        MatrixView mv[3];
        for (int s = 0; s < 3; ++s) mv[s] = MatrixView{outs[s]->p, DType::BF16, W * 130, c.width(s), c.width(s) + pad};
        qkv_gemm_a2a(*w, MatrixView{c.dx.p, DType::BF16, 130, 128, 0}, MatrixView{c.dw.p, DType::BF16, c.cols, 128, 0},
                     h, mv[0], mv[1], mv[2], stream, o);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        const char* names[3] = {"q", "k", "v"};
        for (int s = 0; s < 3; ++s) {
            const auto all = download(outs[s]->p, W * 130, c.width(s) + pad, c.width(s) + pad);
            std::vector<double> got;
            int pad_written = 0;
            for (int64_t r = 0; r < W * 130; ++r)
                for (int64_t col = 0; col < c.width(s) + pad; ++col) {
                    const double x = all[r * (c.width(s) + pad) + col];
                    if (col < c.width(s)) {
                        got.push_back(x);
                    } else if (!std::isnan(x)) {
                        ++pad_written;
                    }
                }
            bad += compare(names[s], got, c.want[s], c.mag[s], c.width(s));
            if (pad_written) bad += std::string(names[s]) + ": " + std::to_string(pad_written) + " padding written\n";
        }
    }
    ASSERT_EQ(test::agree(*w, bad, "ulysses_qkv_strided"), "");
}

// ---- a2a_o_gemm -------------------------------------------------------------------------------------------------

struct OCase {
    int W, me;
    int64_t R, width, hidden;
    HostMat o, wo;
    std::vector<double> want, mag;
    DevBuf d_o, d_w, d_out;
    OCase(int W_, int me_, int64_t R_, int64_t width_, int64_t hidden_, int tc)
        : W(W_),
          me(me_),
          R(R_),
          width(width_),
          hidden(hidden_),
          o(make_bf16(static_cast<std::size_t>(W_ * R_ * width_), seed_of(me_, tc, 3))),
          wo(make_bf16(static_cast<std::size_t>(hidden_ * W_ * width_), seed_of(0, tc, 4))),
          d_o(static_cast<std::size_t>(W_ * R_ * width_) * 2),
          d_w(static_cast<std::size_t>(hidden_ * W_ * width_) * 2),
          d_out(static_cast<std::size_t>(R_ * hidden_) * 2) {
        upload(d_o.p, o);
        upload(d_w.p, wo);
        reference(tc);
    }
    void reference(int tc) {
        // o_shard[i, p w + c] = o_p[me R + i, c]; out = o_shard * W_o^T.
        const int64_t K = W * width;
        std::vector<double> shard(static_cast<std::size_t>(R * K));
        for (int p = 0; p < W; ++p) {
            const HostMat op = p == me ? o : make_bf16(static_cast<std::size_t>(W * R * width), seed_of(p, tc, 3));
            for (int64_t i = 0; i < R; ++i)
                for (int64_t c = 0; c < width; ++c) shard[i * K + p * width + c] = op.val[(me * R + i) * width + c];
        }
        want.assign(static_cast<std::size_t>(R * hidden), 0.0);
        mag.assign(want.size(), 0.0);
        for (int64_t i = 0; i < R; ++i)
            for (int64_t j = 0; j < hidden; ++j) {
                double sum = 0, abs = 0;
                for (int64_t k = 0; k < K; ++k) {
                    const double t = shard[i * K + k] * wo.val[j * K + k];
                    sum += t;
                    abs += std::fabs(t);
                }
                want[i * hidden + j] = sum;
                mag[i * hidden + j] = abs;
            }
    }
    void run(World& world, cudaStream_t stream, UlyssesAlgo algo) const {
        UlyssesOptions opt;
        opt.algo = algo;
        a2a_o_gemm(world, MatrixView{d_o.p, DType::BF16, W * R, width, 0},
                   MatrixView{d_w.p, DType::BF16, hidden, W * width, 0}, MatrixView{d_out.p, DType::BF16, R, hidden, 0},
                   stream, opt);
    }
    std::string check() const { return compare("out", download(d_out.p, R, hidden, hidden), want, mag, hidden); }
};

TEST_F(Ulysses, A2aOGemmMatchesTheReference) {
    const int W = w->world_size(), me = w->rank();
    int tc = 100;
    for (int64_t width : {128, 64})
        for (int64_t R : {200, 256, 77})
            for (UlyssesAlgo algo : {UlyssesAlgo::Fused, UlyssesAlgo::Sequential, UlyssesAlgo::Auto}) {
                OCase c(W, me, R, width, 384, ++tc);
                poison(c.d_out.p, static_cast<std::size_t>(R * 384) * 2);
                c.run(*w, stream, algo);
                ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
                const std::string bad = test::agree(*w, c.check(), "ulysses_o_" + std::to_string(tc));
                ASSERT_EQ(bad, "") << "width " << width << " R " << R << " " << to_string(algo);
            }
}

// ---- back to back -----------------------------------------------------------------------------------------------

// 1000 calls of each op on a small shape, every seventh Sequential (the algorithms share the buffers' halves and the
// call count), the inputs switching between two sets each call: a call that read a half or a signal of the wrong
// call would produce the other set's result. Checked after calls 1, 2, 7 and 8 (a Sequential call and the Fused one
// after it), 500 and 1000.
TEST_F(Ulysses, ThousandBackToBackCalls) {
    const int W = w->world_size(), me = w->rank();
    const UlyssesHeads h{2 * W, W > 1 ? 1 : 2, 64};
    const QkvCase qa(W, me, 64, 128, h, 700), qb(W, me, 64, 128, h, 701);
    const OCase oa(W, me, 64, 64, 128, 702), ob(W, me, 64, 64, 128, 703);
    // qb and ob write into qa's and oa's outputs (same shapes) so that each call overwrites the last.
    std::string bad;
    for (int i = 1; i <= 1000; ++i) {
        const bool a = i % 2 == 1;
        const UlyssesAlgo algo = i % 7 == 0 ? UlyssesAlgo::Sequential : UlyssesAlgo::Fused;
        const QkvCase& qc = a ? qa : qb;
        qkv_gemm_a2a(*w, MatrixView{qc.dx.p, DType::BF16, 64, 128, 0},
                     MatrixView{qc.dw.p, DType::BF16, qc.cols, 128, 0}, h, qa.view(0), qa.view(1), qa.view(2), stream,
                     UlyssesOptions{algo});
        const OCase& oc = a ? oa : ob;
        a2a_o_gemm(*w, MatrixView{oc.d_o.p, DType::BF16, W * 64, 64, 0},
                   MatrixView{oc.d_w.p, DType::BF16, 128, W * 64, 0}, MatrixView{oa.d_out.p, DType::BF16, 64, 128, 0},
                   stream, UlyssesOptions{algo});
        if (i == 1 || i == 2 || i == 7 || i == 8 || i == 500 || i == 1000) {
            ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
            const char* names[3] = {"q", "k", "v"};
            for (int s = 0; s < 3; ++s)
                bad += compare(names[s], download(qa.view(s).data, W * 64, qa.width(s), qa.width(s)), qc.want[s],
                               qc.mag[s], qa.width(s));
            bad += compare("out", download(oa.d_out.p, 64, 128, 128), oc.want, oc.mag, 128);
            if (!bad.empty()) bad = "after call " + std::to_string(i) + ":\n" + bad;
            ASSERT_EQ(test::agree(*w, bad, "ulysses_b2b_" + std::to_string(i)), "");
        }
    }
}

// ---- bad inputs -------------------------------------------------------------------------------------------------

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST_F(Ulysses, BadInputsRaiseNamingTheArgument) {
    const int W = w->world_size(), me = w->rank();
    const UlyssesHeads h{2 * W, W, 64};
    QkvCase c(W, me, 64, 128, h, 800);
    const MatrixView x{c.dx.p, DType::BF16, 64, 128, 0}, wq{c.dw.p, DType::BF16, c.cols, 128, 0};
    auto qkv = [&](MatrixView xx, MatrixView ww, UlyssesHeads hh, MatrixView q, MatrixView k, MatrixView v,
                   UlyssesOptions o = {}) {
        return error_of([&] { qkv_gemm_a2a(*w, xx, ww, hh, q, k, v, stream, o); });
    };
    std::string bad;
    auto expect = [&](const std::string& msg, const char* needle) {
        if (msg.find(needle) == std::string::npos)
            bad += "expected an error with '" + std::string(needle) + "', got '" + msg + "'\n";
    };
    MatrixView q = c.view(0), k = c.view(1), v = c.view(2);
    MatrixView null_q = q;
    null_q.data = nullptr;
    expect(qkv(x, wq, h, null_q, k, v), "device pointer for q");
    MatrixView f16_k = k;
    f16_k.dtype = DType::F16;
    expect(qkv(x, wq, h, q, f16_k, v), "expected k of dtype bf16");
    MatrixView short_v = v;
    short_v.rows -= 1;
    expect(qkv(x, wq, h, q, k, short_v), "expected v of [");
    MatrixView narrow_w = wq;
    narrow_w.rows -= 8;
    expect(qkv(x, narrow_w, h, q, k, v), "expected w_qkv of [");
    expect(qkv(x, wq, UlyssesHeads{2 * W + 1, 1, 64}, q, k, v), W > 1 ? "divide heads.q" : "expected w_qkv of [");
    expect(qkv(x, wq, UlyssesHeads{2 * W, W, 60}, q, k, v), "heads.dim a multiple of 8");
    MatrixView f32_x = x;
    f32_x.dtype = DType::F32;
    expect(qkv(f32_x, wq, h, q, k, v), "expected x bf16 or f16");
    // A host pointer of the right shape (16-byte aligned; the check looks at the memory behind it).
    alignas(16) static std::uint16_t host_rows[4096];
    MatrixView host_q = q;
    host_q.data = host_rows;
    expect(qkv(x, wq, h, host_q, k, v), "expected q to be device memory");
    UlyssesOptions neg;
    neg.comm_sms = -1;
    expect(qkv(x, wq, h, q, k, v, neg), "comm_sms >= 0");

    OCase oc(W, me, 64, 64, 128, 801);
    const MatrixView o{oc.d_o.p, DType::BF16, W * 64, 64, 0}, wo{oc.d_w.p, DType::BF16, 128, W * 64, 0},
        out{oc.d_out.p, DType::BF16, 64, 128, 0};
    auto og = [&](MatrixView oo, MatrixView ww, MatrixView dd) {
        return error_of([&] { a2a_o_gemm(*w, oo, ww, dd, stream); });
    };
    MatrixView wide_w = wo;
    wide_w.cols += 8;
    expect(og(o, wide_w, out), "expected w_o of [");
    MatrixView tall_out = out;
    tall_out.rows += 1;
    expect(og(o, wo, tall_out), "expected out of [");
    MatrixView null_o = o;
    null_o.data = nullptr;
    expect(og(null_o, wo, out), "device pointer for o");
    if (W > 1) {
        MatrixView odd_o = o;
        odd_o.rows -= 1;
        expect(og(odd_o, wo, out), "multiple of the");
    }
    ASSERT_EQ(test::agree(*w, bad, "ulysses_bad"), "");

    // The World still works: a good call of each.
    c.poison_outputs();
    c.run(*w, stream, UlyssesAlgo::Auto);
    oc.run(*w, stream, UlyssesAlgo::Auto);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_EQ(test::agree(*w, c.check() + oc.check(), "ulysses_bad_after"), "");
}

}  // namespace
}  // namespace loom
