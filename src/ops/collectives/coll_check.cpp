#include "ops/collectives/coll_check.hpp"

#include <cstdint>

#include "loom/runtime/error.hpp"
#include "runtime/pointer_check.hpp"

namespace loom::coll {

void check_view(const char* op, const char* which, const BufferView& b) {
    // First: every later check and size computation divides or multiplies by the element size.
    LOOM_CHECK(dtype_size(b.dtype) > 0,
               "{}: expected {} of a known dtype (f32, f16, bf16, f8e4m3, i32, i64, u8), given DType value {}", op,
               which, static_cast<int>(b.dtype));
    LOOM_CHECK(b.count > 0, "{}: expected {} to hold at least one element, given count 0", op, which);
    LOOM_CHECK(b.data != nullptr, "{}: expected a device pointer for {}, given nullptr", op, which);
    const auto a = reinterpret_cast<std::uintptr_t>(b.data);
    LOOM_CHECK(a % static_cast<std::uintptr_t>(dtype_size(b.dtype)) == 0,
               "{}: expected {} aligned to its element size ({} bytes for {}), given address {}", op, which,
               dtype_size(b.dtype), dtype_name(b.dtype), b.data);
    detail::buffer_bytes(op, which, b.count, b.dtype);
}

void check_buffer(const char* op, const char* which, World& world, const BufferView& b) {
    check_view(op, which, b);
    detail::check_memory(&world, world.device(), op, which, b.data, b.bytes());
}

std::size_t times_world(const char* op, const char* what, std::size_t count, int world_size) {
    return detail::checked_mul(op, what, count, static_cast<std::size_t>(world_size));
}

void check_same_dtype(const char* op, const BufferView& in, const BufferView& out) {
    LOOM_CHECK(in.dtype == out.dtype, "{}: expected in and out of the same dtype, given in {} and out {}", op,
               dtype_name(in.dtype), dtype_name(out.dtype));
}

void check_float_dtype(const char* op, const BufferView& b) {
    LOOM_CHECK(b.dtype == DType::F32 || b.dtype == DType::F16 || b.dtype == DType::BF16,
               "{}: expected dtype f32, f16 or bf16, given {}", op, dtype_name(b.dtype));
}

void check_symmetric(const char* op, const char* algo, const char* which, World& world, const BufferView& b) {
    LOOM_CHECK(world.is_symmetric(b.data, b.bytes()),
               "{}: {} ({}, {} bytes) is not in the symmetric heap; the {} algorithm needs it there: allocate it "
               "with world.alloc",
               op, which, b.data, b.bytes(), algo);
}

std::string a2av_counts_error(const std::vector<A2avSends>& ranks, std::uint64_t out_count) {
    const std::size_t W = ranks.size();
    std::vector<std::uint64_t> received(W, 0);
    for (std::size_t s = 0; s < W; ++s) {
        const A2avSends& r = ranks[s];
        std::uint64_t packed = 0;
        for (std::size_t j = 0; j < W && j < r.counts.size(); ++j) {
            const std::int64_t cnt = r.counts[j];
            if (cnt < 0) return fmt::format("all_to_all_v: rank {}'s send_counts[{}] = {} is negative", s, j, cnt);
            const std::int64_t off = r.offsets.empty() ? static_cast<std::int64_t>(packed) : r.offsets[j];
            if (off < 0 || static_cast<std::uint64_t>(off) > r.in_count ||
                static_cast<std::uint64_t>(cnt) > r.in_count - static_cast<std::uint64_t>(off))
                return fmt::format(
                    "all_to_all_v: rank {}'s block for rank {} lies outside its in: send_offsets[{}] + send_counts[{}] "
                    "= {} + {} > in.count = {}{}",
                    s, j, j, j, off, cnt, r.in_count, r.offsets.empty() ? " (send_offsets null: packed)" : "");
            packed += static_cast<std::uint64_t>(cnt);  // <= in_count: no overflow
            const std::uint64_t u = static_cast<std::uint64_t>(cnt);
            if (u > out_count - received[j] || received[j] > out_count)
                return fmt::format(
                    "all_to_all_v: rank {} receives more than out.count = {} elements: the send_counts[{}] of ranks "
                    "0..{} sum past it",
                    j, out_count, j, s);
            received[j] += u;
        }
    }
    return "";
}

detail::CallSignature signature(World& world, CollKind kind, const BufferView& in, const BufferView& out,
                                const CollOptions& opts) {
    // In place, the chunk's offset in the heap depends on the rank: compared as "in place".
    const auto chunk = [&](const BufferView& whole, const BufferView& part) {
        return reinterpret_cast<std::uintptr_t>(whole.data) + static_cast<std::uintptr_t>(world.rank()) * part.count *
                                                                  static_cast<std::uintptr_t>(dtype_size(part.dtype)) ==
               reinterpret_cast<std::uintptr_t>(part.data);
    };
    const bool in_in_place = kind == CollKind::AllGather && chunk(out, in);
    const bool out_in_place = kind == CollKind::ReduceScatter && chunk(in, out);
    detail::CallSignature s(to_string(kind));
    if (kind != CollKind::AllToAllV) s.add("in.count", in.count);
    s.add("in.dtype", detail::dtype_field(in.dtype))
        .add("in", in_in_place ? "in place" : detail::placement_field(world, in.data))
        .add("out.count", out.count)
        .add("out.dtype", detail::dtype_field(out.dtype))
        .add("out", out_in_place ? "in place" : detail::placement_field(world, out.data))
        .add("CollOptions::algo", to_string(opts.algo))
        .add("CollOptions::path", to_string(opts.path));
    if (kind == CollKind::ReduceScatter || kind == CollKind::AllReduce)
        s.add("CollOptions::op", opts.op == ReduceOp::Sum ? std::string("sum")
                                 : opts.op == ReduceOp::Max
                                     ? std::string("max")
                                     : fmt::format("ReduceOp value {}", static_cast<int>(opts.op)));
    s.add("CollOptions::num_sms", opts.num_sms);
    return s;
}

}  // namespace loom::coll
