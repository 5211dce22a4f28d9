"""The MoE routing utilities and the TP-MoE ops on torch tensors (docs/moe.md): loom.moe_routing, loom.moe_route,
loom.moe_permute, loom.moe_topk_reduce (one GPU) and loom.ag_moe, loom.moe_rs, loom.moe_ar (collective over the
World: every rank calls them in the same order with the same shapes and options).

A routing (MoeRouting) is one uint8 CUDA tensor carved into the device arrays of the grouped-rows layout, exposed as
tensor views; the ops fill it on the device and the host never reads it. All ops run on the current torch stream of
their inputs' device, release the GIL while they enqueue and never synchronise the host (the TP-MoE ops except when
their state is created or grows). Eager only (no torch custom op: they do not trace under torch.compile).
"""
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from . import _C
from ._enums import parse
from .ops import _ACTIVATIONS, _d, _matrix, _out_dtype, _scales, _stream
from .world import resolve

__all__ = ["MoeRouting", "moe_routing", "moe_route", "moe_permute", "moe_topk_reduce", "ag_moe", "moe_rs", "moe_ar",
           "release_moe_state"]


class MoeRouting(NamedTuple):
    """A routing of `tokens` tokens (T), each to `topk` (k) of `num_experts` (E) experts, from `ranks` source ranks
    (G = ranks * E groups), group sizes rounded up to a multiple of `align`. `buffer` holds the arrays; the others
    are int32 / float32 views of it: offsets [G + 1] (the groups' row offsets: grouped_gemm's offsets), counts [G]
    (rows with a token per group), dest_rows [T, k] (row of entry (t, s)), row_tokens [max_rows] (token of each row,
    -1 for padding and unused rows), weights [T, k] (the routing weights; 1 where none were given)."""
    buffer: Tensor
    tokens: int
    topk: int
    num_experts: int
    ranks: int
    align: int
    offsets: Tensor
    counts: Tensor
    dest_rows: Tensor
    row_tokens: Tensor
    weights: Tensor

    @property
    def shape(self) -> Tuple[int, int, int, int, int]:
        return (self.tokens, self.topk, self.num_experts, self.ranks, self.align)

    @property
    def num_groups(self) -> int:
        return self.ranks * self.num_experts

    @property
    def max_rows(self) -> int:
        """Rows the layout may take: T * k plus each group's padding (the grouped rows' tensors have this many)."""
        return self.tokens * self.topk + self.num_groups * (self.align - 1)


def moe_routing(tokens: int, topk: int, num_experts: int, *, ranks: int = 1, align: int = 1,
                device=None) -> MoeRouting:
    """A new routing's buffer on `device` (default: the current CUDA device), its arrays uninitialised until
    moe_route or ag_moe fills them. A bad shape (topk outside 1..32 or > num_experts, tokens not a multiple of ranks,
    align outside 1..4096, ranks * num_experts > 8192) raises loom.Error naming the field."""
    shape = (int(tokens), int(topk), int(num_experts), int(ranks), int(align))
    layout = _C.moe_routing_layout(shape)
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    buf = torch.empty(layout["bytes"], dtype=torch.uint8, device=device)

    def view(name: str, n: int, dtype: torch.dtype) -> Tensor:
        at = layout[name]
        return buf[at:at + 4 * n].view(dtype)

    g, entries = shape[2] * shape[3], shape[0] * shape[1]
    return MoeRouting(buf, *shape, offsets=view("offsets", g + 1, torch.int32), counts=view("counts", g, torch.int32),
                      dest_rows=view("dest_rows", entries, torch.int32).view(shape[0], shape[1]),
                      row_tokens=view("row_tokens", layout["max_rows"], torch.int32),
                      weights=view("weights", entries, torch.float32).view(shape[0], shape[1]))


