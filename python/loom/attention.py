"""The attention ops on torch tensors (docs/attention.md): loom.decode_attention, loom.sp_decode_attention (decode)
and loom.qkv_gemm_a2a, loom.a2a_o_gemm (Ulysses sequence parallelism).

All run on the current torch stream of their inputs' device, release the GIL while they enqueue and never synchronise
the host. Eager only (no torch custom op: they do not trace under torch.compile). decode_attention and
sp_decode_attention replay in a CUDA graph once a call of the same shape ran eagerly; decode_attention's split
workspace is the stream's, so make that call on the stream that will capture (torch.cuda.graph captures on a side
stream of its own: pass it one with stream=s and warm up under torch.cuda.stream(s)). The Ulysses ops are not
capturable. sp_decode_attention and the Ulysses ops are collective over the World.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _C
from ._enums import parse
from .world import resolve

__all__ = ["decode_attention", "sp_decode_attention", "qkv_gemm_a2a", "a2a_o_gemm", "release_attention_state",
           "release_ulysses_state"]


def _stream(t: Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _2d(t: Tensor, op: str, arg: str) -> None:
    if t.dim() != 2:
        raise ValueError(f"{op}: {arg} must be a 2-D tensor; given shape {list(t.shape)}")


# ---- decode --------------------------------------------------------------------------------------------------------
def _decode_check(op: str, q: Tensor, k_cache: Tensor, v_cache: Tensor, seq_lens: Tensor,
                  block_table: Optional[Tensor]) -> None:
    """The shape and dtype relations between the arguments (ValueError naming the argument); devices and layouts are
    checked by the binding, the values (head_dim, group, page size, options) by Loom's op."""
    if q.dim() != 3:
        raise ValueError(f"{op}: q must be 3-D [batch, num_heads, head_dim]; given shape {list(q.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise ValueError(f"{op}: {name} must be 4-D [batch or pages, tokens, num_kv_heads, head_dim]; given "
                             f"shape {list(t.shape)}")
        if t.dtype != q.dtype:
            raise ValueError(f"{op}: {name} must have q's dtype {q.dtype}; given {t.dtype}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"{op}: v_cache must have k_cache's shape {list(k_cache.shape)}; given "
                         f"{list(v_cache.shape)}")
    if k_cache.shape[3] != q.shape[2]:
        raise ValueError(f"{op}: k_cache's head_dim (dimension 3) must be q's {q.shape[2]}; given {k_cache.shape[3]}")
    batch = q.shape[0]
    if seq_lens.dtype != torch.int32 or seq_lens.dim() != 1 or seq_lens.shape[0] != batch:
        raise ValueError(f"{op}: seq_lens must be int32 [batch = {batch}]; given {seq_lens.dtype} "
                         f"{list(seq_lens.shape)}")
    if block_table is None:
        if k_cache.shape[0] != batch:
            raise ValueError(f"{op}: a contiguous k_cache (no block_table) must be [batch = {batch}, max_seq_len, "
                             f"num_kv_heads, head_dim]; given {list(k_cache.shape)}")
    elif block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"{op}: block_table must be int32 [batch = {batch}, max_pages]; given {block_table.dtype} "
                         f"{list(block_table.shape)}")


def _decode_outputs(q: Tensor, out: Optional[Tensor], lse: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if lse is None:
        lse = torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32, device=q.device)
    return out, lse


def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, seq_lens: Tensor,
                     block_table: Optional[Tensor] = None, *, scale: float = 0.0, softcap: float = 0.0,
                     max_seq_len: int = 0, num_splits: int = 0, out: Optional[Tensor] = None,
                     lse: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """One query token per sequence against its KV cache -> (O [batch, num_heads, head_dim] of q's dtype,
    LSE float32 [batch, num_heads], natural log; a sequence of length 0 gets O = 0, LSE = -inf).

    q [batch, num_heads, head_dim], bf16 or fp16, head_dim 64, 128 or 256. k_cache, v_cache of q's dtype:
    [batch, max_seq_len, num_kv_heads, head_dim] (contiguous, block_table None) or [num_pages, page_size,
    num_kv_heads, head_dim] (paged; token t of sequence b in page block_table[b, t // page_size]); num_heads a multiple
    of num_kv_heads. seq_lens int32 [batch], block_table int32 [batch, max_pages], on the device (read by the kernel).
    scale 0: 1 / sqrt(head_dim); softcap > 0: scores soft-capped; max_seq_len: a bound on seq_lens (0: the cache's
    capacity); num_splits 0: chosen by Loom. out= / lse=: tensors to write. Takes no World."""
    _decode_check("decode_attention", q, k_cache, v_cache, seq_lens, block_table)
    out, lse = _decode_outputs(q, out, lse)
    _C.decode_attention(q.detach(), k_cache.detach(), v_cache.detach(), seq_lens, block_table, out, lse, _stream(q),
                        float(scale), float(softcap), int(max_seq_len), int(num_splits))
    return out, lse


def sp_decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, seq_lens: Tensor,
                        block_table: Optional[Tensor] = None, *, world=None, scale: float = 0.0, softcap: float = 0.0,
                        max_seq_len: int = 0, num_splits: int = 0, out: Optional[Tensor] = None,
                        lse: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Sequence-parallel decode_attention: each rank passes its own shard of every sequence's KV (its own cache,
    seq_lens and block_table; 0 tokens is fine) and every rank gets (O, LSE) over the whole KV. Arguments as
    decode_attention's. Collective: every rank calls it with the same q shape, dtype and options; the first call
    creates the World's state (not inside a CUDA graph capture). Node-local worlds."""
    _decode_check("sp_decode_attention", q, k_cache, v_cache, seq_lens, block_table)
    w = resolve(world)
    out, lse = _decode_outputs(q, out, lse)
    _C.sp_decode_attention(w._h, q.detach(), k_cache.detach(), v_cache.detach(), seq_lens, block_table, out, lse,
                           _stream(q), float(scale), float(softcap), int(max_seq_len), int(num_splits))
    return out, lse


# ---- Ulysses sequence parallelism -----------------------------------------------------------------------------------
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


def release_attention_state(world=None) -> None:
    """Frees the attention ops' state on the World: sp_decode_attention's LL area and the Ulysses ops' buffers
    (collective; synchronises the device). decode_attention keeps none."""
    _C.release_attention_state(resolve(world)._h)


def release_ulysses_state(world=None) -> None:
    """Frees the Ulysses ops' state on the World only; sp_decode_attention's stays (collective)."""
    _C.release_ulysses_state(resolve(world)._h)
