"""GPU tests of the Python package, one pytest per rank: loomrun -n 2 python -m pytest -q python/tests/gpu
(2 or 4 ranks; ranks may share one GPU). Every rank runs every test in the same order: the ops are collective."""
import pathlib

import pytest
import torch

import loom

NO_GPU = "" if loom.gpu_available() and torch.cuda.is_available() else (
    f"no GPU: {loom._C.gpu_unavailable_reason() or 'torch sees no CUDA device'}")


def pytest_collection_modifyitems(config, items):
    here = pathlib.Path(__file__).parent
    for item in items:  # the hook sees every collected item: mark only this folder's
        if NO_GPU and here in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.skip(reason=NO_GPU))


@pytest.fixture(scope="session")
def world():
    w = loom.init()
    yield w
    torch.cuda.synchronize()
    w.shutdown()
