"""GEMM time on one GPU: a tile-wave model fitted to bench-gemm, with measured rows taking precedence.

The persistent kernel covers C (M x N) with tile_m x tile_n tiles, one tile per SM at a time, so a GEMM takes
ceil(tiles / sms) waves and a wave costs a K-proportional main loop plus a fixed prologue/epilogue:

    t = waves * (us_per_wave_per_k * K + us_per_wave)

bounded below by streaming A and B in and C out once (small-M, memory-bound shapes): a fixed pipeline fill and
tail plus the bytes at the streaming rate, both fitted to bench-gemm's skinny rows (docs/perf/gemm_skinny.json:
stream_fixed_us + bytes / stream_GBps, every heuristic row within 9 %). Below one wave of tiles the heuristic runs
one wave of whole tiles, or for a wave at most half full splits K over every SM (waves()). Where the parameter file
names a table (docs/perf/gemm.json for the H200) a shape measured there returns its measured time instead. H800 and
H100 SXM share the H200's GH100 die (132 SMs, same boost clock), so their files carry the H200's fitted wave costs;
only HBM bandwidth (and with it the streaming rate) differs.
"""
import json
import math
import os

from .params import REPO_ROOT

_tables = {}
K_BLOCK = 64  # bf16 k-block of the sm90 GEMM (kernels::gemm_block_k)
TAIL_FIXUP = 0.1  # a split tail's fix-up, in waves (src/ops/gemm/gemm_internal.hpp kGemmTailFixupCost)


def _table(path):
    if path not in _tables:
        with open(os.path.join(REPO_ROOT, path)) as f:
            rows = json.load(f)["rows"]
        _tables[path] = {(r["m"], r["n"], r["k"]): r["loom_us"] for r in rows if r.get("dtype", "bf16") == "bf16"}
    return _tables[path]


def tiles(p, m, n):
    """Output tiles of an M x N GEMM (the model's tile_m x tile_n)."""
    g = p["gpu"]["gemm"]
    return math.ceil(m / g["tile_m"]) * math.ceil(n / g["tile_n"])


def waves(p, m, n, sms=None, k=None):
    """Waves of output tiles. Below one wave, as src/ops/gemm/heuristic.cpp plans it: tiles filling more than half
    the SMs run one wave of whole tiles (the persistent grid is the tiles); a thinner wave splits K over every SM,
    s = min(SMs / tiles, K-blocks / 4) ways, at 1 / s of a wave plus the fix-up (0.1 of a wave:
    kGemmTailFixupCost). k None: the split as wide as the SMs allow."""
    sms = sms or p["gpu"]["sms"]
    count = tiles(p, m, n)
    if count >= sms:
        return math.ceil(count / sms)
    if 2 * count > sms:
        return 1
    splits = sms // count
    if k is not None:
        splits = min(splits, math.ceil(k / K_BLOCK) // 4)
    return 1 / splits + TAIL_FIXUP if splits >= 2 else 1


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
    compute = waves(p, m, n, sms, k) * (g["us_per_wave_per_k"] * k + g["us_per_wave"])
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
