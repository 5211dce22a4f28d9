"""Per-op predictions: the overlapped op, its sequential baseline (collective then GEMM, or GEMM then
collective, nothing overlapped) and speedup = sequential / overlapped. Each result names the algorithm the
model charges, the one Loom's Auto picks (src/ops/overlap/*/plan.cpp).

Chunked overlap (one GPU per rank): the op is split into n chunks, one per source (ag_gemm) or destination
(gemm_rs) rank, and chunk i's compute runs while chunk i+1 moves:

  ag_gemm  = max(gemm, comm/(n-1) + gemm*(n-1)/n, comm + gemm/n)   (local chunk first; the last arrival's
                                                                    GEMM is the drain)
  gemm_rs  = max(gemm, gemm*(n-1)/n + comm/(n-1), gemm/n + comm)   (own chunk last; the first chunk's GEMM
             + reduce tail                                           is the fill) and the final reduction of
             [+ nodes * node stage]                                  n partial chunks through HBM; across
                                                                     nodes one barrier-closed stage per node
  gemm_ar  = max(gemm, gemm/n + all_reduce) + alpha                (across nodes)

One node, one GPU per rank, Auto by waves of output tiles: ag_gemm runs the sequence while its tiles fit one
wave; gemm_rs the fused epilogue to one wave, the sequence below three, the chunked overlap beyond; gemm_ar the
fused epilogue to one wave (fused_epilogue_us), the sequence beyond.

Ranks sharing one GPU run compute and copies on the same SMs and HBM: every rank's GEMM runs at once on its MPS
share of the SMs, their operand bytes streaming through the one HBM; ag_gemm and gemm_rs hide only part of the
copy: max(gemm, comm) + f * min(gemm, comm) with f = shared_gpu.overlap_serial_fraction; gemm_ar runs the
sequence at every M.

The sequential baseline uses the same GEMM model and, across nodes, a flat ring collective (what NCCL runs);
the overlapped op uses the hierarchical collective.
"""
import math

from . import comm
from .gemm import fitted_us, gemm_us, tiles

BF16 = 2


def _result(op, t, gemm, comm_us, overlapped, sequential, **extra):
    r = {"op": op, "topology": repr(t), "ranks": t.ranks, "gemm_us": gemm, "comm_us": comm_us,
         "overlapped_us": overlapped, "sequential_us": sequential, "speedup": sequential / overlapped}
    r.update(extra)
    return r


def _check(op, **dims):
    for k, v in dims.items():
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{op}: {k}: expected a positive integer, got {v!r}")


def _rank_gemm(p, t, m, n, k):
    """One rank's GEMM; ranks sharing a GPU each run on their MPS share of the SMs (shared_gpu.sm_fraction_by_ranks)
    while all of them stream their operands through the one HBM at once (r x the bytes at the streaming rate)."""
    if not t.shared:
        return gemm_us(p, m, n, k)
    frac = p["shared_gpu"]["sm_fraction_by_ranks"].get(str(t.ranks))
    if frac is None:
        raise ValueError(f"{p['name']}: shared_gpu.sm_fraction_by_ranks has no entry for {t.ranks} ranks")
    sms = max(1, int(p["gpu"]["sms"] * frac))
    return fitted_us(p, m, n, k, sms=sms, streams=t.ranks)


def _shared_overlap(p, gemm, comm_us):
    f = p["shared_gpu"]["overlap_serial_fraction"]
    return max(gemm, comm_us) + f * min(gemm, comm_us)


