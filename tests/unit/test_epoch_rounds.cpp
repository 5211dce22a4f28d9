// The check of LangSignal.EpochsAcrossTheWrap on the host: the records a wrap-safe compare produces pass, and those
// of a compare that ignores the wrap fail, at the rounds next to 2^64. The records are made here the way
// loom_test::epochs makes them (the same epoch_answers packing), with a host copy of lang::compare's arithmetic
// (lang/spin.cuh is device-only) in place of the device compare.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/epoch_rounds.hpp"

namespace {

using loom::test::EpochRound;

// lang::compare: the compare on the signed difference, in the counter's width.
bool wrap_safe_compare(std::uint64_t value, int cmp, std::uint64_t target) {
    return loom::test::reference_compare(static_cast<std::int64_t>(value - target), cmp, 0);
}

constexpr std::uint32_t kIters = 1000;
constexpr std::uint64_t kBase = ~std::uint64_t(0) - kIters / 2;  // as the GPU test: the targets wrap half way
constexpr std::uint32_t kWrapRound = kIters / 2 + 1;             // its target is 0

// The records of a run whose wait returned `observed(k, target)` in round k, with answers from `compare`.
template <class Observed, class Compare>
std::vector<EpochRound> run(std::uint64_t base, Observed&& observed, Compare&& compare) {
    std::vector<EpochRound> rounds(kIters);
    for (std::uint32_t k = 1; k <= kIters; ++k) {
        const std::uint64_t target = base + k;
        const std::uint64_t o = observed(k, target);
        rounds[k - 1] = EpochRound{o, loom_test::epoch_answers(target, o, compare), 0};
    }
    return rounds;
}

// The partner one round ahead in every third round.
std::uint64_t in_step(std::uint32_t k, std::uint64_t target) { return k % 3 == 0 ? target + 1 : target; }

TEST(EpochRounds, WrapSafeCompareMatchesTheReference) {
    const auto rounds = run(kBase, in_step, wrap_safe_compare);
    EXPECT_EQ(loom::test::check_epoch_rounds(kBase, rounds), "");
    EXPECT_GT(loom::test::answers_a_plain_compare_gets_wrong(kBase, rounds), 0u);
}

TEST(EpochRounds, PlainCompareIsCaughtAtTheWrap) {
    const auto rounds = run(kBase, in_step, loom::test::plain_compare);
    const std::string report = loom::test::check_epoch_rounds(kBase, rounds);
    EXPECT_NE(report.find("round " + std::to_string(kWrapRound) + " (target 0x0000000000000000):"), std::string::npos)
        << report;
    EXPECT_NE(report.find("[epoch before] compare(0xffffffffffffffff >= 0x0000000000000000) answered true"),
              std::string::npos)
        << report;
}

// A wait whose compare ignores the wrap returns at once in the round whose target is 0 while the counter still
// holds 2^64 - 1 (the partner's notify not yet landed).
TEST(EpochRounds, EarlyReturnAtTheWrapIsCaught) {
    const auto early = [](std::uint32_t k, std::uint64_t target) { return k == kWrapRound ? target - 1 : target; };
    const std::string report = loom::test::check_epoch_rounds(kBase, run(kBase, early, loom::test::plain_compare));
    EXPECT_NE(report.find("the wait returned 0xffffffffffffffff (epoch " + std::to_string(kWrapRound - 1) +
                          "), not its target"),
              std::string::npos)
        << report;
}

TEST(EpochRounds, EpochsAwayFromTheWrapCannotTellTheCompares) {
    const auto rounds = run(0, in_step, loom::test::plain_compare);
    EXPECT_EQ(loom::test::check_epoch_rounds(0, rounds), "");
    EXPECT_EQ(loom::test::answers_a_plain_compare_gets_wrong(0, rounds), 0u);
}

TEST(EpochRounds, ReportCountsEveryWrongRoundAndShowsTheFirst) {
    auto rounds = run(kBase, in_step, wrap_safe_compare);
    for (std::uint32_t k = 1; k <= 20; ++k) rounds[k - 1].answers ^= 1u;  // == answered the other way
    const std::string report = loom::test::check_epoch_rounds(kBase, rounds);
    EXPECT_EQ(report.rfind("20 of 1000 rounds wrong (the first 8 shown):\n", 0), 0u) << report;
    EXPECT_NE(report.find("round 8 "), std::string::npos) << report;
    EXPECT_EQ(report.find("round 9 "), std::string::npos) << report;
}

}  // namespace
