// Loom's one exception type and the checking macros that raise it.
//
// Every failure in the host library is a loom::Error carrying the API that failed, the decoded error and
// the file:line of the check. The library never calls exit().
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace loom {

class Error : public std::runtime_error {
  public:
    Error(std::string api, std::string detail, const char* file, int line);
    const std::string& api() const { return api_; }
    const std::string& detail() const { return detail_; }
    const char* file() const { return file_; }
    int line() const { return line_; }

  private:
    std::string api_, detail_;
    const char* file_;
    int line_;
};

namespace detail {
[[noreturn]] void throw_cuda(int err, const char* expr, const char* file, int line);
[[noreturn]] void throw_cu(int err, const char* expr, const char* file, int line);
[[noreturn]] void throw_nvrtc(int err, const char* expr, const char* file, int line);
[[noreturn]] void throw_nvjitlink(int err, const char* expr, const char* file, int line);
[[noreturn]] void throw_errno(int err, const char* expr, const char* file, int line);
}  // namespace detail

}  // namespace loom

// LOOM_CHECK(cond, "format {}", args...): raises loom::Error("loom", message) when cond is false.
#define LOOM_CHECK(cond, ...)                                                                     \
    do {                                                                                          \
        if (!(cond)) throw ::loom::Error("loom", ::fmt::format(__VA_ARGS__), __FILE__, __LINE__); \
    } while (0)
#define LOOM_FAIL(...) throw ::loom::Error("loom", ::fmt::format(__VA_ARGS__), __FILE__, __LINE__)

// Runtime API (cudaError_t), driver API (CUresult), NVRTC (nvrtcResult), nvJitLink (nvJitLinkResult), and
// POSIX calls returning -1 with errno.
#define LOOM_CHECK_CUDA(expr)                                                                 \
    do {                                                                                      \
        int loom_err_ = static_cast<int>(expr);                                               \
        if (loom_err_ != 0) ::loom::detail::throw_cuda(loom_err_, #expr, __FILE__, __LINE__); \
    } while (0)
#define LOOM_CHECK_CU(expr)                                                                 \
    do {                                                                                    \
        int loom_err_ = static_cast<int>(expr);                                             \
        if (loom_err_ != 0) ::loom::detail::throw_cu(loom_err_, #expr, __FILE__, __LINE__); \
    } while (0)
#define LOOM_CHECK_NVRTC(expr)                                                                 \
    do {                                                                                       \
        int loom_err_ = static_cast<int>(expr);                                                \
        if (loom_err_ != 0) ::loom::detail::throw_nvrtc(loom_err_, #expr, __FILE__, __LINE__); \
    } while (0)
#define LOOM_CHECK_NVJITLINK(expr)                                                                 \
    do {                                                                                           \
        int loom_err_ = static_cast<int>(expr);                                                    \
        if (loom_err_ != 0) ::loom::detail::throw_nvjitlink(loom_err_, #expr, __FILE__, __LINE__); \
    } while (0)
#define LOOM_CHECK_ERRNO(expr)                                                           \
    do {                                                                                 \
        if ((expr) == -1) ::loom::detail::throw_errno(errno, #expr, __FILE__, __LINE__); \
    } while (0)
