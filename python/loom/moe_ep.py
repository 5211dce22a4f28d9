"""Expert-parallel MoE, throughput mode, on torch tensors (docs/moe.md, "Expert parallelism: throughput mode"):
loom.ep_dispatch, loom.ep_combine, loom.ep_check and loom.ep_moe_experts. Collective over the World: every rank calls
them in the same order with the same options. Experts are spread over the ranks of one node: E experts, E % W == 0,
expert e on rank e // (E // W) as local expert e % (E // W).

All ops run on the current torch stream of their inputs' device and release the GIL while they enqueue. With
capacity 0 (auto) the dispatch synchronises the stream once (the host reads the rows it needs). Eager only.
"""
from typing import Optional

import torch
from torch import Tensor

from . import _C
from ._enums import parse
from .ops import _ACTIVATIONS, _d, _matrix, _stream
from .world import resolve

__all__ = ["EpHandle", "ep_dispatch", "ep_combine", "ep_check", "ep_dispatch_bytes", "ep_moe_experts",
           "release_moe_ep_state"]


class EpHandle:
    """One dispatch's result, valid until the next ep_dispatch (or ep_moe_experts) on the World. recv_x
    [capacity, H] bfloat16: the received rows, local expert l's in rows [recv_offsets[l], recv_offsets[l + 1])
    (sources in rank order, each source's tokens in order); recv_offsets int32 [L + 1], recv_counts int32 [L]: device
    tensors (views of the World's EP buffers, overwritten by the next dispatch). Pass recv_x and recv_offsets to
    loom.grouped_gemm (num_experts = L), its output to ep_combine."""

    def __init__(self, h, device: torch.device, world, routing=()):
        self._h = h
        self._world = world
        # ep_combine reads the dispatch's topk_idx and topk_weights again: the handle keeps them alive until then.
        self._routing = tuple(routing)
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = device
        self.tokens, self.hidden, self.topk = h.tokens, h.hidden, h.topk
        self.num_experts, self.local_experts, self.capacity = h.num_experts, h.local_experts, h.capacity
        self.recv_x = torch.from_dlpack(h.recv_x(index))
        self.recv_offsets = torch.from_dlpack(h.recv_offsets(index))
        self.recv_counts = torch.from_dlpack(h.recv_counts(index))


def _check_topk(op: str, x: Tensor, topk_idx: Tensor, topk_weights: Optional[Tensor]) -> None:
    _matrix(x, op, "x")
    if topk_idx.dim() != 2 or topk_idx.dtype != torch.int32 or topk_idx.shape[0] != x.shape[0]:
        raise ValueError(f"{op}: topk_idx must be int32 [T = {x.shape[0]}, k]; given {topk_idx.dtype} "
                         f"{list(topk_idx.shape)}")
    if topk_weights is not None and (topk_weights.dtype != torch.float32
                                     or topk_weights.shape != topk_idx.shape):
        raise ValueError(f"{op}: topk_weights must be float32 of topk_idx's shape {list(topk_idx.shape)}; given "
                         f"{topk_weights.dtype} {list(topk_weights.shape)}")


def ep_dispatch(x: Tensor, topk_idx: Tensor, topk_weights: Optional[Tensor], num_experts: int, *, world=None,
                capacity: int = 0, num_blocks: int = 0) -> EpHandle:
    """Sends each token of x [T, H] bfloat16 (H a multiple of 8; T may be 0 and differ per rank) to the ranks of its
    top-k experts: topk_idx int32 [T, k] (ids in [0, E) or -1: slot unused), topk_weights float32 [T, k] or None
    (weights 1). ep_combine reads topk_idx and topk_weights again: the handle holds them, and they must not be changed
    in place before the combine. capacity: rows any rank may receive (0: auto; a fixed capacity that overflows moves
    no data: ep_check raises). Returns the handle."""
    op = "ep_dispatch"
    w = resolve(world)
    _check_topk(op, x, topk_idx, topk_weights)
    h = _C.ep_dispatch(w._h, _d(x), topk_idx, _d(topk_weights), int(num_experts), _stream(x), int(capacity),
                       int(num_blocks))
    return EpHandle(h, x.device, w, (topk_idx, topk_weights))


