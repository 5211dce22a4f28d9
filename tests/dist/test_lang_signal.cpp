// Signals across ranks: message passing litmus, many notifiers on one counter, epochs across the 64-bit wrap,
// and the bounded-wait diagnostic (in a child process: loom_test_child lang-missing-notify).
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "common/child_process.hpp"
#include "common/epoch_rounds.hpp"
#include "common/test_env.hpp"
#include "common/test_kernels.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"

namespace {

using loom::jit::LaunchConfig;
using loom::test::lang_kernel;

// Mirrors loom::lang::Scope (device headers are not host-compilable; same underlying int).
enum class Scope : int { Gpu, Sys };

int partner_of(int rank, int world) { return (rank ^ 1) < world ? (rank ^ 1) : rank; }

TEST(LangSignal, MessagePassingLitmus) {
    LOOM_REQUIRE_GPU();
    auto& w = loom::test::world();
    const uint32_t words = 4096, rounds = 100000;
    auto* data = w.alloc<uint32_t>(words);
    auto* sig = w.alloc<uint64_t>(1);
    auto* ack = w.alloc<uint64_t>(1);
    uint32_t* errors = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(&errors, sizeof(uint32_t)));
    for (auto scope : {Scope::Sys, Scope::Gpu}) {
        LOOM_CHECK_CUDA(cudaMemset(sig, 0, 8));
        LOOM_CHECK_CUDA(cudaMemset(ack, 0, 8));
        LOOM_CHECK_CUDA(cudaMemset(errors, 0, 4));
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
        w.barrier("litmus");
        lang_kernel("loom_test::mp_litmus")(LaunchConfig{dim3(1), dim3(256)}, w.ctx(), data, sig, ack, words, rounds,
                                            partner_of(w.rank(), w.world_size()), scope, errors);
        LOOM_CHECK_CUDA(cudaDeviceSynchronize());
        uint32_t bad = 1;
        LOOM_CHECK_CUDA(cudaMemcpy(&bad, errors, 4, cudaMemcpyDeviceToHost));
        EXPECT_EQ(bad, 0u) << "stale words seen after the matching wait (scope " << int(scope) << ")";
        w.barrier("litmus-done");
    }
    LOOM_CHECK_CUDA(cudaFree(errors));
    w.free(ack);
    w.free(sig);
    w.free(data);
}

TEST(LangSignal, ManyBlocksNotifyOneCounterExactly) {
    LOOM_REQUIRE_GPU();
    auto& w = loom::test::world();
    auto* counter = w.alloc<uint64_t>(1);
    LOOM_CHECK_CUDA(cudaMemset(counter, 0, 8));
    uint64_t* observed = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(&observed, 8));
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    w.barrier("many-notify");
    const uint32_t blocks = 64, threads = 256, adds = 10;
    const int target = (w.rank() + 1) % w.world_size();  // each rank is the target of exactly one sender
    lang_kernel("loom_test::many_notify")(LaunchConfig{dim3(blocks), dim3(threads)}, w.ctx(), counter, target, adds);
    const uint64_t expected = uint64_t(blocks) * threads * adds;
    lang_kernel("loom_test::wait_count")(LaunchConfig{dim3(1), dim3(128)}, w.ctx(), counter, expected, observed);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    w.barrier("many-notify-done");
    uint64_t got = 0, final_value = 0;
    LOOM_CHECK_CUDA(cudaMemcpy(&got, observed, 8, cudaMemcpyDeviceToHost));
    LOOM_CHECK_CUDA(cudaMemcpy(&final_value, counter, 8, cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, expected);
    EXPECT_EQ(final_value, expected);
    LOOM_CHECK_CUDA(cudaFree(observed));
    w.free(counter);
}

