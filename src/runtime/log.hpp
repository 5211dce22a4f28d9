// Loom's messages on stderr: "loom[rank r]: ..." when LOOM_LOG_LEVEL lets `level` through (log_enabled).
//
//     loom::log(LogLevel::Debug, "compiled {} in {:.3f} s", name, seconds);
//     for (...) loom::log_progress(LogLevel::Warn, "tuning {}: {}/{}", op, i, n);  // one line, rewritten
//     loom::log_progress_end(LogLevel::Warn);
//
// Each message is written with one call, so lines of concurrent threads do not interleave. Progress lines rewrite
// one terminal line when stderr is a terminal, and are whole lines otherwise (loomrun's pipes, log files).
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <utility>

#include "loom/runtime/settings.hpp"

namespace loom {

namespace detail {

inline bool stderr_is_terminal() {
    static const bool tty = ::isatty(STDERR_FILENO) == 1;
    return tty;
}

inline void write_stderr(const std::string& text) {
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
}

}  // namespace detail

template <class... Args>
void log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
    if (!log_enabled(level)) return;
    detail::write_stderr(
        fmt::format("loom[rank {}]: {}\n", settings().rank.rank, fmt::format(f, std::forward<Args>(args)...)));
}

template <class... Args>
void log_progress(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
    if (!log_enabled(level)) return;
    const std::string msg = fmt::format(f, std::forward<Args>(args)...);
    if (detail::stderr_is_terminal()) {
        detail::write_stderr(fmt::format("\rloom[rank {}]: {}\033[K", settings().rank.rank, msg));
    } else {
        detail::write_stderr(fmt::format("loom[rank {}]: {}\n", settings().rank.rank, msg));
    }
}

// Ends a run of log_progress lines (a newline on a terminal).
inline void log_progress_end(LogLevel level) {
    if (log_enabled(level) && detail::stderr_is_terminal()) detail::write_stderr("\n");
}

}  // namespace loom
