#include "runtime/pointer_check.hpp"

#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <limits>

#include "loom/runtime/device_memory.hpp"
#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"

namespace loom::detail {

std::size_t checked_mul(const char* op, const char* what, std::size_t a, std::size_t b) {
    std::size_t r = 0;
    LOOM_CHECK(!__builtin_mul_overflow(a, b, &r), "{}: {} overflows: {} x {} does not fit in 64 bits", op, what, a, b);
    return r;
}

std::size_t buffer_bytes(const char* op, const char* which, std::size_t count, DType dtype) {
    return checked_mul(op, fmt::format("{}'s size in bytes ({}.count x element size)", which, which).c_str(), count,
                       static_cast<std::size_t>(dtype_size(dtype)));
}

std::size_t matrix_bytes(const char* op, const char* which, const MatrixView& m) {
    LOOM_CHECK(m.rows > 0 && m.cols > 0 && m.stride() >= m.cols,
               "{}: expected {} with rows > 0, cols > 0 and ld >= cols, given {} x {} with ld {}", op, which, m.rows,
               m.cols, m.stride());
    const auto rows = static_cast<std::size_t>(m.rows), cols = static_cast<std::size_t>(m.cols),
               ld = static_cast<std::size_t>(m.stride());
    const std::string what = fmt::format("{}'s extent ((rows - 1) x ld + cols elements)", which);
    std::size_t elems = checked_mul(op, what.c_str(), rows - 1, ld);
    LOOM_CHECK(!__builtin_add_overflow(elems, cols, &elems), "{}: {} overflows", op, what);
    return checked_mul(op, what.c_str(), elems, static_cast<std::size_t>(dtype_size(m.dtype)));
}

const char* to_string(MemoryKind k) {
    switch (k) {
        case MemoryKind::Unregistered:
            return "host memory unknown to CUDA (malloc, a static array or the stack) or no memory at all";
        case MemoryKind::Host:
            return "page-locked host memory (cudaMallocHost / cudaHostRegister)";
        case MemoryKind::Device:
            return "device memory";
        case MemoryKind::Managed:
            return "managed memory";
    }
    return "?";
}

MemoryRange query_memory(std::uintptr_t address) {
    // The runtime call makes the device's primary context current, which the driver's query needs.
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, reinterpret_cast<const void*>(address)) != cudaSuccess) {
        cudaGetLastError();
        return {};
    }
    MemoryRange r;
    switch (attr.type) {
        case cudaMemoryTypeDevice:
            r.kind = MemoryKind::Device;
            break;
        case cudaMemoryTypeManaged:
            r.kind = MemoryKind::Managed;
            break;
        case cudaMemoryTypeHost:
            r.kind = MemoryKind::Host;
            return r;
        default:
            return r;
    }
    r.device = attr.device;
    CUpointer_attribute names[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    CUdeviceptr start = 0;
    std::size_t size = 0;
    void* values[] = {&start, &size};
    LOOM_CU(cuPointerGetAttributes, 2, names, values, static_cast<CUdeviceptr>(address));
    r.start = static_cast<std::uintptr_t>(start);
    r.size = size;
    if (!r.contains(address)) {  // no range reported: keep this address alone
        r.start = address;
        r.size = 1;
    }
    return r;
}

MemoryRangeCache::MemoryRangeCache(Query query, std::size_t max_entries)
    : query_(std::move(query)), max_entries_(max_entries) {}

MemoryRange MemoryRangeCache::find(std::uintptr_t address) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = ranges_.upper_bound(address);
        if (it != ranges_.begin() && std::prev(it)->second.contains(address)) return std::prev(it)->second;
    }
    const MemoryRange r = query_(address);
    if (r.kind == MemoryKind::Device || r.kind == MemoryKind::Managed) {
        std::lock_guard<std::mutex> lock(mu_);
        if (ranges_.size() >= max_entries_) ranges_.clear();
        ranges_[r.start] = r;
    }
    return r;
}

void MemoryRangeCache::forget(std::uintptr_t address) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ranges_.upper_bound(address);
    if (it != ranges_.begin() && std::prev(it)->second.contains(address)) ranges_.erase(std::prev(it));
}

