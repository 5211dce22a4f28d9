// NVTX ranges for profilers (Nsight Systems, and any tool that reads NVTX): each public op call and each JIT
// compile opens one on the calling thread, in the NVTX domain "loom", named like "loom::ag_gemm M=8192 N=4096 K=8192".
//
//     const loom::detail::NvtxRange nvtx("loom::ag_gemm M={} N={} K={}", c.rows, c.cols, a.cols);
//
// Without a tool attached (NVTX's no-op state, decided once per process at the first call, as NVTX decides it) a
// range costs a call, a load and a branch: the name is never formatted. With a tool, the name is formatted into a
// buffer on the stack (no heap allocation) and truncated to NvtxName::kCapacity - 1 characters. The arguments are
// evaluated either way: pass values and references, not strings built for the name.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <utility>

namespace loom::detail {

// True when an NVTX tool is attached to this process (Loom's NVTX domain exists).
bool nvtx_enabled() noexcept;
// Push / pop a range of Loom's domain on the calling thread. Call only when nvtx_enabled().
void nvtx_push(const char* name) noexcept;
void nvtx_pop() noexcept;

// A range name formatted into a fixed buffer: no heap allocation, truncated to kCapacity - 1 characters.
class NvtxName {
  public:
    static constexpr std::size_t kCapacity = 256;

    template <class... Args>
    explicit NvtxName(fmt::format_string<Args...> f, Args&&... args) {
        *fmt::format_to_n(buf_, kCapacity - 1, f, std::forward<Args>(args)...).out = '\0';
    }
    const char* c_str() const { return buf_; }

  private:
    char buf_[kCapacity];
};

// One NVTX range, from construction to destruction (scope-bound; not copyable, not movable).
class NvtxRange {
  public:
    template <class... Args>
    explicit NvtxRange(fmt::format_string<Args...> f, Args&&... args) : active_(nvtx_enabled()) {
        if (active_) nvtx_push(NvtxName(f, std::forward<Args>(args)...).c_str());
    }
    ~NvtxRange() {
        if (active_) nvtx_pop();
    }
    NvtxRange(const NvtxRange&) = delete;
    NvtxRange& operator=(const NvtxRange&) = delete;

  private:
    bool active_;
};

}  // namespace loom::detail
