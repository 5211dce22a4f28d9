// loom::version(): the version this library was built as (LOOM_VERSION_STRING of its own headers).
#include "loom/version.hpp"

namespace loom {

const char* version() noexcept { return LOOM_VERSION_STRING; }

}  // namespace loom
