// Node facts: LOOM_NODE_SIZE's split of the launcher's layout (emulated nodes) and the layout from host names.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "loom/runtime/env.hpp"
#include "loom/runtime/error.hpp"
#include "runtime/node_layout.hpp"

namespace {

using Vars = std::map<std::string, std::string>;

loom::RankInfo parse(const Vars& vars) {
    return loom::rank_info_from_env([vars](const std::string& name) -> std::optional<std::string> {
        auto it = vars.find(name);
        if (it == vars.end()) return std::nullopt;
        return it->second;
    });
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const loom::Error& e) {
        return e.what();
    }
    return "";
}

Vars loomrun(int rank, int world) {
    return {{"LOOM_RANK", std::to_string(rank)},
            {"LOOM_WORLD_SIZE", std::to_string(world)},
            {"LOOM_LOCAL_RANK", std::to_string(rank)},
            {"LOOM_LOCAL_WORLD_SIZE", std::to_string(world)}};
}

TEST(NodeSize, SplitsOneHostIntoEmulatedNodes) {
    for (int rank = 0; rank < 8; ++rank) {
        Vars v = loomrun(rank, 8);
        v["LOOM_NODE_SIZE"] = "4";
        const loom::RankInfo info = parse(v);
        EXPECT_EQ(info.node_size, 4);
        EXPECT_EQ(info.local_world_size, 4);
        EXPECT_EQ(info.local_rank, rank % 4);
        EXPECT_EQ(info.node, rank / 4);
        EXPECT_EQ(info.num_nodes(), 2);
        EXPECT_EQ(info.host_local_rank, rank);  // the GPU is still chosen by the place on the host
        EXPECT_EQ(info.host_local_world_size, 8);
        EXPECT_EQ(info.master_addr, "127.0.0.1");  // one host: no rendezvous address needed
    }
}

TEST(NodeSize, LayoutsOfTheEmulatedTests) {
    const int layouts[][2] = {{2, 2}, {2, 4}, {4, 2}};  // nodes x ranks per node
    for (const auto& [nodes, per] : layouts) {
        const int world = nodes * per;
        for (int rank = 0; rank < world; ++rank) {
            Vars v = loomrun(rank, world);
            v["LOOM_NODE_SIZE"] = std::to_string(per);
            const loom::RankInfo info = parse(v);
            EXPECT_EQ(info.num_nodes(), nodes);
            EXPECT_EQ(info.node, rank / per);
            EXPECT_EQ(info.local_rank, rank % per);
        }
    }
}

TEST(NodeSize, SplitsEachHostOfAMultiHostJob) {
    // torchrun --nnodes 2 --nproc-per-node 4, LOOM_NODE_SIZE=2: four nodes of two, two on each host.
    const loom::RankInfo info = parse({{"RANK", "5"},
                                       {"WORLD_SIZE", "8"},
                                       {"LOCAL_RANK", "1"},
                                       {"LOCAL_WORLD_SIZE", "4"},
                                       {"MASTER_ADDR", "h0"},
                                       {"LOOM_NODE_SIZE", "2"}});
    EXPECT_EQ(info.node, 2);
    EXPECT_EQ(info.local_rank, 1);
    EXPECT_EQ(info.num_nodes(), 4);
    EXPECT_EQ(info.host_local_rank, 1);
    EXPECT_EQ(info.host_local_world_size, 4);
}

TEST(NodeSize, UnsetLeavesTheLauncherLayout) {
    const loom::RankInfo info = parse(loomrun(3, 4));
    EXPECT_EQ(info.node_size, 0);
    EXPECT_EQ(info.local_world_size, 4);
    EXPECT_EQ(info.num_nodes(), 1);
    EXPECT_EQ(info.host_local_rank, 3);
    EXPECT_FALSE(info.local_from_hosts);
}

TEST(NodeSize, RejectsSizesThatSpanHosts) {
    Vars v = loomrun(0, 8);
    v["LOOM_NODE_SIZE"] = "3";
    std::string e = error_of([&] { parse(v); });
    EXPECT_NE(e.find("LOOM_NODE_SIZE=3"), std::string::npos) << e;
    EXPECT_NE(e.find("divisor of the ranks per host (8"), std::string::npos) << e;
    v["LOOM_NODE_SIZE"] = "16";
    EXPECT_NE(error_of([&] { parse(v); }).find("LOOM_NODE_SIZE=16"), std::string::npos);
    v["LOOM_NODE_SIZE"] = "0";
    EXPECT_NE(error_of([&] { parse(v); }).find("LOOM_NODE_SIZE: expected a number of ranks per node >= 1"),
              std::string::npos);
    v["LOOM_NODE_SIZE"] = "two";
    EXPECT_NE(error_of([&] { parse(v); }).find("\"two\""), std::string::npos);
}

