#!/usr/bin/env python3
"""loom.decode_attention against FlashInfer's batch decode and torch's scaled_dot_product_attention, in one process on
the same tensors and the same timing: the rows of docs/perf/decode.json.

    python3 bench/attention_flashinfer.py --out DIR [--quick] [--iters N] [--batch 1,16,64] [--kv 8192,32768,131072]
                                          [--heads 32:8,96:12] [--pages 0,1,16]

Cases: every (q heads : kv heads) pair x batch x KV length (every sequence full), D 128, bf16. Page 0 is the
contiguous layout ([batch, kv_len, Hkv, D]; FlashInfer runs the same memory as in-order pages of 16 tokens); pages 1 and 16 are paged caches with the pages in a shuffled order. FlashInfer:
BatchDecodeWithPagedKVCacheWrapper (planned once per case, run timed), with and without tensor cores; its baseline is
the faster. SDPA: torch.nn.functional.scaled_dot_product_attention on the contiguous layout's [B, H, S, D] views
(enable_gqa). Loom: loom.decode_attention (loom_us). Each row also carries the HBM bytes moved, Loom's GB/s and
its fraction of the copy bandwidth (--copy-gbs, the device-to-device copy measured in the same process when 0), and
the outputs' largest differences from FlashInfer's.
Timing as bench/harness.hpp: warm-up, then per run a clean L2 flush (256 MiB written, then a buffer of twice L2's size
read, so that the written lines' write-back is not timed with the call), events around one call; the median. Writes DIR/decode.json. Without torch, a GPU or loom the script says so and exits 0; without flashinfer it
measures Loom and SDPA.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

D = 128


def skip(why):
    print(f"attention_flashinfer: {why}; nothing measured")
    sys.exit(0)


def timed(torch, fn, iters, warmup, flush):
    for _ in range(warmup):
        fn()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        flush()
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(start, end))


def flashinfer_decode(torch, flashinfer, workspace, tensor_cores, q, k, v, indptr, indices, last_len, page, hq,
                      hkv):
    """A callable that runs FlashInfer's batch decode (planned here) and returns (o, lse)."""
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tensor_cores)
    if hasattr(w, "plan"):
        try:
            w.plan(indptr, indices, last_len, hq, hkv, D, page, pos_encoding_mode="NONE", q_data_type=q.dtype,
                   kv_data_type=k.dtype)
        except TypeError:  # releases that name one data type
            w.plan(indptr, indices, last_len, hq, hkv, D, page, pos_encoding_mode="NONE", data_type=q.dtype)
        return lambda: w.run(q, (k, v), return_lse=True)
    w.begin_forward(indptr, indices, last_len, hq, hkv, D, page, pos_encoding_mode="NONE", data_type=q.dtype)
    return lambda: w.forward_return_lse(q, (k, v), pos_encoding_mode="NONE")


