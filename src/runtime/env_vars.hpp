// Typed readers of single environment variables, for settings_from (settings.cpp) and for the few places that parse
// one variable of a synthetic environment. Library code takes its settings from loom::settings(), never from these.
// Errors name the variable and the value given; unset or empty -> fallback.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include "loom/runtime/env.hpp"

namespace loom {

std::optional<std::string> env_str(const EnvLookup& env, const char* name);
long long env_int(const EnvLookup& env, const char* name, long long fallback);
// "1", "true", "yes", "on" / "0", "false", "no", "off" (case-insensitive).
bool env_flag(const EnvLookup& env, const char* name);
// parse_bytes' forms: 1073741824, 1G, 512M, 64K, 2GiB.
std::size_t env_bytes(const EnvLookup& env, const char* name, std::size_t fallback);
// A duration in milliseconds in [0, max_ms] (default: a year, which the waits' nanosecond clocks hold).
std::chrono::milliseconds env_ms(const EnvLookup& env, const char* name, std::chrono::milliseconds fallback,
                                 long long max_ms = 365LL * 24 * 3600 * 1000);

}  // namespace loom
