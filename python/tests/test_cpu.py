"""CPU tests of the Python package (no GPU): import, dtype mapping, rank facts from a synthetic environment, Worlds
without a heap, argument checking of the ops, the custom ops' fake implementations, the JIT's compile."""
import os
import pathlib
import subprocess
import sys
import threading

import pytest

import loom

torch = pytest.importorskip("torch", reason="torch is not installed: the tensor API's tests need it")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_version_is_the_version_file():
    assert loom.__version__ == (ROOT / "VERSION").read_text().strip()


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


def test_rank_info_conventions():
    r = loom.rank_info({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                        "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "1234"})
    assert (r["rank"], r["world_size"], r["local_rank"], r["local_world_size"], r["node"]) == (3, 4, 1, 2, 1)
    assert (r["master_addr"], r["master_port"], r["source"]) == ("10.1.2.3", 1234, "torchrun")
    r = loom.rank_info({"LOOM_RANK": "0", "LOOM_WORLD_SIZE": "2", "RANK": "1", "WORLD_SIZE": "2"})
    assert (r["rank"], r["source"]) == (0, "loom")
    r = loom.rank_info({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"})
    assert (r["rank"], r["world_size"], r["source"]) == (1, 2, "openmpi")
    r = loom.rank_info({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
                        "SLURM_TASKS_PER_NODE": "4(x2)", "MASTER_ADDR": "node0"})
    assert (r["rank"], r["local_rank"], r["local_world_size"], r["source"]) == (5, 1, 4, "slurm")
    assert loom.rank_info({})["source"] == "default"


@pytest.mark.parametrize("env,names", [({"LOOM_RANK": "x", "LOOM_WORLD_SIZE": "2"}, "LOOM_RANK"),
                                       ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK"),
                                       ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "port"}, "MASTER_PORT")])
def test_rank_info_errors_name_the_variable(env, names):
    with pytest.raises(loom.Error, match=names):
        loom.rank_info(env)
    assert issubclass(loom.Error, RuntimeError)


def _cpu_world(rank=0, size=1, port=0):
    return loom.World.create(rank, size, master_port=port, create_heap=False, bind_device=False)


def test_world_without_heap(free_port):
    w = _cpu_world(port=free_port)
    assert (w.rank, w.world_size, w.local_rank, w.device) == (0, 1, 0, -1)
    assert w.collect() == 0 and w.pending_frees() == 0
    assert w.all_gather_object({"a": 1}) == [{"a": 1}]
    with pytest.raises(loom.Error, match="no symmetric heap"):
        w.empty((4,), torch.float32)
    w.shutdown()
    w.shutdown()  # idempotent
    assert w.is_shut_down


def test_world_two_ranks_in_threads(free_port):
    worlds, errors = [None, None], []

    def rank(r):
        try:
            worlds[r] = _cpu_world(r, 2, free_port)
            assert worlds[r].all_gather_object(r * 10) == [0, 10]
            assert worlds[r].collect() == 0
            worlds[r].shutdown()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert all(w is not None and w.is_shut_down for w in worlds)


def test_world_create_checks_layout():
    with pytest.raises(loom.Error, match="rank"):
        loom.World.create(2, 2, create_heap=False, bind_device=False)
    with pytest.raises(loom.Error, match="node by node"):
        loom.World.create(1, 4, local_rank=0, local_world_size=2, create_heap=False, bind_device=False)


def _python(code, env):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("LOOM_", "RANK", "WORLD_SIZE", "MASTER_",
                                                                      "LOCAL_", "OMPI_", "SLURM_"))}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)


def test_world_from_env_in_a_fresh_process(free_port):
    code = ("import loom; w = loom.World.from_env(create_heap=False, bind_device=False); "
            "print(w.rank, w.world_size, w.info['source'], w.info['master_port']); w.shutdown()")
    p = _python(code, {"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": str(free_port)})
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0", "1", "torchrun", str(free_port)]


def test_world_from_env_reports_a_malformed_variable():
    code = "import loom\ntry:\n loom.World.from_env(create_heap=False, bind_device=False)\nexcept loom.Error as e:\n print(e)"
    p = _python(code, {"LOOM_RANK": "zero", "LOOM_WORLD_SIZE": "2"})
    assert p.returncode == 0, p.stderr
    assert "LOOM_RANK" in p.stdout


def test_default_world_needs_init():
    with pytest.raises(RuntimeError, match="loom.init"):
        loom.default_world()


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


# ---- JIT: compile without a GPU ------------------------------------------------------------------------------------
KERNEL = """
#include "loom/lang/context.cuh"
namespace user {
template <int kVec>
__global__ void scale_by_rank(loom::Ctx ctx, float a, const float* x, float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + static_cast<float>(ctx.rank + kVec);
}
}  // namespace user
"""


def test_jit_compiles_source_text_without_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOM_CACHE_DIR", str(tmp_path))  # the source file's folder (the JIT's cache is per process)
    k = loom.jit.compile(KERNEL, "user::scale_by_rank", [4], arch=90)
    assert k.info["compiler"] in ("nvrtc", "nvcc")
    assert k.info["registers"] != 0
    assert list((tmp_path / "python-src").glob("*.cuh"))
    with pytest.raises(RuntimeError, match="nothing to launch"):
        k.launch(1, 1)


def test_jit_compile_error_carries_the_log():
    with pytest.raises(loom.Error, match="user::broken"):
        loom.jit.compile("__global__ void broken_kernel() { this is not C++; }\n", "user::broken", arch=90)


def test_jit_argument_packing():
    from loom.jit import _arg

    assert _arg(7) == (7).to_bytes(4, "little")
    assert len(_arg(1.5)) == 4 and len(loom.jit.f64(1.5).data) == 8 and len(loom.jit.i64(-1).data) == 8
    with pytest.raises(TypeError, match="bool"):
        _arg(True)
    with pytest.raises(ValueError, match="CUDA tensor"):
        _arg(torch.ones(2))
    with pytest.raises(TypeError, match="str"):
        _arg("x")
    assert loom.jit._dim3(4) == (4, 1, 1) and loom.jit._dim3((2, 3)) == (2, 3, 1)
    with pytest.raises(ValueError):
        loom.jit._dim3((0,))


def test_enum_parsing():
    from loom import _C
    from loom._enums import parse

    assert parse(_C.CollAlgo, "one_shot", "algo") == _C.CollAlgo.OneShot
    assert parse(_C.DataPath, "copy-engine", "path") == _C.DataPath.CopyEngine
    assert parse(_C.RsAlgo, "FusedEpilogue", "algo") == _C.RsAlgo.FusedEpilogue
    with pytest.raises(ValueError, match="'auto'"):
        parse(_C.ArAlgo, "magic", "algo")
