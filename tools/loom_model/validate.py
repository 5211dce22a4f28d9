"""Predicted against measured (Loom's docs/perf rows) and against published figures (data/published.json)."""
import json
import os

from . import ops, params
from .params import DATA_DIR, REPO_ROOT
from .topology import Topology


def load_published():
    with open(os.path.join(DATA_DIR, "published.json")) as f:
        return json.load(f)


def predict_published(fig, p=None):
    """The model's value for one published figure (same metric as fig['value'])."""
    p = p or params.load(fig["hardware"])
    t = Topology(fig["nodes"], fig["gpus_per_node"])
    op = fig["op"]
    if op in ("ag_gemm", "gemm_rs", "gemm_ar"):
        r = getattr(ops, op)(p, t, fig["m"], fig["n"], fig["k"])
        return r["speedup"] if fig["metric"] == "speedup" else r["overlapped_us"]
    if op in ("ep_dispatch", "ep_combine"):
        return ops.ep_ll(p, t, op[3:], fig["tokens"], fig["hidden"], fig["topk"])["overlapped_us"]
    if op.startswith("ep_normal_"):
        return ops.ep_normal_bottleneck_GBps(p, t)
    raise ValueError(f"published figure {fig['id']}: no model for op {op!r}")


def _shape(fig):
    if "m" in fig:
        return f"{fig['m']}x{fig['n']}x{fig['k']}"
    if "tokens" in fig:
        return f"T={fig['tokens']} H={fig['hidden']} top{fig['topk']}"
    return "-"


def published_table():
    """Rows: id, op, where, shape, metric, published, predicted, error (predicted / published - 1), source."""
    doc = load_published()
    cache = {}
    rows = []
    for fig in doc["figures"]:
        p = cache.setdefault(fig["hardware"], params.load(fig["hardware"]))
        pred = predict_published(fig, p)
        rows.append({"id": fig["id"], "op": fig["op"], "where": f"{fig['nodes']}x{fig['gpus_per_node']} {fig['hardware']}",
                     "shape": _shape(fig), "metric": fig["metric"], "published": fig["value"], "predicted": pred,
                     "error": pred / fig["value"] - 1, "calibration": bool(fig.get("calibration")),
                     "source": f"{fig['source']['repo']}/{fig['source']['path']}"})
    return rows


def _perf(name):
    with open(os.path.join(REPO_ROOT, "docs", "perf", name + ".json")) as f:
        return json.load(f)["rows"]


def _topology_of(row, world):
    if "shared" in row.get("machine", "") or row.get("shared_gpu"):
        return Topology(shared_ranks=world)
    return Topology(1, world)


def measured_table(p=None):
    """Loom's own rows: overlapped ops at every measured shape and rank count, collectives at 1 MiB, 64 MiB and
    1 GiB (Loom's automatic choice). Rows: op, where, shape, measured, predicted, error."""
    p = p or params.load("h200")
    rows = []
    for op in ("ag_gemm", "gemm_rs", "gemm_ar"):
        for r in _perf(op):
            if r.get("dtype", "bf16") != "bf16":
                continue
            t = _topology_of(r, r["world"])
            pred = getattr(ops, op)(p, t, r["M"], r["N"], r["K"])
            rows.append({"op": op, "where": repr(t), "shape": r["shape"], "measured": r["loom_us"],
                         "predicted": pred["overlapped_us"], "error": pred["overlapped_us"] / r["loom_us"] - 1})
    for op in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all"):
        for r in _perf(op):
            if r.get("algo") != "auto" or "timing" in r or r.get("out_plain"):
                continue
            if r["size_bytes"] not in (1 << 20, 64 << 20, 1 << 30):
                continue
            t = _topology_of(r, r["ranks"])
            pred = ops.collective(p, t, op, r["size_bytes"])["overlapped_us"]
            rows.append({"op": op, "where": repr(t), "shape": r["size"], "measured": r["loom_us"], "predicted": pred,
                         "error": pred / r["loom_us"] - 1})
    with open(os.path.join(REPO_ROOT, "docs", "perf", "ep.json")) as f:
        ep = json.load(f)
    for r in ep["rows"]:  # bench-ep on one H200, its ranks (the file's one rank count) sharing it
        if r.get("mode") != "normal" or r["op"] not in ("ep_dispatch", "ep_combine") or r.get("nodes", 1) != 1:
            continue
        ranks = ep["ranks"]
        t = Topology(shared_ranks=r.get("ranks", ranks[0] if isinstance(ranks, list) else ranks))
        pred = ops.ep_normal(p, t, r["op"][3:], r["T"], r["H"], r["k"], r["E"])["overlapped_us"]
        rows.append({"op": "ep_normal_" + r["op"][3:], "where": repr(t), "shape": r["shape"], "measured": r["loom_us"],
                     "predicted": pred, "error": pred / r["loom_us"] - 1})
    for r in _perf("sp_decode_attention"):
        t = Topology(shared_ranks=r.get("ranks", 4))
        pred = ops.sp_decode(p, t, r["batch"], r["kv_len"], r["hq"], r["hkv"], r["d"])["overlapped_us"]
        rows.append({"op": "sp_decode", "where": repr(t), "shape": r["shape"], "measured": r["loom_us"],
                     "predicted": pred, "error": pred / r["loom_us"] - 1})
    return rows
