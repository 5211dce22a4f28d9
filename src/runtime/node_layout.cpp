#include "runtime/node_layout.hpp"

#include "loom/runtime/error.hpp"

namespace loom::detail {

HostLayout host_layout(const std::vector<std::string>& hosts, int rank) {
    const int n = static_cast<int>(hosts.size());
    LOOM_CHECK(rank >= 0 && rank < n, "host layout: expected a rank in [0, {}), given {}", n, rank);
    // Runs of equal names; a name that comes back after another host's run means the ranks are not host by host.
    std::vector<std::pair<std::string, int>> runs;  // (host, first rank)
    for (int r = 0; r < n; ++r) {
        if (!runs.empty() && runs.back().first == hosts[r]) continue;
        for (const auto& [h, first] : runs)
            LOOM_CHECK(h != hosts[r],
                       "ranks on host '{}' are not consecutive (ranks {} and {}, another host between): expected "
                       "ranks laid out node by node",
                       h, first, r);
        runs.emplace_back(hosts[r], r);
    }
    const int per_host = (runs.size() > 1 ? runs[1].second : n);
    for (std::size_t i = 0; i < runs.size(); ++i) {
        const int end = i + 1 < runs.size() ? runs[i + 1].second : n;
        LOOM_CHECK(end - runs[i].second == per_host,
                   "host '{}' runs {} ranks, host '{}' runs {}: expected the same number of ranks on every host",
                   runs[0].first, per_host, runs[i].first, end - runs[i].second);
    }
    return HostLayout{rank % per_host, per_host, static_cast<int>(runs.size())};
}

void reconcile_with_hosts(RankInfo& info, const std::vector<std::string>& hosts) {
    LOOM_CHECK(static_cast<int>(hosts.size()) == info.world_size, "host names: expected {} (one per rank), given {}",
               info.world_size, hosts.size());
    if (info.local_from_hosts) {
        const HostLayout h = host_layout(hosts, info.rank);
        info.host_local_rank = info.local_rank = h.host_local_rank;
        info.host_local_world_size = info.local_world_size = h.host_local_world_size;
        info.node = info.rank / info.local_world_size;
        if (info.node_size) apply_node_size(info, info.node_size);
        return;
    }
    const int first = info.node * info.local_world_size;
    for (int r = first; r < first + info.local_world_size; ++r)
        LOOM_CHECK(hosts[r] == hosts[first],
                   "node {} (ranks {}..{}, {} per node from the {} convention) spans hosts '{}' (rank {}) and '{}' "
                   "(rank {}): expected the ranks of a node on one host",
                   info.node, first, first + info.local_world_size - 1, info.local_world_size, info.source,
                   hosts[first], first, hosts[r], r);
}

void check_rank_layout(const RankInfo& info) {
    LOOM_CHECK(info.world_size >= 1 && info.rank >= 0 && info.rank < info.world_size,
               "RankInfo: expected 0 <= rank < world_size, given rank {} of {}", info.rank, info.world_size);
    LOOM_CHECK(info.local_world_size >= 1 && info.world_size % info.local_world_size == 0,
               "RankInfo: expected local_world_size dividing world_size {} (the same number of ranks on every node), "
               "given {}",
               info.world_size, info.local_world_size);
    LOOM_CHECK(info.local_rank == info.rank % info.local_world_size && info.node == info.rank / info.local_world_size,
               "RankInfo: expected ranks laid out node by node: rank {} with {} per node is local rank {} of node {}, "
               "given local rank {} of node {}",
               info.rank, info.local_world_size, info.rank % info.local_world_size, info.rank / info.local_world_size,
               info.local_rank, info.node);
}

}  // namespace loom::detail
