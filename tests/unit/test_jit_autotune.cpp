// Single-process autotuner: heuristic by default, timing with LOOM_AUTOTUNE=1, persistence, failures.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loom/jit/autotune.hpp"
#include "loom/runtime/error.hpp"
#include "loom/runtime/settings.hpp"
#include "runtime/settings_override.hpp"

namespace fs = std::filesystem;

namespace {

class Autotune : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::path(::testing::TempDir()) / ("loom-tune-" + std::to_string(::getpid()));
        fs::remove_all(dir_);
        settings_.emplace([this](loom::Settings& s) {
            s.cache_dir = dir_.string();
            s.autotune = false;
        });
    }
    void TearDown() override {
        settings_.reset();
        fs::remove_all(dir_);
    }
    // LOOM_AUTOTUNE=1 or unset, for the rest of the test.
    void set_autotune(bool on) {
        settings_.reset();
        settings_.emplace([this, on](loom::Settings& s) {
            s.cache_dir = dir_.string();
            s.autotune = on;
        });
    }
    loom::jit::TuneRequest request() {
        loom::jit::TuneRequest r;
        r.op = "test_op";
        r.shape_bucket = loom::jit::shape_bucket({{"m", 1000}, {"n", 4096}});
        r.arch = 90;
        r.candidates = {{"a", R"({"tile": 64})"}, {"b", R"({"tile": 128})"}, {"c", R"({"tile": 256})"}};
        r.heuristic = 0;
        r.time_us = [this](const loom::jit::TuneCandidate& c) {
            ++calls_;
            if (c.name == "a") return 30.0;
            if (c.name == "b") return 10.0;
            throw loom::Error("test", "candidate c does not fit", __FILE__, __LINE__);
        };
        return r;
    }
    fs::path dir_;
    std::optional<loom::detail::ScopedSettings> settings_;
    int calls_ = 0;
};

TEST_F(Autotune, ShapeBucketRoundsUpToPowersOfTwo) {
    EXPECT_EQ(loom::jit::shape_bucket({{"m", 1000}, {"n", 4096}, {"k", 1}}), "m1024_n4096_k1");
    EXPECT_THROW(loom::jit::shape_bucket({{"m", -1}}), loom::Error);
}

TEST_F(Autotune, HeuristicWithoutTuningAndNoTiming) {
    auto r = loom::jit::autotune(request());
    EXPECT_EQ(r.source, "heuristic");
    EXPECT_EQ(r.choice.name, "a");
    EXPECT_EQ(calls_, 0);
}

TEST_F(Autotune, TunesPersistsAndReuses) {
    set_autotune(true);
    auto r = loom::jit::autotune(request());
    EXPECT_EQ(r.source, "tuned");
    EXPECT_EQ(r.choice.name, "b");
    EXPECT_EQ(r.choice.config, R"({"tile": 128})");
    EXPECT_DOUBLE_EQ(r.us, 10.0);
    EXPECT_EQ(calls_, 3);
    const std::string file = loom::jit::tune_file("test_op", "m1024_n4096", 1, 90);
    EXPECT_TRUE(fs::exists(file)) << file;

    set_autotune(false);
    auto p = loom::jit::autotune(request());
    EXPECT_EQ(p.source, "persisted");
    EXPECT_EQ(p.choice.name, "b");
    EXPECT_EQ(calls_, 3);
    // Another world size or arch does not see this result.
    auto other = request();
    other.arch = 80;
    EXPECT_EQ(loom::jit::autotune(other).source, "heuristic");
    // A persisted winner that is no longer a candidate falls back to the heuristic.
    auto fewer = request();
    fewer.candidates.erase(fewer.candidates.begin() + 1);
    EXPECT_EQ(loom::jit::autotune(fewer).source, "heuristic");
}

// rounds = 3: every candidate timed three times in rotated orders, the median of its rounds decides (one slow round
// does not lose a candidate the race, one lucky round does not win it); a candidate that threw is not run again.
TEST_F(Autotune, RoundsTakeTheMedianInRotatedOrders) {
    set_autotune(true);
    auto r = request();
    r.rounds = 3;
    std::vector<std::string> order;
    std::map<std::string, int> seen;
    r.time_us = [&](const loom::jit::TuneCandidate& c) -> double {
        order.push_back(c.name);
        const int k = seen[c.name]++;
        if (c.name == "a") return std::vector<double>{10, 100, 12}[k];  // median 12, one lucky 10
        if (c.name == "b") return std::vector<double>{11, 11, 30}[k];   // median 11
        throw loom::Error("test", "candidate c does not fit", __FILE__, __LINE__);
    };
    const auto res = loom::jit::autotune(r);
    EXPECT_EQ(res.choice.name, "b");
    EXPECT_DOUBLE_EQ(res.us, 11.0);
    EXPECT_EQ(seen["a"], 3);
    EXPECT_EQ(seen["b"], 3);
    EXPECT_EQ(seen["c"], 1);
    // Rounds start at candidates 0, 1 and 2: a b c | b a | a b (c threw in round 1).
    EXPECT_EQ(order, (std::vector<std::string>{"a", "b", "c", "b", "a", "a", "b"}));
    r.rounds = 1;  // a single round takes the lucky 10
    seen.clear();
    EXPECT_EQ(loom::jit::autotune(r).choice.name, "a");
}

TEST_F(Autotune, AllCandidatesFailingRaisesWithReasons) {
    set_autotune(true);
    auto r = request();
    r.time_us = [](const loom::jit::TuneCandidate& c) -> double {
        if (c.name == "a") return std::numeric_limits<double>::quiet_NaN();
        throw loom::Error("test", "does not fit " + c.name, __FILE__, __LINE__);
    };
    try {
        loom::jit::autotune(r);
        FAIL() << "expected loom::Error";
    } catch (const loom::Error& e) {
        EXPECT_NE(std::string(e.what()).find("does not fit c"), std::string::npos) << e.what();
    }
}

TEST_F(Autotune, RejectsBadRequests) {
    auto r = request();
    r.heuristic = 7;
    EXPECT_THROW(loom::jit::autotune(r), loom::Error);
    r.candidates.clear();
    EXPECT_THROW(loom::jit::autotune(r), loom::Error);
}

}  // namespace
