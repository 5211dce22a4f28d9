// Rank facts from the environment: LOOM_*, torchrun's, Open MPI's or Slurm's variables.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

namespace loom {

struct RankInfo {
    int rank = 0;
    int world_size = 1;
    int local_rank = 0;
    int local_world_size = 1;
    int node = 0;  // rank / local_world_size when ranks are laid out node by node
    std::string master_addr = "127.0.0.1";
    int master_port = 29500;
    std::string source;  // which convention supplied the facts: "loom", "torchrun", "openmpi", "slurm", "default"
};

// Look-up function so that tests can parse a synthetic environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();

// Parse the rank facts. Precedence: LOOM_* > torchrun > Open MPI > Slurm > single-rank default.
// Raises loom::Error naming the variable when a value is malformed or inconsistent (rank >= world size,
// local world not dividing, ...).
RankInfo rank_info_from_env(const EnvLookup& env = process_env());

// Typed helpers for LOOM_* settings; errors name the variable and the value given.
std::optional<std::string> env_str(const char* name);
long long env_int(const char* name, long long fallback);
bool env_flag(const char* name);               // "1", "true", "yes", "on" (case-insensitive)
std::size_t env_bytes(const char* name, std::size_t fallback);  // accepts 1073741824, 1G, 512M, 64K, 2GiB
std::chrono::milliseconds env_ms(const char* name, std::chrono::milliseconds fallback);

}  // namespace loom
