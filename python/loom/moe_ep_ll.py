"""Expert-parallel MoE, low-latency mode (decode), on torch tensors (docs/moe.md, "Expert parallelism: low-latency
mode"): loom.EpLowLatencyBuffers, loom.ep_ll_dispatch, loom.ep_ll_combine and their *_wait halves. Collective over
the World: every rank calls them in the same order with the same shape and options, on one stream per World. E
experts over W ranks, expert e on rank e // L as local expert e % L (L = E // W); each rank passes at most max_tokens
tokens per call (T may differ per rank and may be 0).

Stream-ordered, no host synchronisation and no barrier between calls; capturable in a CUDA graph once a call of the
same shape ran outside the capture (the first call of a shape allocates the op's buffers). The ops run on the current
torch stream of their inputs' device and release the GIL while they enqueue.
"""
from typing import Optional

import torch
from torch import Tensor

from . import _C
from .ops import _d, _matrix, _stream
from .world import resolve

__all__ = ["EpLowLatencyBuffers", "ep_ll_dispatch", "ep_ll_dispatch_wait", "ep_ll_combine", "ep_ll_combine_wait",
           "release_ep_ll_state"]


class EpLowLatencyBuffers:
    """The shape of a low-latency dispatch / combine pair and its receive layout on the World's device:
    x [L, W * M, H] (float8_e4m3fn with fp8, else bfloat16), scales [L, W * M, H // 128] float32 (x ~ x * scale;
    fp8 only, else None), src_info [L, W * M] int32 (each row's source entry t * k + s), counts [L, W] int32. Local
    expert l's rows from source rank r are x[l, r * M : r * M + counts[l, r]] (in no particular order): a masked
    grouped GEMM's input. ep_ll_dispatch writes them; ep_ll_combine reads src_info and counts. M = max_tokens.
    symmetric (one node): x, scales and src_info come from the World's symmetric heap (world.empty) and the senders
    write each entry straight into them (no receive copy; the heap must hold them: LOOM_SYMMETRIC_SIZE). Every rank
    passes the same fp8 and symmetric."""

    def __init__(self, max_tokens: int, hidden: int, topk: int, num_experts: int, *, fp8: bool = True,
                 symmetric: bool = False, world=None):
        w = resolve(world)
        W = w.world_size
        if num_experts < 1 or num_experts % W != 0:
            raise ValueError(f"EpLowLatencyBuffers: num_experts must be a positive multiple of the world size {W}; "
                             f"given {num_experts}")
        if hidden < 128 or hidden % 128 != 0:
            raise ValueError(f"EpLowLatencyBuffers: hidden must be a positive multiple of 128; given {hidden}")
        if max_tokens < 1 or not 1 <= topk <= 32:
            raise ValueError(f"EpLowLatencyBuffers: expected max_tokens >= 1 and topk in 1..32; given {max_tokens} "
                             f"and {topk}")
        self.max_tokens, self.hidden, self.topk, self.num_experts, self.fp8 = max_tokens, hidden, topk, num_experts, fp8
        self.symmetric = symmetric
        self.local_experts = num_experts // W
        L, rows, dev = self.local_experts, W * max_tokens, w.torch_device

        def empty(shape, dtype):
            return w.empty(shape, dtype) if symmetric else torch.empty(shape, dtype=dtype, device=dev)

        self.x = empty((L, rows, hidden), torch.float8_e4m3fn if fp8 else torch.bfloat16)
        self.scales = empty((L, rows, hidden // 128), torch.float32) if fp8 else None
        self.src_info = empty((L, rows), torch.int32)
        self.counts = torch.zeros((L, W), dtype=torch.int32, device=dev)

    def _shape(self):
        return self.max_tokens, self.hidden, self.topk, self.num_experts


def _check_idx(op: str, topk_idx: Tensor, tokens: Optional[int], buffers: EpLowLatencyBuffers) -> None:
    """topk_idx: int32 [tokens, k] (tokens None: any)."""
    if (topk_idx.dim() != 2 or topk_idx.dtype != torch.int32 or topk_idx.shape[1] != buffers.topk
            or tokens not in (None, topk_idx.shape[0])):
        want = "T" if tokens is None else f"T = {tokens}"
        raise ValueError(f"{op}: topk_idx must be int32 [{want}, topk = {buffers.topk}]; given {topk_idx.dtype} "
                         f"{list(topk_idx.shape)}")


def _stream_of(w, stream: Optional[torch.cuda.Stream]) -> int:
    return (stream if stream is not None else torch.cuda.current_stream(w.torch_device)).cuda_stream


def ep_ll_dispatch(x: Tensor, topk_idx: Tensor, buffers: EpLowLatencyBuffers, *,
                   return_without_waiting: bool = False, world=None) -> EpLowLatencyBuffers:
    """Sends each entry (t, s) of x [T, H] bfloat16 (T <= max_tokens) with topk_idx[t, s] >= 0 (int32 [T, k]; -1:
    slot unused) to its expert's rank, cast to fp8 e4m3 with one scale per 128 elements (buffers.fp8) or as bf16,
    into buffers' receive layout. An expert id outside [-1, E), or more entries for one expert than max_tokens, traps
    the kernel with a named diagnostic (the next CUDA call raises loom.Error). With return_without_waiting only the
    send half is launched; ep_ll_dispatch_wait launches the receive half (before the next dispatch or a combine).
    Returns buffers."""
    op = "ep_ll_dispatch"
    w = resolve(world)
    _matrix(x, op, "x")
    _check_idx(op, topk_idx, x.shape[0], buffers)
    b = buffers
    _C.ep_ll_dispatch(w._h, _d(x), topk_idx, *b._shape(), b.x, b.scales, b.src_info, b.counts, _stream(x), b.fp8,
                      bool(return_without_waiting), b.symmetric)
    # The receive half, launched by ep_ll_dispatch_wait, may still read what the call was given: held until then.
    w._ll_pending_dispatch = (x, topk_idx) if return_without_waiting else None
    return buffers


def ep_ll_dispatch_wait(world=None, stream: Optional[torch.cuda.Stream] = None) -> None:
    """The receive half of a dispatch made with return_without_waiting, on `stream` (default: the current one)."""
    w = resolve(world)
    _C.ep_ll_dispatch_wait(w._h, _stream_of(w, stream))
    w._ll_pending_dispatch = None


def ep_ll_combine(expert_out: Tensor, topk_idx: Tensor, topk_weights: Tensor, buffers: EpLowLatencyBuffers, *,
                  out: Optional[Tensor] = None, return_without_waiting: bool = False, world=None) -> Tensor:
    """y [T, H] bfloat16 on each token's rank: sum over its used slots s of topk_weights[t, s] (float32 [T, k]) times
    the expert output of entry (t, s), fp32 in slot order. expert_out: bfloat16 [L, W * M, H] (or [L * W * M, H]),
    row i of block l the output of buffers.x[l, i]. Where expert_out is in the World's symmetric heap
    (world.empty(...)) the token ranks of this node read the rows there (no copy through the op's buffers); other
    memory is pushed. Either way expert_out is free again once the call (its receive half) completes. topk_idx and
    topk_weights: the dispatch's routing. With return_without_waiting, ep_ll_combine_wait launches the receive half."""
    op = "ep_ll_combine"
    w = resolve(world)
    b = buffers
    if expert_out.dim() == 3:
        expert_out = expert_out.reshape(expert_out.shape[0] * expert_out.shape[1], expert_out.shape[2])
    _matrix(expert_out, op, "expert_out")
    _check_idx(op, topk_idx, None, b)
    tokens = topk_idx.shape[0]
    if topk_weights.dtype != torch.float32 or topk_weights.shape != topk_idx.shape:
        raise ValueError(f"{op}: topk_weights must be float32 of topk_idx's shape {list(topk_idx.shape)}; given "
                         f"{topk_weights.dtype} {list(topk_weights.shape)}")
    if out is None:
        out = expert_out.new_empty((tokens, b.hidden), dtype=torch.bfloat16)
    _C.ep_ll_combine(w._h, _d(expert_out), topk_idx, topk_weights, *b._shape(), b.src_info, b.counts, out,
                     _stream(expert_out), bool(return_without_waiting))
    # The receive half, launched by ep_ll_combine_wait, reads topk_idx, topk_weights and expert_out: held until then
    # (torch would otherwise hand their memory to the next allocation while the wait is still to come).
    w._ll_pending_combine = (expert_out, topk_idx, topk_weights, out) if return_without_waiting else None
    return out


def ep_ll_combine_wait(world=None, stream: Optional[torch.cuda.Stream] = None) -> None:
    """The receive half of a combine made with return_without_waiting, on `stream` (default: the current one)."""
    w = resolve(world)
    _C.ep_ll_combine_wait(w._h, _stream_of(w, stream))
    w._ll_pending_combine = None


def release_ep_ll_state(world=None) -> None:
    """Frees the low-latency ops' buffers on the World (collective; synchronises the device)."""
    _C.release_ep_ll_state(resolve(world)._h)