TEST(HostLayout, GroupsConsecutiveRanksByHost) {
    const std::vector<std::string> hosts{"a", "a", "a", "b", "b", "b"};
    for (int r = 0; r < 6; ++r) {
        const auto h = loom::detail::host_layout(hosts, r);
        EXPECT_EQ(h.host_local_rank, r % 3);
        EXPECT_EQ(h.host_local_world_size, 3);
        EXPECT_EQ(h.num_hosts, 2);
    }
    const auto one = loom::detail::host_layout({"x", "x"}, 1);
    EXPECT_EQ(one.num_hosts, 1);
    EXPECT_EQ(one.host_local_world_size, 2);
}

TEST(HostLayout, RejectsInterleavedAndUnevenHosts) {
    std::string e = error_of([] { loom::detail::host_layout({"a", "b", "a", "b"}, 0); });
    EXPECT_NE(e.find("host 'a' are not consecutive"), std::string::npos) << e;
    e = error_of([] { loom::detail::host_layout({"a", "a", "a", "b"}, 0); });
    EXPECT_NE(e.find("same number of ranks on every host"), std::string::npos) << e;
}

TEST(HostLayout, SuppliesLocalFactsTheLauncherLacks) {
    // mpirun without local variables, two hosts of two: the World derives the nodes from host names.
    loom::RankInfo info = parse({{"LOOM_RANK", "3"}, {"LOOM_WORLD_SIZE", "4"}});
    ASSERT_TRUE(info.local_from_hosts);
    loom::detail::reconcile_with_hosts(info, {"a", "a", "b", "b"});
    EXPECT_EQ(info.local_rank, 1);
    EXPECT_EQ(info.local_world_size, 2);
    EXPECT_EQ(info.node, 1);
    EXPECT_EQ(info.host_local_rank, 1);
    // With LOOM_NODE_SIZE too, the host layout is split again.
    loom::RankInfo split = parse({{"LOOM_RANK", "3"}, {"LOOM_WORLD_SIZE", "4"}, {"LOOM_NODE_SIZE", "2"}});
    loom::detail::reconcile_with_hosts(split, {"a", "a", "a", "a"});
    EXPECT_EQ(split.node, 1);
    EXPECT_EQ(split.local_rank, 1);
    EXPECT_EQ(split.host_local_rank, 3);
    EXPECT_EQ(split.host_local_world_size, 4);
}

TEST(HostLayout, ANodeOfTheLauncherMustNotSpanHosts) {
    loom::RankInfo info = parse(loomrun(1, 4));  // loomrun: one node of four
    std::string e = error_of([&] { loom::detail::reconcile_with_hosts(info, {"a", "a", "b", "b"}); });
    EXPECT_NE(e.find("spans hosts 'a' (rank 0) and 'b' (rank 2)"), std::string::npos) << e;
    // Ranks of one host in different nodes are fine: emulated or faked nodes.
    Vars v = loomrun(1, 4);
    v["LOOM_NODE_SIZE"] = "2";
    loom::RankInfo emulated = parse(v);
    EXPECT_NO_THROW(loom::detail::reconcile_with_hosts(emulated, {"a", "a", "a", "a"}));
    EXPECT_EQ(emulated.node, 0);
}

}  // namespace

// A RankInfo built by hand for World's constructor is held to the launcher conventions' layout.
TEST(NodeSize, HandMadeRankFactsAreChecked) {
    loom::RankInfo info;
    info.rank = 5;
    info.world_size = 8;
    info.local_world_size = 4;
    info.local_rank = 1;
    info.node = 1;
    EXPECT_NO_THROW(loom::detail::check_rank_layout(info));
    info.node = 0;  // rank 5 with 4 per node is on node 1
    try {
        loom::detail::check_rank_layout(info);
        ADD_FAILURE() << "node 0 accepted for rank 5";
    } catch (const loom::Error& e) {
        EXPECT_NE(std::string(e.what()).find("is local rank 1 of node 1, given local rank 1 of node 0"),
                  std::string::npos)
            << e.what();
    }
    info.node = 1;
    info.local_world_size = 3;  // 8 ranks cannot be nodes of 3
    EXPECT_THROW(loom::detail::check_rank_layout(info), loom::Error);
    info.local_world_size = 4;
    info.rank = 8;
    EXPECT_THROW(loom::detail::check_rank_layout(info), loom::Error);
}