def ag_gemm(p, t, m, n, k):
    """C (M x N/ranks per rank) = all_gather(A: M x K, rows split over ranks) @ B (K x N/ranks)."""
    _check("ag_gemm", m=m, n=n, k=k)
    r = t.ranks
    gemm = _rank_gemm(p, t, m, math.ceil(n / r), k)
    nbytes = m * k * BF16
    c = comm.all_gather(p, t, nbytes)
    seq = gemm + comm.ring_all_gather(p, t, nbytes)
    algo = "chunked"
    if r == 1:
        ovl, algo = gemm, "gemm"
    elif t.shared:
        ovl = _shared_overlap(p, gemm, c)
    elif t.nodes == 1 and tiles(p, m, math.ceil(n / r)) <= p["gpu"]["sms"]:
        ovl, algo = c + gemm, "sequence"  # Auto: one wave of tiles has nothing to overlap (ag_gemm/plan.cpp)
    else:
        ovl = max(gemm, c / (r - 1) + gemm * (r - 1) / r, c + gemm / r)
    return _result("ag_gemm", t, gemm, c, ovl, seq, m=m, n=n, k=k, algorithm=algo)


def node_stage_us(p, t):
    """Across nodes the reduce-scatter runs one stage per node (scatter inside the node, reduce, send to the
    same local rank of the next node), each closed by a barrier over all ranks (dissemination: 2 log2(ranks) IB
    latencies) and two kernel launches (reduce, send)."""
    return 2 * p["gpu"]["launch_us"] + 2 * math.ceil(math.log2(t.ranks)) * p["ib"]["latency_us"]


def gemm_rs(p, t, m, n, k):
    """reduce_scatter(A (M x K/ranks) @ B (K/ranks x N)) over rows: each rank ends with M/ranks x N."""
    _check("gemm_rs", m=m, n=n, k=k)
    r = t.ranks
    gemm = _rank_gemm(p, t, m, n, math.ceil(k / r))
    nbytes = m * n * BF16
    c = comm.reduce_scatter(p, t, nbytes)
    seq = gemm + comm.ring_reduce_scatter(p, t, nbytes)
    hbm = comm.bytes_per_us(p["gpu"]["hbm_GBps"] * p["gpu"]["gemm"]["hbm_efficiency"])
    tail = (nbytes + nbytes / r) / hbm * (r if t.shared else 1)
    if t.nodes > 1:
        tail += t.nodes * node_stage_us(p, t)
    waves_of_tiles = tiles(p, m, n) / p["gpu"]["sms"]
    algo = "chunked"
    if r == 1:
        ovl, algo = gemm, "gemm"
    elif t.shared:
        ovl = _shared_overlap(p, gemm, c) + tail
    elif t.nodes == 1 and waves_of_tiles <= 1:
        # Auto (gemm_rs/plan.cpp gemm_rs_distinct_auto): one wave, the fused epilogue pushing each tile to its
        # destination rank; every push through the link, the last wave's after the GEMM; then the reduction.
        push_all = (r - 1) / r * nbytes / comm.nvlink_rate(p)
        ovl, algo = max(gemm, push_all) + push_all + comm.barrier_us(p, t) + tail, "fused_epilogue"
    elif t.nodes == 1 and waves_of_tiles < 3:
        ovl, algo = gemm + c, "sequence"  # Auto: below three waves the sequence
    else:
        ovl = max(gemm, gemm * (r - 1) / r + c / (r - 1), gemm / r + c) + tail
    return _result("gemm_rs", t, gemm, c, ovl, seq, m=m, n=n, k=k, reduce_tail_us=tail, algorithm=algo)


def fused_epilogue_us(p, t, gemm, m, n):
    """gemm_ar's fused epilogue (one node, one GPU per rank): each tile, once stored, is pushed to every peer, the
    peers' copies awaited and summed. Every tile's pushes pass the rank's link ((g - 1) x M x N x 2 bytes), under
    the GEMM where it is longer; the pushes of the last wave of tiles come after it (all of them where the tiles fit
    one wave, as at M <= 128, the op's limit), then one barrier."""
    g = p["gpu"]["gemm"]
    peers, rate = t.gpus_per_node - 1, comm.nvlink_rate(p)
    last_wave = min(m * n, p["gpu"]["sms"] * g["tile_m"] * g["tile_n"])
    push_all = peers * m * n * BF16 / rate
    return max(gemm, push_all) + peers * last_wave * BF16 / rate + comm.barrier_us(p, t)


