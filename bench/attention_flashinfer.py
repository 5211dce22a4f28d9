#!/usr/bin/env python3
"""FlashInfer's decode attention as the baseline of bench-attention's decode mode, and Loom's from Python, in one
process on the same tensors and the same timing.

    python3 bench/attention_flashinfer.py --out DIR [--quick] [--iters N] [--batch 1,16] [--kv 1024,4096]

Shapes are bench-attention decode's: batch x KV length (every sequence full), GQA Hq 32 / Hkv 8, D 128, bf16, NHD;
"paged" rows use pages of 16 tokens in a shuffled order, "contiguous" rows a [batch, kv_len, Hkv, D] cache (FlashInfer
runs it as the paged wrapper with one page of kv_len tokens per sequence). FlashInfer:
BatchDecodeWithPagedKVCacheWrapper (planned once per shape, run timed), with and without tensor cores
(flashinfer_cuda_cores_us, flashinfer_tensor_cores_us; the baseline is the faster). Loom: loom.decode_attention on
the same K / V (loom_py_us); the rows also carry the two outputs' largest differences. Both return the LSE.
Writes DIR/decode_attention_flashinfer.json: rows with bench-attention's shape keys (layout, batch, kv_len, hq, hkv, d,
page_size, dtype) and {"baselines": {"flashinfer": us}}, to merge into docs/perf/decode_attention.json as the flashinfer
baseline. Timing as bench/harness.hpp: warm-up, then per run an L2 flush (256 MiB written), events around one call;
the median. Without flashinfer (or torch, or a GPU) the script says so and exits 0.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

BATCHES = [1, 16, 64, 128]
KV_LENS = [1024, 4096, 16384, 65536]
HQ, HKV, D, PAGE = 32, 8, 128, 16


def skip(why):
    print(f"attention_flashinfer: {why}; nothing measured")
    sys.exit(0)


def timed(torch, fn, iters, warmup, flush):
    for _ in range(warmup):
        fn()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        flush.zero_()
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(start, end))


def flashinfer_decode(torch, flashinfer, workspace, tensor_cores, q, k, v, indptr, indices, last_len, page):
    """A callable that runs FlashInfer's batch decode (planned here) and returns (o, lse)."""
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tensor_cores)
    if hasattr(w, "plan"):
        try:
            w.plan(indptr, indices, last_len, HQ, HKV, D, page, pos_encoding_mode="NONE", q_data_type=q.dtype,
                   kv_data_type=k.dtype)
        except TypeError:  # releases that name one data type
            w.plan(indptr, indices, last_len, HQ, HKV, D, page, pos_encoding_mode="NONE", data_type=q.dtype)
        return lambda: w.run(q, (k, v), return_lse=True)
    w.begin_forward(indptr, indices, last_len, HQ, HKV, D, page, pos_encoding_mode="NONE", data_type=q.dtype)
    return lambda: w.forward_return_lse(q, (k, v), pos_encoding_mode="NONE")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=".")
    p.add_argument("--quick", action="store_true", help="10 timed runs per point")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--batch", default=",".join(map(str, BATCHES)))
    p.add_argument("--kv", default=",".join(map(str, KV_LENS)))
    a = p.parse_args()
    iters = 10 if a.quick and "--iters" not in sys.argv else a.iters
    batches = [int(x) for x in a.batch.split(",")]
    kv_lens = [int(x) for x in a.kv.split(",")]

    try:
        import torch
    except ImportError:
        skip("torch is not installed")
    if not torch.cuda.is_available():
        skip("no CUDA device")
    try:
        import flashinfer
    except Exception as e:  # ImportError, or a build that does not load
        skip(f"import flashinfer failed ({e})")
    try:
        import loom
    except Exception as e:
        loom = None
        print(f"attention_flashinfer: import loom failed ({e}); FlashInfer only")

    dev = torch.device("cuda")
    torch.manual_seed(0)
    tokens_cap = max(batches) * max(kv_lens)
    k_all = torch.empty(tokens_cap * HKV * D, dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
    v_all = torch.empty_like(k_all).uniform_(-1, 1)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    rows = []
    for B in batches:
        for S in kv_lens:
            q = torch.empty(B, HQ, D, dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
            lens = torch.full((B,), S, dtype=torch.int32, device=dev)
            pages_per_seq = (S + PAGE - 1) // PAGE
            if B * pages_per_seq * PAGE > tokens_cap:
                continue
            perm = torch.randperm(B * pages_per_seq, device=dev, dtype=torch.int64).to(torch.int32)
            layouts = {
                # (FlashInfer's page size, its K / V view, page indices, Loom's K / V view, Loom's block_table)
                "contiguous": (S, k_all[:B * S * HKV * D].view(B, S, HKV, D),
                               v_all[:B * S * HKV * D].view(B, S, HKV, D),
                               torch.arange(B, dtype=torch.int32, device=dev), None),
                "paged": (PAGE, k_all[:B * pages_per_seq * PAGE * HKV * D].view(-1, PAGE, HKV, D),
                          v_all[:B * pages_per_seq * PAGE * HKV * D].view(-1, PAGE, HKV, D), perm,
                          perm.view(B, pages_per_seq)),
            }
            for layout, (fi_page, k, v, indices, table) in layouts.items():
                pages = indices.numel() // B
                indptr = torch.arange(0, B + 1, dtype=torch.int32, device=dev) * pages
                last = torch.full((B,), S - (pages - 1) * fi_page, dtype=torch.int32, device=dev)
                row = {"layout": layout, "batch": B, "kv_len": S, "hq": HQ, "hkv": HKV, "d": D,
                       "page_size": PAGE if layout == "paged" else 0, "dtype": "bf16"}
                fi = {}
                for tc in (False, True):
                    try:
                        fn = flashinfer_decode(torch, flashinfer, workspace, tc, q, k, v, indptr, indices, last,
                                               fi_page)
                        fi["tensor_cores" if tc else "cuda_cores"] = timed(torch, fn, iters, 3, flush)
                    except Exception as e:  # a configuration this FlashInfer build does not have
                        row[f"flashinfer_{'tensor_cores' if tc else 'cuda_cores'}_error"] = str(e)[:200]
                for name, us in fi.items():
                    row[f"flashinfer_{name}_us"] = us
                if fi:
                    row["baselines"] = {"flashinfer": min(fi.values())}
                if loom is not None:
                    out = torch.empty_like(q)
                    lse = torch.empty(B, HQ, dtype=torch.float32, device=dev)
                    row["loom_py_us"] = timed(
                        torch, lambda: loom.decode_attention(q, k, v, lens, table, out=out, lse=lse), iters, 3, flush)
                    if fi:
                        o_fi, lse_fi = flashinfer_decode(torch, flashinfer, workspace, False, q, k, v, indptr, indices,
                                                         last, fi_page)()
                        row["max_abs_diff_o"] = (out.float() - o_fi.float()).abs().max().item()
                        # Loom's LSE is natural; FlashInfer's is base 2 or e depending on release and backend.
                        by_base = {"2": (lse - lse_fi.float() * 0.6931471805599453).abs().max().item(),
                                   "e": (lse - lse_fi.float()).abs().max().item()}
                        row["flashinfer_lse_base"] = min(by_base, key=by_base.get)
                        row["max_abs_diff_lse"] = min(by_base.values())
                print(json.dumps(row))
                rows.append(row)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    doc = {"op": "decode_attention", "baseline": "flashinfer", "flashinfer_version": flashinfer.__version__,
           "command": " ".join(sys.argv), "gpu": torch.cuda.get_device_name(), "commit": commit,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "ranks": 1,
           "rows": rows}
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "decode_attention_flashinfer.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
