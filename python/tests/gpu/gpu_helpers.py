"""Inputs and checks shared by the GPU tests."""
import torch


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
