// Host references of expert-parallel dispatch / combine, throughput mode (loom::ep_dispatch / ep_combine): the
// receive layout every rank must produce and the combine's arithmetic, emulated step for step (bitwise comparable).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace loom::test {

// All ranks' routings: idx[r] = rank r's topk_idx [T_r, k] (ids in [0, E) or -1).
struct EpLayoutRef {
    int W = 0, E = 0, L = 0, k = 0;
    std::vector<std::vector<int32_t>> offsets;    // [W][L + 1]: receiver d's expert segments
    std::vector<std::vector<int32_t>> row_src;    // [W][rows]: source rank of receiver d's row
    std::vector<std::vector<int32_t>> row_tok;    // [W][rows]: source token of the row
    std::vector<std::vector<int32_t>> entry_row;  // [W][T_r k]: row of rank r's entry at its expert's rank, -1 unused
    std::vector<int64_t> pairs_out;               // [W]: (token, rank) pairs rank r sends to other ranks
    int64_t max_rows = 0;                         // the most rows any rank receives
};
EpLayoutRef ep_layout_reference(const std::vector<std::vector<int32_t>>& idx, int k, int E, int W);

// Rank r's y [T_r, H] as ep_combine computes it, with expert outputs out(d, row, c) (bf16 values as floats):
// per token, per destination rank d ascending, p = fmaf chain over d's slots in slot order from 0, then the bf16
// rounding of p added in fp32; y rounded to bf16.
std::vector<float> ep_combine_reference(const EpLayoutRef& ref, const std::vector<int32_t>& idx_r,
                                        const std::vector<float>& w_r, int r, int64_t H,
                                        const std::function<float(int d, int32_t row, int64_t c)>& out);

}  // namespace loom::test
