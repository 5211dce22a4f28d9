// Every ptx/ and lang/ header compiles alone under NVRTC for sm_90a and sm_80, and one kernel instantiates every
// primitive family (so the templates are really compiled). Needs no GPU: loom::jit::compile only.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/jit/jit.hpp"

namespace {

const std::vector<std::string> kHeaders = {
    "loom/ptx/memory.cuh", "loom/ptx/async.cuh", "loom/ptx/special.cuh", "loom/ptx/ptx.cuh",   "loom/lang/group.cuh",
    "loom/lang/spin.cuh",  "loom/lang/rank.cuh", "loom/lang/signal.cuh", "loom/lang/copy.cuh", "loom/lang/barrier.cuh",
    "loom/lang/ll.cuh",    "loom/lang/lang.cuh", "loom/lang/remote.cuh",
};

const std::string kTestKernels = LOOM_SOURCE_DIR "/tests/dist/kernels/lang_test.cuh";

TEST(LangHeaders, EachCompilesAloneForSm90aAndSm80) {
    for (int arch : {90, 80}) {
        for (const auto& h : kHeaders) {
            SCOPED_TRACE(h + " sm_" + std::to_string(arch));
            loom::jit::KernelSpec spec;
            spec.header = h;  // empty name: header-only compile
            EXPECT_NO_THROW(loom::jit::compile(spec, arch));
        }
    }
}

loom::jit::CompileResult compile_kernel(const std::string& name, std::vector<std::string> targs, int arch) {
    loom::jit::KernelSpec spec;
    spec.header = kTestKernels;
    spec.name = name;
    spec.template_args = std::move(targs);
    return loom::jit::compile(spec, arch);
}

TEST(LangHeaders, EveryPrimitiveFamilyInstantiates) {
    // TMA path (sm_90 only) at block and warp scope; ld/st path at every scope and on sm_80.
    for (const char* g : {"loom::lang::Block", "loom::lang::Warp"}) {
        SCOPED_TRACE(g);
        auto r = compile_kernel("loom_test::instantiate_all", {g, "1"}, 90);
        EXPECT_FALSE(r.cubin.empty());
    }
    for (int arch : {90, 80}) {
        for (const char* g : {"loom::lang::Thread", "loom::lang::Warp", "loom::lang::Block"}) {
            SCOPED_TRACE(std::string(g) + " sm_" + std::to_string(arch));
            auto r = compile_kernel("loom_test::instantiate_all", {g, "0"}, arch);
            EXPECT_FALSE(r.cubin.empty());
        }
    }
}

TEST(LangHeaders, TestKernelsCompile) {
    for (const char* k : {"loom_test::mp_litmus", "loom_test::many_notify", "loom_test::wait_count",
                          "loom_test::epochs", "loom_test::barrier_rounds", "loom_test::missing_notify"}) {
        SCOPED_TRACE(k);
        EXPECT_NO_THROW(compile_kernel(k, {}, 90));
    }
    EXPECT_NO_THROW(compile_kernel("loom_test::ll_pingpong", {"loom::lang::LL8"}, 90));
    EXPECT_NO_THROW(compile_kernel("loom_test::ll_pingpong", {"loom::lang::LL16"}, 90));
    EXPECT_NO_THROW(compile_kernel("loom_test::move", {"loom::lang::Block", "1"}, 90));
}

TEST(LangHeaders, TmaPathIsRejectedOnSm80) {
    // The TMA data path static_asserts on older archs instead of compiling into a trap.
    EXPECT_THROW(compile_kernel("loom_test::instantiate_all", {"loom::lang::Block", "1"}, 80), std::exception);
}

}  // namespace
