// Shared test support: the world-aware GoogleTest environment and GPU skips.
//
// loom_dist_tests runs one process per rank under loomrun; LoomTestEnv owns the World (created on first use),
// and only rank 0 prints GoogleTest's output. Fixtures skip with a clear message when there is no GPU.
#pragma once

#include <gtest/gtest.h>

#include "loom/runtime/driver.hpp"
#include "loom/runtime/world.hpp"

namespace loom::test {

// The process's World for multi-rank tests (created from the environment on first call).
World& world();
// True when a GPU and driver are present.
bool has_gpu();

}  // namespace loom::test

// Skip the current test when no GPU is present, saying why.
#define LOOM_REQUIRE_GPU()                                                                                \
    do {                                                                                                  \
        if (!::loom::test::has_gpu()) GTEST_SKIP() << "no GPU: " << ::loom::driver::unavailable_reason(); \
    } while (0)
