"""Communication times, in microseconds: a fixed cost per call plus bytes over the bottleneck's rate.

Links: NVLink per GPU per direction (GBps_per_dir * efficiency) inside a node; InfiniBand per GPU
(GBps_per_nic * efficiency * nics_per_node / gpus_per_node) between nodes. Ranks sharing one GPU move every byte
through its HBM: an algorithm's time is its HBM traffic (bytes read plus bytes written, by all ranks together, as
src/ops/collectives/coll_choice.cpp's model_traffic_units counts them) over the GPU's measured traffic rate with
that many ranks (shared_gpu.traffic_GBps_by_ranks).

Sizes follow nccl-tests: all_gather S = output bytes (each rank contributes S / n); reduce_scatter S = input
bytes per rank; all_reduce S = the buffer; all_to_all S = bytes each rank sends (its own block included).

One node: the automatic choice of src/ops/collectives/coll_choice.cpp (symmetric buffers), which the table took
from measurements: the flag-in-data LL kernel to its capacity (no barrier; a flag word beside every data word, so
twice the bytes, and each rank's payload at most at LL's measured rate, gpu.ll_GBps; ranks sharing a GPU: the
traffic at LL's measured rate there, shared_gpu.ll_traffic_GBps), else one kernel between an
entry and an exit barrier (fan-out push / pull / ring / two-shot over ld/st), or for the largest transfers the copy
engine (a barrier kernel, the per-peer copies on side streams, a barrier kernel). A bandwidth kernel runs one block
per 64-128 KiB of its size (at most 64, pick_blocks), each at one block's measured copy rate (block_copy_GBps):
small calls are bound by their blocks. Where both LL and a bandwidth algorithm may run, the model takes the
faster, as the measured table does. A call costs:
  distinct GPUs: one launch, one signal per peer and the link latency (alpha);
  ranks sharing a GPU: the measured per-call time of the smallest collective with that many ranks
  (shared_gpu.call_us_by_ranks: MPS serialises the ranks' launches, so it grows with the ranks);
and each barrier a release/acquire signal round trip (gpu.barrier_us; shared_gpu.barrier_us on one GPU).

Across nodes the hierarchical form moves only between ranks of the same local rank over IB, then fans out over
NVLink, the two stages pipelined (time = the slower stage). ring_* is the flat ring a library (NCCL) runs over
several nodes: one channel per NIC, each GPU one IB hop and g - 1 NVLink hops per channel.
"""
import math

from . import topology as _topo  # noqa: F401  (documented type of `t`)

KiB, MiB = 1024, 1024 * 1024
# coll_choice.cpp's LL capacity (bytes as choose_collective counts them), per sharing.
LL_MAX = {"all_gather": (512 * KiB, 128 * KiB), "reduce_scatter": (512 * KiB, 128 * KiB),
          "all_reduce": (256 * KiB, 64 * KiB), "all_to_all": (512 * KiB, 128 * KiB)}


def bytes_per_us(gbps):
    return gbps * 1e3


def nvlink_rate(p):
    return bytes_per_us(p["nvlink"]["GBps_per_dir"] * p["nvlink"]["efficiency"])


def ib_rate(p):
    ib = p["ib"]
    return bytes_per_us(ib["GBps_per_nic"] * ib["efficiency"] * ib["nics_per_node"] / p["gpus_per_node"])


def _shared(p, name, ranks):
    shared = p.get("shared_gpu")
    if shared is None:
        raise ValueError(f"{p['name']}: no shared_gpu section: this parameter file does not model ranks sharing a GPU")
    by = shared[name]
    if str(ranks) not in by:
        raise ValueError(f"{p['name']}: shared_gpu.{name} has no entry for {ranks} ranks "
                         f"(has {', '.join(sorted(by, key=int))})")
    return by[str(ranks)]


def traffic_rate(p, ranks):
    """HBM traffic (bytes read + written, all ranks together) per us of `ranks` ranks sharing one GPU."""
    return bytes_per_us(_shared(p, "traffic_GBps_by_ranks", ranks))


def alpha(p, t):
    """Fixed cost of one call: distinct GPUs a launch, one signal per peer and the link latency; ranks sharing a GPU
    the measured per-call time of the smallest collective."""
    if t.shared:
        return _shared(p, "call_us_by_ranks", t.ranks)
    gpu = p["gpu"]
    a = gpu["launch_us"] + (t.gpus_per_node - 1) * gpu["signal_us"] + p["nvlink"]["latency_us"]
    if t.nodes > 1:
        a += p["ib"]["latency_us"]
    return a


