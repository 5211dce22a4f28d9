#include "loom/runtime/tma.hpp"

#include <cstdint>

#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"

namespace loom {

CUtensorMap make_tma_2d(const MatrixView& m, int box_rows, int box_cols, TmaSwizzle swizzle) {
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
            LOOM_FAIL("make_tma_2d: expected a bf16/f16/f32/8-bit matrix, given {}", dtype_name(m.dtype));
    }
    const int64_t esize = dtype_size(m.dtype);
    const auto addr = reinterpret_cast<std::uintptr_t>(m.data);
    LOOM_CHECK(addr % 16 == 0, "make_tma_2d: expected a 16-byte aligned base address, given {:#x}", addr);
    LOOM_CHECK(m.rows > 0 && m.cols > 0, "make_tma_2d: expected a non-empty matrix, given {} x {}", m.rows, m.cols);
    LOOM_CHECK((m.stride() * esize) % 16 == 0, "make_tma_2d: expected a row stride multiple of 16 bytes, given {} B",
               m.stride() * esize);
    LOOM_CHECK(box_rows >= 1 && box_rows <= 256 && box_cols >= 1 && box_cols <= 256,
               "make_tma_2d: expected box sizes in [1, 256], given {} x {}", box_rows, box_cols);
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
               "make_tma_2d: expected the box's inner extent ({} B) within the {} B swizzle span", box_cols * esize,
               span);
    cuuint64_t dims[2] = {static_cast<cuuint64_t>(m.cols), static_cast<cuuint64_t>(m.rows)};
    cuuint64_t strides[1] = {static_cast<cuuint64_t>(m.stride() * esize)};
    cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
    cuuint32_t elem_strides[2] = {1, 1};
    CUtensorMap map;
    LOOM_CU(cuTensorMapEncodeTiled, &map, type, 2, m.data, dims, strides, box, elem_strides,
            CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return map;
}

}  // namespace loom
