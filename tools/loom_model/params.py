"""Hardware parameter files: loading and validation.

A parameter file (JSON, data/<name>.json or any path) describes one machine kind:

  {"name": str, "description": str, "sources": {field: where the value comes from},
   "gpu": {"sms": int, "hbm_GBps": number, "launch_us": number, "signal_us": number, "barrier_us": number,
           "block_copy_GBps": number, "ll_GBps": number, "decode_GBps": number, "decode_fixed_us": number,
           "gemm": {"tile_m": int, "tile_n": int, "us_per_wave_per_k": number, "us_per_wave": number,
                    "stream_GBps": number, "stream_fixed_us": number,
                    "hbm_efficiency": number in (0, 1], "table": "docs/perf/<file>.json" or null}},
   "nvlink": {"GBps_per_dir": number, "efficiency": number in (0, 1], "latency_us": number},
   "ib": {"GBps_per_nic": number, "efficiency": number in (0, 1], "latency_us": number, "nics_per_node": int},
   "gpus_per_node": int,
   "ll": {"overhead_us": number},
   "shared_gpu": {"traffic_GBps_by_ranks": {"2": number, ...}, "call_us_by_ranks": {"2": number, ...},
                  "ll_traffic_GBps": number, "barrier_us": number, "block_copy_GBps": number,
                  "sm_fraction_by_ranks": {"2": number in (0, 1], ...}, "overlap_serial_fraction": number in [0, 1]}
                 (optional: ranks sharing one GPU)}

load() returns the validated dict; every violation raises ParamError naming the file, the field, what was
expected and what was given.
"""
import json
import math
import os

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ParamError(ValueError):
    pass


POS = "positive number"
FRAC = "number in (0, 1]"
FRAC0 = "number in [0, 1]"
NONNEG = "non-negative number"
INT = "positive integer"

SCHEMA = {
    "name": str,
    "description": str,
    "sources": dict,
    "gpu": {
        "sms": INT,
        "hbm_GBps": POS,
        "launch_us": NONNEG,
        "signal_us": NONNEG,
        "barrier_us": NONNEG,
        "block_copy_GBps": POS,
        "ll_GBps": POS,
        "decode_GBps": POS,
        "decode_fixed_us": NONNEG,
        "gemm": {
            "tile_m": INT,
            "tile_n": INT,
            "us_per_wave_per_k": POS,
            "us_per_wave": NONNEG,
            "stream_GBps": POS,
            "stream_fixed_us": NONNEG,
            "hbm_efficiency": FRAC,
            "table": (str, type(None)),
        },
    },
    "nvlink": {"GBps_per_dir": POS, "efficiency": FRAC, "latency_us": NONNEG},
    "ib": {"GBps_per_nic": POS, "efficiency": FRAC, "latency_us": NONNEG, "nics_per_node": INT},
    "gpus_per_node": INT,
    "ll": {"overhead_us": NONNEG},
}
OPTIONAL = {"shared_gpu": {"traffic_GBps_by_ranks": dict, "call_us_by_ranks": dict, "ll_traffic_GBps": POS,
                           "barrier_us": NONNEG, "block_copy_GBps": POS,
                           "sm_fraction_by_ranks": dict, "overlap_serial_fraction": FRAC0}}
# shared_gpu fields keyed by rank count, and the kind of their values
BY_RANKS = (("traffic_GBps_by_ranks", POS), ("call_us_by_ranks", POS), ("sm_fraction_by_ranks", FRAC))


def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_value(where, field, kind, v):
    def fail(expected):
        raise ParamError(f"{where}: {field}: expected a {expected}, got {v!r}")

    if kind is str:
        if not isinstance(v, str) or not v.strip():
            fail("non-empty string")
    elif kind is dict:
        if not isinstance(v, dict):
            fail("object")
    elif isinstance(kind, tuple):
        if not isinstance(v, kind):
            fail(" or ".join("null" if k is type(None) else k.__name__ for k in kind))
    elif kind == INT:
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            fail(INT)
    elif kind == POS:
        if not _is_num(v) or v <= 0:
            fail(POS)
    elif kind == NONNEG:
        if not _is_num(v) or v < 0:
            fail(NONNEG)
    elif kind == FRAC:
        if not _is_num(v) or not 0 < v <= 1:
            fail(FRAC)
    elif kind == FRAC0:
        if not _is_num(v) or not 0 <= v <= 1:
            fail(FRAC0)
    else:
        raise AssertionError(kind)


def _check_object(where, prefix, schema, d, optional=None):
    if not isinstance(d, dict):
        raise ParamError(f"{where}: {prefix or '(top level)'}: expected an object, got {d!r:.60}")
    optional = optional or {}
    for key, kind in schema.items():
        field = f"{prefix}.{key}" if prefix else key
        if key not in d:
            raise ParamError(f"{where}: {field}: missing")
        if isinstance(kind, dict):
            _check_object(where, field, kind, d[key])
        else:
            _check_value(where, field, kind, d[key])
    for key, kind in optional.items():
        if key in d:
            _check_object(where, f"{prefix}.{key}" if prefix else key, kind, d[key])
    for key in d:
        if key not in schema and key not in optional:
            allowed = ", ".join([*schema, *optional])
            raise ParamError(f"{where}: {prefix + '.' if prefix else ''}{key}: unknown field (allowed: {allowed})")


def validate(p, where="parameters"):
    """Raises ParamError on the first violation; returns p."""
    _check_object(where, "", SCHEMA, p, OPTIONAL)
    shared = p.get("shared_gpu")
    if shared is not None:
        for name, kind in BY_RANKS:
            by = shared[name]
            if not by:
                raise ParamError(f"{where}: shared_gpu.{name}: expected at least one rank count, got {{}}")
            for k, v in by.items():
                if not k.isdigit() or int(k) < 2:
                    raise ParamError(f"{where}: shared_gpu.{name}: expected keys that are rank counts >= 2, got {k!r}")
                _check_value(where, f"shared_gpu.{name}.{k}", kind, v)
    table = p["gpu"]["gemm"]["table"]
    if table is not None and not os.path.isfile(os.path.join(REPO_ROOT, table)):
        raise ParamError(f"{where}: gpu.gemm.table: expected a file under the repository root, got {table!r} "
                         f"(not found under {REPO_ROOT})")
    return p


def available():
    return sorted(f[:-5] for f in os.listdir(DATA_DIR) if f.endswith(".json") and f != "published.json")


def load(name_or_path):
    """A parameter file by name (data/<name>.json) or by path."""
    path = name_or_path
    if not os.path.sep in path and not path.endswith(".json"):
        path = os.path.join(DATA_DIR, name_or_path + ".json")
        if not os.path.isfile(path):
            raise ParamError(f"no parameter file named {name_or_path!r} (available: {', '.join(available())})")
    try:
        with open(path) as f:
            p = json.load(f)
    except json.JSONDecodeError as e:
        raise ParamError(f"{path}: not valid JSON: {e}") from None
    return validate(p, os.path.basename(path))
