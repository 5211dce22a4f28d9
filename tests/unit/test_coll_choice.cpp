// The automatic collective choice (src/ops/collectives/coll_choice.cpp): the rows follow the H200 measurements in
// docs/perf/*.json, and infeasible algorithms (buffers outside the symmetric heap) are never chosen.
#include <gtest/gtest.h>

#include <string>

#include "loom/runtime/error.hpp"
#include "ops/collectives/coll_choice.hpp"

namespace loom {
namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

CollTopology shared(int w) { return CollTopology{w, true, 90, w}; }
CollTopology distinct(int w) { return CollTopology{w, false, 90}; }

void expect(const CollChoice& c, CollAlgo a, DataPath p) {
    EXPECT_EQ(c.algo, a) << to_string(c.algo) << "/" << to_string(c.path) << " (" << c.reason << ")";
    EXPECT_EQ(c.path, p) << to_string(c.algo) << "/" << to_string(c.path) << " (" << c.reason << ")";
}

TEST(CollChoice, AllGatherFanOutPushOnASharedGpu) {
    // Ranks sharing a GPU: the fan-out push (ld/st) at every size past LL.
    expect(choose_collective(CollKind::AllGather, 1 * MiB, shared(2)), CollAlgo::Push, DataPath::LdSt);
    expect(choose_collective(CollKind::AllGather, 8 * MiB, shared(8)), CollAlgo::Push, DataPath::LdSt);
    expect(choose_collective(CollKind::AllGather, 512 * MiB, shared(2)), CollAlgo::Push, DataPath::LdSt);
    expect(choose_collective(CollKind::AllGather, 128 * MiB, shared(8)), CollAlgo::Push, DataPath::LdSt);
    expect(choose_collective(CollKind::AllGather, 256 * MiB, shared(4)), CollAlgo::Push, DataPath::LdSt);
    // One GPU per rank (two H200s over NVLink): ring at two ranks to 16 MiB per rank, ld/st to 8 MiB at more, the
    // copy engine (with an SM share) beyond.
    expect(choose_collective(CollKind::AllGather, 1 * MiB, distinct(2)), CollAlgo::Ring, DataPath::LdSt);
    expect(choose_collective(CollKind::AllGather, 1 * MiB, distinct(8)), CollAlgo::Push, DataPath::LdSt);
    expect(choose_collective(CollKind::AllGather, 32 * MiB, distinct(2)), CollAlgo::Push, DataPath::CopyEngine);
    expect(choose_collective(CollKind::AllGather, 16 * MiB, distinct(8)), CollAlgo::Push, DataPath::CopyEngine);
    expect(choose_collective(CollKind::AllGather, 256 * MiB, distinct(2)), CollAlgo::Push, DataPath::CopyEngine);
    // out outside the heap: pull, or LL (which needs no symmetric buffer) while it is chosen anyway.
    expect(choose_collective(CollKind::AllGather, 1 * MiB, shared(2), true, false), CollAlgo::Pull, DataPath::LdSt);
    expect(choose_collective(CollKind::AllGather, 32 * MiB, shared(2), true, false), CollAlgo::Pull,
           DataPath::CopyEngine);
    expect(choose_collective(CollKind::AllGather, 4 * KiB, shared(2), false, false), CollAlgo::LL, DataPath::LdSt);
}

TEST(CollChoice, SmallMessagesGoLowLatency) {
    for (CollKind k : {CollKind::AllGather, CollKind::ReduceScatter, CollKind::AllToAll, CollKind::AllReduce})
        for (const CollTopology& t : {shared(2), shared(8), distinct(2), distinct(8)}) {
            expect(choose_collective(k, 4 * KiB, t), CollAlgo::LL, DataPath::LdSt);
            // Up to the LL capacity on distinct GPUs (not all_reduce: its chunk is the whole buffer).
            if (!t.shared_gpu && k != CollKind::AllReduce)
                expect(choose_collective(k, 512 * KiB, t), CollAlgo::LL, DataPath::LdSt);
        }
}

TEST(CollChoice, AllReduceLLThenTwoShotOneShotWhenNotSymmetric) {
    expect(choose_collective(CollKind::AllReduce, 64 * KiB, shared(8)), CollAlgo::LL, DataPath::LdSt);
    expect(choose_collective(CollKind::AllReduce, 256 * KiB, shared(8)), CollAlgo::TwoShot, DataPath::LdSt);
    expect(choose_collective(CollKind::AllReduce, 256 * KiB, shared(2)), CollAlgo::LL, DataPath::LdSt);
    expect(choose_collective(CollKind::AllReduce, 256 * KiB, distinct(2)), CollAlgo::LL, DataPath::LdSt);
    expect(choose_collective(CollKind::AllReduce, 1 * MiB, distinct(2)), CollAlgo::TwoShot, DataPath::LdSt);
    expect(choose_collective(CollKind::AllReduce, 256 * MiB, distinct(2)), CollAlgo::TwoShot, DataPath::CopyEngine);
    expect(choose_collective(CollKind::AllReduce, 256 * MiB, shared(2)), CollAlgo::TwoShot, DataPath::LdSt);
    // in not symmetric: two-shot with in staged (the cost model puts it below one-shot here); one-shot on distinct
    // GPUs at 512 KiB with out plain too, where the staging's copy and barrier launches weigh more than one-shot's
    // extra traffic.
    for (const bool out_sym : {false, true}) {
        const CollChoice c = choose_collective(CollKind::AllReduce, 256 * KiB, shared(8), false, out_sym);
        expect(c, CollAlgo::TwoShot, DataPath::LdSt);
        EXPECT_TRUE(c.staged) << c.reason;
    }
    expect(choose_collective(CollKind::AllReduce, 512 * KiB, distinct(8), false, false), CollAlgo::OneShot,
           DataPath::LdSt);
    // in symmetric, out not: two-shot stages its shards in the scratch (all_reduce.cpp keeps it off the copy engine).
    expect(choose_collective(CollKind::AllReduce, 256 * KiB, shared(8), true, false), CollAlgo::TwoShot,
           DataPath::LdSt);
    expect(choose_collective(CollKind::AllReduce, 1 * MiB, distinct(2), true, false), CollAlgo::TwoShot,
           DataPath::LdSt);
}

TEST(CollChoice, ReduceScatterAndAllToAll) {
    expect(choose_collective(CollKind::ReduceScatter, 64 * MiB, shared(2)), CollAlgo::Pull, DataPath::LdSt);
    // in not symmetric: scatter at 1 MiB on two ranks (the staging copy's launches weigh more), pull with in staged
    // at 64 MiB.
    expect(choose_collective(CollKind::ReduceScatter, 1 * MiB, shared(2), false, true), CollAlgo::Scatter,
           DataPath::Tma);
    expect(choose_collective(CollKind::ReduceScatter, 64 * MiB, shared(2), false, true), CollAlgo::Pull,
           DataPath::LdSt);
    expect(choose_collective(CollKind::AllToAll, 16 * MiB, shared(8)), CollAlgo::Push, DataPath::LdSt);
    expect(choose_collective(CollKind::AllToAll, 64 * MiB, shared(2)), CollAlgo::Push, DataPath::CopyEngine);
    expect(choose_collective(CollKind::AllToAll, 64 * MiB, distinct(2)), CollAlgo::Push, DataPath::LdSt);
    expect(choose_collective(CollKind::AllToAll, 256 * MiB, distinct(2)), CollAlgo::Push, DataPath::CopyEngine);
    // out not symmetric (in symmetric): pull, through the copy engine past 16 MiB per peer.
    expect(choose_collective(CollKind::AllToAll, 16 * MiB, shared(8), true, false), CollAlgo::Pull, DataPath::LdSt);
    expect(choose_collective(CollKind::AllToAll, 64 * MiB, distinct(2), true, false), CollAlgo::Pull,
           DataPath::CopyEngine);
    expect(choose_collective(CollKind::AllToAll, 64 * MiB, shared(2), true, false), CollAlgo::Pull,
           DataPath::CopyEngine);
    expect(choose_collective(CollKind::AllToAllV, 1 * MiB, distinct(2), true, false), CollAlgo::Pull, DataPath::LdSt);
    expect(choose_collective(CollKind::AllToAllV, 64 * MiB, shared(8), true, false), CollAlgo::Pull, DataPath::Tma);
}

// Neither buffer symmetric: past LL, all_gather and all_to_all pull with in staged through the scratch, all_to_all_v
// pushes with out staged; never the copy engine (the staged paths are kernels); reduce_scatter pulls and all_reduce
// runs two-shot with in staged where the cost model says so (always at 1 GiB), else scatter and one-shot. LL still
// wins where it applies, unstaged.
TEST(CollChoice, PlainBuffersStageThroughTheScratch) {
    auto expect_staged = [](CollKind k, std::size_t bytes, const CollTopology& t, CollAlgo a, DataPath p) {
        const CollChoice c = choose_collective(k, bytes, t, false, false);
        expect(c, a, p);
        EXPECT_TRUE(c.staged) << to_string(k) << " " << bytes << " (" << c.reason << ")";
        EXPECT_NE(c.reason.find("staged through symmetric memory"), std::string::npos) << c.reason;
    };
    for (const CollTopology& t : {shared(2), shared(8), distinct(2), distinct(8)}) {
        EXPECT_FALSE(choose_collective(CollKind::AllGather, 4 * KiB, t, false, false).staged);
        expect(choose_collective(CollKind::AllGather, 4 * KiB, t, false, false), CollAlgo::LL, DataPath::LdSt);
        expect_staged(CollKind::AllGather, 1 * MiB, t, CollAlgo::Pull, DataPath::LdSt);
        expect_staged(CollKind::AllGather, 1 * GiB, t, CollAlgo::Pull, DataPath::LdSt);  // the CE row, on ld/st
        expect_staged(CollKind::AllToAll, 4 * MiB, t, CollAlgo::Pull, DataPath::LdSt);
        expect_staged(CollKind::AllToAll, 256 * MiB, t, CollAlgo::Pull, DataPath::LdSt);
        expect_staged(CollKind::AllToAllV, 1 * MiB, t, CollAlgo::Push, DataPath::LdSt);
        expect_staged(CollKind::AllToAllV, 64 * MiB, t, CollAlgo::Push, DataPath::Tma);
        expect_staged(CollKind::ReduceScatter, 1 * GiB, t, CollAlgo::Pull, DataPath::LdSt);
        expect_staged(CollKind::AllReduce, 1 * GiB, t, CollAlgo::TwoShot, DataPath::LdSt);  // the CE row on distinct
        for (CollKind k : {CollKind::ReduceScatter, CollKind::AllReduce}) {
            const CollChoice c = choose_collective(k, 1 * MiB, t, false, false);
            EXPECT_NE(c.algo, CollAlgo::Auto) << to_string(k);
            if (!c.staged) EXPECT_EQ(c.algo, k == CollKind::ReduceScatter ? CollAlgo::Scatter : CollAlgo::OneShot);
        }
    }
    // Below sm_90 the staged all_to_all_v takes ld/st.
    expect_staged(CollKind::AllToAllV, 64 * MiB, CollTopology{2, false, 80}, CollAlgo::Push, DataPath::LdSt);
    // One buffer symmetric: the algorithm that does without the other, unstaged.
    EXPECT_FALSE(choose_collective(CollKind::AllGather, 1 * MiB, shared(2), false, true).staged);
    expect(choose_collective(CollKind::AllGather, 1 * MiB, shared(2), false, true), CollAlgo::Push, DataPath::LdSt);
    EXPECT_FALSE(choose_collective(CollKind::AllToAll, 64 * MiB, shared(2), true, false).staged);
}

TEST(CollChoice, StagedBufferPerAlgorithm) {
    using coll::Staged;
    EXPECT_EQ(coll::staged_buffer(CollKind::AllGather, CollAlgo::Pull), Staged::In);
    EXPECT_EQ(coll::staged_buffer(CollKind::AllToAll, CollAlgo::Pull), Staged::In);
    EXPECT_EQ(coll::staged_buffer(CollKind::AllToAllV, CollAlgo::Push), Staged::Out);
    for (CollAlgo a : {CollAlgo::Push, CollAlgo::Ring, CollAlgo::LL})
        EXPECT_EQ(coll::staged_buffer(CollKind::AllGather, a), Staged::None) << to_string(a);
    EXPECT_EQ(coll::staged_buffer(CollKind::AllToAll, CollAlgo::Push), Staged::None);
    EXPECT_EQ(coll::staged_buffer(CollKind::AllToAllV, CollAlgo::Pull), Staged::None);
    EXPECT_EQ(coll::staged_buffer(CollKind::ReduceScatter, CollAlgo::Pull), Staged::In);
    EXPECT_EQ(coll::staged_buffer(CollKind::AllReduce, CollAlgo::TwoShot), Staged::In);
    for (CollAlgo a : {CollAlgo::Scatter, CollAlgo::Ring, CollAlgo::LL}) {
        EXPECT_FALSE(coll::stageable(CollKind::ReduceScatter, a)) << to_string(a);
        EXPECT_FALSE(coll::stageable(CollKind::AllReduce, a)) << to_string(a);
    }
    EXPECT_FALSE(coll::stageable(CollKind::AllReduce, CollAlgo::OneShot));
}

// An algorithm asked for by name runs staged where it cannot run on the buffers as given and has a staged variant;
// its copy-engine path then becomes ld/st when the path is Auto, and is an error when asked for.
TEST(CollChoice, ExplicitAlgorithmsStageWhereTheyCan) {
    const CollTopology t = shared(4);
    auto resolve = [&](CollKind k, CollOptions o, bool in_sym, bool out_sym) {
        return coll::resolve(k, 4 * MiB, t, o, in_sym, out_sym);
    };
    CollChoice c = resolve(CollKind::AllGather, CollOptions{CollAlgo::Pull}, false, false);
    EXPECT_TRUE(c.staged);
    EXPECT_EQ(c.path, DataPath::Tma);  // default_path past 256 KiB on sm_90
    c = resolve(CollKind::AllGather, CollOptions{CollAlgo::Pull, DataPath::LdSt}, false, true);
    EXPECT_TRUE(c.staged);
    EXPECT_FALSE(resolve(CollKind::AllGather, CollOptions{CollAlgo::Pull}, true, false).staged);
    EXPECT_FALSE(resolve(CollKind::AllGather, CollOptions{CollAlgo::Push}, false, false).staged);  // the op raises
    EXPECT_TRUE(resolve(CollKind::AllToAllV, CollOptions{CollAlgo::Push}, true, false).staged);
    EXPECT_FALSE(resolve(CollKind::AllToAllV, CollOptions{CollAlgo::Push}, true, true).staged);
    // reduce_scatter's pull and all_reduce's two-shot with in plain: staged, on ld/st.
    c = resolve(CollKind::ReduceScatter, CollOptions{CollAlgo::Pull}, false, true);
    EXPECT_TRUE(c.staged);
    EXPECT_EQ(c.path, DataPath::LdSt);
    EXPECT_FALSE(resolve(CollKind::ReduceScatter, CollOptions{CollAlgo::Scatter}, false, false).staged);
    for (const bool out_sym : {false, true}) {
        c = resolve(CollKind::AllReduce, CollOptions{CollAlgo::TwoShot}, false, out_sym);
        EXPECT_TRUE(c.staged);
        EXPECT_EQ(c.path, DataPath::LdSt);
    }
    EXPECT_FALSE(resolve(CollKind::AllReduce, CollOptions{CollAlgo::OneShot}, false, false).staged);
    std::string e;
    try {
        resolve(CollKind::AllReduce, CollOptions{CollAlgo::TwoShot, DataPath::CopyEngine}, false, true);
    } catch (const Error& err) {
        e = err.what();
    }
    EXPECT_NE(e.find("two_shot through the copy engine needs in in the symmetric heap"), std::string::npos) << e;
    e.clear();
    try {
        resolve(CollKind::AllToAll, CollOptions{CollAlgo::Pull, DataPath::CopyEngine}, false, false);
    } catch (const Error& err) {
        e = err.what();
    }
    EXPECT_NE(e.find("pull through the copy engine needs in in the symmetric heap"), std::string::npos) << e;
    // Auto with the copy engine asked for, where the choice is staged: the same error.
    e.clear();
    try {
        resolve(CollKind::AllGather, CollOptions{CollAlgo::Auto, DataPath::CopyEngine}, false, false);
    } catch (const Error& err) {
        e = err.what();
    }
    EXPECT_NE(e.find("through the copy engine needs in in the symmetric heap"), std::string::npos) << e;
}

// The cost model: traffic per rank in units of the choice's bytes, the staging copy's included.
TEST(CollChoice, CostModelTraffic) {
    using coll::model_traffic_units;
    for (int W : {2, 3, 8}) {
        const double w = W;
        EXPECT_DOUBLE_EQ(model_traffic_units(CollKind::ReduceScatter, CollAlgo::Pull, W, false, true), w + 1);
        EXPECT_DOUBLE_EQ(model_traffic_units(CollKind::ReduceScatter, CollAlgo::Pull, W, true, true), 3 * w + 1);
        EXPECT_DOUBLE_EQ(model_traffic_units(CollKind::ReduceScatter, CollAlgo::Scatter, W, false, true), 3 * w + 1);
        EXPECT_DOUBLE_EQ(model_traffic_units(CollKind::AllReduce, CollAlgo::TwoShot, W, false, true), 2);
        EXPECT_DOUBLE_EQ(model_traffic_units(CollKind::AllReduce, CollAlgo::TwoShot, W, true, true), 4);
        EXPECT_DOUBLE_EQ(model_traffic_units(CollKind::AllReduce, CollAlgo::TwoShot, W, true, false), 5);
        EXPECT_DOUBLE_EQ(model_traffic_units(CollKind::AllReduce, CollAlgo::OneShot, W, false, false), 2 * w + 2);
        EXPECT_DOUBLE_EQ(model_traffic_units(CollKind::AllGather, CollAlgo::Pull, W, true, false), 2 * w + 2);
        EXPECT_DOUBLE_EQ(model_traffic_units(CollKind::AllToAll, CollAlgo::Pull, W, true, false), 4 * w);
        EXPECT_DOUBLE_EQ(model_traffic_units(CollKind::AllToAllV, CollAlgo::Push, W, true, false), 6 * w);
    }
    // Staging costs its copy and launches: more than the same algorithm on symmetric buffers.
    const CollTopology t = shared(2);
    EXPECT_GT(coll::model_us(CollKind::ReduceScatter, CollAlgo::Pull, 64 * MiB, t, true, true),
              coll::model_us(CollKind::ReduceScatter, CollAlgo::Pull, 64 * MiB, t, false, true));
}

// Plain in (out symmetric or not) past the LL sizes, at several sizes and rank counts (odd ones too): reduce_scatter
// pulls and all_reduce runs two-shot with in staged once the sizes leave the launches behind; all_gather and
// all_to_all with only in plain push unstaged; all_to_all_v with only out plain pulls unstaged (staging out costs
// two copies of its capacity, which the model weighs); a choice is staged exactly where the model says so.
TEST(CollChoice, CostModelDecidesStaging) {
    for (const CollTopology& t : {shared(2), shared(3), shared(8), distinct(2), distinct(3), distinct(8)})
        for (std::size_t b : {16 * MiB, 64 * MiB, 256 * MiB, 1 * GiB})
            for (const bool out_sym : {false, true}) {
                const std::string at = std::to_string(t.world) + (t.shared_gpu ? " shared " : " distinct ") +
                                       std::to_string(b) + (out_sym ? " out symmetric" : " out plain");
                CollChoice c = choose_collective(CollKind::ReduceScatter, b, t, false, out_sym);
                EXPECT_TRUE(c.staged && c.algo == CollAlgo::Pull && c.path == DataPath::LdSt) << at << c.reason;
                c = choose_collective(CollKind::AllReduce, b, t, false, out_sym);
                EXPECT_TRUE(c.staged && c.algo == CollAlgo::TwoShot && c.path == DataPath::LdSt) << at << c.reason;
                EXPECT_NE(c.reason.find("model:"), std::string::npos) << c.reason;
            }
    for (const CollTopology& t : {shared(2), shared(3), distinct(3)}) {
        EXPECT_FALSE(choose_collective(CollKind::AllGather, 64 * MiB, t, false, true).staged);
        EXPECT_FALSE(choose_collective(CollKind::AllToAll, 64 * MiB, t, false, true).staged);
        const CollChoice c = choose_collective(CollKind::AllToAllV, 64 * MiB, t, true, false);
        EXPECT_FALSE(c.staged) << c.reason;
        EXPECT_EQ(c.algo, CollAlgo::Pull);
    }
    // Staged exactly where the model puts the staged row below the first one that runs as given.
    for (const CollTopology& t : {shared(2), shared(4), distinct(2), distinct(8)})
        for (std::size_t b = 256 * KiB; b <= 64 * MiB; b *= 4) {
            const CollChoice c = choose_collective(CollKind::ReduceScatter, b, t, false, true);
            const double staged = coll::model_us(CollKind::ReduceScatter, CollAlgo::Pull, b, t, true, true);
            const double given = coll::model_us(CollKind::ReduceScatter, CollAlgo::Scatter, b, t, false, true);
            if (c.algo != CollAlgo::LL) EXPECT_EQ(c.staged, staged < given) << b << " " << c.reason;
        }
}

TEST(CollChoice, PreHopperNeverGetsTma) {
    for (CollKind k : {CollKind::AllGather, CollKind::AllToAllV, CollKind::ReduceScatter}) {
        const CollChoice c = choose_collective(k, 256 * MiB, CollTopology{2, false, 80}, false, true);
        EXPECT_NE(c.path, DataPath::Tma) << to_string(k);
    }
}

TEST(CollChoice, ExplainPrintsTheTable) {
    const std::string s = explain_collectives(shared(4));
    EXPECT_NE(s.find("ranks share a GPU"), std::string::npos) << s;
    EXPECT_NE(s.find("copy engine (measured)"), std::string::npos) << s;
    EXPECT_NE(s.find("choice with in and out outside the symmetric heap"), std::string::npos) << s;
    EXPECT_NE(s.find("pull/ld+staged"), std::string::npos) << s;
}

}  // namespace
}  // namespace loom
