// Element types and non-owning views used by the host ops API (loom::gemm, loom::all_gather, ...).
//
// Plain data, usable from host code and as template-argument vocabulary in the JIT (dtype_cuda_name()).
#pragma once

#include "loom/config.hpp"

namespace loom {

enum class DType : int { F32 = 0, F16 = 1, BF16 = 2, F8E4M3 = 3, I32 = 4, I64 = 5, U8 = 6 };

LOOM_HOST_DEVICE constexpr int dtype_size(DType t) {
    switch (t) {
        case DType::F32:
        case DType::I32:
            return 4;
        case DType::F16:
        case DType::BF16:
            return 2;
        case DType::F8E4M3:
        case DType::U8:
            return 1;
        case DType::I64:
            return 8;
    }
    return 0;
}

// Name for messages ("bf16") and the CUDA type spelled in generated TUs ("__nv_bfloat16").
constexpr const char* dtype_name(DType t) {
    switch (t) {
        case DType::F32:
            return "f32";
        case DType::F16:
            return "f16";
        case DType::BF16:
            return "bf16";
        case DType::F8E4M3:
            return "f8e4m3";
        case DType::I32:
            return "i32";
        case DType::I64:
            return "i64";
        case DType::U8:
            return "u8";
    }
    return "?";
}
constexpr const char* dtype_cuda_name(DType t) {
    switch (t) {
        case DType::F32:
            return "float";
        case DType::F16:
            return "__half";
        case DType::BF16:
            return "__nv_bfloat16";
        case DType::F8E4M3:
            return "__nv_fp8_e4m3";
        case DType::I32:
            return "int";
        case DType::I64:
            return "long long";
        case DType::U8:
            return "unsigned char";
    }
    return "?";
}

// A row-major matrix: element (r, c) at data + (r * ld + c) * dtype_size(dtype). ld >= cols.
struct MatrixView {
    void* data = nullptr;
    DType dtype = DType::BF16;
    int64_t rows = 0;
    int64_t cols = 0;
    int64_t ld = 0;  // 0 means cols (dense)
    LOOM_HOST_DEVICE int64_t stride() const { return ld ? ld : cols; }
};

// A contiguous 1-D buffer of `count` elements.
struct BufferView {
    void* data = nullptr;
    DType dtype = DType::F32;
    size_t count = 0;
    LOOM_HOST_DEVICE size_t bytes() const { return count * static_cast<size_t>(dtype_size(dtype)); }
};

}  // namespace loom
