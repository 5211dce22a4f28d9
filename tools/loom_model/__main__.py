"""python3 -m loom_model (or tools/loom-model): predictions, sweeps over nodes, validation tables.

  loom-model predict --hw h800 --op ag_gemm --m 8192 --n 29568 --k 8192 [--nodes 1] [--gpus-per-node 8]
  loom-model predict --hw h200 --op all_gather --bytes 67108864 --shared-ranks 4
  loom-model predict --hw h800 --op ep_dispatch --tokens 128 --hidden 7168 --topk 8 --nodes 4
  loom-model predict --hw h200 --op ep_normal_dispatch --tokens 4096 --hidden 7168 --topk 8 --experts 256
  loom-model sweep   --hw h800 --op gemm_rs --m 8192 --n 8192 --k 28672      (1-128 nodes x 8 GPUs)
  loom-model validate [--published] [--measured] [--markdown]
  loom-model check FILE.json ...                                            (validate parameter files)
"""
import argparse
import sys

from . import ops, params, validate
from .topology import Topology

GEMM_OPS = ("ag_gemm", "gemm_rs", "gemm_ar")
COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
EP_OPS = ("ep_dispatch", "ep_combine")  # low-latency mode
EP_NORMAL_OPS = ("ep_normal_dispatch", "ep_normal_combine")  # throughput mode
ALL_OPS = GEMM_OPS + COLLECTIVES + EP_OPS + EP_NORMAL_OPS + ("sp_decode",)


def predict(p, t, a):
    def need(*names):
        missing = [n for n in names if getattr(a, n) is None]
        if missing:
            raise SystemExit(f"loom-model: --op {a.op} needs " + ", ".join("--" + n.replace("_", "-") for n in missing))

    if a.op in GEMM_OPS:
        need("m", "n", "k")
        return getattr(ops, a.op)(p, t, a.m, a.n, a.k)
    if a.op in COLLECTIVES:
        need("bytes")
        return ops.collective(p, t, a.op, a.bytes)
    if a.op in EP_OPS:
        need("tokens", "hidden", "topk")
        return ops.ep_ll(p, t, a.op[3:], a.tokens, a.hidden, a.topk)
    if a.op in EP_NORMAL_OPS:
        need("tokens", "hidden", "topk", "experts")
        return ops.ep_normal(p, t, a.op[len("ep_normal_"):], a.tokens, a.hidden, a.topk, a.experts)
    need("batch", "kv_len", "hq", "hkv", "d")
    return ops.sp_decode(p, t, a.batch, a.kv_len, a.hq, a.hkv, a.d)


def fmt_row(r):
    algo = f", {r['algorithm']}" if "algorithm" in r else ""
    return (f"{r['topology']:>26}  overlapped {r['overlapped_us']:10.1f} us  sequential {r['sequential_us']:10.1f} us"
            f"  speedup {r['speedup']:5.2f}x  (gemm {r['gemm_us']:.1f} us, comm {r['comm_us']:.1f} us{algo})")


def markdown(rows, cols):
    out = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(f(r) for _, f in cols) + " |")
    return "\n".join(out)


def num(v):
    return f"{v:.2f}" if v < 10 else f"{v:.1f}"


def print_published(md):
    rows = validate.published_table()
    if md:
        print(markdown(rows, [("figure", lambda r: r["id"]), ("where", lambda r: r["where"]),
                              ("shape", lambda r: r["shape"]), ("metric", lambda r: r["metric"]),
                              ("published", lambda r: num(r["published"])), ("predicted", lambda r: num(r["predicted"])),
                              ("error", lambda r: f"{r['error'] * 100:+.1f} %" + (" (calibration)" if r["calibration"] else "")),
                              ("source", lambda r: r["source"])]))
    else:
        for r in rows:
            print(f"{r['id']:28} {r['where']:10} {r['shape']:22} {r['metric']:7} {r['published']:9.2f} "
                  f"{r['predicted']:9.2f} {r['error'] * 100:+6.1f} %")
    # A calibration row is a figure a parameter was derived from: reproducing it validates nothing.
    preds = [r for r in rows if not r["calibration"]]
    within = sum(abs(r["error"]) <= 0.25 for r in preds)
    print(f"\n{within} of {len(preds)} published figures within 25 % (predictions; {len(rows) - len(preds)} "
          f"calibration row{'s' if len(rows) - len(preds) != 1 else ''} besides); largest error "
          f"{max(abs(r['error']) for r in preds) * 100:.1f} %")


def print_measured(md):
    rows = validate.measured_table()
    if md:
        print(markdown(rows, [("op", lambda r: r["op"]), ("where", lambda r: r["where"]), ("shape", lambda r: r["shape"]),
                              ("measured us", lambda r: f"{r['measured']:.1f}"),
                              ("predicted us", lambda r: f"{r['predicted']:.1f}"),
                              ("error", lambda r: f"{r['error'] * 100:+.1f} %")]))
    else:
        for r in rows:
            print(f"{r['op']:15} {r['where']:26} {r['shape']:40} {r['measured']:9.1f} {r['predicted']:9.1f} "
                  f"{r['error'] * 100:+6.1f} %")
    within = sum(abs(r["error"]) <= 0.25 for r in rows)
    print(f"\n{within} of {len(rows)} measured rows within 25 %")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="loom-model", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("predict", "sweep"):
        s = sub.add_parser(name)
        s.add_argument("--hw", default="h200", help="parameter file: a name (" + ", ".join(params.available()) +
                       ") or a path")
        s.add_argument("--op", required=True, choices=ALL_OPS)
        for arg in ("m", "n", "k", "bytes", "tokens", "hidden", "topk", "experts", "batch", "kv-len", "hq", "hkv",
                    "d"):
            s.add_argument("--" + arg, type=int)
        s.add_argument("--gpus-per-node", type=int)
        if name == "predict":
            s.add_argument("--nodes", type=int, default=1)
            s.add_argument("--shared-ranks", type=int, default=0, help="ranks sharing one GPU (h200)")
        else:
            s.add_argument("--max-nodes", type=int, default=128)
    v = sub.add_parser("validate")
    v.add_argument("--published", action="store_true")
    v.add_argument("--measured", action="store_true")
    v.add_argument("--markdown", action="store_true")
    c = sub.add_parser("check")
    c.add_argument("files", nargs="+")
    a = ap.parse_args(argv)

    try:
        if a.cmd == "check":
            for f in a.files:
                params.load(f)
                print(f"{f}: ok")
            return 0
        if a.cmd == "validate":
            both = not a.published and not a.measured
            if a.published or both:
                print_published(a.markdown)
            if a.measured or both:
                print() if both else None
                print_measured(a.markdown)
            return 0
        p = params.load(a.hw)
        g = a.gpus_per_node or p["gpus_per_node"]
        if a.cmd == "predict":
            t = Topology(a.nodes, g, a.shared_ranks)
            print(fmt_row(predict(p, t, a)))
            return 0
        nodes = 1
        while nodes <= a.max_nodes:
            print(fmt_row(predict(p, Topology(nodes, g), a)))
            nodes *= 2
        return 0
    except (params.ParamError, ValueError) as e:
        print(f"loom-model: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
