#include "convert.hpp"

#include <fmt/format.h>

namespace loom::py {

namespace {

std::string shape_str(const AnyArray& t) {
    std::string s = "[";
    for (size_t i = 0; i < t.ndim(); ++i) s += fmt::format("{}{}", i ? ", " : "", t.shape(i));
    return s + "]";
}

const char* device_name(int type) {
    switch (type) {
        case nb::device::cpu::value:
            return "cpu";
        case nb::device::cuda::value:
            return "cuda";
        case nb::device::cuda_host::value:
            return "cuda pinned host";
        case nb::device::cuda_managed::value:
            return "cuda managed";
        default:
            return "another device";
    }
}

DType element_type(const AnyArray& t, const char* op, const char* arg) {
    auto d = dtype_from_dlpack(t.dtype());
    if (!d)
        value_error(
            fmt::format("{}: {} must have dtype float32, float16, bfloat16, float8_e4m3fn, int32, int64 or uint8; "
                        "given {}",
                        op, arg, dlpack_dtype_name(t.dtype())));
    return *d;
}

void check_cuda(const AnyArray& t, const char* op, const char* arg) {
    if (t.device_type() != nb::device::cuda::value)
        value_error(fmt::format("{}: {} must be a CUDA tensor; given a {} tensor of shape {}", op, arg,
                                device_name(t.device_type()), shape_str(t)));
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != t.device_id())
        value_error(fmt::format("{}: {} must be on the current CUDA device cuda:{}; given a tensor on cuda:{}", op, arg,
                                current, t.device_id()));
}

}  // namespace

std::optional<DType> dtype_from_dlpack(const nb::dlpack::dtype& t) {
    if (t.lanes != 1) return std::nullopt;
    const auto code = static_cast<nb::dlpack::dtype_code>(t.code);
    if (code == nb::dlpack::dtype_code::Float && t.bits == 32) return DType::F32;
    if (code == nb::dlpack::dtype_code::Float && t.bits == 16) return DType::F16;
    if (code == nb::dlpack::dtype_code::Bfloat && t.bits == 16) return DType::BF16;
    if (code == nb::dlpack::dtype_code::Int && t.bits == 32) return DType::I32;
    if (code == nb::dlpack::dtype_code::Int && t.bits == 64) return DType::I64;
    if (code == nb::dlpack::dtype_code::UInt && t.bits == 8) return DType::U8;
    // DLPack 1.1: kDLFloat8_e4m3fn = 10.
    if (t.code == 10 && t.bits == 8) return DType::F8E4M3;
    return std::nullopt;
}

std::string dlpack_dtype_name(const nb::dlpack::dtype& t) {
    const char* kind = "code";
    switch (static_cast<nb::dlpack::dtype_code>(t.code)) {
        case nb::dlpack::dtype_code::Int:
            kind = "int";
            break;
        case nb::dlpack::dtype_code::UInt:
            kind = "uint";
            break;
        case nb::dlpack::dtype_code::Float:
            kind = "float";
            break;
        case nb::dlpack::dtype_code::Bfloat:
            kind = "bfloat";
            break;
        case nb::dlpack::dtype_code::Complex:
            kind = "complex";
            break;
        case nb::dlpack::dtype_code::Bool:
            kind = "bool";
            break;
        default:
            return fmt::format("DLPack code {} with {} bits", t.code, t.bits);
    }
    return fmt::format("{}{}", kind, t.bits);
}

MatrixView as_matrix(const AnyArray& t, const char* op, const char* arg) {
    const DType dt = element_type(t, op, arg);
    check_cuda(t, op, arg);
    if (t.ndim() != 2) value_error(fmt::format("{}: {} must be a 2-D tensor; given shape {}", op, arg, shape_str(t)));
    const int64_t rows = static_cast<int64_t>(t.shape(0)), cols = static_cast<int64_t>(t.shape(1));
    const int64_t s0 = t.stride(0), s1 = t.stride(1);
    if (rows == 0) return MatrixView{t.data(), dt, 0, cols, 0};  // no elements: no layout to check
    if (cols > 1 && s1 != 1)
        value_error(
            fmt::format("{}: {} must be row-major with contiguous rows (column stride 1); given strides ({}, {}): "
                        "call .contiguous() first",
                        op, arg, s0, s1));
    if (rows > 1 && s0 < cols)
        value_error(
            fmt::format("{}: {} must be row-major (row stride >= {} columns); given strides ({}, {}): call "
                        ".contiguous() first",
                        op, arg, cols, s0, s1));
    const int64_t ld = rows > 1 ? s0 : cols;
    return MatrixView{t.data(), dt, rows, cols, ld == cols ? 0 : ld};
}

BufferView as_buffer(const AnyArray& t, const char* op, const char* arg) {
    const DType dt = element_type(t, op, arg);
    check_cuda(t, op, arg);
    // Contiguous: strides are the row-major ones (dimensions of extent 1 may carry any stride; a tensor with no
    // elements has no layout to check, as torch's is_contiguous() says).
    int64_t expect = 1;
    for (size_t i = t.size() == 0 ? 0 : t.ndim(); i-- > 0;) {
        if (t.shape(i) != 1 && t.stride(i) != expect)
            value_error(
                fmt::format("{}: {} must be contiguous; given shape {} with a stride {} in dimension {} (expected {}): "
                            "call .contiguous() first",
                            op, arg, shape_str(t), t.stride(i), i, expect));
        expect *= static_cast<int64_t>(t.shape(i));
    }
    return BufferView{t.data(), dt, t.size()};
}

BufferView as_buffer(const AnyArray& t, const char* op, const char* arg, DType want) {
    BufferView b = as_buffer(t, op, arg);
    if (b.dtype != want)
        value_error(fmt::format("{}: {} must have dtype {}; given {}", op, arg, dtype_name(want), dtype_name(b.dtype)));
    return b;
}

const float* as_scale(const std::optional<AnyArray>& t, const char* op, const char* arg) {
    if (!t) return nullptr;
    BufferView b = as_buffer(*t, op, arg, DType::F32);
    if (b.count != 1) value_error(fmt::format("{}: {} must hold one float32; given {} elements", op, arg, b.count));
    return static_cast<const float*>(b.data);
}

void value_error(const std::string& msg) { throw nb::value_error(msg.c_str()); }

const void* as_routing(const AnyArray& t, int64_t tokens, int topk, DType want, const char* op, const char* arg) {
    if (t.ndim() != 2 || static_cast<int64_t>(t.shape(0)) != tokens ||
        (topk >= 0 && static_cast<int64_t>(t.shape(1)) != topk))
        value_error(fmt::format("{}: {} must be [tokens = {}, topk{}]; given {} dimensions of shape ({}, {})", op, arg,
                                tokens, topk >= 0 ? fmt::format(" = {}", topk) : "", t.ndim(),
                                t.ndim() > 0 ? t.shape(0) : 0, t.ndim() > 1 ? t.shape(1) : 0));
    return as_buffer(t, op, arg, want).data;
}

}  // namespace loom::py
