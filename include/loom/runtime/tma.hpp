// Host-side TMA tensor-map encoding (cuTensorMapEncodeTiled through the lazy driver table).
//
// The map describes a row-major 2-D matrix; kernels receive it by value (__grid_constant__) as
// loom::ptx::TmaDescriptor, which is bit-identical to CUtensorMap.
#pragma once

#include <cuda.h>

#include "loom/tensor.hpp"

namespace loom {

enum class TmaSwizzle { None, B32, B64, B128 };

// Map over `m` (rows x cols, row stride m.stride() elements) with boxes of box_rows x box_cols elements.
// Validates what the hardware requires (16-byte aligned base and row stride, box_cols * element size <= the
// swizzle span, box sizes <= 256) and raises loom::Error naming the violated rule.
CUtensorMap make_tma_2d(const MatrixView& m, int box_rows, int box_cols, TmaSwizzle swizzle = TmaSwizzle::B128);

// Map over `count` matrices of m.rows x m.cols stacked in m (m.rows x count rows: matrix i starts at row i x m.rows),
// as a 3-D tensor [count][rows][cols] with boxes of box_rows x box_cols x 1: a box never reaches into the next
// matrix (rows past m.rows are zero-filled, like columns past m.cols). The same checks as make_tma_2d.
CUtensorMap make_tma_3d(const MatrixView& m, int64_t count, int box_rows, int box_cols,
                        TmaSwizzle swizzle = TmaSwizzle::B128);

}  // namespace loom
