// CI compiles every kernel: each registered sample instantiation (src/jit/kernel_samples.cpp) for sm_90a and
// sm_80, every device header alone, and a check that no kernel header lacks a registered sample.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "jit/kernel_samples.hpp"
#include "loom/jit/jit.hpp"
#include "loom/runtime/error.hpp"

namespace fs = std::filesystem;

namespace {

// Compiles every (spec, arch) job on a small thread pool; returns "display for sm_XX: error" per failure.
std::vector<std::string> compile_all(const std::vector<std::pair<loom::jit::KernelSpec, int>>& jobs) {
    std::mutex mu;
    std::vector<std::string> failures;
    std::atomic<std::size_t> next{0};
    auto worker = [&] {
        for (std::size_t i; (i = next++) < jobs.size();) {
            const auto& [spec, arch] = jobs[i];
            try {
                auto r = loom::jit::compile(spec, arch);
                if (r.cubin.empty()) throw std::runtime_error("empty cubin");
            } catch (const std::exception& e) {
                std::lock_guard lock(mu);
                failures.push_back(fmt::format("{} ({}) for sm_{}: {}", spec.display(), spec.header, arch, e.what()));
            }
        }
    };
    unsigned n = std::max(2u, std::min(4u, std::thread::hardware_concurrency()));
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < n; ++t) threads.emplace_back(worker);
    for (auto& t : threads) t.join();
    return failures;
}

std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += x + "\n\n";
    return s;
}

TEST(JitSamples, EveryRegisteredKernelCompiles) {
    std::vector<std::pair<loom::jit::KernelSpec, int>> jobs;
    for (const auto& s : loom::jit::kernel_samples()) {
        jobs.emplace_back(s.spec(), 90);
        if (!s.sm90_only) jobs.emplace_back(s.spec(), 80);
    }
    ASSERT_FALSE(jobs.empty());
    auto failures = compile_all(jobs);
    EXPECT_TRUE(failures.empty()) << failures.size() << " of " << jobs.size() << " failed:\n" << join(failures);
}

TEST(JitSamples, EveryKernelHeaderHasASample) {
    const fs::path dir = fs::path(LOOM_SOURCE_DIR) / "include/loom/kernels";
    std::set<std::string> covered;
    for (const auto& s : loom::jit::kernel_samples()) covered.insert(s.header);
    std::vector<std::string> missing;
    for (const auto& e : fs::recursive_directory_iterator(dir)) {  // one folder per op family
        if (e.path().extension() != ".cuh") continue;
        const std::string h = "loom/kernels/" + fs::relative(e.path(), dir).generic_string();
        if (!covered.count(h)) missing.push_back(h);
    }
    EXPECT_FALSE(covered.empty());
    std::sort(missing.begin(), missing.end());
    EXPECT_TRUE(missing.empty()) << "kernel headers without an entry in src/jit/kernel_samples.cpp:\n" << join(missing);
}

TEST(JitSamples, EveryDeviceHeaderCompilesAlone) {
    const auto& sm90 = loom::jit::sm90_only_headers();
    std::vector<std::pair<loom::jit::KernelSpec, int>> jobs;
    for (const auto& h : loom::jit::standalone_headers()) {
        loom::jit::KernelSpec s;
        s.header = h;
        jobs.emplace_back(s, 90);
        if (std::find(sm90.begin(), sm90.end(), h) == sm90.end()) jobs.emplace_back(s, 80);
    }
    ASSERT_FALSE(jobs.empty());
    auto failures = compile_all(jobs);
    EXPECT_TRUE(failures.empty()) << failures.size() << " of " << jobs.size() << " failed:\n" << join(failures);
}

}  // namespace