def ep_combine(handle: EpHandle, expert_out: Tensor, *, out: Optional[Tensor] = None, world=None,
               num_blocks: int = 0) -> Tensor:
    """y [T, H] bfloat16: per token, the top-k weighted sum (fp32) of its experts' outputs, expert_out
    [>= handle.capacity, H] bfloat16 holding the output of recv_x's row i in row i. One combine per dispatch."""
    w = handle._world if world is None else resolve(world)
    _matrix(expert_out, "ep_combine", "expert_out")
    if out is None:
        out = expert_out.new_empty((handle.tokens, handle.hidden), dtype=torch.bfloat16)
    _C.ep_combine(w._h, handle._h, _d(expert_out), out, _stream(expert_out), int(num_blocks))
    return out


def ep_check(handle: EpHandle, world=None) -> None:
    """Synchronises the current stream; raises loom.Error when the handle's dispatch overflowed its capacity (it
    moved no data) or the handle is not the World's latest dispatch."""
    w = handle._world if world is None else resolve(world)
    _C.ep_check(w._h, handle._h, torch.cuda.current_stream(handle.device).cuda_stream)


def ep_dispatch_bytes(handle: EpHandle, world=None) -> int:
    """Bytes of token rows this rank's dispatch sent to other ranks (synchronises the current stream)."""
    w = handle._world if world is None else resolve(world)
    return _C.ep_dispatch_bytes(w._h, handle._h, torch.cuda.current_stream(handle.device).cuda_stream)


def ep_moe_experts(x: Tensor, topk_idx: Tensor, topk_weights: Optional[Tensor], w_up: Tensor,
                   w_down: Optional[Tensor] = None, *, num_experts: int, out: Optional[Tensor] = None, world=None,
                   algo: str = "auto", activation: str = "none", capacity: int = 0, num_blocks: int = 0,
                   return_handle: bool = False):
    """y = ep_combine(experts(ep_dispatch(x))): each received row through its local expert l, act(row @ w_up[l].T)
    then (with w_down) @ w_down[l].T. w_up: this rank's L = E / W experts, [L, N1, H] or stacked [L * N1, H];
    w_down: [L, H, N1'] or [L * H, N1'] (N1' = N1, or N1 / 2 with activation "swiglu"); without w_down the output
    width must be H. algo: "auto" (= "sequential"), "sequential", "overlapped" (the first grouped GEMM's tiles of an
    expert start once every rank's rows of that expert have landed; one node: docs/moe.md).
    Returns out [T, H] bfloat16, or with return_handle (out, the dispatch's EpHandle): with a fixed capacity that
    overflows nothing moves and out is left as it was; ep_check(handle) raises then."""
    op = "ep_moe_experts"
    w = resolve(world)
    _check_topk(op, x, topk_idx, topk_weights)
    if activation not in _ACTIVATIONS:
        raise ValueError(f"{op}: activation must be one of {sorted(_ACTIVATIONS)}; given {activation!r}")
    if w_up.dim() == 3:
        w_up = w_up.reshape(w_up.shape[0] * w_up.shape[1], w_up.shape[2])
    if w_down is not None and w_down.dim() == 3:
        w_down = w_down.reshape(w_down.shape[0] * w_down.shape[1], w_down.shape[2])
    if out is None:
        out = x.new_empty(x.shape, dtype=torch.bfloat16)
    h = _C.ep_moe_experts(w._h, _d(x), topk_idx, _d(topk_weights), int(num_experts), _d(w_up), _d(w_down), out,
                          _stream(x), parse(_C.EpMoeAlgo, algo, "algo"), _ACTIVATIONS[activation], int(capacity),
                          int(num_blocks))
    return (out, EpHandle(h, x.device, w, (topk_idx, topk_weights))) if return_handle else out


def release_moe_ep_state(world=None) -> None:
    """Frees the EP throughput mode's buffers on the World (collective; synchronises the device)."""
    _C.release_moe_ep_state(resolve(world)._h)