void MemoryRangeCache::clear() {
    std::lock_guard<std::mutex> lock(mu_);
    ranges_.clear();
}

std::size_t MemoryRangeCache::size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ranges_.size();
}

MemoryRangeCache& memory_ranges() {
    static MemoryRangeCache* const c = new MemoryRangeCache(query_memory);  // never destroyed: used at exit
    return *c;
}

namespace {

// "" when `device` may use the memory of answer r, else what it is.
std::string unusable(const MemoryRange& r, int device) {
    if (r.kind == MemoryKind::Managed || (r.kind == MemoryKind::Device && r.device == device)) return "";
    if (r.kind == MemoryKind::Device) return fmt::format("device memory of GPU {}", r.device);
    return to_string(r.kind);
}

}  // namespace

void check_usable(const char* op, const char* which, const void* p, std::size_t bytes, int device,
                  const MemoryRange& first, const MemoryRange& last) {
    const std::string a = unusable(first, device);
    LOOM_CHECK(
        a.empty(),
        "{}: expected {} to be device memory of GPU {} (cudaMalloc, world.alloc, a GPU tensor) or managed memory, "
        "given {} ({}): a kernel must never touch it",
        op, which, device, p, a);
    const std::string b = unusable(last, device);
    LOOM_CHECK(b.empty(),
               "{}: expected all {} bytes of {} in device memory of GPU {}, given {} whose last byte ({}) is {}: the "
               "buffer is shorter than its count says",
               op, bytes, which, device, p, static_cast<const void*>(static_cast<const char*>(p) + bytes - 1), b);
}

void check_in_allocation(const char* op, const char* which, const void* p, std::size_t bytes,
                         const std::optional<World::Allocation>& a) {
    LOOM_CHECK(a.has_value(),
               "{}: {} ({}) points into the symmetric heap but into no live allocation (freed, or never returned by "
               "world.alloc)",
               op, which, p);
    const std::size_t offset =
        static_cast<std::size_t>(static_cast<const char*>(p) - static_cast<const char*>(a->start));
    LOOM_CHECK(bytes <= a->bytes - offset,
               "{}: expected {} to lie in one symmetric allocation, given {} needing {} bytes at offset {} of an "
               "allocation of {} bytes (at {}): allocate at least {} bytes",
               op, which, p, bytes, offset, a->bytes, a->start, offset + bytes);
}

bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) {
    const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
    return an > 0 && bn > 0 && (x <= y ? y - x < an : x - y < bn);
}

void check_disjoint(const char* op, const char* a_name, const void* a, std::size_t a_bytes, const char* b_name,
                    const void* b, std::size_t b_bytes) {
    LOOM_CHECK(!overlaps(a, a_bytes, b, b_bytes),
               "{}: expected {} not to overlap {}, given {} ({} bytes) and {} ({} bytes)", op, a_name, b_name, a,
               a_bytes, b, b_bytes);
}

