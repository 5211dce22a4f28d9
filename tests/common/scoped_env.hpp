// Sets (or, with nullopt, unsets) an environment variable for one scope and restores its old value. Loom reads its
// own settings once per process (loom::settings()): a test that switches a LOOM_* setting uses
// loom::detail::ScopedSettings (runtime/settings_override.hpp). ScopedEnv is for what a child process inherits and
// for variables of other programs.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace loom {

class ScopedEnv {
  public:
    ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old;
        if (value) {
            ::setenv(name, value->c_str(), 1);
        } else {
            ::unsetenv(name);
        }
    }
    ~ScopedEnv() {
        if (old_) {
            ::setenv(name_, old_->c_str(), 1);
        } else {
            ::unsetenv(name_);
        }
    }
    ScopedEnv(const ScopedEnv&) = delete;
    ScopedEnv& operator=(const ScopedEnv&) = delete;

  private:
    const char* name_;
    std::optional<std::string> old_;
};

}  // namespace loom