def _check_routing(op: str, routing, want: Optional[tuple] = None) -> None:
    if not isinstance(routing, MoeRouting):
        raise ValueError(f"{op}: routing must be a loom.MoeRouting (loom.moe_routing / loom.moe_route); given "
                         f"{type(routing).__name__}")
    if want is not None and routing.shape != want:
        raise ValueError(f"{op}: routing must have shape (tokens, topk, num_experts, ranks, align) = {want}; given "
                         f"{routing.shape}")


def _check_topk(op: str, topk_idx: Tensor, topk_weights: Optional[Tensor]) -> None:
    if topk_idx.dim() != 2 or topk_idx.dtype != torch.int32:
        raise ValueError(f"{op}: topk_idx must be int32 [tokens, topk]; given {topk_idx.dtype} "
                         f"{list(topk_idx.shape)}")
    if topk_weights is not None and (topk_weights.dtype != torch.float32 or topk_weights.shape != topk_idx.shape):
        raise ValueError(f"{op}: topk_weights must be float32 of topk_idx's shape {list(topk_idx.shape)}; given "
                         f"{topk_weights.dtype} {list(topk_weights.shape)}")


def moe_route(topk_idx: Tensor, topk_weights: Optional[Tensor] = None, *, num_experts: Optional[int] = None,
              ranks: int = 1, align: int = 1, routing: Optional[MoeRouting] = None) -> MoeRouting:
    """Fills a routing from top-k results: topk_idx int32 [T, k] (expert ids in [0, E) on the device), topk_weights
    float32 [T, k] or None (weights 1). Entry (t, s) goes to group (t // (T / ranks)) * E + topk_idx[t, s]; a group's
    rows hold its entries in order (t, then s). routing: one to fill (of T tokens, k slots and E experts; its own
    ranks and align are used); None: a new one (num_experts= needed). An id outside [0, E) traps the kernel (the
    CUDA context is lost: check ids on the host where they are there). Returns the routing."""
    _check_topk("moe_route", topk_idx, topk_weights)
    if routing is None:
        if num_experts is None:
            raise ValueError("moe_route: pass num_experts= or routing=")
        routing = moe_routing(topk_idx.shape[0], topk_idx.shape[1], num_experts, ranks=ranks, align=align,
                              device=topk_idx.device)
    else:
        _check_routing("moe_route", routing)
        e = routing.num_experts if num_experts is None else int(num_experts)
        _check_routing("moe_route", routing, (topk_idx.shape[0], topk_idx.shape[1], e, routing.ranks, routing.align))
    _C.moe_route(topk_idx, _d(topk_weights), routing.buffer, routing.shape, _stream(topk_idx))
    return routing


def moe_permute(x: Tensor, routing: MoeRouting, *, out: Optional[Tensor] = None) -> Tensor:
    """out[r] = x[row_tokens[r]] for the layout's rows (zeros for padding rows; rows past offsets[G] untouched).
    x: [T, H] (any dtype); out: [>= max_rows, H] of x's dtype (new: [max_rows, H])."""
    _check_routing("moe_permute", routing)
    _matrix(x, "moe_permute", "x")
    if out is None:
        out = x.new_empty((routing.max_rows, x.shape[1]))
    _C.moe_permute(_d(x), routing.buffer, routing.shape, out, _stream(x))
    return out