def l2_flusher(torch, dev):
    """bench/harness.hpp's clean L2 flush: a 256 MiB memset evicts L2, then a read of twice L2's size evicts the
    memset's dirty lines (their write-back happens here, untimed) and leaves L2 holding clean lines."""
    dirty = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    clean = torch.zeros(max(2 * l2, 1 << 20) // 8, dtype=torch.int64, device=dev)

    def flush():
        dirty.zero_()
        clean.sum()
    return flush


def copy_gbs(torch, flush):
    """Device-to-device copy bandwidth (GB/s, read + write) of a 2 GiB buffer, median of 10."""
    a = torch.empty(1 << 31, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    us = timed(torch, lambda: b.copy_(a), 10, 2, flush)
    del a, b
    return 2 * (1 << 31) / us / 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=".")
    p.add_argument("--quick", action="store_true", help="10 timed runs per point")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--batch", default="1,16,64")
    p.add_argument("--kv", default="8192,32768,131072")
    p.add_argument("--heads", default="32:8,96:12", help="q heads:kv heads pairs")
    p.add_argument("--pages", default="0,1,16", help="page sizes; 0 is the contiguous layout")
    p.add_argument("--copy-gbs", type=float, default=0.0)
    a = p.parse_args()
    iters = 10 if a.quick and "--iters" not in sys.argv else a.iters
    batches = [int(x) for x in a.batch.split(",")]
    kv_lens = [int(x) for x in a.kv.split(",")]
    heads = [tuple(int(y) for y in x.split(":")) for x in a.heads.split(",")]
    pages = [int(x) for x in a.pages.split(",")]

    try:
        import torch
    except ImportError:
        skip("torch is not installed")
    if not torch.cuda.is_available():
        skip("no CUDA device")
    try:
        import loom
    except Exception as e:
        skip(f"import loom failed ({e})")
    try:
        import flashinfer
    except Exception as e:  # ImportError, or a build that does not load
        flashinfer = None
        print(f"attention_flashinfer: import flashinfer failed ({e}); Loom and SDPA only")
    import torch.nn.functional as F

    dev = torch.device("cuda")
    torch.manual_seed(0)
    flush = l2_flusher(torch, dev)
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    bw = a.copy_gbs or copy_gbs(torch, flush)
    print(f"device copy bandwidth {bw:.0f} GB/s")
    max_hkv = max(h for _, h in heads)
    tokens_cap = max(batches) * max(kv_lens)
    k_all = torch.empty(tokens_cap * max_hkv * D, dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
    v_all = torch.empty_like(k_all).uniform_(-1, 1)
    rows = []
    for hq, hkv in heads:
        for B in batches:
            for S in kv_lens:
                q = torch.empty(B, hq, D, dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
                lens = torch.full((B,), S, dtype=torch.int32, device=dev)
                n = B * S * hkv * D
                for page in pages:
                    if page == 0:  # contiguous: FlashInfer sees the same memory as in-order pages of 16 tokens
                        fi_page, table = (16 if S % 16 == 0 else S), None
                        k, v = k_all[:n].view(B, S, hkv, D), v_all[:n].view(B, S, hkv, D)
                        indices = torch.arange(B * S // fi_page, dtype=torch.int32, device=dev)
                    else:
                        per_seq = (S + page - 1) // page
                        if B * per_seq * page > tokens_cap:
                            continue
                        fi_page = page
                        k = k_all[:B * per_seq * page * hkv * D].view(-1, page, hkv, D)
                        v = v_all[:B * per_seq * page * hkv * D].view(-1, page, hkv, D)
                        indices = torch.randperm(B * per_seq, device=dev, dtype=torch.int64).to(torch.int32)
                        table = indices.view(B, per_seq)
                    fi_kv = (k.reshape(-1, fi_page, hkv, D), v.reshape(-1, fi_page, hkv, D))
                    per_seq = indices.numel() // B
                    indptr = torch.arange(0, B + 1, dtype=torch.int32, device=dev) * per_seq
                    last = torch.full((B,), S - (per_seq - 1) * fi_page, dtype=torch.int32, device=dev)
                    layout = "contiguous" if page == 0 else "paged"
                    io_bytes = 2 * n * 2 + B * hq * (2 * D * 2 + 4)  # K + V, q + O, LSE
                    row = {"shape": f"B={B} kv={S} Hq={hq} Hkv={hkv} D={D} {layout}"
                                    + (f" page {page}" if page else "") + " bf16",
                           "layout": layout, "batch": B, "kv_len": S, "hq": hq, "hkv": hkv, "d": D,
                           "page_size": page, "dtype": "bf16", "bytes": io_bytes}
                    out = torch.empty_like(q)
                    lse = torch.empty(B, hq, dtype=torch.float32, device=dev)
                    loom_us = timed(torch, lambda: loom.decode_attention(q, k, v, lens, table, out=out, lse=lse),
                                    iters, 3, flush)
                    row["loom_us"] = loom_us
                    row["loom_gbs"] = io_bytes / loom_us / 1e3
                    row["fraction_of_copy_bw"] = row["loom_gbs"] / bw
                    base = {}
                    if flashinfer is not None:
                        fi = {}
                        for tc in (False, True):
                            name = "flashinfer_tensor_cores" if tc else "flashinfer_cuda_cores"
                            try:
                                fn = flashinfer_decode(torch, flashinfer, workspace, tc, q, *fi_kv, indptr,
                                                       indices, last, fi_page, hq, hkv)
                                fi[name] = timed(torch, fn, iters, 3, flush)
                            except Exception as e:  # a configuration this FlashInfer build does not have
                                row[f"{name}_error"] = str(e)[:200]
                        row.update({f"{k_}_us": v_ for k_, v_ in fi.items()})
                        if fi:
                            base["flashinfer"] = min(fi.values())
                            o_fi, lse_fi = flashinfer_decode(torch, flashinfer, workspace, False, q, *fi_kv, indptr,
                                                             indices, last, fi_page, hq, hkv)()
                            row["max_abs_diff_o"] = (out.float() - o_fi.float()).abs().max().item()
                            # Loom's LSE is natural; FlashInfer's is base 2 or e depending on release and backend.
                            by_base = {"2": (lse - lse_fi.float() * 0.6931471805599453).abs().max().item(),
                                       "e": (lse - lse_fi.float()).abs().max().item()}
                            row["flashinfer_lse_base"] = min(by_base, key=by_base.get)
                            row["max_abs_diff_lse"] = min(by_base.values())
                    if page == 0:
                        qs, ks, vs = q.view(B, hq, 1, D), k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)
                        try:
                            base["sdpa"] = timed(torch, lambda: F.scaled_dot_product_attention(qs, ks, vs,
                                                                                            enable_gqa=True),
                                                 iters, 3, flush)
                        except Exception as e:
                            row["sdpa_error"] = str(e)[:200]
                    row["baselines"] = base
                    row["speedup"] = {k_: v_ / loom_us for k_, v_ in base.items()}
                    print(json.dumps(row), flush=True)
                    rows.append(row)

    commit = os.environ.get("LOOM_GIT_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    doc = {"op": "decode_attention", "command": "python3 bench/attention_flashinfer.py " + " ".join(sys.argv[1:]),
           "gpu": torch.cuda.get_device_name(), "commit": commit,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "ranks": [1],
           "note": f"fraction_of_copy_bw: of the device-to-device copy measured in the same process, {bw:.0f} GB/s; "
                   f"flashinfer-python {getattr(flashinfer, '__version__', 'absent')}", "rows": rows}
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "decode.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
