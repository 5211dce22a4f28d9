"""Communication times: alpha-beta per link (latency + bytes / bandwidth), in microseconds.

Links: NVLink per GPU per direction (GBps_per_dir * efficiency) inside a node; InfiniBand per GPU
(GBps_per_nic * efficiency * nics_per_node / gpus_per_node) between nodes. Ranks sharing one GPU copy through
its HBM: the measured aggregate copy rate of the ranks (shared_gpu.copy_GBps_by_ranks[r], bytes moved per
second by all r ranks together) divided by r per rank.

Sizes follow nccl-tests: all_gather S = output bytes (each rank contributes S / n); reduce_scatter S = input
bytes per rank; all_reduce S = the buffer; all_to_all S = bytes each rank sends (its own block included).

Algorithms: inside a node every rank reaches every peer directly (one shot: (g - 1) / g of S through its
link); between nodes the hierarchical form moves only between ranks of the same local rank over IB, then fans
out over NVLink, the two stages pipelined (time = the slower stage). ring_* is the flat ring a library
(NCCL) runs over several nodes: one channel per NIC, each GPU one IB hop and g - 1 NVLink hops per channel.
"""
from . import topology as _topo  # noqa: F401  (documented type of `t`)


def bytes_per_us(gbps):
    return gbps * 1e3


def nvlink_rate(p):
    return bytes_per_us(p["nvlink"]["GBps_per_dir"] * p["nvlink"]["efficiency"])


def ib_rate(p):
    ib = p["ib"]
    return bytes_per_us(ib["GBps_per_nic"] * ib["efficiency"] * ib["nics_per_node"] / p["gpus_per_node"])


def shared_rate(p, ranks):
    """Per-rank copy rate (bytes/us) of `ranks` ranks sharing one GPU."""
    shared = p.get("shared_gpu")
    if shared is None:
        raise ValueError(f"{p['name']}: no shared_gpu section: this parameter file does not model ranks sharing a GPU")
    by = shared["copy_GBps_by_ranks"]
    if str(ranks) not in by:
        raise ValueError(f"{p['name']}: shared_gpu.copy_GBps_by_ranks has no entry for {ranks} ranks "
                         f"(has {', '.join(sorted(by, key=int))})")
    return bytes_per_us(by[str(ranks)]) / ranks


def alpha(p, t):
    """Fixed cost of one collective: a launch, one signal per peer, and the link latency."""
    gpu = p["gpu"]
    a = gpu["launch_us"] + (t.gpus_per_node - 1) * gpu["signal_us"]
    if not t.shared:
        a += p["nvlink"]["latency_us"]
    if t.nodes > 1:
        a += p["ib"]["latency_us"]
    return a


def _intra_rate(p, t):
    return shared_rate(p, t.ranks) if t.shared else nvlink_rate(p)


def _hierarchical(p, t, nbytes):
    g, n = t.gpus_per_node, t.ranks
    t_nvl = (g - 1) / g * nbytes / _intra_rate(p, t)
    if t.nodes == 1:
        return t_nvl
    t_ib = (t.nodes - 1) * (nbytes / n) / ib_rate(p)
    return max(t_ib, t_nvl)


def all_gather(p, t, nbytes):
    return alpha(p, t) + _hierarchical(p, t, nbytes) if t.ranks > 1 else 0.0


def reduce_scatter(p, t, nbytes):
    return alpha(p, t) + _hierarchical(p, t, nbytes) if t.ranks > 1 else 0.0


def all_reduce(p, t, nbytes):
    """Two-shot: reduce-scatter then all-gather of the buffer."""
    return reduce_scatter(p, t, nbytes) + all_gather(p, t, nbytes) if t.ranks > 1 else 0.0


def all_to_all(p, t, nbytes):
    if t.ranks == 1:
        return 0.0
    g, n = t.gpus_per_node, t.ranks
    t_nvl = (g - 1) / n * nbytes / _intra_rate(p, t)
    t_ib = (n - g) / n * nbytes / ib_rate(p) if t.nodes > 1 else 0.0
    return alpha(p, t) + max(t_nvl, t_ib)


def ring_all_gather(p, t, nbytes):
    """A library's flat ring over all ranks (the sequential baseline across nodes)."""
    if t.nodes == 1:
        return all_gather(p, t, nbytes)
    g, n = t.gpus_per_node, t.ranks
    per_channel = (n - 1) / n * nbytes / g
    return alpha(p, t) + max(per_channel / ib_rate(p), (g - 1) * per_channel / nvlink_rate(p))


def ring_reduce_scatter(p, t, nbytes):
    return ring_all_gather(p, t, nbytes)


def ll_all_to_all(p, t, nbytes):
    """Low-latency all-to-all (EP dispatch / combine): `nbytes` leave each rank in total, spread evenly over the
    ranks; intra-node peers over NVLink, the rest over IB, both at once; plus the fixed LL cost (ll.overhead_us:
    launch, count exchange, per-expert signalling)."""
    g, n = t.gpus_per_node, t.ranks
    t_nvl = (g - 1) / n * nbytes / _intra_rate(p, t)
    t_ib = (n - g) / n * nbytes / ib_rate(p) if t.nodes > 1 else 0.0
    return p["ll"]["overhead_us"] + max(t_nvl, t_ib)
