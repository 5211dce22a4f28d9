"""CPU tests of the Python package's tensor API (torch, no GPU): dtype mapping, argument checking of the ops, the
custom ops' registration and fake implementations."""
import pytest

import loom
from test_cpu import _cpu_world

torch = pytest.importorskip("torch", reason="torch is not installed: the tensor API's CPU tests need it")


@pytest.mark.parametrize("dtype,name,size", [(torch.float32, "F32", 4), (torch.float16, "F16", 2),
                                             (torch.bfloat16, "BF16", 2), (torch.float8_e4m3fn, "F8E4M3", 1),
                                             (torch.int32, "I32", 4), (torch.int64, "I64", 8),
                                             (torch.uint8, "U8", 1)])
def test_dtype_mapping(dtype, name, size):
    from loom import _dtypes

    d = _dtypes.to_loom(dtype)
    assert d == getattr(loom.DType, name)
    assert _dtypes.to_torch(d) == dtype
    assert _dtypes.itemsize(dtype) == size == dtype.itemsize


@pytest.mark.parametrize("dtype", [torch.float64, torch.int8, torch.bool, torch.complex64])
def test_dtype_rejected(dtype):
    from loom import _dtypes

    with pytest.raises(ValueError, match=str(dtype).removeprefix("torch.")):
        _dtypes.to_loom(dtype)


# ---- ops: argument checking (no GPU: the checks that come before any device work) ---------------------------------
@pytest.fixture
def world(free_port):
    w = _cpu_world(port=free_port)
    yield w
    w.shutdown()


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_reduce", "all_to_all"])
def test_collective_wants_a_cuda_tensor(world, op):
    with pytest.raises(ValueError, match=f"{op}: input must be a CUDA tensor; given a cpu tensor"):
        getattr(loom, op)(torch.ones(8), world=world)


def test_collective_rejects_dtype_and_layout(world):
    with pytest.raises(ValueError, match="all_reduce: input must have dtype .* given float64"):
        loom.all_reduce(torch.ones(8, dtype=torch.float64), world=world)
    with pytest.raises(ValueError, match="algo: expected one of"):
        loom.all_reduce(torch.ones(8), world=world, algo="fastest")
    with pytest.raises(ValueError, match="path: expected one of"):
        loom.all_gather(torch.ones(8), world=world, path="carrier pigeon")
    with pytest.raises(ValueError, match="reduce_scatter: the input's first dimension must be a multiple"):
        loom.reduce_scatter(torch.ones(3), world=_FakeWorld(2))
    with pytest.raises(ValueError, match="all_to_all_v: pass out= or capacity="):
        loom.all_to_all_v(torch.ones(8), torch.ones(1, dtype=torch.int64), world=world)


def test_gemm_checks(world):
    a, b = torch.ones(16, 32, dtype=torch.bfloat16), torch.ones(8, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="gemm: a must be a CUDA tensor"):
        loom.gemm(a, b)
    with pytest.raises(ValueError, match="gemm: a must be a 2-D tensor; given shape \\[16, 32, 1\\]"):
        loom.gemm(a[..., None], b)
    with pytest.raises(ValueError, match="gemm: a must have dtype .* given float64"):
        loom.gemm(a.double(), b)
    with pytest.raises(ValueError, match="beta"):
        loom.gemm(a, b, beta=1.0)
    with pytest.raises(ValueError, match="gemm_rs: a's rows M must be a multiple of the world size"):
        loom.gemm_rs(a[:15], b, world=_FakeWorld(2))
    with pytest.raises(ValueError, match="producer: expected one of"):
        loom.ag_gemm(a, b, world=world, producer="telepathy")


def _decode_inputs(batch=2, hq=8, hkv=2, d=64, tokens=32, dtype=torch.bfloat16):
    q = torch.zeros(batch, hq, d, dtype=dtype)
    k = torch.zeros(batch, tokens, hkv, d, dtype=dtype)
    return q, k, k.clone(), torch.full((batch,), tokens, dtype=torch.int32)


@pytest.mark.parametrize("op", ["decode_attention", "sp_decode_attention"])
def test_decode_attention_checks(world, op):
    f = getattr(loom, op)
    q, k, v, lens = _decode_inputs()
    kw = {"world": world} if op == "sp_decode_attention" else {}
    with pytest.raises(ValueError, match=f"{op}: q must be a CUDA tensor; given a cpu tensor"):
        f(q, k, v, lens, **kw)  # every shape below is consistent: the binding's device check is what raises
    with pytest.raises(ValueError, match=f"{op}: q must be 3-D .*; given shape \\[2, 512\\]"):
        f(q.view(2, -1), k, v, lens, **kw)
    with pytest.raises(ValueError, match=f"{op}: k_cache must be 4-D"):
        f(q, k[0], v, lens, **kw)
    with pytest.raises(ValueError, match=f"{op}: v_cache must have q's dtype torch.bfloat16; given torch.float16"):
        f(q, k, v.half(), lens, **kw)
    with pytest.raises(ValueError, match=f"{op}: v_cache must have k_cache's shape \\[2, 32, 2, 64\\]"):
        f(q, k, v[:, :16], lens, **kw)
    with pytest.raises(ValueError, match=f"{op}: k_cache's head_dim \\(dimension 3\\) must be q's 64; given 32"):
        f(q, k[..., :32], v[..., :32], lens, **kw)
    with pytest.raises(ValueError, match=f"{op}: seq_lens must be int32 \\[batch = 2\\]; given torch.int64"):
        f(q, k, v, lens.long(), **kw)
    with pytest.raises(ValueError, match=f"{op}: seq_lens must be int32 .*; given torch.int32 \\[3\\]"):
        f(q, k, v, torch.zeros(3, dtype=torch.int32), **kw)
    with pytest.raises(ValueError, match=f"{op}: a contiguous k_cache \\(no block_table\\) must be \\[batch = 2,"):
        f(q, k[:1], v[:1], lens, **kw)
    pages = k.view(8, 8, 2, 64)  # [num_pages, page_size, kv heads, D]: any page count with a block table
    with pytest.raises(ValueError, match=f"{op}: block_table must be int32 \\[batch = 2, max_pages\\]"):
        f(q, pages, pages, lens, torch.zeros(2, 4, dtype=torch.int64), **kw)
    with pytest.raises(ValueError, match=f"{op}: block_table must be int32 \\[batch = 2, max_pages\\]"):
        f(q, pages, pages, lens, torch.zeros(3, 4, dtype=torch.int32), **kw)
    with pytest.raises(ValueError, match=f"{op}: q must be a CUDA tensor"):
        f(q, pages, pages, lens, torch.zeros(2, 4, dtype=torch.int32), **kw)


