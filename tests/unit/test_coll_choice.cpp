// The automatic collective choice (src/ops/collectives/coll_choice.cpp): the rows follow the H200 measurements in
// docs/perf/*.json, and infeasible algorithms (buffers outside the symmetric heap) are never chosen.
#include <gtest/gtest.h>

#include "ops/collectives/coll_choice.hpp"

namespace loom {
namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;

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
    expect(choose_collective(CollKind::AllToAll, 64 * MiB, shared(2), false, false), CollAlgo::Auto, DataPath::Auto);
    expect(choose_collective(CollKind::AllToAllV, 1 * MiB, distinct(2), true, false), CollAlgo::Pull, DataPath::LdSt);
    expect(choose_collective(CollKind::AllToAllV, 64 * MiB, shared(8), true, false), CollAlgo::Pull, DataPath::Tma);
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
}

}  // namespace
}  // namespace loom