def barrier_us(p, t):
    """One cross-rank barrier inside a kernel: a release signal to every peer and an acquire wait (in parallel)."""
    return p["shared_gpu"]["barrier_us"] if t.shared else p["gpu"]["barrier_us"]


def shared_traffic(name, ranks, nbytes):
    """HBM bytes (all ranks) of the bandwidth algorithm Auto runs when ranks share a GPU (coll_choice.cpp's
    model_traffic_units x choose_collective's bytes x ranks): all_gather fan-out push reads in once for W writes;
    reduce_scatter pull reads W chunks and writes one; all_reduce two-shot reads and writes the buffer; all_to_all
    reads and writes every block (its own too)."""
    w = ranks
    return {"all_gather": (w + 1) * nbytes, "reduce_scatter": (w + 1) * nbytes, "all_reduce": 2 * w * nbytes,
            "all_to_all": 2 * w * nbytes}[name]


def _link_bytes(name, t, nbytes):
    """Bytes each rank sends over its NVLink (one node, distinct GPUs)."""
    g = t.gpus_per_node
    share = (g - 1) / g * nbytes
    return 2 * share if name == "all_reduce" else share


# The bandwidth kernels' blocks (src/ops/collectives/*/ld_tma.cpp pick_blocks): bytes per block of the size they
# split, at most MAX_BLOCKS. all_gather: in per rank; reduce_scatter: in (out x W); all_reduce: the buffer;
# all_to_all: per peer.
BLOCK_BYTES = {"all_gather": 64 * KiB, "reduce_scatter": 128 * KiB, "all_reduce": 64 * KiB, "all_to_all": 64 * KiB}
MAX_BLOCKS = 64


def kernel_blocks(name, t, nbytes):
    split = {"all_gather": nbytes / t.ranks, "reduce_scatter": nbytes, "all_reduce": nbytes,
             "all_to_all": nbytes / t.ranks}[name]
    return max(1, min(MAX_BLOCKS, math.ceil(split / BLOCK_BYTES[name])))


def block_rate(p, t):
    """One block's ld/st copy rate (bytes/us)."""
    return bytes_per_us(p["shared_gpu"]["block_copy_GBps"] if t.shared else p["gpu"]["block_copy_GBps"])


def _block_bound_us(p, t, name, nbytes):
    """A small call runs few blocks (kernel_blocks), each copying at one block's rate: the bytes one rank's blocks
    move (all_gather and all_to_all: S written; reduce_scatter: S read; all_reduce: S read and S written) over
    their joint rate."""
    per_rank = 2 * nbytes if name == "all_reduce" else nbytes
    return per_rank / (kernel_blocks(name, t, nbytes) * block_rate(p, t))


def plain_move_us(p, t, name, nbytes):
    """Plain stores of the data (no flag words): the bottleneck's bytes at its rate (the ranks' HBM traffic when they
    share a GPU, else each rank's NVLink)."""
    if t.shared:
        return shared_traffic(name, t.ranks, nbytes) / traffic_rate(p, t.ranks)
    return _link_bytes(name, t, nbytes) / nvlink_rate(p)


def _bandwidth_us(p, t, name, nbytes):
    """The bandwidth algorithm: one kernel between two barriers (the copy engine: two barrier kernels around the
    copies, the same two barriers plus a launch); its data at the slower of the bottleneck and its blocks."""
    return alpha(p, t) + 2 * barrier_us(p, t) + max(plain_move_us(p, t, name, nbytes),
                                                     _block_bound_us(p, t, name, nbytes))


def ll_move_us(p, t, name, nbytes):
    """The LL kernel's data movement (one node): every data word travels with a flag word (twice the bytes) and is
    polled for by its receiver; each rank's payload to its peers goes at most at the LL rate (gpu.ll_GBps). Ranks
    sharing a GPU: that traffic at the LL kernel's own measured rate (shared_gpu.ll_traffic_GBps), well below a
    plain copy's (the receivers' polls re-read the packets)."""
    if t.shared:
        move = 2 * shared_traffic(name, t.ranks, nbytes) / bytes_per_us(p["shared_gpu"]["ll_traffic_GBps"])
    else:
        move = 2 * _link_bytes(name, t, nbytes) / nvlink_rate(p)
    g = t.gpus_per_node
    payload = (g - 1) * nbytes if name == "all_reduce" else (g - 1) / g * nbytes
    return max(move, payload / bytes_per_us(p["gpu"]["ll_GBps"]))


