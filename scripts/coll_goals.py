#!/usr/bin/env python3
"""Issue #6's goals, read from bench-collectives JSON (docs/perf/{all_gather,...}.json or a --out DIR).

Per (machine, ranks): the automatic choice against NVSHMEM / NCCL at every size (ratio > 1: Loom faster), AllReduce
<= 64 KiB latency against them (back to back and per call interleaved: < 0.5 is the goal), and AllGather /
ReduceScatter >= 64 MiB as a fraction of the copy reference (copy_same_traffic with ranks sharing a GPU,
copy_engine_puts with one GPU per rank: >= 0.85 is the goal).
    usage: scripts/coll_goals.py [DIR]   (default docs/perf)
"""
import collections
import json
import os
import sys

OPS = ["all_gather", "reduce_scatter", "all_reduce", "all_to_all"]


def load(d):
    rows = []
    for op in OPS:
        p = os.path.join(d, op + ".json")
        if os.path.exists(p):
            for r in json.load(open(p))["rows"]:
                rows.append(dict(r, op=op))
    return rows


def main():
    rows = load(sys.argv[1] if len(sys.argv) > 1 else "docs/perf")
    groups = collections.defaultdict(list)
    for r in rows:
        groups[(r.get("machine", "?"), r["ranks"])].append(r)
    for (machine, ranks), rs in sorted(groups.items()):
        print(f"== {machine}, {ranks} ranks")
        for op in OPS:
            auto = sorted((r for r in rs if r["op"] == op and r["algo"] == "auto" and "timing" not in r),
                          key=lambda r: r["size_bytes"])
            if not auto:
                continue
            worst = {}
            for r in auto:
                for b in ("nvshmem", "nccl"):
                    s = r.get("speedup", {}).get(b)
                    if s is not None and (b not in worst or s < worst[b][0]):
                        worst[b] = (s, r["size"])
            ref = "copy_same_traffic" if rs[0].get("shared_gpu") else "copy_engine_puts"
            frac = [f"{r['size']} {r['speedup'][ref]:.2f}" for r in auto
                    if r["size_bytes"] >= 64 << 20 and ref in r.get("speedup", {})]
            line = f"  {op:15s} slowest vs " + ", ".join(f"{b} {s:.2f}x ({z})" for b, (s, z) in worst.items())
            if frac and op in ("all_gather", "reduce_scatter"):
                line += f"; of {ref}: " + ", ".join(frac)
            print(line)
        for timing in ("back_to_back x20", "per_call_interleaved"):
            lat = sorted((r for r in rs if r["op"] == "all_reduce" and r.get("timing") == timing
                          and r["size_bytes"] <= 64 << 10), key=lambda r: r["size_bytes"])
            for b in ("nccl", "nvshmem"):
                cells = [f"{r['size']} {r['loom_us'] / r['baselines'][b]:.2f}" for r in lat if b in r["baselines"]]
                if cells:
                    print(f"  all_reduce <= 64K {timing}, Loom / {b}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