def moe_topk_reduce(rows: Tensor, routing: MoeRouting, *, out: Optional[Tensor] = None,
                    out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """out[t] = sum over slots s of weights[t, s] * rows[dest_rows[t, s]] (fp32, slot order). rows: [>= offsets[G],
    H] bf16 / fp16 / fp32; out: [T, H] bf16 / fp16 / fp32 (default: rows' dtype)."""
    _check_routing("moe_topk_reduce", routing)
    _matrix(rows, "moe_topk_reduce", "rows")
    if out is None:
        out = rows.new_empty((routing.tokens, rows.shape[1]), dtype=_out_dtype(rows, out_dtype))
    _C.moe_topk_reduce(_d(rows), routing.buffer, routing.shape, out, _stream(rows))
    return out


def _stacked(w: Tensor, num_experts: Optional[int], op: str, arg: str) -> Tuple[Tensor, int]:
    """w as the 2-D stack of its experts' matrices ([E, R, C] -> [E * R, C]) and the expert count."""
    if w.dim() == 3:
        if num_experts is not None and num_experts != w.shape[0]:
            raise ValueError(f"{op}: num_experts {num_experts} disagrees with {arg}'s {w.shape[0]} experts")
        return w.reshape(w.shape[0] * w.shape[1], w.shape[2]), w.shape[0]
    _matrix(w, op, arg)
    if num_experts is None:
        raise ValueError(f"{op}: a 2-D {arg} needs num_experts= (or a routing)")
    return w, int(num_experts)


def _layout(op: str, b_layout: str) -> bool:
    if b_layout not in ("nk", "kn"):
        raise ValueError(f"{op}: b_layout must be 'nk' or 'kn'; given {b_layout!r}")
    return b_layout == "kn"


def ag_moe(x: Tensor, topk_idx: Tensor, topk_weights: Optional[Tensor], w_up: Tensor, *,
           num_experts: Optional[int] = None, routing: Optional[MoeRouting] = None, align: int = 1,
           expert_major: bool = True, out: Optional[Tensor] = None, world=None, algo: str = "auto",
           b_layout: str = "nk", activation: str = "none", alpha: float = 1.0, scale_a: Optional[Tensor] = None,
           scale_b: Optional[Tensor] = None, out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, MoeRouting]:
    """The TP-MoE up projection: the grouped GEMM of every rank's tokens' routed rows with this rank's N-slice of every
    expert. x: this rank's tokens [T_loc, H]; topk_idx int32, topk_weights float32 or None: [T_loc, k]; w_up:
    [E, N_loc, H] or stacked [E * N_loc, H] (b_layout "kn": [E, H, N_loc] / [E * H, N_loc]). activation: "none",
    "swiglu" (out has N_loc / 2 columns), "gelu". routing: filled by the op for the gathered tokens, shape
    (W * T_loc, k, E, ranks, align): ranks 1, expert-major, group e holds every rank's tokens of expert e, so the GEMMs
    read each expert's weights once; or ranks W, source-major, rank r's tokens are groups [r E, (r + 1) E). Every
    algorithm runs on either. None: a new one, expert-major unless expert_major is False. out: [>= max_rows, N_loc]
    x's dtype or fp32 (new: [max_rows, ...]), the grouped rows. algo: "auto", "fused", "sequential". Returns
    (out, routing): pass both to moe_rs."""
    op = "ag_moe"
    w = resolve(world)
    _matrix(x, op, "x")
    _check_topk(op, topk_idx, topk_weights)
    if topk_idx.shape[0] != x.shape[0]:
        raise ValueError(f"{op}: topk_idx must have x's {x.shape[0]} rows; given {list(topk_idx.shape)}")
    if num_experts is None and routing is not None:
        num_experts = routing.num_experts
    w_up, e = _stacked(w_up, num_experts, op, "w_up")
    ranks = 1 if expert_major else w.world_size
    if routing is not None and routing.ranks in (1, w.world_size):
        ranks = routing.ranks
    want = (w.world_size * x.shape[0], topk_idx.shape[1], e, ranks, int(align))
    if routing is None:
        routing = moe_routing(*want[:3], ranks=want[3], align=want[4], device=x.device)
    else:
        _check_routing(op, routing, want[:4] + (routing.align, ))
    if activation not in _ACTIVATIONS:
        raise ValueError(f"{op}: activation must be one of {sorted(_ACTIVATIONS)}; given {activation!r}")
    b_kn = _layout(op, b_layout)
    if out is None:
        n = w_up.shape[1] if b_kn else w_up.shape[0] // e
        out = x.new_empty((routing.max_rows, n // 2 if activation == "swiglu" else n), dtype=_out_dtype(x, out_dtype))
    _scales(op, scale_a, scale_b, e)
    _C.ag_moe(w._h, _d(x), topk_idx, _d(topk_weights), _d(w_up), routing.buffer, routing.shape, out, _stream(x),
              parse(_C.TpMoeAlgo, algo, "algo"), b_kn, _ACTIVATIONS[activation], float(alpha), _d(scale_a),
              _d(scale_b))
    return out, routing


def _down(op: str, rows: Tensor, w_down: Tensor, routing: MoeRouting, out: Optional[Tensor], world, algo: str,
          b_layout: str, alpha: float, scale_a: Optional[Tensor], scale_b: Optional[Tensor],
          out_dtype: Optional[torch.dtype], out_tokens) -> Tensor:
    w = resolve(world)
    _check_routing(op, routing)
    _matrix(rows, op, "rows")
    w_down, e = _stacked(w_down, routing.num_experts, op, "w_down")
    _scales(op, scale_a, scale_b, e)
    b_kn = _layout(op, b_layout)
    if out is None:
        h = w_down.shape[1] if b_kn else w_down.shape[0] // e
        out = rows.new_empty((out_tokens(w.world_size), h), dtype=_out_dtype(rows, out_dtype))
    getattr(_C, op)(w._h, _d(rows), _d(w_down), routing.buffer, routing.shape, out, _stream(rows),
                    parse(_C.TpMoeAlgo, algo, "algo"), b_kn, float(alpha), _d(scale_a), _d(scale_b))
    return out


def moe_rs(rows: Tensor, w_down: Tensor, routing: MoeRouting, *, out: Optional[Tensor] = None, world=None,
           algo: str = "auto", b_layout: str = "nk", alpha: float = 1.0, scale_a: Optional[Tensor] = None,
           scale_b: Optional[Tensor] = None, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """The TP-MoE down projection: out[T_loc, H] = reduce_scatter over ranks of the top-k reduce (fp32, weighted by
    routing.weights) of the grouped GEMM of rows [>= max_rows, K_loc] (ag_moe's out after the activation) with
    w_down: [E, H, K_loc] or stacked [E * H, K_loc], this rank's K-slice of every expert. routing: ag_moe's. Each rank
    receives its own tokens. out bf16 / fp16 / fp32 (default: rows' dtype). algo: "auto", "fused", "sequential"."""
    if isinstance(routing, MoeRouting) and routing.ranks not in (1, resolve(world).world_size):
        raise ValueError(f"moe_rs: routing must be ag_moe's (ranks = the world size {resolve(world).world_size}, or "
                         f"1: expert-major); given ranks {routing.ranks}")
    return _down("moe_rs", rows, w_down, routing, out, world, algo, b_layout, alpha, scale_a, scale_b, out_dtype,
                 lambda ws: routing.tokens // ws)


def moe_ar(rows: Tensor, w_down: Tensor, routing: MoeRouting, *, out: Optional[Tensor] = None, world=None,
           algo: str = "auto", b_layout: str = "nk", alpha: float = 1.0, scale_a: Optional[Tensor] = None,
           scale_b: Optional[Tensor] = None, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """As moe_rs for a batch every rank holds whole: routing of shape (T, k, E, 1, align) (moe_route on the same ids
    on every rank); out [T, H], the same on every rank (all_reduce). algo: "auto" (Sequential), "fused" (the one-shot
    fused reduce; raises where it cannot run), "sequential"."""
    return _down("moe_ar", rows, w_down, routing, out, world, algo, b_layout, alpha, scale_a, scale_b, out_dtype,
                 lambda ws: routing.tokens)


def release_moe_state(world=None) -> None:
    """Frees the TP-MoE ops' symmetric buffers on the World (collective; synchronises the device); the
    expert-parallel ops' state stays (release_moe_ep_state, release_ep_ll_state)."""
    _C.release_moe_state(resolve(world)._h)
