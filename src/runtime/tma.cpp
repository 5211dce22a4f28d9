#include "loom/runtime/tma.hpp"

#include <cstdint>

#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"

namespace loom {
namespace {

// A 2-D (count 0) or 3-D (count >= 1 stacked matrices) tiled map with make_tma_2d's checks.
CUtensorMap make_tma(const char* op, const MatrixView& m, int64_t count, int box_rows, int box_cols,
                     TmaSwizzle swizzle) {
    CUtensorMapDataType type;
    switch (m.dtype) {
        case DType::BF16:
            type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
            break;
        case DType::F16:
            type = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
            break;
        case DType::F32:
            type = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
            break;
        case DType::F8E4M3:
        case DType::U8:
            type = CU_TENSOR_MAP_DATA_TYPE_UINT8;
            break;
        default:
            LOOM_FAIL("{}: expected a bf16/f16/f32/8-bit matrix, given {}", op, dtype_name(m.dtype));
    }
    const int64_t esize = dtype_size(m.dtype);
    const auto addr = reinterpret_cast<std::uintptr_t>(m.data);
    LOOM_CHECK(addr % 16 == 0, "{}: expected a 16-byte aligned base address, given {:#x}", op, addr);
    LOOM_CHECK(m.rows > 0 && m.cols > 0, "{}: expected a non-empty matrix, given {} x {}", op, m.rows, m.cols);
    LOOM_CHECK((m.stride() * esize) % 16 == 0, "{}: expected a row stride multiple of 16 bytes, given {} B", op,
               m.stride() * esize);
    LOOM_CHECK(box_rows >= 1 && box_rows <= 256 && box_cols >= 1 && box_cols <= 256,
               "{}: expected box sizes in [1, 256], given {} x {}", op, box_rows, box_cols);
    CUtensorMapSwizzle sw = CU_TENSOR_MAP_SWIZZLE_NONE;
    int span = 0;
    switch (swizzle) {
        case TmaSwizzle::None:
            break;
        case TmaSwizzle::B32:
            sw = CU_TENSOR_MAP_SWIZZLE_32B, span = 32;
            break;
        case TmaSwizzle::B64:
            sw = CU_TENSOR_MAP_SWIZZLE_64B, span = 64;
            break;
        case TmaSwizzle::B128:
            sw = CU_TENSOR_MAP_SWIZZLE_128B, span = 128;
            break;
    }
    LOOM_CHECK(span == 0 || box_cols * esize <= span,
               "{}: expected the box's inner extent ({} B) within the {} B swizzle span", op, box_cols * esize, span);
    const cuuint32_t rank = count > 0 ? 3 : 2;
    const cuuint64_t row_bytes = static_cast<cuuint64_t>(m.stride() * esize);
    cuuint64_t dims[3] = {static_cast<cuuint64_t>(m.cols), static_cast<cuuint64_t>(m.rows),
                          static_cast<cuuint64_t>(count)};
    cuuint64_t strides[2] = {row_bytes, row_bytes * static_cast<cuuint64_t>(m.rows)};
    cuuint32_t box[3] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows), 1};
    cuuint32_t elem_strides[3] = {1, 1, 1};
    CUtensorMap map;
    LOOM_CU(cuTensorMapEncodeTiled, &map, type, rank, m.data, dims, strides, box, elem_strides,
            CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return map;
}

}  // namespace

CUtensorMap make_tma_2d(const MatrixView& m, int box_rows, int box_cols, TmaSwizzle swizzle) {
    return make_tma("make_tma_2d", m, 0, box_rows, box_cols, swizzle);
}

CUtensorMap make_tma_3d(const MatrixView& m, int64_t count, int box_rows, int box_cols, TmaSwizzle swizzle) {
    LOOM_CHECK(count >= 1, "make_tma_3d: expected at least one matrix, given {}", count);
    return make_tma("make_tma_3d", m, count, box_rows, box_cols, swizzle);
}

}  // namespace loom
