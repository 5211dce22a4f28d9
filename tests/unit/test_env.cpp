// Rank facts and typed settings parsed from synthetic environments (the EnvLookup overloads).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "loom/runtime/env.hpp"
#include "loom/runtime/error.hpp"

namespace {

using Vars = std::map<std::string, std::string>;

loom::EnvLookup lookup(const Vars& vars) {
    return [vars](const std::string& name) -> std::optional<std::string> {
        auto it = vars.find(name);
        if (it == vars.end()) return std::nullopt;
        return it->second;
    };
}

loom::RankInfo parse(const Vars& vars) { return loom::rank_info_from_env(lookup(vars)); }

// The error raised for `vars`, which must mention every string in `needles`.
void expect_error(const Vars& vars, std::initializer_list<std::string> needles) {
    try {
        auto info = parse(vars);
        ADD_FAILURE() << "parsed without error: rank " << info.rank << " of " << info.world_size;
    } catch (const loom::Error& e) {
        for (auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
}

TEST(Env, DefaultIsOneRank) {
    auto info = parse({});
    EXPECT_EQ(info.source, "default");
    EXPECT_EQ(info.rank, 0);
    EXPECT_EQ(info.world_size, 1);
    EXPECT_EQ(info.local_rank, 0);
    EXPECT_EQ(info.local_world_size, 1);
    EXPECT_EQ(info.node, 0);
    EXPECT_EQ(info.master_addr, "127.0.0.1");
    EXPECT_EQ(info.master_port, 29500);
    EXPECT_EQ(info.device, -1);
}

TEST(Env, LoomVariables) {
    auto info = parse({{"LOOM_RANK", "5"},
                       {"LOOM_WORLD_SIZE", "8"},
                       {"LOOM_LOCAL_RANK", "1"},
                       {"LOOM_LOCAL_WORLD_SIZE", "4"},
                       {"LOOM_MASTER_ADDR", "node0"},
                       {"LOOM_MASTER_PORT", "1234"},
                       {"LOOM_DEVICE", "1"}});
    EXPECT_EQ(info.source, "loom");
    EXPECT_EQ(info.rank, 5);
    EXPECT_EQ(info.world_size, 8);
    EXPECT_EQ(info.local_rank, 1);
    EXPECT_EQ(info.local_world_size, 4);
    EXPECT_EQ(info.node, 1);
    EXPECT_EQ(info.master_addr, "node0");
    EXPECT_EQ(info.master_port, 1234);
    EXPECT_EQ(info.device, 1);
}

TEST(Env, LoomTakesPrecedenceOverTorchrunAndMpi) {
    auto info = parse({{"LOOM_RANK", "1"},
                       {"LOOM_WORLD_SIZE", "2"},
                       {"RANK", "3"},
                       {"WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_RANK", "0"},
                       {"OMPI_COMM_WORLD_SIZE", "1"},
                       {"MASTER_PORT", "4000"},
                       {"LOOM_MASTER_PORT", "5000"}});
    EXPECT_EQ(info.source, "loom");
    EXPECT_EQ(info.rank, 1);
    EXPECT_EQ(info.world_size, 2);
    EXPECT_EQ(info.local_rank, 1);  // no local variables: one node
    EXPECT_EQ(info.local_world_size, 2);
    EXPECT_EQ(info.master_port, 5000);
}

TEST(Env, Torchrun) {
    auto info = parse({{"RANK", "6"},
                       {"WORLD_SIZE", "8"},
                       {"LOCAL_RANK", "2"},
                       {"LOCAL_WORLD_SIZE", "4"},
                       {"MASTER_ADDR", "10.0.0.1"},
                       {"MASTER_PORT", "29501"},
                       {"OMPI_COMM_WORLD_RANK", "0"},
                       {"OMPI_COMM_WORLD_SIZE", "1"}});
    EXPECT_EQ(info.source, "torchrun");
    EXPECT_EQ(info.rank, 6);
    EXPECT_EQ(info.node, 1);
    EXPECT_EQ(info.local_rank, 2);
    EXPECT_EQ(info.master_addr, "10.0.0.1");
    EXPECT_EQ(info.master_port, 29501);
}

TEST(Env, OpenMpi) {
    auto info = parse({{"OMPI_COMM_WORLD_RANK", "3"},
                       {"OMPI_COMM_WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                       {"MASTER_ADDR", "head"},
                       {"SLURM_PROCID", "0"},
                       {"SLURM_NTASKS", "1"}});
    EXPECT_EQ(info.source, "openmpi");
    EXPECT_EQ(info.rank, 3);
    EXPECT_EQ(info.world_size, 4);
    EXPECT_EQ(info.local_rank, 1);
    EXPECT_EQ(info.local_world_size, 2);
    EXPECT_EQ(info.node, 1);
    EXPECT_EQ(info.master_addr, "head");
    // One node: the address defaults to loopback.
    auto one = parse({{"OMPI_COMM_WORLD_RANK", "1"},
                      {"OMPI_COMM_WORLD_SIZE", "2"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
    EXPECT_EQ(one.master_addr, "127.0.0.1");
}

TEST(Env, SlurmTasksPerNodeForms) {
    Vars base{{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}, {"LOOM_MASTER_ADDR", "n0"}};
    for (auto [name, value] : std::vector<std::pair<std::string, std::string>>{{"SLURM_NTASKS_PER_NODE", "4"},
                                                                               {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
                                                                               {"SLURM_TASKS_PER_NODE", "4,4"},
                                                                               {"SLURM_TASKS_PER_NODE", "4(x1),4"}}) {
        Vars v = base;
        v[name] = value;
        auto info = parse(v);
        EXPECT_EQ(info.source, "slurm") << name << "=" << value;
        EXPECT_EQ(info.rank, 5);
        EXPECT_EQ(info.local_world_size, 4) << name << "=" << value;
        EXPECT_EQ(info.node, 1);
        EXPECT_EQ(info.master_addr, "n0");
    }
    // The step's layout wins over the job's.
    Vars v = base;
    v["SLURM_STEP_TASKS_PER_NODE"] = "4(x2)";
    v["SLURM_TASKS_PER_NODE"] = "8";
    EXPECT_EQ(parse(v).local_world_size, 4);
}

TEST(Env, SlurmMalformed) {
    Vars base{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "1"}, {"MASTER_ADDR", "n0"}};
    Vars v = base;
    v["SLURM_TASKS_PER_NODE"] = "4,2";
    expect_error(v, {"SLURM_TASKS_PER_NODE", "\"4,2\"", "same number of tasks"});
    v["SLURM_TASKS_PER_NODE"] = "3(2)";
    expect_error(v, {"SLURM_TASKS_PER_NODE", "\"3(2)\""});
    v = base;
    expect_error(v, {"SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"});  // local id without the layout
}

TEST(Env, MissingPartnerVariable) {
    expect_error({{"LOOM_RANK", "0"}}, {"LOOM_RANK", "LOOM_WORLD_SIZE"});
    expect_error({{"WORLD_SIZE", "4"}}, {"WORLD_SIZE", "RANK"});
    expect_error({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}}, {"LOCAL_RANK", "LOCAL_WORLD_SIZE"});
    expect_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"});
}

TEST(Env, NonNumbers) {
    expect_error({{"LOOM_RANK", "one"}, {"LOOM_WORLD_SIZE", "2"}}, {"LOOM_RANK", "\"one\"", "integer"});
    expect_error({{"LOOM_RANK", "0"}, {"LOOM_WORLD_SIZE", "2x"}}, {"LOOM_WORLD_SIZE", "\"2x\""});
    expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1.5"}},
                 {"LOCAL_WORLD_SIZE", "\"1.5\""});
    expect_error({{"LOOM_RANK", "99999999999999999999"}, {"LOOM_WORLD_SIZE", "2"}}, {"LOOM_RANK"});
}

TEST(Env, InconsistentValues) {
    expect_error({{"LOOM_RANK", "4"}, {"LOOM_WORLD_SIZE", "4"}}, {"LOOM_RANK", "[0, 4)", "given 4"});
    expect_error({{"LOOM_RANK", "-1"}, {"LOOM_WORLD_SIZE", "4"}}, {"LOOM_RANK", "given -1"});
    expect_error({{"LOOM_RANK", "0"}, {"LOOM_WORLD_SIZE", "0"}}, {"LOOM_WORLD_SIZE", ">= 1"});
    expect_error({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
                 {"LOCAL_RANK", "[0, 2)"});
    expect_error(
        {{"RANK", "1"}, {"WORLD_SIZE", "6"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}},
        {"LOCAL_WORLD_SIZE=4", "WORLD_SIZE=6", "does not divide"});
    expect_error(
        {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}},
        {"node by node"});
}

TEST(Env, PortAndAddress) {
    expect_error({{"LOOM_MASTER_PORT", "70000"}}, {"LOOM_MASTER_PORT", "\"70000\"", "[0, 65535]"});
    expect_error({{"MASTER_PORT", "http"}}, {"MASTER_PORT", "\"http\""});
    EXPECT_EQ(parse({{"MASTER_PORT", "0"}}).master_port, 0);
    // Several nodes need an address.
    expect_error({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}},
                 {"LOOM_MASTER_ADDR", "MASTER_ADDR", "2-node"});
    // LOOM_MASTER_ADDR beats MASTER_ADDR; empty values count as unset.
    auto info = parse({{"LOOM_MASTER_ADDR", ""}, {"MASTER_ADDR", "m"}, {"LOOM_MASTER_PORT", ""}});
    EXPECT_EQ(info.master_addr, "m");
    EXPECT_EQ(info.master_port, 29500);
    expect_error({{"LOOM_DEVICE", "gpu0"}}, {"LOOM_DEVICE", "\"gpu0\""});
}

TEST(Env, Bytes) {
    auto bytes = [](const std::string& v) { return loom::env_bytes(lookup({{"LOOM_X", v}}), "LOOM_X", 7); };
    EXPECT_EQ(bytes("1073741824"), 1073741824u);
    EXPECT_EQ(bytes("1G"), 1ull << 30);
    EXPECT_EQ(bytes("512M"), 512ull << 20);
    EXPECT_EQ(bytes("64K"), 64ull << 10);
    EXPECT_EQ(bytes("2GiB"), 2ull << 30);
    EXPECT_EQ(bytes("3mb"), 3ull << 20);
    EXPECT_EQ(bytes(" 16 KiB "), 16ull << 10);
    EXPECT_EQ(loom::env_bytes(lookup({}), "LOOM_X", 7), 7u);
    for (std::string bad : {"", "G", "1.5G", "-1", "12Q", "1GiBs", "99999999999999999999", "17179869184G"}) {
        if (bad.empty()) continue;  // empty is unset
        try {
            bytes(bad);
            ADD_FAILURE() << "accepted \"" << bad << "\"";
        } catch (const loom::Error& e) {
            EXPECT_NE(std::string(e.what()).find("LOOM_X"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("\"" + bad + "\""), std::string::npos) << e.what();
        }
    }
}

TEST(Env, IntFlagAndMilliseconds) {
    auto env =
        lookup({{"A", "42"}, {"B", "x"}, {"T", "TRUE"}, {"F", "off"}, {"M", "250"}, {"N", "-3"}, {"Q", "maybe"}});
    EXPECT_EQ(loom::env_int(env, "A", 1), 42);
    EXPECT_EQ(loom::env_int(env, "unset", 9), 9);
    EXPECT_THROW(loom::env_int(env, "B", 1), loom::Error);
    EXPECT_TRUE(loom::env_flag(env, "T"));
    EXPECT_FALSE(loom::env_flag(env, "F"));
    EXPECT_FALSE(loom::env_flag(env, "unset"));
    EXPECT_THROW(loom::env_flag(env, "Q"), loom::Error);
    EXPECT_EQ(loom::env_ms(env, "M", std::chrono::milliseconds(1)).count(), 250);
    EXPECT_THROW(loom::env_ms(env, "N", std::chrono::milliseconds(1)), loom::Error);
}

TEST(Env, StoreTimeoutDefault) {
    const char* old = std::getenv("LOOM_STORE_TIMEOUT_MS");
    std::string saved = old ? old : "";
    unsetenv("LOOM_STORE_TIMEOUT_MS");
    EXPECT_EQ(loom::store_timeout().count(), 300000);
    setenv("LOOM_STORE_TIMEOUT_MS", "1500", 1);
    EXPECT_EQ(loom::store_timeout().count(), 1500);
    setenv("LOOM_STORE_TIMEOUT_MS", "0", 1);
    EXPECT_THROW(loom::store_timeout(), loom::Error);
    if (old)
        setenv("LOOM_STORE_TIMEOUT_MS", saved.c_str(), 1);
    else
        unsetenv("LOOM_STORE_TIMEOUT_MS");
}

}  // namespace
