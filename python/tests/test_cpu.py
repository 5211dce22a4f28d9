"""CPU tests of the Python package that need neither a GPU nor torch: import, rank facts from a synthetic
environment, Worlds without a heap, the JIT's compile and argument packing. test_cpu_torch.py has those of the
tensor API."""
import os
import pathlib
import socket
import subprocess
import sys
import threading

import pytest

import loom

try:
    import torch
except ImportError:  # the tensor API's parts of these tests are in test_cpu_torch.py's skip
    torch = None

ROOT = pathlib.Path(__file__).resolve().parents[2]
def test_every_world_op_has_a_python_function():
    """Each public C++ op that takes a World (include/loom/ops/*.hpp) has a Python function of its name in the package,
    listed in loom.__all__ (read as text: the tensor API's modules import torch)."""
    import re

    cpp = set()
    for h in (ROOT / "include" / "loom" / "ops").glob("*.hpp"):
        cpp |= set(re.findall(r"^[A-Za-z:<>]+ ([a-z_0-9]+)\(World& world", h.read_text(), re.M))
    pkg = ROOT / "python" / "loom"
    defs = set()
    for f in pkg.glob("*.py"):
        defs |= set(re.findall(r"^def ([a-z_0-9]+)\(", f.read_text(), re.M))
    init = (pkg / "__init__.py").read_text()
    exported = set(re.findall(r'"([a-z_0-9]+)"', init[init.index("__all__"):]))
    # The collectives are module functions of ops.py's table; release_collective_state / release_overlap_state are
    # World methods.
    world_methods = {"release_collective_state", "release_overlap_state"}
    assert cpp, "no ops parsed"
    missing = sorted(n for n in cpp - world_methods if n not in exported or (n not in defs and n not in init))
    assert not missing, f"C++ ops with no Python function in loom.__all__: {missing}"


def test_version_is_the_version_file():
    assert loom.__version__ == (ROOT / "VERSION").read_text().strip()


def test_rank_info_conventions():
    r = loom.rank_info({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                        "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "1234"})
    assert (r["rank"], r["world_size"], r["local_rank"], r["local_world_size"], r["node"]) == (3, 4, 1, 2, 1)
    # Loom's store takes MASTER_PORT + 1: torchrun's own store holds MASTER_PORT.
    assert (r["master_addr"], r["master_port"], r["source"]) == ("10.1.2.3", 1235, "torchrun")
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
    if torch is not None:
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


def _listener_with_free_next_port():
    """A listening socket on a port P whose P + 1 was free when checked (an ephemeral P alone says nothing of P + 1)."""
    for _ in range(100):
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                held.close()
                continue
        held.listen()
        return held, port
    raise RuntimeError("no port P with P + 1 free in 100 tries")


def test_world_from_env_beside_torchruns_store():
    # A listener holds MASTER_PORT, as torchrun's store does; Loom's store comes up on MASTER_PORT + 1.
    held, port = _listener_with_free_next_port()
    with held:
        code = ("import loom; w = loom.World.from_env(create_heap=False, bind_device=False); "
                "print(w.rank, w.world_size, w.info['source'], w.info['master_port']); w.shutdown()")
        p = _python(code, {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0", "1", "torchrun", str(port + 1)]


def test_world_from_env_reports_a_malformed_variable():
    code = "import loom\ntry:\n loom.World.from_env(create_heap=False, bind_device=False)\nexcept loom.Error as e:\n print(e)"
    p = _python(code, {"LOOM_RANK": "zero", "LOOM_WORLD_SIZE": "2"})
    assert p.returncode == 0, p.stderr
    assert "LOOM_RANK" in p.stdout


def test_default_world_needs_init():
    with pytest.raises(RuntimeError, match="loom.init"):
        loom.default_world()


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
    if torch is not None:
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
    assert parse(_C.TpMoeAlgo, "fused", "algo") == _C.TpMoeAlgo.Fused
    with pytest.raises(ValueError, match="'auto'"):
        parse(_C.ArAlgo, "magic", "algo")


def test_every_binding_names_python_types():
    """A C++ type in a signature (say std::string without nanobind's caster) makes every call a TypeError."""
    from loom import _C

    for name in dir(_C):
        doc = getattr(getattr(_C, name), "__doc__", None) or ""
        assert "std::" not in doc, f"loom._C.{name}: a parameter has no Python type: {doc.splitlines()[0]}"


def test_decode_bindings_want_cuda_tensors():
    np = pytest.importorskip("numpy", reason="numpy is not installed: the binding's check needs a DLPack tensor")
    from loom import _C

    q, k = np.zeros((2, 8, 64), np.float32), np.zeros((2, 32, 2, 64), np.float32)
    lens = np.full(2, 32, np.int32)
    with pytest.raises(ValueError, match="decode_attention: q must be a CUDA tensor; given a cpu tensor of shape "
                                         r"\[2, 8, 64\]"):
        _C.decode_attention(q, k, k, lens, None, q, None, 0)
    assert callable(_C.sp_decode_attention) and callable(_C.release_attention_state)


def test_moe_routing_layout():
    """The routing buffer's layout (host arithmetic, no GPU): 256-byte-aligned arrays in the order of docs/moe.md."""
    from loom import _C

    lay = _C.moe_routing_layout((64, 2, 8, 2, 4))  # T 64, k 2, E 8, 2 ranks (G 16), align 4
    assert lay["max_rows"] == 64 * 2 + 16 * 3
    assert lay["offsets"] == 0 and lay["counts"] == 256 and lay["dest_rows"] == 512
    assert lay["row_tokens"] == 1024 and lay["weights"] == 1792  # dest_rows: 128 int32; row_tokens: 176 int32
    assert lay["bytes"] >= lay["weights"] + 128 * 4 and lay["bytes"] % 256 == 0
    with pytest.raises(_C.Error, match="topk: expected <= num_experts"):
        _C.moe_routing_layout((64, 9, 8, 1, 1))
    with pytest.raises(_C.Error, match="tokens: expected a multiple of ranks"):
        _C.moe_routing_layout((63, 2, 8, 2, 1))


def test_moe_bindings_want_cuda_tensors():
    np = pytest.importorskip("numpy", reason="numpy is not installed: the binding's check needs a DLPack tensor")
    from loom import _C

    shape = (8, 2, 4, 1, 1)
    buf = np.zeros(_C.moe_routing_layout(shape)["bytes"], np.uint8)
    idx, x = np.zeros((8, 2), np.int32), np.zeros((8, 64), np.float32)
    with pytest.raises(ValueError, match=r"moe_route: topk_idx must be a CUDA tensor; given a cpu tensor of shape "
                                         r"\[8, 2\]"):
        _C.moe_route(idx, None, buf, shape, 0)
    with pytest.raises(ValueError, match="moe_permute: routing buffer must be a CUDA tensor; given a cpu tensor"):
        _C.moe_permute(x, buf, shape, x, 0)
    with pytest.raises(ValueError, match="moe_topk_reduce: routing buffer must be a CUDA tensor; given a cpu tensor"):
        _C.moe_topk_reduce(x, buf, shape, x, 0)
    for name in ("ag_moe", "moe_rs", "moe_ar", "release_moe_state"):  # these need a World (a GPU) first
        assert callable(getattr(_C, name)), name
    assert {m.name for m in _C.TpMoeAlgo} == {"Auto", "Fused", "Sequential"}
