// The host side of LangSignal.EpochsAcrossTheWrap: the reference every round of loom_test::epochs is checked
// against (tests/dist/kernels/epoch_round.cuh says what a round records).
//
// The reference answers on epoch indices: value - base, exact for the values a run produces (base .. base + iters
// + 1, modulo 2^64), compared as plain integers, which never wrap. A compare that ignores the wrap answers
// differently as soon as the target has wrapped and the value has not, which the rounds next to 2^64 ask.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "dist/kernels/epoch_round.cuh"

namespace loom::test {

using loom_test::EpochRound;

// `index <cmp> target_index` (cmp in lang::Cmp's order: EQ, NE, GE, GT, LE, LT) on integers.
bool reference_compare(std::int64_t index, int cmp, std::int64_t target_index);
// `value <cmp> target` on the unsigned values: a compare that ignores the wrap.
bool plain_compare(std::uint64_t value, int cmp, std::uint64_t target);

// Checks rounds[k - 1], k = 1 .. rounds.size(), of a run whose counter started at `base`: the wait returned its
// target or the next epoch (the partner runs at most one round ahead, never less than the target), and every
// answer of the device compare equals the reference. Returns "" or the first failing rounds and their count.
std::string check_epoch_rounds(std::uint64_t base, std::span<const EpochRound> rounds);

// How many answers of these rounds a compare of the plain unsigned values (one that ignores the wrap) gets wrong:
// more than 0 only when the run's epochs straddle 2^64, i.e. when the rounds can tell the two compares apart.
std::size_t answers_a_plain_compare_gets_wrong(std::uint64_t base, std::span<const EpochRound> rounds);

}  // namespace loom::test
