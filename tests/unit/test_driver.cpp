// The CUDA driver table, resolved at run time.
#include <gtest/gtest.h>

#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"

namespace {

// On a machine without a driver (CI) the driver table must say so plainly instead of crashing; with a GPU the
// table resolves every entry point.
TEST(Driver, AvailabilityIsReportedWithoutCrashing) {
    if (loom::driver::available()) {
        EXPECT_EQ(loom::driver::unavailable_reason(), "");
        EXPECT_NE(loom::driver::api().cuMemCreate, nullptr);
    } else {
        EXPECT_FALSE(loom::driver::unavailable_reason().empty());
        EXPECT_THROW(loom::driver::api(), loom::Error);
        try {
            loom::driver::api();
        } catch (const loom::Error& e) {
            EXPECT_EQ(e.api(), "cuda-driver");
        }
    }
}

}  // namespace
