// Tests and benchmarks that switch a setting around some calls: the process's settings replaced for one scope.
// Not thread-safe against concurrent settings() readers holding a reference across the switch.
#pragma once

#include <memory>

#include "loom/runtime/settings.hpp"

namespace loom::detail {

class ScopedSettings {
  public:
    explicit ScopedSettings(const Settings& s);
    ~ScopedSettings();
    ScopedSettings(const ScopedSettings&) = delete;
    ScopedSettings& operator=(const ScopedSettings&) = delete;

  private:
    std::unique_ptr<Settings> old_;
};

}  // namespace loom::detail
