// Environment parsing: rank facts from the launchers' conventions, and typed readers of single variables.
#include "loom/runtime/env.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <vector>

#include "loom/runtime/error.hpp"
#include "runtime/env_vars.hpp"

namespace loom {
namespace {

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
}

std::string trim(const std::string& s) {
    std::size_t b = 0, e = s.size();
    while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
    while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
    return s.substr(b, e - b);
}

// Whole-string decimal integer (optional sign); nullopt when anything else is present or it overflows.
std::optional<long long> to_ll(const std::string& raw) {
    std::string s = trim(raw);
    if (s.empty()) return std::nullopt;
    std::size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
    if (i == s.size()) return std::nullopt;
    for (std::size_t j = i; j < s.size(); ++j)
        if (!std::isdigit(static_cast<unsigned char>(s[j]))) return std::nullopt;
    errno = 0;
    long long v = std::strtoll(s.c_str(), nullptr, 10);
    if (errno == ERANGE) return std::nullopt;
    return v;
}

std::optional<std::string> get(const EnvLookup& env, const std::string& name) {
    auto v = env(name);
    if (v && v->empty()) return std::nullopt;
    return v;
}

int int_var(const EnvLookup& env, const std::string& name, const std::string& value) {
    auto v = to_ll(value);
    LOOM_CHECK(v && *v >= INT_MIN && *v <= INT_MAX, "{}: expected an integer, given \"{}\"", name, value);
    return static_cast<int>(*v);
}

// Slurm's tasks-per-node syntax: "4", "4(x2)", "4,4", "2(x3),2". Returns the common count; raises when the
// nodes differ (node = rank / local_world_size needs the same count everywhere).
int slurm_tasks_per_node(const std::string& name, const std::string& value) {
    std::vector<long long> counts;
    std::size_t pos = 0;
    while (pos <= value.size()) {
        std::size_t comma = value.find(',', pos);
        std::string item = trim(value.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
        std::string count = item, reps = "1";
        if (auto paren = item.find('('); paren != std::string::npos) {
            LOOM_CHECK(item.size() > paren + 3 && item.compare(paren, 2, "(x") == 0 && item.back() == ')',
                       "{}: expected a tasks-per-node list like \"4(x2)\" or \"4,4\", given \"{}\"", name, value);
            count = item.substr(0, paren);
            reps = item.substr(paren + 2, item.size() - paren - 3);
        }
        auto c = to_ll(count), r = to_ll(reps);
        LOOM_CHECK(c && r && *c > 0 && *r > 0,
                   "{}: expected a tasks-per-node list like \"4(x2)\" or \"4,4\", given \"{}\"", name, value);
        counts.push_back(*c);
        if (comma == std::string::npos) break;
        pos = comma + 1;
    }
    for (long long c : counts)
        LOOM_CHECK(c == counts[0],
                   "{}: expected the same number of tasks on every node (ranks laid out node by node), given \"{}\"",
                   name, value);
    LOOM_CHECK(counts[0] <= INT_MAX, "{}: tasks per node out of range, given \"{}\"", name, value);
    return static_cast<int>(counts[0]);
}

struct Convention {
    const char* source;
    const char* rank;
    const char* world;
    const char* local_rank;
    const char* local_world;
};

constexpr Convention kConventions[] = {
    {"loom", "LOOM_RANK", "LOOM_WORLD_SIZE", "LOOM_LOCAL_RANK", "LOOM_LOCAL_WORLD_SIZE"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},  // local world: tasks per node
};

}  // namespace

EnvLookup process_env() {
    return [](const std::string& name) -> std::optional<std::string> {
        const char* v = std::getenv(name.c_str());
        if (!v) return std::nullopt;
        return std::string(v);
    };
}

RankInfo rank_info_from_env(const EnvLookup& env) {
    RankInfo info;
    info.source = "default";
    const Convention* conv = nullptr;
    for (const auto& c : kConventions) {
        if (get(env, c.rank) || get(env, c.world)) {
            conv = &c;
            break;
        }
    }
    if (conv) {
        info.source = conv->source;
        auto rank = get(env, conv->rank);
        auto world = get(env, conv->world);
        LOOM_CHECK(rank, "{} is set ({}) but {} is not: expected both", conv->world, *world, conv->rank);
        LOOM_CHECK(world, "{} is set ({}) but {} is not: expected both", conv->rank, *rank, conv->world);
        info.rank = int_var(env, conv->rank, *rank);
        info.world_size = int_var(env, conv->world, *world);
        LOOM_CHECK(info.world_size >= 1, "{}: expected a world size >= 1, given {}", conv->world, *world);
        LOOM_CHECK(info.rank >= 0 && info.rank < info.world_size, "{}: expected a rank in [0, {}) ({}={}), given {}",
                   conv->rank, info.world_size, conv->world, *world, *rank);

        // Local facts; without any, the job is one node.
        std::string local_world_name;
        std::optional<std::string> local_world;
        if (conv->local_world) {
            local_world_name = conv->local_world;
            local_world = get(env, conv->local_world);
        } else {  // Slurm: the step's layout first, then the job's.
            for (const char* n : {"SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
                if (auto v = get(env, n)) {
                    local_world_name = n;
                    local_world = v;
                    break;
                }
            }
        }
        auto local_rank = get(env, conv->local_rank);
        if (local_rank || local_world) {
            LOOM_CHECK(local_rank, "{} is set ({}) but {} is not: expected both", local_world_name, *local_world,
                       conv->local_rank);
            LOOM_CHECK(local_world, "{} is set ({}) but {} is not: expected both", conv->local_rank, *local_rank,
                       conv->local_world ? conv->local_world : "SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE");
            info.local_rank = int_var(env, conv->local_rank, *local_rank);
            info.local_world_size = conv->local_world ? int_var(env, local_world_name, *local_world)
                                                      : slurm_tasks_per_node(local_world_name, *local_world);
        } else {
            info.local_rank = info.rank;
            info.local_world_size = info.world_size;
        }
        LOOM_CHECK(info.local_world_size >= 1, "{}: expected a local world size >= 1, given {}", local_world_name,
                   info.local_world_size);
        LOOM_CHECK(info.local_rank >= 0 && info.local_rank < info.local_world_size,
                   "{}: expected a local rank in [0, {}) ({}={}), given {}", conv->local_rank, info.local_world_size,
                   local_world_name, info.local_world_size, info.local_rank);
        LOOM_CHECK(info.world_size % info.local_world_size == 0,
                   "{}={} does not divide {}={}: expected the same number of ranks on every node", local_world_name,
                   info.local_world_size, conv->world, info.world_size);
        LOOM_CHECK(info.local_rank == info.rank % info.local_world_size,
                   "{}={} with {}={} and {}={}: expected ranks laid out node by node (local rank = rank % local "
                   "world size = {})",
                   conv->local_rank, info.local_rank, conv->rank, info.rank, local_world_name, info.local_world_size,
                   info.rank % info.local_world_size);
        info.node = info.rank / info.local_world_size;
        info.local_from_hosts = !local_rank;
    }
    info.host_local_rank = info.local_rank;
    info.host_local_world_size = info.local_world_size;
    if (auto k = get(env, "LOOM_NODE_SIZE")) {
        auto v = to_ll(*k);
        LOOM_CHECK(v && *v >= 1 && *v <= INT_MAX,
                   "LOOM_NODE_SIZE: expected a number of ranks per node >= 1, given \"{}\"", *k);
        apply_node_size(info, static_cast<int>(*v));
    }

    // Rendezvous address and port.
    const int nodes = info.world_size / info.host_local_world_size;  // hosts: emulated nodes share 127.0.0.1
    if (auto a = get(env, "LOOM_MASTER_ADDR")) {
        info.master_addr = trim(*a);
    } else if (auto m = get(env, "MASTER_ADDR")) {
        info.master_addr = trim(*m);
    } else {
        LOOM_CHECK(nodes == 1,
                   "no rendezvous address for a {}-node job ({} ranks, {} per node, from the {} convention): "
                   "expected LOOM_MASTER_ADDR or MASTER_ADDR (the host of rank 0)",
                   nodes, info.world_size, info.host_local_world_size, info.source);
    }
    // MASTER_PORT is torch.distributed's: under torchrun its store already listens there (and a torch script under
    // mpirun or loomrun binds it), so Loom's store takes the next port.
    if (auto p = get(env, "LOOM_MASTER_PORT")) {
        auto v = to_ll(*p);
        LOOM_CHECK(v && *v >= 0 && *v <= 65535, "LOOM_MASTER_PORT: expected a TCP port in [0, 65535], given \"{}\"",
                   *p);
        info.master_port = static_cast<int>(*v);
    } else if (auto m = get(env, "MASTER_PORT")) {
        auto v = to_ll(*m);
        LOOM_CHECK(v && *v >= 1 && *v <= 65534,
                   "MASTER_PORT: expected a TCP port in [1, 65534] (Loom's store takes MASTER_PORT + 1; "
                   "LOOM_MASTER_PORT sets it directly), given \"{}\"",
                   *m);
        info.master_port = static_cast<int>(*v) + 1;
    }
    if (auto d = get(env, "LOOM_DEVICE")) {
        auto v = to_ll(*d);
        LOOM_CHECK(v && *v >= 0 && *v <= INT_MAX, "LOOM_DEVICE: expected a device index >= 0, given \"{}\"", *d);
        info.device = static_cast<int>(*v);
    }
    return info;
}

void apply_node_size(RankInfo& info, int node_size) {
    if (node_size == 0) return;
    if (info.host_local_rank < 0) info.host_local_rank = info.local_rank;
    if (info.host_local_world_size < 0) info.host_local_world_size = info.local_world_size;
    LOOM_CHECK(node_size >= 1 && info.host_local_world_size % node_size == 0,
               "LOOM_NODE_SIZE={}: expected a divisor of the ranks per host ({} of {} ranks; nodes never span hosts)",
               node_size, info.host_local_world_size, info.world_size);
    info.node_size = node_size;
    info.local_world_size = node_size;
    info.local_rank = info.rank % node_size;
    info.node = info.rank / node_size;
}

std::size_t parse_bytes(const std::string& text, const std::string& what) {
    std::string s = trim(text);
    std::size_t i = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    LOOM_CHECK(i > 0, "{}: expected a byte count like 1073741824, 512M, 1G or 2GiB, given \"{}\"", what, text);
    std::string digits = s.substr(0, i), suffix = lower(trim(s.substr(i)));
    errno = 0;
    unsigned long long n = std::strtoull(digits.c_str(), nullptr, 10);
    LOOM_CHECK(errno != ERANGE, "{}: byte count out of range, given \"{}\"", what, text);
    int shift = -1;
    if (suffix.empty() || suffix == "b") shift = 0;
    static constexpr const char* kUnits = "kmgtp";
    for (int u = 0; u < 5 && shift < 0; ++u) {
        std::string k(1, kUnits[u]);
        if (suffix == k || suffix == k + "b" || suffix == k + "ib") shift = 10 * (u + 1);
    }
    LOOM_CHECK(shift >= 0,
               "{}: expected a byte count with an optional suffix K, M, G, T, P (or KiB, MiB, GiB, ...), given \"{}\"",
               what, text);
    LOOM_CHECK(shift == 0 || n <= (~0ull >> shift), "{}: byte count out of range, given \"{}\"", what, text);
    return static_cast<std::size_t>(n << shift);
}

std::optional<std::string> env_str(const EnvLookup& env, const char* name) { return get(env, name); }

long long env_int(const EnvLookup& env, const char* name, long long fallback) {
    auto v = get(env, name);
    if (!v) return fallback;
    auto n = to_ll(*v);
    LOOM_CHECK(n, "{}: expected an integer, given \"{}\"", name, *v);
    return *n;
}

bool env_flag(const EnvLookup& env, const char* name) {
    auto v = get(env, name);
    if (!v) return false;
    std::string s = lower(trim(*v));
    if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
    if (s == "0" || s == "false" || s == "no" || s == "off" || s.empty()) return false;
    LOOM_FAIL("{}: expected 1/true/yes/on or 0/false/no/off, given \"{}\"", name, *v);
}

std::size_t env_bytes(const EnvLookup& env, const char* name, std::size_t fallback) {
    auto v = get(env, name);
    return v ? parse_bytes(*v, name) : fallback;
}

std::chrono::milliseconds env_ms(const EnvLookup& env, const char* name, std::chrono::milliseconds fallback,
                                 long long max_ms) {
    auto v = get(env, name);
    if (!v) return fallback;
    auto n = to_ll(*v);
    LOOM_CHECK(n && *n >= 0 && *n <= max_ms, "{}: expected a duration in milliseconds in [0, {}], given \"{}\"", name,
               max_ms, *v);
    return std::chrono::milliseconds(*n);
}

}  // namespace loom
