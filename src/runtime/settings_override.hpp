// Tests and benchmarks that switch a setting around some calls: the process's settings replaced for one scope, then
// restored. Scopes nest. Not thread-safe against other threads reading settings() across the switch.
//
//     loom::detail::ScopedSettings tune([](loom::Settings& s) { s.autotune = true; });
#pragma once

#include <concepts>
#include <memory>
#include <utility>

#include "loom/runtime/settings.hpp"

namespace loom::detail {

class ScopedSettings {
  public:
    // The process's settings become `s`.
    explicit ScopedSettings(const Settings& s);
    // The process's settings become a copy of the current ones, edited by `edit(Settings&)`.
    template <class Edit>
    requires std::invocable<Edit, Settings&>
    explicit ScopedSettings(Edit&& edit) : ScopedSettings(edited(std::forward<Edit>(edit))) {}
    ~ScopedSettings();
    ScopedSettings(const ScopedSettings&) = delete;
    ScopedSettings& operator=(const ScopedSettings&) = delete;

  private:
    template <class Edit>
    static Settings edited(Edit&& edit) {
        Settings s = settings();
        std::forward<Edit>(edit)(s);
        return s;
    }
    std::unique_ptr<Settings> old_;
};

}  // namespace loom::detail
