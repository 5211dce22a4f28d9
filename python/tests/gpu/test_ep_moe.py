"""Expert-parallel MoE, throughput mode (loom.ep_dispatch / ep_combine / ep_moe_experts) against torch references:
the receive counts exactly, the layer (dispatch -> grouped GEMM -> combine) against an fp64 per-expert loop, and
ep_moe_experts' Overlapped against Sequential bitwise. Every rank regenerates every rank's routing (shared seeds).
Run: loomrun -n 2 python3 -m pytest -q python/tests/gpu -k ep   (2 or 4 ranks; ranks may share one GPU)."""
import pytest
import torch

import loom
from gpu_helpers import assert_close, poisoned, rank_tensor


def ep_inputs(rank, tokens, hidden, experts, topk, seed):
    """Rank `rank`'s tokens [T, H] bf16 (T differs per rank), distinct top-k expert ids (int32), weights (fp32)."""
    t = tokens - rank % 3
    x = rank_tensor(rank, (t, hidden), torch.bfloat16, seed) * 0.5
    idx = rank_tensor(rank, (t, experts), torch.float32, seed + 1).argsort(dim=1)[:, :topk].to(torch.int32)
    wts = rank_tensor(rank, (t, topk), torch.float32, seed + 2).softmax(dim=1)
    return x, idx, wts


def experts_reference(x, idx, wts, w_up, w_down=None, magnitude=False):
    """sum over slots of wts * expert(x), expert = x @ w_up[e].T (rounded to bf16 as the GEMM stores it), or with
    w_down: silu(gate) * up of x @ w_up[e].T (gate columns first; bf16) @ w_down[e].T (bf16); fp64 sums. magnitude:
    the same sum of |wts * expert(x)|, the scale of the roundings a right answer may differ by."""
    y = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64, device=x.device)
    for e in range(w_up.shape[0]):
        t, s = (idx == e).nonzero(as_tuple=True)
        if t.numel() == 0:
            continue
        h = x[t].double() @ w_up[e].double().T
        if w_down is not None:
            n = h.shape[1] // 2
            h = (torch.nn.functional.silu(h[:, :n]) * h[:, n:]).to(torch.bfloat16).double() @ w_down[e].double().T
        term = wts[t, s].double()[:, None] * h.to(torch.bfloat16).double()
        y.index_add_(0, t, term.abs() if magnitude else term)
    return y


def experts_slack(x, idx, wts, w_up, w_down=None):
    """Per element: an expert output's bf16 rounding may flip by an ulp (fp32 sums against fp64), twice for the FFN,
    and the combine rounds its sum once more."""
    return 2.0 ** -6 * experts_reference(x, idx, wts, w_up, w_down, magnitude=True)


def test_ep_dispatch_grouped_gemm_combine(world):
    W, me, tokens, hidden, topk = world.world_size, world.rank, 96, 256, 4
    experts = 4 * W
    L = experts // W
    w_all = rank_tensor(100, (experts, hidden, hidden), torch.bfloat16, seed=40) * 0.05
    x, idx, wts = ep_inputs(me, tokens, hidden, experts, topk, seed=41)
    h = loom.ep_dispatch(x, idx, wts, experts)
    # Receive counts: every rank's entries routed to this rank's experts.
    all_idx = torch.cat([ep_inputs(r, tokens, hidden, experts, topk, seed=41)[1] for r in range(W)])
    want = torch.bincount(all_idx.flatten().long(), minlength=experts)[me * L:(me + 1) * L]
    assert torch.equal(h.recv_counts.long(), want)
    assert torch.equal(h.recv_offsets.long(), torch.cat([want.new_zeros(1), want.cumsum(0)]))
    assert h.recv_x.shape == (h.capacity, hidden) and h.recv_x.dtype == torch.bfloat16
    out = loom.grouped_gemm(h.recv_x, w_all[me * L:(me + 1) * L].contiguous(), h.recv_offsets)
    y = loom.ep_combine(h, out, out=poisoned(tuple(x.shape), torch.bfloat16))
    loom.ep_check(h)
    assert_close(y, experts_reference(x, idx, wts, w_all), 1e-2, slack=experts_slack(x, idx, wts, w_all))
    loom.release_moe_ep_state()


@pytest.mark.parametrize("ffn", [False, True])
def test_ep_moe_experts_overlapped_equals_sequential(world, ffn):
    W, me, tokens, hidden, topk, inter = world.world_size, world.rank, 128, 256, 6, 128
    experts = 8 * W
    L = experts // W
    mine = slice(me * L, (me + 1) * L)
    n1 = 2 * inter if ffn else hidden
    w_up = rank_tensor(100, (experts, n1, hidden), torch.bfloat16, seed=50) * 0.05
    w_down = rank_tensor(100, (experts, hidden, inter), torch.bfloat16, seed=51) * 0.1 if ffn else None
    x, idx, wts = ep_inputs(me, tokens, hidden, experts, topk, seed=52)
    act = "swiglu" if ffn else "none"
    down = w_down[mine].contiguous() if ffn else None
    ys = []
    for algo in ["overlapped", "sequential", "overlapped", "auto"]:  # back to back, the algorithms interleaved
        ys.append(loom.ep_moe_experts(x, idx, wts, w_up[mine].contiguous(), down, num_experts=experts, algo=algo,
                                      activation=act, out=poisoned(tuple(x.shape), torch.bfloat16)))
    for y in ys[1:]:
        assert torch.equal(y, ys[0])
    assert_close(ys[0], experts_reference(x, idx, wts, w_up, w_down), 2e-2,
                 slack=experts_slack(x, idx, wts, w_up, w_down))
    with pytest.raises(ValueError, match="algo"):
        loom.ep_moe_experts(x, idx, wts, w_up[mine].contiguous(), down, num_experts=experts, algo="fused")
    loom.release_moe_ep_state()
