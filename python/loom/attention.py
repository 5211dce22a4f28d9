"""Ulysses sequence parallelism on torch tensors (docs/attention.md): loom.qkv_gemm_a2a, loom.a2a_o_gemm.

Both run on the current torch stream of their inputs' device, release the GIL while they enqueue, never synchronise
the host, and are collective over the World. Eager only (no torch custom op: they do not trace under torch.compile),
and not capturable in a CUDA graph.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _C
from ._enums import parse
from .world import resolve

__all__ = ["qkv_gemm_a2a", "a2a_o_gemm"]


def _stream(t: Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _2d(t: Tensor, op: str, arg: str) -> None:
    if t.dim() != 2:
        raise ValueError(f"{op}: {arg} must be a 2-D tensor; given shape {list(t.shape)}")


def qkv_gemm_a2a(x: Tensor, w_qkv: Tensor, heads_q: int, heads_kv: int, head_dim: int, *, world=None,
                 algo: str = "auto", comm_sms: int = 0, num_sms: int = 0,
                 out: Optional[Tuple[Tensor, Tensor, Tensor]] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """x [S / W, hidden] (this rank's tokens), w_qkv [(Hq + 2 Hkv) D, hidden] -> (q [S, Hq / W, D], k, v
    [S, max(Hkv / W, 1), D]): the projection, then heads <-> sequence. algo: "auto", "fused", "sequential".
    out: (q, k, v) to write, 2-D [S, heads x D] or 3-D [S, heads, D] with rows of whole heads. Hopper only."""
    _2d(x, "qkv_gemm_a2a", "x")
    _2d(w_qkv, "qkv_gemm_a2a", "w_qkv")
    w = resolve(world)
    W = w.world_size
    S = x.shape[0] * W
    hkv_r = heads_kv // W if heads_kv >= W else 1
    if out is None:
        out = (x.new_empty((S, heads_q // W, head_dim)), x.new_empty((S, hkv_r, head_dim)),
               x.new_empty((S, hkv_r, head_dim)))
    q, k, v = (t.view(t.shape[0], -1) if t.dim() == 3 else t for t in out)
    _C.qkv_gemm_a2a(w._h, x.detach(), w_qkv.detach(), heads_q, heads_kv, head_dim, q, k, v, _stream(x),
                    parse(_C.UlyssesAlgo, algo, "algo"), comm_sms, num_sms)
    return out


def a2a_o_gemm(o: Tensor, w_o: Tensor, *, world=None, algo: str = "auto", comm_sms: int = 0, num_sms: int = 0,
               out: Optional[Tensor] = None, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """o [S, Hq / W, D] or [S, Hq / W x D] (attention's output for this rank's heads), w_o [hidden, Hq D] ->
    out [S / W, hidden]: sequence <-> heads, then the output projection. algo: "auto", "fused", "sequential"."""
    o2 = o.reshape(o.shape[0], -1) if o.dim() == 3 else o
    _2d(o2, "a2a_o_gemm", "o")
    _2d(w_o, "a2a_o_gemm", "w_o")
    w = resolve(world)
    W = w.world_size
    if o2.shape[0] % W:
        raise ValueError(f"a2a_o_gemm: o's rows S must be a multiple of the world size {W}; given {list(o.shape)}")
    if out is None:
        out = o2.new_empty((o2.shape[0] // W, w_o.shape[0]), dtype=out_dtype or o2.dtype)
    _C.a2a_o_gemm(w._h, o2.detach(), w_o.detach(), out, _stream(o2), parse(_C.UlyssesAlgo, algo, "algo"),
                  comm_sms, num_sms)
    return out