namespace {

// A view's rows as byte intervals relative to `base` (at or below the view): `rows` rows of `width` bytes, `pitch`
// apart. A dense view, or one of a single row, is one interval.
struct RowSet {
    std::uint64_t start, width, pitch, rows;
};
RowSet row_set(const MatrixView& m, std::uintptr_t base) {
    const std::uint64_t e = dtype_size(m.dtype), w = static_cast<std::uint64_t>(m.cols) * e,
                        p = static_cast<std::uint64_t>(m.stride()) * e, r = static_cast<std::uint64_t>(m.rows);
    const std::uint64_t start = reinterpret_cast<std::uintptr_t>(m.data) - base;
    if (r == 1 || p == w) return {start, (r - 1) * p + w, (r - 1) * p + w, 1};
    return {start, w, p, r};
}

// Whether the interval [s, s + w) meets a row of q: q's first row ending past s is the only candidate.
bool meets_a_row(std::uint64_t s, std::uint64_t w, const RowSet& q) {
    const std::uint64_t j = s >= q.start + q.width ? (s - q.start - q.width) / q.pitch + 1 : 0;
    return j < q.rows && q.start + j * q.pitch < s + w;
}

// Whether some row of a meets some row of b. One pitch: B's row j starts d bytes into A's row j + k (delta = k p + d),
// so it can meet only A's rows j + k (d < wa) and j + k + 1 (d + wb > p): O(1). Otherwise the rows of the view with
// fewer rows are walked across the other's span.
bool rows_meet(const RowSet& a, const RowSet& b) {
    if (a.rows > 1 && b.rows > 1 && a.pitch == b.pitch) {
        // In 128 bits: offsets and pitches are below 2^64, their differences and sums are not below 2^63.
        using I = __int128;
        const I p = static_cast<I>(a.pitch);
        const I delta = static_cast<I>(b.start) - static_cast<I>(a.start);
        const I k = delta >= 0 ? delta / p : -((-delta + p - 1) / p), d = delta - k * p;
        const I ra = static_cast<I>(a.rows), rb = static_cast<I>(b.rows);
        // Some j in [0, rb) with j + shift in [0, ra).
        auto some_row = [&](I shift) { return std::max<I>(0, -shift) < std::min<I>(rb, ra - shift); };
        return (d < static_cast<I>(a.width) && some_row(k)) || (d + static_cast<I>(b.width) > p && some_row(k + 1));
    }
    const RowSet& walk = a.rows <= b.rows ? a : b;
    const RowSet& other = a.rows <= b.rows ? b : a;
    const std::uint64_t other_end = other.start + (other.rows - 1) * other.pitch + other.width;
    std::uint64_t i =
        other.start >= walk.start + walk.width ? (other.start - walk.start - walk.width) / walk.pitch + 1 : 0;
    for (; i < walk.rows; ++i) {
        const std::uint64_t s = walk.start + i * walk.pitch;
        if (s >= other_end) break;
        if (meets_a_row(s, walk.width, other)) return true;
    }
    return false;
}

}  // namespace

void check_disjoint(const char* op, const char* a_name, const MatrixView& a, const char* b_name, const MatrixView& b) {
    if (a.data == nullptr || b.data == nullptr || a.rows <= 0 || b.rows <= 0 || a.cols <= 0 || b.cols <= 0) return;
    if (!overlaps(a.data, matrix_bytes(op, a_name, a), b.data, matrix_bytes(op, b_name, b))) return;
    const std::uintptr_t base =
        std::min(reinterpret_cast<std::uintptr_t>(a.data), reinterpret_cast<std::uintptr_t>(b.data));
    LOOM_CHECK(!rows_meet(row_set(a, base), row_set(b, base)),
               "{}: expected {} not to overlap {}, given {} ({} x {}, ld {}) and {} ({} x {}, ld {})", op, a_name,
               b_name, a.data, a.rows, a.cols, a.stride(), b.data, b.rows, b.cols, b.stride());
}

namespace {
std::atomic<std::uint64_t> g_memory_generation{0};
}  // namespace

std::uint64_t memory_generation() { return g_memory_generation.load(std::memory_order_acquire); }
void bump_memory_generation() { g_memory_generation.fetch_add(1, std::memory_order_acq_rel); }

void check_memory(const World* world, int device, const char* op, const char* which, const void* p, std::size_t bytes) {
    if (world && world->is_symmetric(p))
        return check_in_allocation(op, which, p, bytes, world->symmetric_allocation(p));
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    LOOM_CHECK(bytes <= std::numeric_limits<std::uintptr_t>::max() - a + 1,
               "{}: {} ({}, {} bytes) runs past the end of the address space", op, which, p, bytes);
    MemoryRangeCache& cache = memory_ranges();
    const MemoryRange first = cache.find(a);
    const MemoryRange last = first.contains(a + bytes - 1) ? first : cache.find(a + bytes - 1);
    check_usable(op, which, p, bytes, device, first, last);
}

void check_memory(const World* world, int device, const char* op, const char* which, const MatrixView& m) {
    check_memory(world, device, op, which, m.data, matrix_bytes(op, which, m));
}

}  // namespace loom::detail

namespace loom {

void forget_device_memory(const void* p) {
    detail::bump_memory_generation();
    if (p == nullptr) return detail::memory_ranges().clear();
    detail::memory_ranges().forget(reinterpret_cast<std::uintptr_t>(p));
}

}  // namespace loom