// The counter crosses 2^64 half way. A compare that ignores the wrap returns early (or answers wrongly) in the
// rounds next to it: the rounds' records must match the reference on epoch indices (tests/common/epoch_rounds.hpp),
// and must include answers that a plain compare gets wrong, or the run could not tell the two apart.
TEST(LangSignal, EpochsAcrossTheWrap) {
    LOOM_REQUIRE_GPU();
    auto& w = loom::test::world();
    const uint32_t iters = 1000000;
    const uint64_t base = ~uint64_t(0) - iters / 2;  // targets wrap past 2^64 half way
    auto* sig = w.alloc<uint64_t>(1);
    loom::test::EpochRound* rounds = nullptr;
    LOOM_CHECK_CUDA(cudaMalloc(&rounds, iters * sizeof *rounds));
    LOOM_CHECK_CUDA(cudaMemcpy(sig, &base, 8, cudaMemcpyHostToDevice));
    w.barrier("epochs");
    lang_kernel("loom_test::epochs")(LaunchConfig{dim3(1), dim3(32)}, w.ctx(), sig, base, iters,
                                     partner_of(w.rank(), w.world_size()), rounds);
    LOOM_CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<loom::test::EpochRound> got(iters);
    uint64_t last = 0;
    LOOM_CHECK_CUDA(cudaMemcpy(got.data(), rounds, iters * sizeof *rounds, cudaMemcpyDeviceToHost));
    LOOM_CHECK_CUDA(cudaMemcpy(&last, sig, 8, cudaMemcpyDeviceToHost));
    EXPECT_EQ(loom::test::check_epoch_rounds(base, got), "");
    EXPECT_GT(loom::test::answers_a_plain_compare_gets_wrong(base, got), 0u) << "the epochs do not straddle 2^64";
    EXPECT_EQ(last, base + iters);
    w.barrier("epochs-done");
    LOOM_CHECK_CUDA(cudaFree(rounds));
    w.free(sig);
}

TEST(LangSignal, MissingNotifyEndsInTimeoutDiagnostic) {
    LOOM_REQUIRE_GPU();
    auto& w = loom::test::world();
    if (w.rank() == 0) {
        // The child traps; it runs outside loomrun's MPS server so the trap stays in its own context.
        const auto [status, output] = loom::test::run_child("lang-missing-notify", {{"LOOM_WAIT_TIMEOUT_MS", "300"}});
        EXPECT_EQ(status, 3) << output;
        EXPECT_NE(output.find("loom: wait timeout: rank 0: wait: a signal is missing at 0x"), std::string::npos)
            << output;
        EXPECT_NE(output.find("expected >= 1, observed 0, after "), std::string::npos) << output;
        EXPECT_NE(output.find("(first of this rank: block (0,0,0) thread 0)"), std::string::npos) << output;
    }
    w.barrier("timeout-child");
}

// A put whose bytes run past the end of the heap is refused by the range, not only its first byte.
TEST(LangSignal, PutPastTheHeapEndTraps) {
    LOOM_REQUIRE_GPU();
    auto& w = loom::test::world();
    if (w.rank() == 0) {
        const auto [status, output] = loom::test::run_child("lang-put-past-heap", {{"LOOM_WAIT_TIMEOUT_MS", "300"}});
        EXPECT_EQ(status, 3) << output;
        EXPECT_NE(output.find("loom: symm_at: rank 0 block (0,0,0)"), std::string::npos) << output;
        EXPECT_NE(output.find("is not in this rank's symmetric heap"), std::string::npos) << output;
    }
    w.barrier("put-past-heap-child");
}

std::size_t count(const std::string& s, const std::string& part) {
    std::size_t n = 0;
    for (auto p = s.find(part); p != std::string::npos; p = s.find(part, p + 1)) ++n;
    return n;
}

// 26 blocks time out together (a collective's grid on a shared GPU): one summary line for the rank; each block's own
// line only at LOOM_LOG_LEVEL=debug.
TEST(LangSignal, TimedOutBlocksPrintOneSummaryLine) {
    LOOM_REQUIRE_GPU();
    auto& w = loom::test::world();
    if (w.rank() == 0) {
        const auto [status, output] = loom::test::run_child(
            "lang-missing-notify-26", {{"LOOM_WAIT_TIMEOUT_MS", "300"}, {"LOOM_LOG_LEVEL", "warn"}});
        EXPECT_EQ(status, 3) << output;
        EXPECT_EQ(count(output, "loom: wait timeout: "), 1u) << output;
        EXPECT_EQ(count(output, "loom: wait timeout: rank 0: wait: a signal is missing at 0x"), 1u) << output;
        EXPECT_EQ(count(output, "loom: wait timeout detail: "), 0u) << output;

        const auto [dstatus, doutput] = loom::test::run_child(
            "lang-missing-notify-26", {{"LOOM_WAIT_TIMEOUT_MS", "300"}, {"LOOM_LOG_LEVEL", "debug"}});
        EXPECT_EQ(dstatus, 3) << doutput;
        EXPECT_EQ(count(doutput, "loom: wait timeout: "), 1u) << doutput;
        // Every block that reached its report before the trap stopped the grid (in practice all 26); at least the
        // summary's own block.
        EXPECT_GE(count(doutput, "loom: wait timeout detail: rank 0 block ("), 1u) << doutput;
        EXPECT_LE(count(doutput, "loom: wait timeout detail: rank 0 block ("), 26u) << doutput;
    }
    w.barrier("timeout-child-26");
}

}  // namespace