def gemm_ar(p, t, m, n, k):
    """all_reduce(A (M x K/ranks) @ B (K/ranks x N)): every rank ends with M x N.

    Auto (src/ops/overlap/gemm_ar/plan.cpp): ranks sharing a GPU run the sequence (loom::gemm, then
    loom::all_reduce) at every M; one GPU per rank the fused epilogue while the tiles fit one wave (the GEMM pushes
    its tiles, fused_epilogue_us), else the sequence (Auto's reduce kernel, taken only where its own cost model
    puts it 10 % below the sequence, is not modelled). Across nodes: the chunked overlap of the GEMM with the
    hierarchical all-reduce."""
    _check("gemm_ar", m=m, n=n, k=k)
    r = t.ranks
    gemm = _rank_gemm(p, t, m, n, math.ceil(k / r))
    nbytes = m * n * BF16
    c = comm.all_reduce(p, t, nbytes)
    seq = gemm + c
    if r == 1:
        ovl, algo = gemm, "gemm"
    elif t.shared:
        ovl, algo = seq, "sequence"
    elif t.nodes == 1 and tiles(p, m, n) <= p["gpu"]["sms"]:
        ovl, algo = fused_epilogue_us(p, t, gemm, m, n), "fused_epilogue"
    elif t.nodes == 1:
        ovl, algo = seq, "sequence"
    else:
        ovl, algo = max(gemm, gemm / r + c) + comm.alpha(p, t), "chunked"
    return _result("gemm_ar", t, gemm, c, ovl, seq, m=m, n=n, k=k, algorithm=algo)


def collective(p, t, name, nbytes):
    """One collective alone (name: all_gather, reduce_scatter, all_reduce, all_to_all)."""
    fns = {"all_gather": comm.all_gather, "reduce_scatter": comm.reduce_scatter, "all_reduce": comm.all_reduce,
           "all_to_all": comm.all_to_all}
    if name not in fns:
        raise ValueError(f"collective: expected one of {', '.join(fns)}, got {name!r}")
    _check(name, nbytes=nbytes)
    us = fns[name](p, t, nbytes)
    ring = {"all_gather": comm.ring_all_gather, "reduce_scatter": comm.ring_reduce_scatter}.get(name)
    seq = ring(p, t, nbytes) if ring else us
    return _result(name, t, 0.0, us, us, seq, bytes=nbytes)


def ep_token_bytes(hidden, phase):
    """Bytes per token copy: dispatch in fp8 with one fp32 scale per 128 values; combine in bf16."""
    if phase == "dispatch":
        return hidden + hidden // 128 * 4
    if phase == "combine":
        return hidden * BF16
    raise ValueError(f"ep: phase: expected 'dispatch' or 'combine', got {phase!r}")


def ep_ll(p, t, phase, tokens, hidden, topk):
    """Low-latency EP dispatch / combine: every rank sends tokens x topk token copies."""
    _check("ep_" + phase, tokens=tokens, hidden=hidden, topk=topk)
    nbytes = tokens * topk * ep_token_bytes(hidden, phase)
    us = comm.ll_all_to_all(p, t, nbytes)
    return _result("ep_" + phase, t, 0.0, us, us, us, bytes=nbytes, logical_GBps=nbytes / us / 1e3)


def ep_routing(ranks, experts, topk):
    """Per token, routed to topk distinct experts of `experts` uniformly at random, experts / ranks per rank: the
    expected ranks it reaches (its (token, rank) pairs) and the expected pairs holding just one of its slots
    (hypergeometric: a rank holds none of them with probability C(E - L, k) / C(E, k), one with
    L C(E - L, k - 1) / C(E, k))."""
    L = experts // ranks
    total = math.comb(experts, topk)
    none = math.comb(experts - L, topk) / total
    one = L * math.comb(experts - L, topk - 1) / total
    return ranks * (1 - none), ranks * one


