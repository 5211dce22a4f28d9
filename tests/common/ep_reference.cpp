#include "common/ep_reference.hpp"

#include <algorithm>
#include <cmath>

#include "loom/bf16.hpp"

namespace loom::test {

EpLayoutRef ep_layout_reference(const std::vector<std::vector<int32_t>>& idx, int k, int E, int W) {
    EpLayoutRef ref;
    ref.W = W, ref.E = E, ref.L = E / W, ref.k = k;
    const int L = ref.L;
    ref.offsets.assign(W, std::vector<int32_t>(L + 1, 0));
    ref.row_src.assign(W, {});
    ref.row_tok.assign(W, {});
    ref.entry_row.assign(W, {});
    ref.pairs_out.assign(W, 0);
    for (int r = 0; r < W; ++r) ref.entry_row[r].assign(idx[r].size(), -1);
    for (int d = 0; d < W; ++d) {
        for (int l = 0; l < L; ++l) {
            const int e = d * L + l;
            ref.offsets[d][l] = static_cast<int32_t>(ref.row_src[d].size());
            for (int r = 0; r < W; ++r) {
                const int64_t T = static_cast<int64_t>(idx[r].size()) / k;
                for (int64_t t = 0; t < T; ++t)
                    for (int s = 0; s < k; ++s)
                        if (idx[r][t * k + s] == e) {
                            ref.entry_row[r][t * k + s] = static_cast<int32_t>(ref.row_src[d].size());
                            ref.row_src[d].push_back(r);
                            ref.row_tok[d].push_back(static_cast<int32_t>(t));
                        }
            }
        }
        ref.offsets[d][L] = static_cast<int32_t>(ref.row_src[d].size());
        ref.max_rows = std::max<int64_t>(ref.max_rows, ref.offsets[d][L]);
    }
    for (int r = 0; r < W; ++r) {
        const int64_t T = static_cast<int64_t>(idx[r].size()) / k;
        for (int64_t t = 0; t < T; ++t)
            for (int d = 0; d < W; ++d) {
                if (d == r) continue;
                bool hit = false;
                for (int s = 0; s < k; ++s) hit |= idx[r][t * k + s] >= 0 && idx[r][t * k + s] / L == d;
                ref.pairs_out[r] += hit;
            }
    }
    return ref;
}

std::vector<float> ep_combine_reference(const EpLayoutRef& ref, const std::vector<int32_t>& idx_r,
                                        const std::vector<float>& w_r, int r, int64_t H,
                                        const std::function<float(int d, int32_t row, int64_t c)>& out) {
    const int k = ref.k, L = ref.L;
    const int64_t T = static_cast<int64_t>(idx_r.size()) / k;
    std::vector<float> y(static_cast<std::size_t>(T * H), 0.f);
    std::vector<int> slots;  // the token's slots, grouped by rank (ascending), slot order within a rank
    std::vector<int> first;  // per rank d: where its slots start in `slots` (W + 1 entries)
    for (int64_t t = 0; t < T; ++t) {
        slots.clear();
        first.assign(ref.W + 1, 0);
        for (int d = 0; d < ref.W; ++d) {
            first[d] = static_cast<int>(slots.size());
            for (int s = 0; s < k; ++s) {
                const int e = idx_r[t * k + s];
                if (e >= 0 && e / L == d) slots.push_back(s);
            }
        }
        first[ref.W] = static_cast<int>(slots.size());
        for (int64_t c = 0; c < H; ++c) {
            float acc = 0.f;
            for (int d = 0; d < ref.W; ++d) {
                if (first[d] == first[d + 1]) continue;
                float p = 0.f;
                for (int i = first[d]; i < first[d + 1]; ++i) {
                    const int s = slots[i];
                    const float w = w_r.empty() ? 1.f : w_r[t * k + s];
                    p = std::fmaf(w, out(d, ref.entry_row[r][t * k + s], c), p);
                }
                acc += bf16_to_float(float_to_bf16(p));
            }
            y[t * H + c] = bf16_to_float(float_to_bf16(acc));
        }
    }
    return y;
}

}  // namespace loom::test
