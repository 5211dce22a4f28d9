"""GEMM time on one GPU: a tile-wave model fitted to bench-gemm, with measured rows taking precedence.

The persistent kernel covers C (M x N) with tile_m x tile_n tiles, one tile per SM at a time, so a GEMM takes
ceil(tiles / sms) waves and a wave costs a K-proportional main loop plus a fixed prologue/epilogue:

    t = waves * (us_per_wave_per_k * K + us_per_wave)

bounded below by streaming A and B in and C out once (small-M, memory-bound shapes): a fixed pipeline fill and
tail plus the bytes at the streaming rate, both fitted to bench-gemm's skinny rows (docs/perf/gemm_skinny.json:
stream_fixed_us + bytes / stream_GBps, every heuristic row within 9 %). Below one wave of tiles the kernel splits K (split-K / stream-K tails), so the wave count is the
fraction tiles / sms. Where the parameter file names a table (docs/perf/gemm.json for the H200) a shape measured there
returns its measured time instead. H800 and H100 SXM share the H200's GH100 die (132 SMs, same boost clock), so
their files carry the H200's fitted wave costs; only HBM bandwidth differs.
"""
import json
import math
import os

from .params import REPO_ROOT

_tables = {}


def _table(path):
    if path not in _tables:
        with open(os.path.join(REPO_ROOT, path)) as f:
            rows = json.load(f)["rows"]
        _tables[path] = {(r["m"], r["n"], r["k"]): r["loom_us"] for r in rows if r.get("dtype", "bf16") == "bf16"}
    return _tables[path]


def waves(p, m, n, sms=None):
    """Waves of output tiles; below one wave the kernel splits K over the idle SMs (a fraction of a wave)."""
    g = p["gpu"]["gemm"]
    sms = sms or p["gpu"]["sms"]
    tiles = math.ceil(m / g["tile_m"]) * math.ceil(n / g["tile_n"])
    return tiles / sms if tiles < sms else math.ceil(tiles / sms)


def stream_us(p, m, n, k, elem_bytes=2, streams=1):
    """The memory bound: A and B read and C written once, by `streams` such GEMMs at once on one GPU (ranks sharing
    it: their bytes add up at the one HBM's streaming rate)."""
    g = p["gpu"]["gemm"]
    return g["stream_fixed_us"] + streams * (m * k + k * n + m * n) * elem_bytes / (g["stream_GBps"] * 1e3)


def fitted_us(p, m, n, k, elem_bytes=2, sms=None, streams=1):
    """The analytic model alone (no measured rows); sms: the SMs the GEMM may use (default: all); streams: GEMMs
    streaming through the same HBM at once."""
    if min(m, n, k) <= 0:
        raise ValueError(f"gemm: expected positive m, n, k, got {m}, {n}, {k}")
    g = p["gpu"]["gemm"]
    compute = waves(p, m, n, sms) * (g["us_per_wave_per_k"] * k + g["us_per_wave"])
    return max(compute, stream_us(p, m, n, k, elem_bytes, streams))


def measured_us(p, m, n, k):
    """The measured time of this exact shape, or None."""
    table = p["gpu"]["gemm"]["table"]
    return _table(table).get((m, n, k)) if table else None


def gemm_us(p, m, n, k, measured=True):
    """bf16 GEMM time (us): the measured row where there is one (measured=True), else the fitted model."""
    if measured:
        t = measured_us(p, m, n, k)
        if t is not None:
            return t
    return fitted_us(p, m, n, k)


def tflops(m, n, k, us):
    return 2.0 * m * n * k / (us * 1e6)
