// Node facts from the hosts the ranks run on: every rank's host name, gathered over the store when the World starts.
//
// The launcher's local facts (env.hpp) are trusted when given; the host names then only check that no node spans two
// hosts (the fd-mapped heap cannot reach another host). Without local facts (a launcher that gives none) the host
// names supply them. LOOM_NODE_SIZE splits hosts further into emulated nodes (env.hpp, apply_node_size).
#pragma once

#include <string>
#include <vector>

#include "loom/runtime/env.hpp"

namespace loom::detail {

struct HostLayout {
    int host_local_rank = 0;        // index of the rank among the ranks of its host
    int host_local_world_size = 1;  // ranks per host
    int num_hosts = 1;
};

// `hosts[r]` is rank r's host name. Raises unless the ranks of each host are consecutive and every host holds the
// same number of ranks (node = rank / local_world_size needs both).
HostLayout host_layout(const std::vector<std::string>& hosts, int rank);

// Brings `info` in line with `hosts` (one name per rank, rank order): adopts the host layout when the launcher gave no
// local facts (info.local_from_hosts; then applies info.node_size again), else raises when one node's ranks are on
// different hosts.
void reconcile_with_hosts(RankInfo& info, const std::vector<std::string>& hosts);

// Raises unless the facts describe a rank of ranks laid out node by node: 0 <= rank < world_size, local_world_size
// dividing world_size, local_rank = rank % local_world_size, node = rank / local_world_size (a RankInfo built by hand
// for World's constructor is checked as the launcher conventions' are).
void check_rank_layout(const RankInfo& info);

}  // namespace loom::detail
