// Autotuner across ranks (loomrun -n 4 build/tests/loom_dist_tests --gtest_filter=*Autotune*): the slowest
// rank's time decides and every rank returns the same winner. Needs no GPU kernel, only the World's store.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/test_env.hpp"
#include "loom/jit/autotune.hpp"
#include "runtime/settings_override.hpp"

namespace {

TEST(AutotuneAcrossRanks, SlowestRankDecidesAndAllAgree) {
    loom::World& w = loom::test::world();
    loom::jit::TuneRequest r;
    r.op = "dist_autotune_test";
    r.shape_bucket = loom::jit::shape_bucket({{"n", 1 << 20}});
    r.arch = 90;
    r.candidates = {{"fast_but_one_slow_rank", "1"}, {"steady", "2"}, {"slow", "3"}};
    r.heuristic = 2;
    const int last = w.world_size() - 1;
    // Every rank but the last prefers candidate 0; its slowest rank makes it worse than "steady".
    r.time_us = [&](const loom::jit::TuneCandidate& c) {
        if (c.name == "fast_but_one_slow_rank") return w.rank() == last && last > 0 ? 500.0 : 10.0;
        if (c.name == "steady") return 50.0 + w.rank();
        return 400.0;
    };
    const loom::jit::TuneResult res = [&] {
        const loom::detail::ScopedSettings on([](loom::Settings& s) { s.autotune = true; });  // tuning on, this call
        return loom::jit::autotune(r, &w);
    }();
    EXPECT_EQ(res.source, "tuned");
    if (w.world_size() > 1) {
        EXPECT_EQ(res.choice.name, "steady");
        EXPECT_DOUBLE_EQ(res.us, 50.0 + last);
    } else {
        EXPECT_EQ(res.choice.name, "fast_but_one_slow_rank");
    }
    // Every rank reports the same choice.
    std::string mine = res.choice.name;
    auto all = w.store().all_gather("test/autotune/choice", loom::Bytes(mine.begin(), mine.end()));
    for (const auto& b : all) EXPECT_EQ(std::string(b.begin(), b.end()), mine);
    w.barrier("test/autotune/persisted");
    // The persisted result is read back without tuning (rank 0 wrote it before publishing the winner).
    auto again = loom::jit::autotune(r, &w);
    EXPECT_EQ(again.source, "persisted");
    EXPECT_EQ(again.choice.name, mine);
    w.barrier("test/autotune/done");
    if (w.rank() == 0) std::filesystem::remove(loom::jit::tune_file(r.op, r.shape_bucket, w.world_size(), r.arch));
}

}  // namespace
