"""Loom's ops on torch tensors: loom.gemm, the collectives and the overlapped GEMMs.

Every op runs on the current torch stream of its inputs' device, releases the GIL while it enqueues, and never
synchronises the host. It returns a new tensor, or writes ``out=`` and returns it. Wrong devices, dtypes and layouts
raise ValueError; what Loom's C++ op rejects (shapes against each other, buffers outside the symmetric heap where an
algorithm needs them, world size) raises loom.Error (a RuntimeError) with Loom's message.

Each op is also a torch custom op (``torch.ops.loom.<name>`` and ``torch.ops.loom.<name>_into`` for out=) with a
fake implementation, so it traces under torch.compile; eager calls skip the dispatcher. The collectives and
collective ops are collective over the World: every rank calls them in the same order with the same shapes.
CUDA graphs: the collectives replay (make one eager call of every captured call first); among the overlapped ops
only the algorithms docs/overlap.md names do, the others raise on a capturing stream.
"""
from typing import Optional

import torch
from torch import Tensor

from . import _C
from ._enums import parse
from .world import lookup, resolve

__all__ = ["gemm", "grouped_gemm", "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "all_to_all_v", "ag_gemm", "gemm_rs",
           "gemm_ar", "barrier_on_stream"]


def _stream(t: Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _d(t: Optional[Tensor]) -> Optional[Tensor]:
    """What crosses over DLPack: a tensor that requires grad is exported as its detached view."""
    return t.detach() if t is not None and t.requires_grad else t


def _scales(op: str, scale_a: Optional[Tensor], scale_b: Optional[Tensor], b_scales: int) -> None:
    """The device scales' sizes, which the kernels read without knowing them: scale_a one float32, scale_b
    `b_scales` float32 (one for a GEMM, one per expert for a grouped GEMM)."""
    for arg, t, n in (("scale_a", scale_a, 1), ("scale_b", scale_b, b_scales)):
        if t is not None and (t.dtype != torch.float32 or t.numel() != n):
            raise ValueError(f"{op}: {arg} must hold {n} float32 value{'s' if n != 1 else ''}; given {t.dtype} of "
                             f"{t.numel()} elements")


def _matrix(t: Tensor, op: str, arg: str) -> None:
    if t.dim() != 2:
        raise ValueError(f"{op}: {arg} must be a 2-D tensor; given shape {list(t.shape)}")


def _out_dtype(a: Tensor, out_dtype: Optional[torch.dtype]) -> torch.dtype:
    if out_dtype is not None:
        return out_dtype
    return a.dtype if a.dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.bfloat16


def _eager() -> bool:
    return not torch.compiler.is_compiling()


# ---- collectives ---------------------------------------------------------------------------------------------------
def _coll_shape(kind: str, x: Tensor, world_size: int):
    if kind == "all_gather":
        return (world_size * x.shape[0], *x.shape[1:]) if x.dim() else (world_size,)
    if kind == "reduce_scatter":
        if x.dim() == 0 or x.shape[0] % world_size:
            raise ValueError(f"reduce_scatter: the input's first dimension must be a multiple of the world size "
                             f"{world_size}; given shape {list(x.shape)}")
        return (x.shape[0] // world_size, *x.shape[1:])
    return tuple(x.shape)  # all_reduce, all_to_all


def _coll(kind: str, x: Tensor, out: Tensor, world: int, algo: str, path: str, op: str, num_sms: int) -> None:
    fn = getattr(_C, kind)
    fn(lookup(world)._h, _d(x), out, _stream(x), parse(_C.CollAlgo, algo, "algo"), parse(_C.DataPath, path, "path"),
       parse(_C.ReduceOp, op, "op"), num_sms)


def _custom_op(name: str, impl, fake, mutates=()):
    """Registers impl as torch.ops.loom.<name> with its fake (meta) implementation; returns the op."""
    op = torch.library.custom_op(f"loom::{name}", impl, mutates_args=mutates)
    op.register_fake(fake)
    return op


def _define_collective(kind: str):
    """torch.ops.loom.<kind> (returns a new tensor), torch.ops.loom.<kind>_into (writes out), and the public
    function, which calls the C++ op directly in eager mode and the custom op while torch.compile traces."""

    def functional(x: Tensor, world: int, algo: str, path: str, op: str, num_sms: int) -> Tensor:
        out = x.new_empty(_coll_shape(kind, x, lookup(world).world_size))
        _coll(kind, x, out, world, algo, path, op, num_sms)
        return out

    def into(x: Tensor, out: Tensor, world: int, algo: str, path: str, op: str, num_sms: int) -> None:
        _coll(kind, x, out, world, algo, path, op, num_sms)

    functional_op = _custom_op(kind, functional,
                               lambda x, world, *_: x.new_empty(_coll_shape(kind, x, lookup(world).world_size)))
    into_op = _custom_op(f"{kind}_into", into, lambda *_: None, mutates=("out",))

    def call(x: Tensor, *, out: Optional[Tensor] = None, world=None, algo: str = "auto", path: str = "auto",
             op: str = "sum", num_sms: int = 0) -> Tensor:
        wid = resolve(world).id
        if out is None:
            return (functional if _eager() else functional_op)(x, wid, algo, path, op, num_sms)
        (into if _eager() else into_op)(x, out, wid, algo, path, op, num_sms)
        return out

    call.__name__ = call.__qualname__ = kind
    return call


all_gather = _define_collective("all_gather")
all_gather.__doc__ = """out[W * n, ...] = every rank's x[n, ...], in rank order. Push / Ring need out symmetric, Pull
needs x symmetric (Auto picks what the buffers allow; a tensor from world.empty() is symmetric)."""
reduce_scatter = _define_collective("reduce_scatter")
reduce_scatter.__doc__ = """out[n, ...] = op over ranks of rows [rank * n, (rank + 1) * n) of x[W * n, ...]
(op: "sum" or "max"; fp32 accumulation for 16-bit types)."""
all_reduce = _define_collective("all_reduce")
all_reduce.__doc__ = """out = op over ranks of x (same shape; op: "sum" or "max"). out=x reduces in place."""
all_to_all = _define_collective("all_to_all")
all_to_all.__doc__ = """Equal splits: x holds W blocks of x.numel() / W elements; block j goes to rank j, where it lands
as block `rank` of out (same shape as x). Not in place."""


# ---- all_to_all_v ----------------------------------------------------------------------------------------------------
def _a2av(x: Tensor, out: Tensor, send_counts: Tensor, send_offsets: Optional[Tensor], recv_counts: Tensor,
          world: int, algo: str, path: str, num_sms: int) -> None:
    w = lookup(world)
    for name, t in (("send_counts", send_counts), ("send_offsets", send_offsets), ("recv_counts", recv_counts)):
        if t is not None and t.numel() != w.world_size:
            raise ValueError(f"all_to_all_v: {name} must hold world size = {w.world_size} int64 counts; given "
                             f"{t.numel()} elements")
    _C.all_to_all_v(w._h, _d(x), out, send_counts, send_offsets, recv_counts, _stream(x),
                    parse(_C.CollAlgo, algo, "algo"), parse(_C.DataPath, path, "path"), num_sms)


_a2av_op = _custom_op("all_to_all_v", _a2av, lambda *_: None, mutates=("out", "recv_counts"))


def all_to_all_v(x: Tensor, send_counts: Tensor, *, capacity: Optional[int] = None, out: Optional[Tensor] = None,
                 send_offsets: Optional[Tensor] = None, recv_counts: Optional[Tensor] = None, world=None,
                 algo: str = "auto", path: str = "auto", num_sms: int = 0):
    """Variable splits with counts on the device (MoE): send_counts[j] (int64[W]) elements of x go to rank j, taken
    from x at send_offsets (int64[W]; None: packed prefix sums). Each rank's out (1-D, capacity elements, the same on
    every rank: pass out= or capacity=) receives the blocks packed in source-rank order; recv_counts (int64[W],
    allocated when None) receives what each rank sent. Returns (out, recv_counts). Any device tensors: counts, x and
    out in the symmetric heap (world.empty) save the staging copies of docs/collectives.md. No host synchronisation."""
    w = resolve(world)
    if out is None:
        if capacity is None:
            raise ValueError("all_to_all_v: pass out= or capacity= (elements of out, the same on every rank)")
        out = x.new_empty((capacity,))
    if recv_counts is None:
        recv_counts = torch.empty(w.world_size, dtype=torch.int64, device=x.device)
    (_a2av if _eager() else _a2av_op)(x, out, send_counts, send_offsets, recv_counts, w.id, algo, path, num_sms)
    return out, recv_counts


def barrier_on_stream(world=None, stream=None) -> None:
    """Stream-ordered barrier over the node's ranks: no rank's stream passes it before every rank's reached it."""
    w = resolve(world)
    s = torch.cuda.current_stream(w.device).cuda_stream if stream is None else int(getattr(stream, "cuda_stream",
                                                                                           stream))
    _C.barrier_on_stream(w._h, s)


# ---- gemm ----------------------------------------------------------------------------------------------------------
def _gemm_shape(a: Tensor, b: Tensor, b_kn: bool):
    _matrix(a, "gemm", "a")
    _matrix(b, "gemm", "b")
    return (a.shape[0], b.shape[1] if b_kn else b.shape[0])


def _gemm_into(a: Tensor, b: Tensor, out: Tensor, bias: Optional[Tensor], scale_a: Optional[Tensor],
               scale_b: Optional[Tensor], alpha: float, beta: float, b_kn: bool) -> None:
    _C.gemm(_d(a), _d(b), out, _stream(a), alpha, beta, _d(bias), b_kn, _d(scale_a), _d(scale_b))


def _gemm(a: Tensor, b: Tensor, bias: Optional[Tensor], scale_a: Optional[Tensor], scale_b: Optional[Tensor],
          alpha: float, b_kn: bool, out_dtype: torch.dtype) -> Tensor:
    out = a.new_empty(_gemm_shape(a, b, b_kn), dtype=out_dtype)
    _gemm_into(a, b, out, bias, scale_a, scale_b, alpha, 0.0, b_kn)
    return out


_gemm_op = _custom_op("gemm", _gemm, lambda a, b, bias, sa, sb, alpha, b_kn, dt: a.new_empty(
    _gemm_shape(a, b, b_kn), dtype=dt))
_gemm_into_op = _custom_op("gemm_into", _gemm_into, lambda *_: None, mutates=("out",))


def gemm(a: Tensor, b: Tensor, *, out: Optional[Tensor] = None, bias: Optional[Tensor] = None, alpha: float = 1.0,
         beta: float = 0.0, b_kn: bool = False, scale_a: Optional[Tensor] = None, scale_b: Optional[Tensor] = None,
         out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """out[M, N] = alpha * scale_a * scale_b * a[M, K] @ b[N, K].T + beta * out + bias[N] (b_kn: b is [K, N]).
    bf16 / fp16, or float8_e4m3fn for both (b as [N, K]); fp32 accumulation; out bf16 / fp16 / fp32 (default: a's
    dtype, bf16 for fp8). M, N, K multiples of 8 (K of 16 for fp8). scale_a / scale_b: one float32 on the device.
    beta needs out=. Takes no World."""
    _scales("gemm", scale_a, scale_b, 1)
    if bias is not None and (bias.dim() != 1 or bias.numel() != (b.shape[-1] if b_kn else b.shape[0])):
        raise ValueError(f"gemm: bias must be 1-D of N = {b.shape[-1] if b_kn else b.shape[0]} elements; given shape "
                         f"{list(bias.shape)}")
    if out is None:
        if beta != 0.0:
            raise ValueError("gemm: beta != 0 reads out: pass out=")
        args = (a, b, bias, scale_a, scale_b, float(alpha), b_kn, _out_dtype(a, out_dtype))
        return _gemm(*args) if _eager() else _gemm_op(*args)
    args = (a, b, out, bias, scale_a, scale_b, float(alpha), float(beta), b_kn)
    (_gemm_into if _eager() else _gemm_into_op)(*args)
    return out


# ---- grouped_gemm (MoE) -------------------------------------------------------------------------------------------
_ACTIVATIONS = {"none": 0, "swiglu": 1, "gelu": 2}


def grouped_gemm(a: Tensor, b: Tensor, offsets: Tensor, *, num_experts: Optional[int] = None,
                 out: Optional[Tensor] = None, b_layout: str = "nk", activation: str = "none", alpha: float = 1.0,
                 scale_a: Optional[Tensor] = None, scale_b: Optional[Tensor] = None,
                 out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """out[rows of group g] = act(alpha * scale_a * scale_b[e] * a[rows of g] @ B_e.T), e = g % num_experts, group g
    owning rows [offsets[g], offsets[g + 1]) (offsets: int32 on the device, len G + 1; never read by the host).
    b: [E, N, K] (b_layout "nk") or [E, K, N] ("kn"), or 2-D stacked [E * N, K] / [E * K, N] with num_experts given.
    activation: "none", "swiglu" (out has N / 2 columns: silu(gate) * up, gate columns first), "gelu". bf16 / fp16 /
    float8_e4m3fn (b_layout "nk") in; out bf16 / fp16 / fp32. Rows of out outside every group are left as they are
    (uninitialised when out is None). Eager only (no torch.compile registration). docs/moe.md "Grouped GEMM"."""
    if b.dim() == 3:
        if num_experts is not None and num_experts != b.shape[0]:
            raise ValueError(f"grouped_gemm: num_experts {num_experts} disagrees with b's {b.shape[0]} experts")
        num_experts = b.shape[0]
        b = b.reshape(b.shape[0] * b.shape[1], b.shape[2])
    elif num_experts is None:
        raise ValueError("grouped_gemm: a 2-D b needs num_experts=")
    _matrix(a, "grouped_gemm", "a")
    _matrix(b, "grouped_gemm", "b")
    if b_layout not in ("nk", "kn"):
        raise ValueError(f"grouped_gemm: b_layout must be 'nk' or 'kn'; given {b_layout!r}")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"grouped_gemm: activation must be one of {sorted(_ACTIVATIONS)}; given {activation!r}")
    _scales("grouped_gemm", scale_a, scale_b, int(num_experts))
    b_kn = b_layout == "kn"
    n = b.shape[1] if b_kn else b.shape[0] // num_experts
    if out is None:
        cols = n // 2 if activation == "swiglu" else n
        out = a.new_empty((a.shape[0], cols), dtype=_out_dtype(a, out_dtype))
    _C.grouped_gemm(_d(a), _d(b), int(num_experts), out, offsets, _stream(a), b_kn, _ACTIVATIONS[activation],
                    float(alpha), _d(scale_a), _d(scale_b))
    return out


# ---- overlapped GEMMs ----------------------------------------------------------------------------------------------
def _ag_shape(a: Tensor, b: Tensor, world: int):
    _matrix(a, "ag_gemm", "a")
    _matrix(b, "ag_gemm", "b")
    return (lookup(world).world_size * a.shape[0], b.shape[0])


def _ag_gemm_into(a: Tensor, b: Tensor, out: Tensor, gathered: Optional[Tensor], world: int, producer: str,
                  alpha: float, scale_a: Optional[Tensor], scale_b: Optional[Tensor], comm_sms: int,
                  num_sms: int) -> None:
    _C.ag_gemm(lookup(world)._h, _d(a), _d(b), out, _stream(a), parse(_C.AgProducer, producer, "producer"), gathered,
               alpha, _d(scale_a), _d(scale_b), comm_sms, num_sms)


def _ag_gemm(a: Tensor, b: Tensor, world: int, producer: str, alpha: float, scale_a: Optional[Tensor],
             scale_b: Optional[Tensor], comm_sms: int, num_sms: int, out_dtype: torch.dtype) -> Tensor:
    out = a.new_empty(_ag_shape(a, b, world), dtype=out_dtype)
    _ag_gemm_into(a, b, out, None, world, producer, alpha, scale_a, scale_b, comm_sms, num_sms)
    return out


_ag_gemm_op = _custom_op("ag_gemm", _ag_gemm, lambda a, b, world, *rest: a.new_empty(
    _ag_shape(a, b, world), dtype=rest[-1]))
_ag_gemm_into_op = _custom_op("ag_gemm_into", _ag_gemm_into, lambda *_: None, mutates=("out", "gathered"))


def ag_gemm(a: Tensor, b: Tensor, *, out: Optional[Tensor] = None, gathered: Optional[Tensor] = None, world=None,
            producer: str = "auto", alpha: float = 1.0, scale_a: Optional[Tensor] = None,
            scale_b: Optional[Tensor] = None, comm_sms: int = 0, num_sms: int = 0,
            out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """out[M, N_loc] = all_gather(a)[M, K] @ b[N_loc, K].T, a: this rank's [M / W, K] rows; the GEMM consumes the
    gathered rows as they arrive. producer: "auto", "copy_engine", "sm", "direct", "sequential". gathered: an
    optional [M, K] symmetric tensor (world.empty) that receives all_gather(a). Hopper only."""
    wid = resolve(world).id
    if out is None and gathered is None:
        args = (a, b, wid, producer, float(alpha), scale_a, scale_b, comm_sms, num_sms, _out_dtype(a, out_dtype))
        return _ag_gemm(*args) if _eager() else _ag_gemm_op(*args)
    if out is None:
        out = a.new_empty(_ag_shape(a, b, wid), dtype=_out_dtype(a, out_dtype))
    args = (a, b, out, gathered, wid, producer, float(alpha), scale_a, scale_b, comm_sms, num_sms)
    (_ag_gemm_into if _eager() else _ag_gemm_into_op)(*args)
    return out


def _rs_shape(a: Tensor, b: Tensor, world: int):
    _matrix(a, "gemm_rs", "a")
    _matrix(b, "gemm_rs", "b")
    w = lookup(world).world_size
    if a.shape[0] % w:
        raise ValueError(f"gemm_rs: a's rows M must be a multiple of the world size {w}; given shape {list(a.shape)}")
    return (a.shape[0] // w, b.shape[0])


def _gemm_rs_into(a: Tensor, b: Tensor, out: Tensor, world: int, algo: str, transport: str, alpha: float,
                  scale_a: Optional[Tensor], scale_b: Optional[Tensor], comm_sms: int, num_sms: int) -> None:
    _C.gemm_rs(lookup(world)._h, _d(a), _d(b), out, _stream(a), parse(_C.RsAlgo, algo, "algo"),
               parse(_C.RsTransport, transport, "transport"), alpha, _d(scale_a), _d(scale_b), comm_sms, num_sms)


def _gemm_rs(a: Tensor, b: Tensor, world: int, algo: str, transport: str, alpha: float, scale_a: Optional[Tensor],
             scale_b: Optional[Tensor], comm_sms: int, num_sms: int, out_dtype: torch.dtype) -> Tensor:
    out = a.new_empty(_rs_shape(a, b, world), dtype=out_dtype)
    _gemm_rs_into(a, b, out, world, algo, transport, alpha, scale_a, scale_b, comm_sms, num_sms)
    return out


_gemm_rs_op = _custom_op("gemm_rs", _gemm_rs, lambda a, b, world, *rest: a.new_empty(
    _rs_shape(a, b, world), dtype=rest[-1]))
_gemm_rs_into_op = _custom_op("gemm_rs_into", _gemm_rs_into, lambda *_: None, mutates=("out",))


def gemm_rs(a: Tensor, b: Tensor, *, out: Optional[Tensor] = None, world=None, algo: str = "auto",
            transport: str = "auto", alpha: float = 1.0, scale_a: Optional[Tensor] = None,
            scale_b: Optional[Tensor] = None, comm_sms: int = 0, num_sms: int = 0,
            out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """out[M / W, N] = reduce_scatter over ranks of a[M, K_loc] @ b[N, K_loc].T (rows split by rank), reduced as
    the GEMM's tiles complete. algo: "auto", "fused_epilogue", "scatter_reduce", "sequential", "fused_pull";
    transport (fused_epilogue): "auto", "sm", "copy_engine". Hopper only."""
    wid = resolve(world).id
    if out is None:
        args = (a, b, wid, algo, transport, float(alpha), scale_a, scale_b, comm_sms, num_sms,
                _out_dtype(a, out_dtype))
        return _gemm_rs(*args) if _eager() else _gemm_rs_op(*args)
    args = (a, b, out, wid, algo, transport, float(alpha), scale_a, scale_b, comm_sms, num_sms)
    (_gemm_rs_into if _eager() else _gemm_rs_into_op)(*args)
    return out


def _ar_shape(a: Tensor, b: Tensor):
    _matrix(a, "gemm_ar", "a")
    _matrix(b, "gemm_ar", "b")
    return (a.shape[0], b.shape[0])


def _gemm_ar_into(a: Tensor, b: Tensor, out: Tensor, world: int, algo: str, alpha: float,
                  scale_a: Optional[Tensor], scale_b: Optional[Tensor], comm_sms: int, num_sms: int) -> None:
    _C.gemm_ar(lookup(world)._h, _d(a), _d(b), out, _stream(a), parse(_C.ArAlgo, algo, "algo"), alpha, _d(scale_a),
               _d(scale_b), comm_sms, num_sms)


def _gemm_ar(a: Tensor, b: Tensor, world: int, algo: str, alpha: float, scale_a: Optional[Tensor],
             scale_b: Optional[Tensor], comm_sms: int, num_sms: int, out_dtype: torch.dtype) -> Tensor:
    out = a.new_empty(_ar_shape(a, b), dtype=out_dtype)
    _gemm_ar_into(a, b, out, world, algo, alpha, scale_a, scale_b, comm_sms, num_sms)
    return out


_gemm_ar_op = _custom_op("gemm_ar", _gemm_ar, lambda a, b, world, *rest: a.new_empty(_ar_shape(a, b),
                                                                                    dtype=rest[-1]))
_gemm_ar_into_op = _custom_op("gemm_ar_into", _gemm_ar_into, lambda *_: None, mutates=("out",))


def gemm_ar(a: Tensor, b: Tensor, *, out: Optional[Tensor] = None, world=None, algo: str = "auto",
            alpha: float = 1.0, scale_a: Optional[Tensor] = None, scale_b: Optional[Tensor] = None,
            comm_sms: int = 0, num_sms: int = 0, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """out[M, N] = all_reduce over ranks of a[M, K_loc] @ b[N, K_loc].T, for small M (<= 128: decode). algo: "auto",
    "fused_epilogue", "reduce_kernel", "sequential". Hopper only."""
    wid = resolve(world).id
    if out is None:
        args = (a, b, wid, algo, float(alpha), scale_a, scale_b, comm_sms, num_sms, _out_dtype(a, out_dtype))
        return _gemm_ar(*args) if _eager() else _gemm_ar_op(*args)
    args = (a, b, out, wid, algo, float(alpha), scale_a, scale_b, comm_sms, num_sms)
    (_gemm_ar_into if _eager() else _gemm_ar_into_op)(*args)
    return out
