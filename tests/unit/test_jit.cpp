// CPU tests of Loom's JIT (NVRTC needs no GPU): hashing, the disk cache (hit, miss, invalidation, concurrent
// writers, cache-only), compiler errors, the nvcc and nvrtc-ptxas paths, debug artifacts, and the NVSHMEM
// device-link path. Each test switches the process's settings (cache directory, compiler) with ScopedSettings.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/child_process.hpp"
#include "common/nvshmem_build.hpp"
#include "jit/backends.hpp"
#include "jit/sha256.hpp"
#include "jit/toolchain.hpp"
#include "loom/jit/jit.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "runtime/settings_override.hpp"

extern char** environ;

namespace fs = std::filesystem;

namespace {

const std::string kKernels = std::string(LOOM_SOURCE_DIR) + "/tests/unit/kernels";

using loom::JitCompiler;
using loom::Settings;
using loom::detail::ScopedSettings;

// A fresh cache directory per test with the default compiler, removed afterwards.
class JitCache : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::path(::testing::TempDir()) / fmt::format("loom-jit-{}-{}", ::getpid(), counter_++);
        fs::remove_all(dir_);
        fs::create_directories(dir_);
        settings_.emplace([this](Settings& s) {
            s.cache_dir = dir_.string();
            s.jit_compiler = JitCompiler::Nvrtc;
            s.jit_nvcc_fallback = true;
            s.log_level = loom::LogLevel::Warn;
        });
    }
    void TearDown() override {
        settings_.reset();
        fs::remove_all(dir_);
    }
    loom::jit::KernelSpec add_spec(const std::string& dir = kKernels) const {
        loom::jit::KernelSpec s;
        s.header = dir + "/jit_add.cuh";
        s.name = "jit_test::add_n";
        s.template_args = {"7", "float"};
        return s;
    }
    // Cache entries (complete or not) under <dir>/jit, excluding failed compiles.
    std::vector<std::string> entries() const {
        std::vector<std::string> out;
        for (const auto& e : fs::directory_iterator(dir_ / "jit"))
            if (e.path().filename() != "failed") out.push_back(e.path().filename().string());
        return out;
    }
    fs::path dir_;
    std::optional<ScopedSettings> settings_;
    static inline int counter_ = 0;
};

