#include <gtest/gtest.h>

#include <cerrno>

#include "loom/runtime/driver.hpp"
#include "loom/runtime/error.hpp"

namespace {

TEST(Error, CheckCarriesApiMessageAndLocation) {
    try {
        int expected = 4, given = 3;
        LOOM_CHECK(given == expected, "world size: expected {}, given {}", expected, given);
        FAIL() << "LOOM_CHECK did not throw";
    } catch (const loom::Error& e) {
        EXPECT_EQ(e.api(), "loom");
        EXPECT_EQ(e.detail(), "world size: expected 4, given 3");
        EXPECT_NE(std::string(e.what()).find("test_error.cpp"), std::string::npos);
        EXPECT_GT(e.line(), 0);
    }
}

TEST(Error, CudaRuntimeErrorIsDecoded) {
    try {
        LOOM_CHECK_CUDA(2);  // cudaErrorMemoryAllocation
        FAIL();
    } catch (const loom::Error& e) {
        EXPECT_EQ(e.api(), "cuda-runtime");
        EXPECT_NE(e.detail().find("cudaErrorMemoryAllocation"), std::string::npos) << e.detail();
    }
}

TEST(Error, ErrnoIsDecoded) {
    errno = ENOENT;
    try {
        LOOM_CHECK_ERRNO(-1);
        FAIL();
    } catch (const loom::Error& e) {
        EXPECT_EQ(e.api(), "posix");
        EXPECT_NE(e.detail().find("No such file"), std::string::npos) << e.detail();
    }
}

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
