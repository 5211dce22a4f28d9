// The cross-node kernels compile: tests/dist/kernels/crossnode.cuh with remote peers (nvcc + NVSHMEM, every group
// scope) for sm_90a, the ops' kernels that run across nodes (hierarchical collectives, low-latency EP) as the ops
// compile them, and the kernel without remote peers under NVRTC, with the trap's diagnostic in its cubin. Needs no
// GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/nvshmem_build.hpp"
#include "loom/jit/jit.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "ops/moe/ep/ll_state.hpp"
#include "runtime/settings_override.hpp"

namespace {

const std::string kKernels = LOOM_SOURCE_DIR "/tests/dist/kernels/crossnode.cuh";

bool contains(const std::vector<char>& bin, const std::string& s) {
    return std::search(bin.begin(), bin.end(), s.begin(), s.end()) != bin.end();
}

TEST(CrossNodeCompile, RemoteKernelsCompileAtEveryScope) {
    if (const auto why = loom::test::nvshmem_build_missing()) GTEST_SKIP() << *why;
    for (const char* k : {"put_all", "get_all", "signal_ring", "barrier_rounds"}) {
        for (const char* g : {"loom::lang::Thread", "loom::lang::Warp", "loom::lang::Block"}) {
            SCOPED_TRACE(std::string(k) + "<" + g + ">");
            loom::jit::KernelSpec s;
            s.header = kKernels;
            s.name = std::string("xnode_test::") + k;
            s.template_args = {g};
            s.remote_peers = true;
            const auto r = loom::jit::compile(s, 90);
            EXPECT_EQ(r.compiler, "nvcc+nvjitlink");
            EXPECT_FALSE(r.lowered_name.empty());
            // The remote column's own diagnostic, not the one asking for remote peers.
            EXPECT_TRUE(contains(r.cubin, "reach it with put / get / put_signal / notify / signal_op"));
        }
    }
}

// The hierarchical collectives' kernels (kernels/collectives/hier.cuh) as the ops compile them: with remote peers.
TEST(CrossNodeCompile, HierarchicalCollectivesCompileWithRemotePeers) {
    if (const auto why = loom::test::nvshmem_build_missing()) GTEST_SKIP() << *why;
    const std::vector<std::pair<std::string, std::vector<std::string>>> kernels = {
        {"hier_all_gather_inter", {}},
        {"hier_all_gather_intra", {}},
        {"hier_reduce_scatter_intra", {"__nv_bfloat16", "0"}},
        {"hier_reduce_scatter_inter", {"float", "1"}},
        {"hier_all_reduce_intra", {"__half", "1"}},
        {"hier_all_reduce_inter", {"float", "0"}},
        {"hier_all_reduce_gather", {"__nv_bfloat16"}},
        {"hier_all_to_all_intra", {}},
        {"hier_all_to_all_inter", {}},
        {"hier_all_to_all_v_counts", {}},
        {"hier_all_to_all_v_data", {}},
    };
    for (const auto& [name, targs] : kernels) {
        SCOPED_TRACE(name);
        loom::jit::KernelSpec s;
        s.header = "loom/kernels/collectives/hier.cuh";
        s.name = "loom::kernels::coll::" + name;
        s.template_args = targs;
        s.remote_peers = true;
        const auto r = loom::jit::compile(s, 90);
        EXPECT_EQ(r.compiler, "nvcc+nvjitlink");
        EXPECT_FALSE(r.lowered_name.empty());
        // The profiled instantiation (the JIT's while the profiler is on: docs/profiling.md) of one kernel per op.
        if (name == "hier_all_gather_intra" || name == "hier_reduce_scatter_inter" || name == "hier_all_reduce_inter" ||
            name == "hier_all_to_all_v_data") {
            s.defines = {"LOOM_PROFILE=1"};
            const auto p = loom::jit::compile(s, 90);
            EXPECT_FALSE(p.lowered_name.empty());
            EXPECT_NE(p.cache_key, r.cache_key);
            // The define reached nvcc: the profiled module carries the ring pointer the JIT binds at load.
            EXPECT_TRUE(contains(p.cubin, "loom_profile_ring"));
            EXPECT_FALSE(contains(r.cubin, "loom_profile_ring"));
        }
    }
}

// The low-latency EP kernels (kernels/moe/ep_ll.cuh) as the ops compile them in a World of several nodes: with remote
// peers and the ops' defines, without spills.
TEST(CrossNodeCompile, EpLowLatencyCompilesWithRemotePeers) {
    if (const auto why = loom::test::nvshmem_build_missing()) GTEST_SKIP() << *why;
    for (const loom::jit::KernelSpec& s :
         {loom::moe::ep_ll::dispatch_spec(true, true), loom::moe::ep_ll::dispatch_spec(false, true),
          loom::moe::ep_ll::combine_spec(true)}) {
        SCOPED_TRACE(s.display());
        EXPECT_TRUE(s.remote_peers);
        EXPECT_EQ(s.defines, std::vector<std::string>{"LOOM_NO_DEVICE_PRINTF=1"});
        const auto r = loom::jit::compile(s, 90);
        EXPECT_EQ(r.compiler, "nvcc+nvjitlink");
        EXPECT_FALSE(r.lowered_name.empty());
        EXPECT_EQ(r.spill_bytes, 0) << r.resource_report;
    }
}

TEST(CrossNodeCompile, KernelWithoutRemotePeersKeepsNvrtcAndCarriesTheDiagnostic) {
    loom::jit::KernelSpec s;
    s.header = kKernels;
    s.name = "xnode_test::touch_peer_undeclared";
    for (int arch : {90, 80}) {
        const auto r = loom::jit::compile(s, arch);
        EXPECT_EQ(r.compiler, "nvrtc");
        EXPECT_TRUE(contains(r.cubin, "compile the kernel with remote peers (jit::KernelSpec::remote_peers)"));
    }
}

TEST(CrossNodeCompile, RemotePeersUnderNvrtcIsACompileError) {
    const loom::detail::ScopedSettings nofallback([](loom::Settings& x) { x.jit_nvcc_fallback = false; });
    loom::jit::KernelSpec s;
    s.header = "loom/lang/lang.cuh";
    s.defines = {"LOOM_REMOTE_PEERS=1"};
    try {
        loom::jit::compile(s, 90);
        ADD_FAILURE() << "LOOM_REMOTE_PEERS=1 compiled under NVRTC";
    } catch (const loom::Error& e) {
        EXPECT_NE(std::string(e.what()).find("compile the kernel with jit::KernelSpec::remote_peers"),
                  std::string::npos)
            << e.what();
    }
}

}  // namespace
