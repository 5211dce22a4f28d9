// The Ulysses ops' argument checks (raise loom::Error naming the op, the argument, what was expected and given).
#include <cstdint>

#include "loom/runtime/error.hpp"
#include "loom/runtime/stream_ops.hpp"
#include "ops/attention/ulysses/ulysses.hpp"
#include "runtime/pointer_check.hpp"

namespace loom::ulysses {

void check_input_dtype(const char* op, const char* name, DType dtype) {
    LOOM_CHECK(dtype == DType::BF16 || dtype == DType::F16, "{}: expected {} bf16 or f16, given {}", op, name,
               dtype_name(dtype));
}

void check_view(World& world, const char* op, const char* name, const MatrixView& m, DType dtype, int64_t rows,
                int64_t cols, const char* shape) {
    LOOM_CHECK(m.data != nullptr, "{}: expected a device pointer for {}, given nullptr", op, name);
    LOOM_CHECK(m.dtype == dtype, "{}: expected {} of dtype {}, given {}", op, name, dtype_name(dtype),
               dtype_name(m.dtype));
    LOOM_CHECK(m.rows == rows && m.cols == cols, "{}: expected {} of [{}, {}] ({}), given [{}, {}]", op, name, rows,
               cols, shape, m.rows, m.cols);
    LOOM_CHECK(reinterpret_cast<std::uintptr_t>(m.data) % 16 == 0, "{}: expected {} 16-byte aligned, given address {}",
               op, name, m.data);
    LOOM_CHECK(m.ld >= 0 && m.stride() >= m.cols && (m.stride() * dtype_size(m.dtype)) % 16 == 0,
               "{}: expected {}'s leading dimension >= {} and a multiple of 16 bytes, given {}", op, name, m.cols,
               m.stride());
    detail::check_memory(&world, world.device(), op, name, m);
}

void check_options(const char* op, const UlyssesOptions& o) {
    LOOM_CHECK(o.algo == UlyssesAlgo::Auto || o.algo == UlyssesAlgo::Fused || o.algo == UlyssesAlgo::Sequential,
               "{}: expected UlyssesOptions::algo Auto, Fused or Sequential, given value {}", op,
               static_cast<int>(o.algo));
    LOOM_CHECK(o.comm_sms >= 0, "{}: expected UlyssesOptions::comm_sms >= 0 (0: the default), given {}", op,
               o.comm_sms);
    LOOM_CHECK(o.num_sms >= 0, "{}: expected UlyssesOptions::num_sms >= 0 (0: the device's), given {}", op, o.num_sms);
}

void check_world(World& world, const char* op) {
    LOOM_CHECK(world.world_size() == world.local_world_size(),
               "{}: expected a World on one node (the all-to-all moves heads and rows by load / store between the "
               "node's ranks), given {} ranks with {} on this node",
               op, world.world_size(), world.local_world_size());
}

void check_not_capturing(const char* op, cudaStream_t stream) {
    LOOM_CHECK(!stream_ops::capturing(stream),
               "{}: expected a stream that is not capturing a CUDA graph: its signal values and buffer halves are "
               "chosen on the host per call, so a replayed graph would reuse one call's (wrong results or a hang)",
               op);
}

}  // namespace loom::ulysses
