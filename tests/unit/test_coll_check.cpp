// The collectives' argument checks on the host: each raises loom::Error naming the argument, never a crash.
#include <gtest/gtest.h>

#include <string>

#include "loom/runtime/error.hpp"
#include "ops/collectives/coll_check.hpp"

namespace {

using loom::BufferView;
using loom::DType;

std::string error_of(const BufferView& b) {
    try {
        loom::coll::check_view("all_reduce", "in", b);
    } catch (const loom::Error& e) {
        return e.what();
    }
    return "";
}

TEST(CollCheck, OutOfRangeDtypeIsAnErrorNotADivisionByZero) {
    alignas(16) static char buf[64];
    for (int v : {-1, 7, 42}) {
        const std::string msg = error_of(BufferView{buf, static_cast<DType>(v), 4});
        EXPECT_NE(msg.find("known dtype"), std::string::npos) << msg;
        EXPECT_NE(msg.find("in"), std::string::npos) << msg;
        EXPECT_NE(msg.find(std::to_string(v)), std::string::npos) << msg;
    }
}

TEST(CollCheck, NullEmptyAndMisalignedBuffersNameTheArgument) {
    alignas(16) static char buf[64];
    EXPECT_NE(error_of(BufferView{nullptr, DType::F32, 4}).find("nullptr"), std::string::npos);
    EXPECT_NE(error_of(BufferView{buf, DType::F32, 0}).find("count 0"), std::string::npos);
    EXPECT_NE(error_of(BufferView{buf + 2, DType::F32, 4}).find("aligned"), std::string::npos);
    EXPECT_EQ(error_of(BufferView{buf, DType::F32, 4}), "");
}

}  // namespace
