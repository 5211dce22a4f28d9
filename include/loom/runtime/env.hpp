// Rank facts from the environment: LOOM_*, torchrun's, Open MPI's or Slurm's variables.
//
// Conventions, in precedence order (the first whose rank variable is set supplies every fact):
//   loom      LOOM_RANK, LOOM_WORLD_SIZE, LOOM_LOCAL_RANK, LOOM_LOCAL_WORLD_SIZE (set by loomrun)
//   torchrun  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
//   openmpi   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE
//   slurm     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and the tasks per node from SLURM_NTASKS_PER_NODE or
//             SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE ("4(x2)", "4,4")
// The rendezvous address is LOOM_MASTER_ADDR, else MASTER_ADDR, else 127.0.0.1 (allowed only on one node);
// the port of Loom's store is LOOM_MASTER_PORT, else MASTER_PORT + 1 (MASTER_PORT is torch.distributed's: under
// torchrun its own store listens there), else 29500. Without a local rank/world the job is taken to be one node (the
// World then groups the ranks by host name instead). Ranks must be laid out node by node: local_rank == rank %
// local_world_size, node = rank / local_world_size.
//
// LOOM_NODE_SIZE=k splits the ranks into nodes of k consecutive ranks regardless of the hosts (k divides the ranks per
// host): peers in another such node are reached only through NVSHMEM, never through the fd-mapped heap. That is the
// emulated multi-node mode (docs/crossnode.md): 8 ranks with LOOM_NODE_SIZE=4 run every cross-node path on one host.
#pragma once

#include <cstddef>
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
    // The launcher's facts about this host (-1: the same as local_rank / local_world_size). They differ from the node
    // facts only under LOOM_NODE_SIZE; the World picks the GPU from them.
    int host_local_rank = -1;
    int host_local_world_size = -1;
    int node_size = 0;              // LOOM_NODE_SIZE (0: unset, nodes are hosts)
    bool local_from_hosts = false;  // the launcher gave no local rank / world: the World derives them from host names

    int num_nodes() const { return world_size / local_world_size; }
    std::string master_addr = "127.0.0.1";
    int master_port = 29500;
    std::string source;  // which convention supplied the facts: "loom", "torchrun", "openmpi", "slurm", "default"
    int device = -1;     // LOOM_DEVICE (loomrun assigns it); -1 when unset: the World picks local_rank % devices
};

// Look-up function so that tests can parse a synthetic environment. An empty value counts as unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();

// Parse the rank facts. Precedence: LOOM_* > torchrun > Open MPI > Slurm > single-rank default.
// Raises loom::Error naming the variable when a value is malformed or inconsistent (rank >= world size,
// local world not dividing, ...).
RankInfo rank_info_from_env(const EnvLookup& env = process_env());

// Splits `info`'s hosts into nodes of `node_size` consecutive ranks (LOOM_NODE_SIZE): host facts keep the launcher's
// layout, local_rank / local_world_size / node become the split's. node_size 0 leaves `info` as it is. Raises when
// node_size does not divide the ranks per host.
void apply_node_size(RankInfo& info, int node_size);

// A byte count: 1073741824, 1G, 512M, 64K or 2GiB (binary suffixes, K = KiB = 1024); `what` names the source in
// errors.
std::size_t parse_bytes(const std::string& text, const std::string& what);

}  // namespace loom