TEST(JitSha256, KnownVectors) {
    using loom::jit::detail::sha256_hex;
    EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    // Incremental updates across block boundaries give the same digest as one update.
    std::string million(1000000, 'a');
    loom::jit::detail::Sha256 s;
    for (std::size_t i = 0; i < million.size(); i += 999) s.update(million.substr(i, 999));
    EXPECT_EQ(s.hex(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(JitPtxasParse, ReadsTheEntryBlock) {
    const std::string log =
        "ptxas info    : 0 bytes gmem\n"
        "ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90a'\n"
        "ptxas info    : Function properties for _Z3fooPf\n"
        "    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 40 registers, used 1 barriers, 4096 bytes smem, 360 bytes cmem[0]\n"
        "ptxas info    : Compiling entry function '_Z3barPf' for 'sm_90a'\n"
        "ptxas info    : Function properties for _Z3barPf\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 8 registers, used 0 barriers, 360 bytes cmem[0]\n";
    auto r = loom::jit::detail::parse_ptxas_verbose(log, "_Z3fooPf");
    EXPECT_EQ(r.registers, 40);
    EXPECT_EQ(r.stack_bytes, 16);
    EXPECT_EQ(r.spill_store_bytes, 8);
    EXPECT_EQ(r.spill_load_bytes, 4);
    EXPECT_EQ(r.smem_bytes, 4096);
    auto b = loom::jit::detail::parse_ptxas_verbose(log, "_Z3barPf");
    EXPECT_EQ(b.registers, 8);
    EXPECT_EQ(b.smem_bytes, 0);
    EXPECT_EQ(b.report.find("_Z3fooPf"), std::string::npos);
}

TEST(JitSpec, Display) {
    loom::jit::KernelSpec s{
        .header = "loom/kernels/gemm/gemm.cuh", .name = "loom::kernels::gemm", .template_args = {"128", "4"}};
    EXPECT_EQ(s.display(), "loom::kernels::gemm<128, 4>");
    s.template_args.clear();
    EXPECT_EQ(s.display(), "loom::kernels::gemm");
}

TEST_F(JitCache, MissThenHitWithResources) {
    auto spec = add_spec();
    auto a = loom::jit::compile(spec, 90);
    EXPECT_FALSE(a.from_cache);
    EXPECT_EQ(a.compiler, "nvrtc");
    EXPECT_FALSE(a.cubin.empty());
    EXPECT_EQ(a.cache_key.size(), 64u);
    EXPECT_EQ(a.lowered_name, "_ZN8jit_test5add_nILi7EfEEvN4loom3CtxEPKT0_PS3_i");
    EXPECT_GT(a.registers, 0) << a.log;
    EXPECT_EQ(a.spill_bytes, 0);
    EXPECT_GE(a.stack_bytes, 0);
    EXPECT_EQ(a.smem_bytes, 0);
    EXPECT_NE(a.resource_report.find("registers"), std::string::npos) << a.resource_report;
    EXPECT_TRUE(fs::exists(a.tu_path)) << a.tu_path;
    EXPECT_TRUE(fs::exists(a.cache_dir + "/meta.json"));
    // The header's plain __global__ function is emitted too; the instantiation is there by its lowered name.
    auto entries = loom::jit::detail::cubin_entries(a.cubin);
    EXPECT_EQ(entries.size(), 2u);
    EXPECT_NE(std::find(entries.begin(), entries.end(), a.lowered_name), entries.end());

    auto b = loom::jit::compile(spec, 90);
    EXPECT_TRUE(b.from_cache);
    EXPECT_EQ(b.cache_key, a.cache_key);
    EXPECT_EQ(b.cubin, a.cubin);
    EXPECT_EQ(b.lowered_name, a.lowered_name);
    EXPECT_EQ(b.registers, a.registers);

    // Arch, template arguments and defines are part of the key.
    auto c = loom::jit::compile(spec, 80);
    EXPECT_FALSE(c.from_cache);
    EXPECT_NE(c.cache_key, a.cache_key);
    spec.template_args = {"8", "float"};
    EXPECT_NE(loom::jit::compile(spec, 90).cache_key, a.cache_key);
    spec.template_args = {"7", "float"};
    spec.defines = {"SOMETHING=1"};
    EXPECT_NE(loom::jit::compile(spec, 90).cache_key, a.cache_key);
}

TEST_F(JitCache, PlainKernelAndHeaderOnly) {
    loom::jit::KernelSpec s;
    s.header = kKernels + "/jit_add.cuh";
    s.name = "jit_test::plain_kernel";
    auto r = loom::jit::compile(s, 90);
    EXPECT_EQ(r.lowered_name, "_ZN8jit_test12plain_kernelEPi");
    loom::jit::KernelSpec h;
    h.header = "loom/lang/context.cuh";
    auto hr = loom::jit::compile(h, 80);
    EXPECT_TRUE(hr.lowered_name.empty());
    EXPECT_FALSE(hr.cubin.empty());
}

TEST_F(JitCache, IncludedHeaderChangeInvalidates) {
    fs::path user = dir_ / "user";
    fs::create_directories(user);
    fs::copy_file(kKernels + "/jit_add.cuh", user / "jit_add.cuh");
    fs::copy_file(kKernels + "/jit_scale.cuh", user / "jit_scale.cuh");
    auto spec = add_spec(user.string());
    auto a = loom::jit::compile(spec, 90);
    EXPECT_TRUE(loom::jit::compile(spec, 90).from_cache);
    std::ofstream(user / "jit_scale.cuh") << "#pragma once\n#define JIT_TEST_SCALE 5\n";
    auto b = loom::jit::compile(spec, 90);
    EXPECT_FALSE(b.from_cache);
    EXPECT_NE(b.cache_key, a.cache_key);
    EXPECT_NE(b.cubin, a.cubin);
    EXPECT_TRUE(loom::jit::compile(spec, 90).from_cache);
}

TEST_F(JitCache, CacheOnlyMakesMissAnError) {
    {
        const ScopedSettings off([](Settings& s) { s.jit_compiler = JitCompiler::CacheOnly; });
        try {
            loom::jit::compile(add_spec(), 90);
            FAIL() << "expected loom::Error";
        } catch (const loom::Error& e) {
            EXPECT_NE(std::string(e.what()).find("LOOM_JIT_COMPILER=cache-only"), std::string::npos) << e.what();
        }
        EXPECT_FALSE(fs::exists(dir_ / "jit") && !entries().empty()) << "cache-only compiled something";
    }
    // The entries NVRTC wrote are the ones cache-only uses.
    const auto compiled = loom::jit::compile(add_spec(), 90);
    const ScopedSettings off([](Settings& s) { s.jit_compiler = JitCompiler::CacheOnly; });
    const auto hit = loom::jit::compile(add_spec(), 90);
    EXPECT_TRUE(hit.from_cache);
    EXPECT_EQ(hit.cache_key, compiled.cache_key);
}

TEST_F(JitCache, DamagedEntryIsRecompiled) {
    auto a = loom::jit::compile(add_spec(), 90);
    std::ofstream(a.cache_dir + "/kernel.cubin", std::ios::trunc) << "junk";
    auto b = loom::jit::compile(add_spec(), 90);
    EXPECT_FALSE(b.from_cache);
    EXPECT_EQ(b.cubin, a.cubin);
    EXPECT_TRUE(loom::jit::compile(add_spec(), 90).from_cache);
    // Bytes changed in place, the size kept: the digest in meta.json tells.
    std::string flipped(b.cubin.begin(), b.cubin.end());
    flipped[flipped.size() / 2] ^= 0x5a;
    std::ofstream(b.cache_dir + "/kernel.cubin", std::ios::trunc | std::ios::binary) << flipped;
    auto c = loom::jit::compile(add_spec(), 90);
    EXPECT_FALSE(c.from_cache);
    EXPECT_EQ(c.cubin, a.cubin);
}

TEST_F(JitCache, MalformedKernelRaisesWithLog) {
    const ScopedSettings nofallback([](Settings& s) { s.jit_nvcc_fallback = false; });
    loom::jit::KernelSpec s;
    s.header = kKernels + "/jit_broken.cuh";
    s.name = "jit_test::broken";
    s.template_args = {"42"};
    try {
        loom::jit::compile(s, 90);
        FAIL() << "expected loom::Error";
    } catch (const loom::Error& e) {
        std::string msg = e.what();
        EXPECT_NE(msg.find("jit_test::broken"), std::string::npos) << msg;
        EXPECT_NE(msg.find("<42>"), std::string::npos) << msg;
        EXPECT_NE(msg.find("loom_jit_test_undeclared_identifier"), std::string::npos) << msg;
        auto p = msg.find("generated TU: ");
        ASSERT_NE(p, std::string::npos) << msg;
        std::string tu = msg.substr(p + 14, msg.find(' ', p + 14) - p - 14);
        EXPECT_TRUE(fs::exists(tu)) << tu;
        std::ifstream in(tu);
        std::string text((std::istreambuf_iterator<char>(in)), {});
        EXPECT_NE(text.find("jit_broken.cuh"), std::string::npos) << text;
    }
    EXPECT_TRUE(entries().empty() || entries() == std::vector<std::string>{}) << "no entry for a failed compile";
}

TEST_F(JitCache, MalformedKernelFallsBackToNvccAndStillFails) {
    if (loom::jit::detail::toolchain().nvcc.empty()) GTEST_SKIP() << "nvcc not found";
    loom::jit::KernelSpec s;
    s.header = kKernels + "/jit_broken.cuh";
    s.name = "jit_test::broken";
    s.template_args = {"1"};
    try {
        loom::jit::compile(s, 90);
        FAIL() << "expected loom::Error";
    } catch (const loom::Error& e) {
        std::string msg = e.what();
        EXPECT_NE(msg.find("--- nvrtc ---"), std::string::npos) << msg;
        EXPECT_NE(msg.find("--- nvcc ---"), std::string::npos) << msg;
    }
}

TEST_F(JitCache, NvccPathMatchesNvrtcEntry) {
    if (loom::jit::detail::toolchain().nvcc.empty()) GTEST_SKIP() << "nvcc not found";
    auto spec = add_spec();
    auto nvrtc = loom::jit::compile(spec, 90);
    spec.force_nvcc = true;
    auto nvcc = loom::jit::compile(spec, 90);
    EXPECT_EQ(nvcc.compiler, "nvcc");
    EXPECT_NE(nvcc.cache_key, nvrtc.cache_key);
    EXPECT_EQ(nvcc.lowered_name, nvrtc.lowered_name);
    EXPECT_GT(nvcc.registers, 0) << nvcc.log;
    EXPECT_TRUE(loom::jit::compile(spec, 90).from_cache);
    // The setting selects nvcc too, under the same key as force_nvcc (the compiler is part of the key).
    spec.force_nvcc = false;
    const ScopedSettings nvcc_setting([](Settings& s) { s.jit_compiler = JitCompiler::Nvcc; });
    const auto by_setting = loom::jit::compile(spec, 90);
    EXPECT_EQ(by_setting.compiler, "nvcc");
    EXPECT_EQ(by_setting.cache_key, nvcc.cache_key);
}

TEST_F(JitCache, NvrtcPtxasPath) {
    if (loom::jit::detail::toolchain().ptxas.empty()) GTEST_SKIP() << "ptxas not found";
    const auto nvrtc = loom::jit::compile(add_spec(), 90);
    const ScopedSettings ptxas([](Settings& s) { s.jit_compiler = JitCompiler::NvrtcPtxas; });
    auto r = loom::jit::compile(add_spec(), 90);
    EXPECT_FALSE(r.from_cache);
    EXPECT_NE(r.cache_key, nvrtc.cache_key);
    EXPECT_EQ(r.compiler, "nvrtc-ptxas");
    EXPECT_GT(r.registers, 0) << r.log;
    auto entries = loom::jit::detail::cubin_entries(r.cubin);
    EXPECT_NE(std::find(entries.begin(), entries.end(), r.lowered_name), entries.end());
    EXPECT_TRUE(fs::exists(r.cache_dir + "/kernel.ptx"));
}

// LOOM_LOG_LEVEL=debug: every compile and cache hit is printed with its time, and the entry keeps kernel.ptx (and
// kernel.sass when cuobjdump is there) beside the cubin.
TEST_F(JitCache, DebugLevelPrintsAndKeepsPtxAndSass) {
    const ScopedSettings debug([](Settings& s) { s.log_level = loom::LogLevel::Debug; });
    ::testing::internal::CaptureStderr();
    const auto miss = loom::jit::compile(add_spec(), 90);
    const auto hit = loom::jit::compile(add_spec(), 90);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("jit: compiled jit_test::add_n<7, float> for sm_90a with nvrtc in "), std::string::npos) << err;
    EXPECT_NE(err.find("jit: cache hit jit_test::add_n<7, float> for sm_90a ("), std::string::npos) << err;
    EXPECT_NE(err.find("loom[rank "), std::string::npos) << err;
    EXPECT_TRUE(hit.from_cache);
    EXPECT_TRUE(fs::exists(miss.cache_dir + "/kernel.ptx"));
    if (!loom::jit::detail::toolchain().cuobjdump.empty()) {
        EXPECT_TRUE(fs::exists(miss.cache_dir + "/kernel.sass"));
    }
}

TEST_F(JitCache, DefaultLevelIsQuietAndKeepsOnlyTheCubin) {
    ::testing::internal::CaptureStderr();
    const auto r = loom::jit::compile(add_spec(), 90);
    loom::jit::compile(add_spec(), 90);
    EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
    EXPECT_TRUE(fs::exists(r.cache_dir + "/kernel.cubin"));
    EXPECT_FALSE(fs::exists(r.cache_dir + "/kernel.ptx"));
    EXPECT_FALSE(fs::exists(r.cache_dir + "/kernel.sass"));
}

TEST_F(JitCache, MissingHeaderRaises) {
    loom::jit::KernelSpec s;
    s.header = "/nonexistent/kernel.cuh";
    s.name = "k";
    EXPECT_THROW(loom::jit::compile(s, 90), loom::Error);
    s.header = "loom/kernels/no_such_kernel.cuh";
    EXPECT_THROW(loom::jit::compile(s, 90), loom::Error);
}

TEST_F(JitCache, NvshmemDeviceLinkProducesLinkedCubin) {
    if (const auto why = loom::test::nvshmem_build_missing()) GTEST_SKIP() << *why;
    loom::jit::KernelSpec s;
    s.header = kKernels + "/jit_nvshmem.cuh";
    s.name = "jit_test::nvshmem_ring_put";
    s.template_args = {"2"};
    s.needs_nvshmem = true;
    auto r = loom::jit::compile(s, 90);
    EXPECT_EQ(r.compiler, "nvcc+nvjitlink");
    EXPECT_EQ(r.lowered_name, "_ZN8jit_test16nvshmem_ring_putILi2EEEvPi");
    auto entries = loom::jit::detail::cubin_entries(r.cubin);
    EXPECT_NE(std::find(entries.begin(), entries.end(), r.lowered_name), entries.end());
    EXPECT_TRUE(loom::jit::compile(s, 90).from_cache);
}

TEST_F(JitCache, ConcurrentWritersLeaveOneEntry) {
    // Eight loom_test_child jit-cache-writer processes compile one spec into this cache at once; their settings come
    // from this environment plus the cache directory.
    std::vector<std::string> env_strings{"LOOM_CACHE_DIR=" + dir_.string()};
    for (char** e = environ; *e; ++e) {
        const std::string_view v(*e);
        if (!v.starts_with("LOOM_CACHE_DIR=") && !v.starts_with("LOOM_JIT_COMPILER=")) env_strings.emplace_back(v);
    }
    std::vector<char*> envp;
    for (auto& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<pid_t> pids;
    for (int i = 0; i < 8; ++i) {
        const std::string helper = loom::test::child_helper_path();
        std::vector<std::string> args{helper, "jit-cache-writer"};
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        posix_spawn_file_actions_t quiet;  // the children's output would only clutter the log
        posix_spawn_file_actions_init(&quiet);
        posix_spawn_file_actions_addopen(&quiet, 1, "/dev/null", O_WRONLY, 0);
        pid_t pid = -1;
        int rc = posix_spawn(&pid, helper.c_str(), &quiet, nullptr, argv.data(), envp.data());
        posix_spawn_file_actions_destroy(&quiet);
        ASSERT_EQ(rc, 0);
        pids.push_back(pid);
    }
    for (pid_t p : pids) {
        int status = 0;
        ASSERT_EQ(waitpid(p, &status, 0), p);
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child " << p << " status " << status;
    }
    auto e = entries();
    ASSERT_EQ(e.size(), 1u) << "expected one cache entry and no temporaries";
    EXPECT_EQ(e[0].size(), 64u) << e[0];
    loom::jit::KernelSpec s;
    s.header = kKernels + "/jit_add.cuh";
    s.name = "jit_test::add_n";
    s.template_args = {"11", "float"};
    auto r = loom::jit::compile(s, 90);
    EXPECT_TRUE(r.from_cache);
    EXPECT_EQ(r.cache_key, e[0]);
}

}  // namespace
