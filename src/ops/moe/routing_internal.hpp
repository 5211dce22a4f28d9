// The routing utilities' host logic shared by the routing entries and the TP-MoE ops (checks, the buffer layout).
#pragma once

#include <cstddef>

#include "loom/ops/moe.hpp"

namespace loom::moe {

inline constexpr int kMaxTopk = 32;  // moe_topk_reduce keeps a token's slots in shared memory

// Raises loom::Error naming `op` and the field unless the shape is one the kernels take.
void check_routing_shape(const char* op, const MoeRoutingShape& s);
// check_routing_shape, and every array of the view present.
void check_routing(const char* op, const MoeRouting& r);
// x [T, H] and rows [>= max_rows, H]: same dtype, dense rows (ld >= cols), non-null.
void check_permute(const char* op, const MatrixView& x, const MoeRouting& r, const MatrixView& rows);
// rows [>= 1, H] and y [T, H]: float types, same column count.
void check_topk_reduce(const char* op, const MatrixView& rows, const MoeRouting& r, const MatrixView& y);

// Blocks of the count / scatter kernels (kRouteChunk entries each, at least 1).
int route_chunks(const MoeRoutingShape& s);

// Byte offsets of the routing's arrays in its buffer, each 256-byte aligned.
struct RoutingLayout {
    std::size_t offsets = 0, counts = 0, dest_rows = 0, row_tokens = 0, weights = 0, workspace = 0, bytes = 0;
};
RoutingLayout routing_layout(const MoeRoutingShape& s);

}  // namespace loom::moe
