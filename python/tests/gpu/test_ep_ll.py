"""Expert-parallel MoE, low-latency mode (loom.EpLowLatencyBuffers, ep_ll_dispatch / ep_ll_combine) against torch:
the receive counts exactly, every received row against its source token (fp8: within e4m3's rounding of its
128-element block's scale), and combine of identity experts (expert_out = the received rows) against x times the
weight sum, with expert_out in the symmetric heap (read by the token ranks) and in torch memory (pushed), eagerly and
with return_without_waiting, the receive layout in torch memory and in the symmetric heap (written by the senders). Run: loomrun -n 2 python3 -m pytest -q python/tests/gpu -k ep_ll (2 to 8 ranks)."""
import pytest
import torch

import loom
from gpu_helpers import poisoned, rank_tensor, rel_err


def ll_inputs(rank, max_tokens, hidden, experts, topk, seed):
    """Rank `rank`'s T <= max_tokens tokens (T differs per rank; rank 2 has none), distinct experts, weights."""
    t = 0 if rank == 2 else max_tokens - rank % 3
    x = rank_tensor(rank, (t, hidden), torch.bfloat16, seed)
    idx = rank_tensor(rank, (t, experts), torch.float32, seed + 1).argsort(dim=1)[:, :topk].to(torch.int32)
    wts = rank_tensor(rank, (t, topk), torch.float32, seed + 2).softmax(dim=1)
    return x, idx, wts


@pytest.mark.parametrize("fp8", [True, False])
@pytest.mark.parametrize("hooked", [False, True])
@pytest.mark.parametrize("symmetric", [False, True])
def test_ep_ll_dispatch_then_identity_combine(world, fp8, hooked, symmetric):
    W, me, M, H, k = world.world_size, world.rank, 24, 512, 4
    E = 4 * W
    L = E // W
    x, idx, wts = ll_inputs(me, M, H, E, k, seed=61)
    b = loom.EpLowLatencyBuffers(M, H, k, E, fp8=fp8, symmetric=symmetric)
    loom.ep_ll_dispatch(x, idx, b, return_without_waiting=hooked)
    if hooked:
        loom.ep_ll_dispatch_wait()
    ins = [ll_inputs(r, M, H, E, k, seed=61) for r in range(W)]
    want = torch.stack([torch.bincount(i.flatten().long(), minlength=E)[me * L:(me + 1) * L] for _, i, _ in ins], 1)
    assert torch.equal(b.counts.long(), want)
    rows = b.x.float() * b.scales.repeat_interleave(128, dim=2) if fp8 else b.x.float()
    for le in range(L):
        for r in range(W):
            n = int(b.counts[le, r])
            src = b.src_info[le, r * M:r * M + n].long()
            assert bool(((src >= 0) & (src < ins[r][1].numel())).all())
            assert torch.equal(ins[r][1].flatten()[src].long(), torch.full_like(src, me * L + le))
            got, sent = rows[le, r * M:r * M + n].double(), ins[r][0][src // k].double()
            tol = 0.07 * sent.abs() + 1e-6 if fp8 else torch.zeros_like(sent)
            assert bool(((got - sent).abs() <= tol).all())
    want_y = x.double() * wts.double().sum(1, keepdim=True)
    for pulled in (True, False):
        eo = world.empty((L, W * M, H), torch.bfloat16) if pulled else torch.empty((L, W * M, H),
                                                                                      dtype=torch.bfloat16,
                                                                                      device="cuda")
        eo.copy_(rows.to(torch.bfloat16))
        y = loom.ep_ll_combine(eo, idx, wts, b, out=poisoned(tuple(x.shape), torch.bfloat16),
                               return_without_waiting=hooked)
        if hooked:
            loom.ep_ll_combine_wait()
        torch.cuda.synchronize()
        assert y.shape == x.shape and not bool(y.isnan().any())
        if x.shape[0] > 0:
            assert rel_err(y, want_y) < (0.05 if fp8 else 1e-2)
    loom.release_ep_ll_state()


def test_ep_ll_no_tokens_with_sliced_routing(world):
    """Every rank with no tokens, its routing sliced from wider tensors (torch gives an empty slice's copy the strides of
    the wide one): accepted as the empty tensors they are; nothing is received, y is [0, H]."""
    W, M, H, k = world.world_size, 8, 256, 2
    E = 2 * W
    b = loom.EpLowLatencyBuffers(M, H, k, E)
    x = torch.empty((0, H), dtype=torch.bfloat16, device="cuda")
    idx = torch.randn(0, E, device="cuda").argsort(dim=1)[:, :k].to(torch.int32)
    wts = torch.ones(0, E, device="cuda")[:, :k]
    loom.ep_ll_dispatch(x, idx, b)
    assert int(b.counts.sum()) == 0
    eo = torch.zeros((E // W, W * M, H), dtype=torch.bfloat16, device="cuda")
    y = loom.ep_ll_combine(eo, idx, wts, b)
    torch.cuda.synchronize()
    assert tuple(y.shape) == (0, H)
    loom.release_ep_ll_state()


def test_ep_ll_bad_shape_raises(world):
    W = world.world_size
    with pytest.raises(ValueError, match=f"num_experts must be a positive multiple of the world size {W}"):
        loom.EpLowLatencyBuffers(8, 256, 2, 4 * W + 1)
    b = loom.EpLowLatencyBuffers(8, 256, 2, 2 * W)
    x = torch.zeros(9, 256, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(loom.Error, match="ep_ll_dispatch: x: expected at most shape.max_tokens = 8 tokens"):
        loom.ep_ll_dispatch(x, torch.zeros(9, 2, dtype=torch.int32, device="cuda"), b)
    loom.release_ep_ll_state()
