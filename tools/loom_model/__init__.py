"""loom_model: a performance model of Loom's ops (docs/model.md). Pure Python, standard library only."""
from . import comm, gemm, ops, params  # noqa: F401
from .params import ParamError, load  # noqa: F401
from .topology import Topology  # noqa: F401
