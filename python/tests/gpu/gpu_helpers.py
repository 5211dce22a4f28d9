"""Inputs and checks shared by the GPU tests."""
import os

import torch

# The run's seed (tests/run_gpu_tests.sh draws one and prints it; the same on every rank): mixed into every input.
RUN_SEED = int(os.environ.get("LOOM_TEST_SEED", "0"))


def rank_tensor(rank, shape, dtype=torch.float32, seed=0):
    """Rank `rank`'s input: random values of this run that every rank can regenerate (for the reference)."""
    g = torch.Generator(device="cuda").manual_seed((1000 * seed + rank + 1 + 7919 * RUN_SEED) % (1 << 63))
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


def assert_close(got, want, rel, slack=None):
    """Every element within rel x (|want| + want's RMS) + slack (per element: e.g. the roundings of partial sums), and
    the whole within rel in L2 (rel_err): an unwritten element (NaN poison) or one wrong element fails, which the L2
    norm alone would average away."""
    g, w = got.double(), want.double()
    assert g.shape == w.shape, f"shape {tuple(g.shape)}, expected {tuple(w.shape)}"
    rms = w.pow(2).mean().sqrt().item() if w.numel() else 0.0
    bound = rel * (w.abs() + rms) + (0 if slack is None else slack.double())
    bad = ~((g - w).abs() <= bound)
    if bad.any():
        i = bad.flatten().nonzero()[0].item()
        raise AssertionError(f"{int(bad.sum())} of {g.numel()} elements off; first at flat index {i}: "
                             f"{g.flatten()[i].item()} against {w.flatten()[i].item()} (rel {rel}, RMS {rms:.3g})")
    err = rel_err(got, want)
    assert err < rel, f"relative L2 error {err:.3g} >= {rel}"