def test_ep_ll_checks(world):
    with pytest.raises(ValueError, match="EpLowLatencyBuffers: num_experts must be a positive multiple of the world "
                                         "size 2; given 3"):
        loom.EpLowLatencyBuffers(8, 256, 2, 3, world=_FakeWorld(2))
    with pytest.raises(ValueError, match="EpLowLatencyBuffers: hidden must be a positive multiple of 128; given 100"):
        loom.EpLowLatencyBuffers(8, 100, 2, 4, world=world)
    b = loom.EpLowLatencyBuffers.__new__(loom.EpLowLatencyBuffers)  # CPU stand-ins for the receive layout
    b.max_tokens, b.hidden, b.topk, b.num_experts, b.fp8, b.local_experts, b.symmetric = 8, 256, 2, 4, False, 4, False
    b.x, b.scales = torch.zeros(4, 8, 256, dtype=torch.bfloat16), None
    b.src_info, b.counts = torch.zeros(4, 8, dtype=torch.int32), torch.zeros(4, 1, dtype=torch.int32)
    x, idx = torch.zeros(4, 256, dtype=torch.bfloat16), torch.zeros(4, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="ep_ll_dispatch: topk_idx must be int32 \\[T = 4, topk = 2\\]; given "
                                         "torch.int64"):
        loom.ep_ll_dispatch(x, idx.long(), b, world=world)
    with pytest.raises(ValueError, match="ep_ll_dispatch: x must be a CUDA tensor; given a cpu tensor"):
        loom.ep_ll_dispatch(x, idx, b, world=world)
    eo = torch.zeros(4, 8, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="ep_ll_combine: topk_weights must be float32 of topk_idx's shape"):
        loom.ep_ll_combine(eo, idx, torch.zeros(4, 2, dtype=torch.float64), b, world=world)
    with pytest.raises(ValueError, match="ep_ll_combine: expert_out must be a CUDA tensor"):
        loom.ep_ll_combine(eo, idx, torch.zeros(4, 2), b, world=world)


class _FakeWorld:
    """A registered stand-in with a world size (shape checks only)."""

    def __init__(self, size):
        from loom import world as w

        self.world_size = size
        self.id = w._register(self)


# ---- custom ops: registered, with fake implementations ----------------------------------------------------------
def test_custom_ops_registered():
    for name in ["gemm", "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "all_to_all_v", "ag_gemm",
                 "gemm_rs", "gemm_ar"]:
        assert hasattr(torch.ops.loom, name), name
    for name in ["gemm", "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "ag_gemm", "gemm_rs", "gemm_ar"]:
        assert hasattr(torch.ops.loom, f"{name}_into"), name


def test_fake_implementations_give_shapes():
    w = _FakeWorld(4)
    x = torch.empty(8, 16, device="meta", dtype=torch.bfloat16)
    assert torch.ops.loom.all_gather(x, w.id, "auto", "auto", "sum", 0).shape == (32, 16)
    assert torch.ops.loom.reduce_scatter(x, w.id, "auto", "auto", "sum", 0).shape == (2, 16)
    assert torch.ops.loom.all_reduce(x, w.id, "auto", "auto", "sum", 0).shape == (8, 16)
    b = torch.empty(24, 16, device="meta", dtype=torch.bfloat16)
    c = torch.ops.loom.gemm(x, b, None, None, None, 1.0, False, torch.float32)
    assert (c.shape, c.dtype) == ((8, 24), torch.float32)
    assert torch.ops.loom.ag_gemm(x, b, w.id, "auto", 1.0, None, None, 0, 0, torch.bfloat16).shape == (32, 24)
    assert torch.ops.loom.gemm_rs(x, b, w.id, "auto", "auto", 1.0, None, None, 0, 0, torch.bfloat16).shape == (2, 24)
    assert torch.ops.loom.gemm_ar(x, b, w.id, "auto", 1.0, None, None, 0, 0, torch.bfloat16).shape == (8, 24)


def test_fake_tensor_mode_traces_an_op():
    from torch._subclasses.fake_tensor import FakeTensorMode

    w = _FakeWorld(2)
    with FakeTensorMode():
        x = torch.empty(4, 8)
        y = torch.ops.loom.all_gather(x, w.id, "auto", "auto", "sum", 0)
    assert y.shape == (8, 8)
