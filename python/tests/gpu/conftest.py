"""GPU tests of the Python package, one pytest per rank: loomrun -n 2 python -m pytest -q python/tests/gpu
(2 or 4 ranks; ranks may share one GPU). Every rank runs every test in the same order: the ops are collective."""
import pytest
import torch

import loom

NO_GPU = "" if loom.gpu_available() and torch.cuda.is_available() else (
    f"no GPU: {loom._C.gpu_unavailable_reason() or 'torch sees no CUDA device'}")


def pytest_collection_modifyitems(config, items):
    if NO_GPU:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=NO_GPU))


@pytest.fixture(scope="session")
def world():
    w = loom.init()
    yield w
    torch.cuda.synchronize()
    w.shutdown()


def rank_tensor(rank, shape, dtype=torch.float32, seed=0):
    """Rank `rank`'s input: fresh random values that every rank can regenerate (for the reference)."""
    g = torch.Generator(device="cuda").manual_seed(1000 * seed + rank + 1)
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def sym_input(world, shape, dtype=torch.float32, seed=0):
    x = world.empty(shape, dtype)
    x.copy_(rank_tensor(world.rank, shape, dtype, seed))
    return x


def poisoned(shape, dtype, device="cuda"):
    return torch.full(shape, float("nan") if dtype.is_floating_point else -7, dtype=dtype, device=device)


def rel_err(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
