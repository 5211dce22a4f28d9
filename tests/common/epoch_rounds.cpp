#include "common/epoch_rounds.hpp"

#include <bit>
#include <cstdio>

namespace loom::test {
namespace {

// `a <cmp> b` in T's own order.
template <class T>
bool ordered_compare(T a, int cmp, T b) {
    switch (cmp) {
        case 0:
            return a == b;
        case 1:
            return a != b;
        case 2:
            return a >= b;
        case 3:
            return a > b;
        case 4:
            return a <= b;
        case 5:
            return a < b;
    }
    return false;
}

const char* const kCmpNames[loom_test::kNumCmps] = {"==", "!=", ">=", ">", "<=", "<"};

// The reference answer bits of round k whose wait returned epoch index `observed_index`.
std::uint32_t reference_answers(std::int64_t k, std::int64_t observed_index) {
    return loom_test::epoch_answers(std::uint64_t(k), std::uint64_t(observed_index),
                                    [](std::uint64_t v, int cmp, std::uint64_t target) {
                                        return reference_compare(std::int64_t(v), cmp, std::int64_t(target));
                                    });
}

std::string hex(std::uint64_t v) {
    char s[24];
    std::snprintf(s, sizeof s, "0x%016llx", static_cast<unsigned long long>(v));
    return s;
}

// What is wrong with round k, or "".
std::string round_error(std::uint64_t base, std::int64_t k, const EpochRound& r) {
    const std::uint64_t target = base + std::uint64_t(k);
    const auto observed_index = static_cast<std::int64_t>(r.observed - base);
    std::string s;
    if (observed_index != k && observed_index != k + 1)
        s += " the wait returned " + hex(r.observed) + " (epoch " + std::to_string(observed_index) +
             "), not its target or the next epoch;";
    const std::uint32_t wrong = r.answers ^ reference_answers(k, observed_index);
    for (int bit = 0; bit < 2 * loom_test::kNumCmps; ++bit) {
        if (!(wrong >> bit & 1u)) continue;
        const bool before = bit / loom_test::kNumCmps == loom_test::kBefore;
        s += std::string(before ? " [epoch before]" : " [returned]") + " compare(" +
             hex(before ? target - 1 : r.observed) + " " + kCmpNames[bit % loom_test::kNumCmps] + " " + hex(target) +
             ") answered " + ((r.answers >> bit & 1u) ? "true" : "false") + ";";
    }
    return s.empty() ? s : "round " + std::to_string(k) + " (target " + hex(target) + "):" + s + "\n";
}

}  // namespace

bool reference_compare(std::int64_t index, int cmp, std::int64_t target_index) {
    return ordered_compare(index, cmp, target_index);
}

bool plain_compare(std::uint64_t value, int cmp, std::uint64_t target) { return ordered_compare(value, cmp, target); }

std::string check_epoch_rounds(std::uint64_t base, std::span<const EpochRound> rounds) {
    constexpr std::size_t kShown = 8;
    std::string shown;
    std::size_t failed = 0;
    for (std::size_t i = 0; i < rounds.size(); ++i) {
        const std::string e = round_error(base, std::int64_t(i) + 1, rounds[i]);
        if (e.empty()) continue;
        if (++failed <= kShown) shown += e;
    }
    if (failed == 0) return "";
    return std::to_string(failed) + " of " + std::to_string(rounds.size()) + " rounds wrong" +
           (failed > kShown ? " (the first " + std::to_string(kShown) + " shown)" : "") + ":\n" + shown;
}

std::size_t answers_a_plain_compare_gets_wrong(std::uint64_t base, std::span<const EpochRound> rounds) {
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < rounds.size(); ++i) {
        const auto k = std::int64_t(i) + 1;
        const std::uint32_t plain =
            loom_test::epoch_answers(base + std::uint64_t(k), rounds[i].observed, plain_compare);
        wrong += std::popcount(plain ^ reference_answers(k, static_cast<std::int64_t>(rounds[i].observed - base)));
    }
    return wrong;
}

}  // namespace loom::test
