"""Loom for Python: symmetric tensors, Loom's ops on torch tensors, and kernels compiled at run time.

    import loom
    world = loom.init()                          # from loomrun / torchrun / mpirun / srun, or torch.distributed
    x = world.empty((1024, 4096), torch.bfloat16)  # in the symmetric heap
    y = loom.all_gather(x)                       # on the current torch stream

See docs/python.md. Torch is needed for the tensor API (any torch >= 2.4; tensors cross over DLPack); without it
the World, rank facts and loom.jit's compile still import.
"""
from . import _C, jit
from ._dtypes import DType
from .world import Error, World, default_world, init, rank_info

try:
    from ._version import __version__
except ImportError:  # a source tree that pip has not built
    __version__ = "0.0.0+unknown"

try:
    import torch as _torch  # noqa: F401
except ImportError:
    _torch = None

if _torch is not None:
    from .ops import (ag_gemm, all_gather, all_reduce, all_to_all, all_to_all_v, barrier_on_stream, gemm, gemm_ar,
                      gemm_rs, grouped_gemm, reduce_scatter)
    from .attention import (a2a_o_gemm, decode_attention, qkv_gemm_a2a, release_attention_state,
                            release_ulysses_state, sp_decode_attention)
    from .moe import (MoeRouting, ag_moe, moe_ar, moe_permute, moe_route, moe_routing, moe_rs, moe_topk_reduce,
                      release_moe_state)
    from .moe_ep import (EpHandle, ep_check, ep_combine, ep_dispatch, ep_dispatch_bytes, ep_moe_experts,
                         release_moe_ep_state)
    from .moe_ep_ll import (EpLowLatencyBuffers, ep_ll_combine, ep_ll_combine_wait, ep_ll_dispatch,
                            ep_ll_dispatch_wait, release_ep_ll_state)

gpu_available = _C.gpu_available

__all__ = ["Error", "World", "DType", "init", "default_world", "rank_info", "jit", "gpu_available", "gemm",
           "grouped_gemm", "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "all_to_all_v", "ag_gemm",
           "gemm_rs", "gemm_ar", "barrier_on_stream", "decode_attention", "sp_decode_attention", "qkv_gemm_a2a",
           "a2a_o_gemm", "release_attention_state", "release_ulysses_state", "MoeRouting", "moe_routing", "moe_route",
           "moe_permute", "moe_topk_reduce", "ag_moe", "moe_rs", "moe_ar", "release_moe_state", "EpHandle",
           "ep_dispatch", "ep_combine", "ep_check", "ep_dispatch_bytes", "ep_moe_experts", "release_moe_ep_state",
           "EpLowLatencyBuffers", "ep_ll_dispatch", "ep_ll_dispatch_wait", "ep_ll_combine", "ep_ll_combine_wait",
           "release_ep_ll_state", "__version__"]