def _ll_us(p, t, name, nbytes):
    """LL: one launch, no barrier."""
    return alpha(p, t) + ll_move_us(p, t, name, nbytes)


def choice_bytes(name, t, nbytes):
    """The size choose_collective sees: all_gather in per rank, reduce_scatter out, all_reduce the buffer,
    all_to_all per peer."""
    return nbytes if name == "all_reduce" else nbytes / t.ranks


def one_node(p, t, name, nbytes):
    """A collective on one node (distinct GPUs or ranks sharing one): Auto's choice (module docstring)."""
    bw = _bandwidth_us(p, t, name, nbytes)
    cap = LL_MAX[name][1 if t.shared else 0]
    if name == "all_reduce" and t.ranks == 2:
        cap = LL_MAX[name][0]  # coll_choice.cpp: two ranks keep LL to 256 KiB
    if choice_bytes(name, t, nbytes) <= cap:
        return min(bw, _ll_us(p, t, name, nbytes))
    return bw


def _hierarchical(p, t, nbytes):
    g, n = t.gpus_per_node, t.ranks
    t_nvl = (g - 1) / g * nbytes / nvlink_rate(p)
    t_ib = (t.nodes - 1) * (nbytes / n) / ib_rate(p)
    return max(t_ib, t_nvl)


def all_gather(p, t, nbytes):
    if t.ranks == 1:
        return 0.0
    if t.nodes == 1:
        return one_node(p, t, "all_gather", nbytes)
    return alpha(p, t) + 2 * barrier_us(p, t) + _hierarchical(p, t, nbytes)


def reduce_scatter(p, t, nbytes):
    if t.ranks == 1:
        return 0.0
    if t.nodes == 1:
        return one_node(p, t, "reduce_scatter", nbytes)
    return alpha(p, t) + 2 * barrier_us(p, t) + _hierarchical(p, t, nbytes)


def all_reduce(p, t, nbytes):
    """One node: two-shot in one kernel (or LL); across nodes reduce-scatter then all-gather."""
    if t.ranks == 1:
        return 0.0
    if t.nodes == 1:
        return one_node(p, t, "all_reduce", nbytes)
    return reduce_scatter(p, t, nbytes) + all_gather(p, t, nbytes)


def all_to_all(p, t, nbytes):
    if t.ranks == 1:
        return 0.0
    if t.nodes == 1:
        return one_node(p, t, "all_to_all", nbytes)
    g, n = t.gpus_per_node, t.ranks
    t_nvl = (g - 1) / n * nbytes / nvlink_rate(p)
    t_ib = (n - g) / n * nbytes / ib_rate(p)
    return alpha(p, t) + 2 * barrier_us(p, t) + max(t_nvl, t_ib)


def ring_all_gather(p, t, nbytes):
    """A library's flat ring over all ranks (the sequential baseline across nodes)."""
    if t.nodes == 1:
        return all_gather(p, t, nbytes)
    g, n = t.gpus_per_node, t.ranks
    per_channel = (n - 1) / n * nbytes / g
    return alpha(p, t) + max(per_channel / ib_rate(p), (g - 1) * per_channel / nvlink_rate(p))


def ring_reduce_scatter(p, t, nbytes):
    if t.nodes == 1:
        return reduce_scatter(p, t, nbytes)
    return ring_all_gather(p, t, nbytes)


def ll_all_to_all(p, t, nbytes):
    """Low-latency all-to-all (EP dispatch / combine): `nbytes` leave each rank in total, spread evenly over the
    ranks; intra-node peers over NVLink, the rest over IB, both at once; plus the fixed LL cost (ll.overhead_us:
    launch, count exchange, per-expert signalling)."""
    g, n = t.gpus_per_node, t.ranks
    if t.shared:
        t_nvl = shared_traffic("all_to_all", n, nbytes) / traffic_rate(p, n)
    else:
        t_nvl = (g - 1) / n * nbytes / nvlink_rate(p)
    t_ib = (n - g) / n * nbytes / ib_rate(p) if t.nodes > 1 else 0.0
    return p["ll"]["overhead_us"] + max(t_nvl, t_ib)