def ep_normal(p, t, phase, tokens, hidden, topk, experts):
    """Throughput-mode EP (src/ops/moe/ep, docs/moe.md), bf16 rows of 2 H bytes, T tokens per rank routed uniformly.
    Per rank: pairs = T x ranks per token (ep_routing), entries = T x k.

    dispatch: the layout (count, scan with the one small exchange, index), then the push of one row per pair (to
      other ranks over the link, to itself through HBM) and the receiver's copies of each row into the pair's
      further slots (entries - pairs rows, read and written in HBM), after every rank's push.
    combine: a pair of several slots is summed at the expert rank (its slots' rows read, one partial written); the
      token rank then reads one row per pair (the partial, or a one-slot pair's expert row in place: the expert
      outputs in the symmetric heap, as ep_moe_experts keeps them) and writes y.

    One GPU per rank: the rows between ranks at the NVLink rate, or across nodes (ranks of another node: their rows
    staged through HBM, then over IB) at the IB rate, NVLink and IB in parallel (one kernel); the local reads and
    writes at the HBM streaming rate. Ranks sharing a GPU: every row read and written is HBM traffic at the measured
    rate. Fixed cost: two calls (the exchange, the data kernels) and one barrier (the receive waits)."""
    _check("ep_normal_" + phase, tokens=tokens, hidden=hidden, topk=topk, experts=experts)
    if phase not in ("dispatch", "combine"):
        raise ValueError(f"ep_normal: phase: expected 'dispatch' or 'combine', got {phase!r}")
    w = t.ranks
    if experts % w != 0 or topk > experts:
        raise ValueError(f"ep_normal: expected experts a multiple of the ranks ({w}) and topk <= experts, got "
                         f"experts={experts}, topk={topk}")
    row = hidden * BF16
    per_token, single_per_token = ep_routing(w, experts, topk)
    pairs, entries, single = tokens * per_token, tokens * topk, tokens * single_per_token
    remote = pairs * (w - 1) / w  # pairs with other ranks (this rank is any of the w equally)
    inter = pairs * (w - t.gpus_per_node) / w if t.nodes > 1 else 0.0  # pairs with ranks of other nodes
    if phase == "dispatch":
        link_rows, local_rows = remote, 2 * (pairs - remote) + 2 * (entries - pairs) + 2 * inter
        if t.shared:
            local_rows = 2 * entries
    else:
        # One-slot pairs are read in place only from node peers; pairs with other nodes get a partial each.
        skipped = single * (1 - (inter / pairs if pairs else 0.0))
        link_rows = remote
        local_rows = (entries - skipped) + (pairs - skipped) + (pairs - remote) + tokens + inter
        if t.shared:
            local_rows = (entries - skipped) + (pairs - skipped) + pairs + tokens
    fixed = 2 * comm.alpha(p, t) + comm.barrier_us(p, t)
    if t.shared:
        us = fixed + w * local_rows * row / comm.traffic_rate(p, w)
    else:
        hbm = comm.bytes_per_us(p["gpu"]["hbm_GBps"] * p["gpu"]["gemm"]["hbm_efficiency"])
        link = max((link_rows - inter) * row / comm.nvlink_rate(p), inter * row / comm.ib_rate(p))
        us = fixed + link + local_rows * row / hbm
    return _result("ep_normal_" + phase, t, 0.0, us, us, us, bytes=int(remote * row), pairs_per_token=per_token,
                   logical_GBps=remote * row / us / 1e3)


def ep_normal_bottleneck_GBps(p, t):
    """Throughput (normal) EP kernels are bound by the slowest link a token crosses: NVLink inside a node,
    IB per GPU across nodes."""
    return (comm.ib_rate(p) if t.nodes > 1 else comm.nvlink_rate(p)) / 1e3


# The SP combine's regions (include/loom/kernels/attention/decode_params.hpp): blocks per launch, packets per block
# (4 floats each in the direct exchange), and the rows from which Auto exchanges directly (src/ops/attention/
# decode_plan.hpp: kSpDirectMinRows).
SP_MAX_BLOCKS, SP_PACKETS_PER_BLOCK, SP_DIRECT_MIN_ROWS = 128, 2048, 256
SP_TWO_SHOT_MIN_BYTES = 8 << 20


