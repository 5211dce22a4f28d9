// The automatic collective choice (src/ops/collectives/coll_choice.cpp): the rows follow the H200 measurements in
// docs/perf/*.json, and infeasible algorithms (buffers outside the symmetric heap) are never chosen.
#include <gtest/gtest.h>

#include <string>

#include "loom/runtime/error.hpp"
#include "ops/collectives/coll_choice.hpp"

namespace loom {
namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

CollTopology shared(int w) { return CollTopology{w, true, 90}; }
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
    expect(choose_collective(CollKind::AllReduce, 256 * KiB, shared(8), false, false), CollAlgo::OneShot,
           DataPath::LdSt);
    expect(choose_collective(CollKind::AllReduce, 256 * KiB, shared(8), false, true), CollAlgo::OneShot,
           DataPath::LdSt);
    // in symmetric, out not: two-shot stages its shards in the scratch (all_reduce.cpp keeps it off the copy engine).
    expect(choose_collective(CollKind::AllReduce, 256 * KiB, shared(8), true, false), CollAlgo::TwoShot,
           DataPath::LdSt);
    expect(choose_collective(CollKind::AllReduce, 1 * MiB, distinct(2), true, false), CollAlgo::TwoShot,
           DataPath::LdSt);
}

TEST(CollChoice, ReduceScatterAndAllToAll) {
    expect(choose_collective(CollKind::ReduceScatter, 64 * MiB, shared(2)), CollAlgo::Pull, DataPath::LdSt);
    expect(choose_collective(CollKind::ReduceScatter, 1 * MiB, shared(2), false, true), CollAlgo::Scatter,
           DataPath::Tma);
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
// pushes with out staged; never the copy engine (the staged paths are kernels); reduce_scatter and all_reduce need no
// staging (scatter, one-shot). LL still wins where it applies, unstaged.
TEST(CollChoice, PlainBuffersStageThroughTheScratch) {
    auto expect_staged = [](CollKind k, std::size_t bytes, const CollTopology& t, CollAlgo a, DataPath p) {
        const CollChoice c = choose_collective(k, bytes, t, false, false);
        expect(c, a, p);
        EXPECT_TRUE(c.staged) << to_string(k) << " " << bytes << " (" << c.reason << ")";
        EXPECT_NE(c.reason.find("staged through the scratch"), std::string::npos) << c.reason;
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
        for (CollKind k : {CollKind::ReduceScatter, CollKind::AllReduce})
            for (std::size_t b : {1 * MiB, 1 * GiB}) {
                const CollChoice c = choose_collective(k, b, t, false, false);
                EXPECT_FALSE(c.staged) << to_string(k) << " " << b;
                EXPECT_NE(c.algo, CollAlgo::Auto) << to_string(k) << " " << b;
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
    for (CollAlgo a : {CollAlgo::Pull, CollAlgo::Scatter, CollAlgo::Ring, CollAlgo::OneShot, CollAlgo::TwoShot}) {
        EXPECT_FALSE(coll::stageable(CollKind::ReduceScatter, a)) << to_string(a);
        EXPECT_FALSE(coll::stageable(CollKind::AllReduce, a)) << to_string(a);
    }
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
    std::string e;
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
