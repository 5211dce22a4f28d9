// loom::Error: what LOOM_CHECK and the API-specific checks raise, decoded and located.
#include <gtest/gtest.h>

#include <cerrno>
#include <string>

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

}  // namespace