def sp_exchange(rows, ranks, d):
    """Auto's exchange of the partials (sp_auto_exchange): LL packets below SP_DIRECT_MIN_ROWS rows; two shots where
    the direct exchange would send SP_TWO_SHOT_MIN_BYTES or more from each rank; direct otherwise."""
    if rows < SP_DIRECT_MIN_ROWS:
        return "packets"
    return "two_shot" if rows * (d + 1) * 4 * max(ranks - 1, 0) >= SP_TWO_SHOT_MIN_BYTES else "direct"


def sp_combine_launches(rows, d, exchange="packets", ranks=1):
    """Launches of the combine (src/ops/attention/sp_decode.cpp): a row is D / 2 + 1 LL packets (direct: D + 1
    floats; two shots: a region holds a rank's share of the block's rows, partials and combined rows); a block takes
    up to one region of rows, a launch SP_MAX_BLOCKS blocks; rows beyond take further launches."""
    region = 4 * SP_PACKETS_PER_BLOCK
    cap = {"packets": SP_PACKETS_PER_BLOCK // (d // 2 + 1), "direct": region // (d + 1),
           "two_shot": (region - 3) // (d + 1 + d // 2 + 1) * ranks}[exchange]
    rows_per_block = max(1, min(math.ceil(rows / SP_MAX_BLOCKS), cap))
    return math.ceil(rows / (SP_MAX_BLOCKS * rows_per_block))


def sp_decode(p, t, batch, kv_len, hq, hkv, d):
    """Sequence-parallel decode: each rank attends over kv_len / ranks of the cache (reading its K and V at the
    measured decode rate, gpu.decode_GBps, plus gpu.decode_fixed_us; ranks sharing a GPU read theirs at once), then
    one combine launch per SP_MAX_BLOCKS blocks of rows exchanges every row's partial output and log-sum-exp and
    merges them (no barrier), as sp_exchange picks: LL packets (B x Hq rows of D / 2 + 1 eight-byte packets, all
    gathered); directly (D + 1 floats per row all gathered, then one flag per block and source: a signal hop); or in
    two shots (each rank's partials to the rows' owners, as a reduce-scatter moves them, then the owners' combined
    rows of D bf16 and an LSE all gathered: two signal hops). Sequential baseline: one GPU decoding the whole
    cache."""
    _check("sp_decode", batch=batch, kv_len=kv_len, hq=hq, hkv=hkv, d=d)
    rate = comm.bytes_per_us(p["gpu"]["decode_GBps"])
    fixed = p["gpu"]["decode_fixed_us"]
    full = 2 * batch * kv_len * hkv * d * BF16 / rate + fixed
    local = 2 * batch * math.ceil(kv_len / t.ranks) * hkv * d * BF16 / rate
    if t.shared:
        local *= t.ranks
    local += fixed
    rows = batch * hq
    c = 0.0
    x = sp_exchange(rows, t.ranks, d)
    if t.ranks > 1 and x == "two_shot":
        launches = sp_combine_launches(rows, d, x, t.ranks)
        c = launches * (comm.alpha(p, t) + 2 * comm.barrier_us(p, t)) + comm.plain_move_us(
            p, t, "reduce_scatter", rows * (d + 1) * 4) + comm.plain_move_us(p, t, "all_gather", rows * (2 * d + 4))
    elif t.ranks > 1 and x == "direct":
        gathered = rows * (d + 1) * 4 * t.ranks
        c = sp_combine_launches(rows, d, x) * (comm.alpha(p, t) + comm.barrier_us(p, t)) + comm.plain_move_us(
            p, t, "all_gather", gathered)
    elif t.ranks > 1:
        gathered = rows * (d // 2 + 1) * 8 * t.ranks
        c = sp_combine_launches(rows, d) * comm.alpha(p, t) + comm.ll_move_us(p, t, "all_gather", gathered)
    ovl = local + c
    return _result("sp_decode", t, local, c, ovl, full, batch=batch, kv_len=kv_len)
