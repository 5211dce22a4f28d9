// Conversion of DLPack tensors (torch tensors, numpy arrays: anything nanobind's ndarray takes) to Loom's views.
//
// Every check raises ValueError naming the op, the argument, what was expected and what was given; Loom's own
// validation (shapes against each other, symmetric-ness, world size) raises loom::Error inside the op.
#pragma once

#include <cuda_runtime_api.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <string>

#include "loom/tensor.hpp"

namespace loom::py {

namespace nb = nanobind;
using Array = nb::ndarray<nb::device::cuda>;  // device checked by hand (clear message), see AnyArray
using AnyArray = nb::ndarray<>;

// The Loom element type of a DLPack dtype, or nullopt (float64, complex, bool, int8, ...).
std::optional<DType> dtype_from_dlpack(const nb::dlpack::dtype& t);
// "float64", "bfloat16", ...: DLPack's name of a dtype, for messages.
std::string dlpack_dtype_name(const nb::dlpack::dtype& t);

// A 2-D CUDA tensor with unit column stride and row stride >= cols (a row-major matrix, possibly a row slice).
MatrixView as_matrix(const AnyArray& t, const char* op, const char* arg);
// A CUDA tensor whose elements are contiguous (any number of dimensions).
BufferView as_buffer(const AnyArray& t, const char* op, const char* arg);
// As as_buffer, and the element type must be `want`.
BufferView as_buffer(const AnyArray& t, const char* op, const char* arg, DType want);
// A one-element float32 CUDA tensor (a device scale), or nullptr for None.
const float* as_scale(const std::optional<AnyArray>& t, const char* op, const char* arg);

// A routing argument (topk_idx, topk_weights): a contiguous CUDA tensor [tokens, topk] of `want`; topk < 0: any.
const void* as_routing(const AnyArray& t, int64_t tokens, int topk, DType want, const char* op, const char* arg);

// Raises ValueError with `msg` (the bindings' own checks).
[[noreturn]] void value_error(const std::string& msg);

inline cudaStream_t as_stream(std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

}  // namespace loom::py
