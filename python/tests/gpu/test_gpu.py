"""Every op on torch tensors against a torch reference; symmetric tensors; custom ops under torch.compile; CUDA
graph capture of a collective; the TP-MLP example. Inputs are fresh random values per rank that every rank can
regenerate, outputs are poisoned first, and every element is checked (bitwise for data movement)."""
import importlib.util
import pathlib

import pytest
import torch

import loom
from gpu_helpers import assert_close, poisoned, rank_tensor, sym_input

ROOT = pathlib.Path(__file__).resolve().parents[3]


def all_inputs(world, shape, dtype=torch.float32, seed=0):
    return [rank_tensor(r, shape, dtype, seed) for r in range(world.world_size)]


def sync(world):
    torch.cuda.synchronize()
    world.barrier()


# ---- symmetric tensors ---------------------------------------------------------------------------------------------
def test_symmetric_tensor_and_peer_views(world):
    W, me = world.world_size, world.rank
    x = world.empty((W, 1000), torch.float32)
    assert x.is_cuda and x.device.index == world.device and world.is_symmetric(x)
    x.fill_(float(me))
    sync(world)
    for r in range(W):
        assert torch.equal(world.peer(x, r), torch.full_like(x, float(r)))
    sync(world)  # every rank has read before any writes
    world.peer(x, (me + 1) % W)[me].fill_(100.0 + me)  # a write into the next rank's copy
    sync(world)
    src = (me - 1) % W
    assert torch.equal(x[src], torch.full_like(x[src], 100.0 + src))
    view = x[1:, 10:20]
    assert torch.equal(world.peer(view, src), world.peer(x, src)[1:, 10:20])
    with pytest.raises(ValueError, match="symmetric allocations"):
        world.peer(torch.zeros(4, device="cuda"), src)
    sync(world)


def test_dropped_tensors_are_freed_together(world):
    x = world.empty(1 << 20, torch.uint8)
    ptr = x.data_ptr()
    before = world.pending_frees()
    del x
    assert world.pending_frees() == before + 1
    assert world.collect() >= 1
    assert world.pending_frees() <= before  # x's allocation went on every rank
    y = world.empty(1 << 20, torch.uint8)
    assert world.is_symmetric(y) and y.data_ptr() != 0 and ptr != 0


# ---- collectives -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_all_gather(world, dtype):
    x = sym_input(world, (64, 96), dtype, seed=1)
    want = torch.cat(all_inputs(world, (64, 96), dtype, seed=1))
    assert torch.equal(loom.all_gather(x), want)
    out = world.empty((world.world_size * 64, 96), dtype)
    out.copy_(poisoned(out.shape, dtype))
    plain = x.clone()
    loom.all_gather(plain, out=out)  # plain input: an algorithm that writes the symmetric out
    assert torch.equal(out, want)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_reduce_scatter(world, dtype, tol):
    W, n = world.world_size, 128
    x = sym_input(world, (W * n, 32), dtype, seed=2)
    want = torch.stack([t.double() for t in all_inputs(world, (W * n, 32), dtype, seed=2)]).sum(0)
    got = loom.reduce_scatter(x, out=poisoned((n, 32), dtype))
    assert got.shape == (n, 32)
    assert_close(got, want[world.rank * n:(world.rank + 1) * n], tol)


@pytest.mark.parametrize("op", ["sum", "max"])
def test_all_reduce(world, op):
    x = sym_input(world, (4096,), torch.float32, seed=3)
    ins = torch.stack(all_inputs(world, (4096,), torch.float32, seed=3)).double()
    want = ins.sum(0) if op == "sum" else ins.max(0).values
    out = poisoned(x.shape, x.dtype)
    loom.all_reduce(x, out=out, op=op)
    assert_close(out, want, 1e-6)
    loom.all_reduce(x, out=x, op=op)  # in place
    assert_close(x, want, 1e-6)


def test_all_to_all(world):
    W, me, n = world.world_size, world.rank, 256
    x = sym_input(world, (W * n,), torch.float32, seed=4)
    ins = all_inputs(world, (W * n,), torch.float32, seed=4)
    want = torch.cat([ins[j][me * n:(me + 1) * n] for j in range(W)])
    assert torch.equal(loom.all_to_all(x), want)


def test_all_to_all_v(world):
    W, me = world.world_size, world.rank
    counts = [[16 * (1 + (s * 7 + d * 3) % 5) for d in range(W)] for s in range(W)]  # counts[src][dst]
    total = [sum(c) for c in counts]
    # Symmetric allocations are collective (the same size on every rank): the largest, of which this rank sends a prefix.
    x = world.empty((max(total),), torch.float32)[: total[me]]
    x.copy_(rank_tensor(me, (total[me],), torch.float32, seed=5))
    send = world.empty((W,), torch.int64)
    send.copy_(torch.tensor(counts[me], dtype=torch.int64))
    cap = max(sum(counts[s][d] for s in range(W)) for d in range(W))
    sync(world)
    out, recv = loom.all_to_all_v(x, send, capacity=cap)
    ins = [rank_tensor(s, (total[s],), torch.float32, seed=5) for s in range(W)]
    want = torch.cat([ins[s][sum(counts[s][:me]):sum(counts[s][:me + 1])] for s in range(W)])
    assert torch.equal(recv.cpu(), torch.tensor([counts[s][me] for s in range(W)]))
    assert torch.equal(out[:want.numel()], want)


def test_collective_errors_carry_looms_message(world):
    x = torch.ones(world.world_size * 4 + 1, device="cuda")
    with pytest.raises((ValueError, loom.Error)):
        loom.reduce_scatter(x)
    with pytest.raises(ValueError, match="must be contiguous"):
        loom.all_reduce(torch.ones(8, 8, device="cuda").t())


# ---- gemm and the overlapped GEMMs ------------------------------------------------------------------------------
def test_gemm(world):
    a = rank_tensor(0, (256, 512), torch.bfloat16, seed=6)
    b = rank_tensor(1, (384, 512), torch.bfloat16, seed=6)
    want = a.double() @ b.double().T
    assert_close(loom.gemm(a, b, out=poisoned((256, 384), torch.bfloat16)), want, 1e-2)
    out = poisoned((256, 384), torch.float32)
    loom.gemm(a, b, out=out, alpha=0.5)
    assert_close(out, 0.5 * want, 1e-2)
    bias = rank_tensor(2, (384,), torch.float32, seed=6)
    assert_close(loom.gemm(a, b, bias=bias, out_dtype=torch.float32), want + bias.double(), 1e-2)


def test_ag_gemm(world):
    W, m, k, n = world.world_size, 256, 512, 256
    a = rank_tensor(world.rank, (m, k), torch.bfloat16, seed=7)
    b = rank_tensor(100, (n, k), torch.bfloat16, seed=7)
    want = torch.cat(all_inputs(world, (m, k), torch.bfloat16, seed=7)).double() @ b.double().T
    got = loom.ag_gemm(a, b, out=poisoned((W * m, n), torch.bfloat16))
    assert got.shape == (W * m, n)
    assert_close(got, want, 1e-2)


def partial_roundings(parts, ranks):
    """What rounding the ranks' partial products (and, in a ring, the running sums) to bf16 may add per element: up
    to 2 x ranks half-ulps of the sum of the partials' magnitudes."""
    return ranks * 2.0 ** -8 * torch.stack(parts).abs().sum(0)


def test_gemm_rs(world):
    W, m, k_loc, n = world.world_size, 256 * world.world_size, 256, 384
    a = rank_tensor(world.rank, (m, k_loc), torch.bfloat16, seed=8)
    b = rank_tensor(world.rank, (n, k_loc), torch.bfloat16, seed=9)
    parts = [rank_tensor(r, (m, k_loc), torch.bfloat16, seed=8).double() @
             rank_tensor(r, (n, k_loc), torch.bfloat16, seed=9).double().T for r in range(W)]
    want = torch.stack(parts).sum(0)
    rows = m // W
    got = loom.gemm_rs(a, b, out=poisoned((rows, n), torch.bfloat16))
    assert got.shape == (rows, n)
    mine = slice(world.rank * rows, (world.rank + 1) * rows)
    assert_close(got, want[mine], 1e-2, slack=partial_roundings(parts, W)[mine])


def test_gemm_ar(world):
    W, m, k_loc, n = world.world_size, 64, 256, 512
    a = rank_tensor(world.rank, (m, k_loc), torch.bfloat16, seed=10)
    b = rank_tensor(world.rank, (n, k_loc), torch.bfloat16, seed=11)
    parts = [rank_tensor(r, (m, k_loc), torch.bfloat16, seed=10).double() @
             rank_tensor(r, (n, k_loc), torch.bfloat16, seed=11).double().T for r in range(W)]
    want = torch.stack(parts).sum(0)
    assert_close(loom.gemm_ar(a, b, out=poisoned((m, n), torch.bfloat16)), want, 1e-2,
                 slack=partial_roundings(parts, W))


# ---- TP-MoE -----------------------------------------------------------------------------------------------------------
def moe_inputs(rank, tokens, hidden, experts, topk, seed):
    """Rank `rank`'s tokens [tokens, hidden] bf16 and their distinct top-k expert ids (int32) and weights (fp32)."""
    x = rank_tensor(rank, (tokens, hidden), torch.bfloat16, seed)
    idx = rank_tensor(rank, (tokens, experts), torch.float32, seed + 1).argsort(dim=1)[:, :topk].to(torch.int32)
    wts = rank_tensor(rank, (tokens, topk), torch.float32, seed + 2).softmax(dim=1)
    return x, idx, wts


def moe_reference(x, idx, wts, w_up, w_down):
    """sum over slots of wts * gelu(x @ w_up[e].T) @ w_down[e].T, a per-expert loop in fp64 (w_up [E, N, H],
    w_down [E, H, N]); the intermediate rounded to bf16 per rank slice is within the tolerance."""
    y = torch.zeros(x.shape[0], w_down.shape[1], dtype=torch.float64, device=x.device)
    for e in range(w_up.shape[0]):
        t, s = (idx == e).nonzero(as_tuple=True)
        h = torch.nn.functional.gelu(x[t].double() @ w_up[e].double().T)
        y.index_add_(0, t, wts[t, s].double()[:, None] * (h @ w_down[e].double().T))
    return y


@pytest.mark.parametrize("algo,expert_major", [("sequential", False), ("auto", False), ("auto", True), ("fused", True),
                                               ("fused", False)])
def test_ag_moe_then_moe_rs(world, algo, expert_major):
    W, me, t_loc, hidden, experts, topk, n_loc = world.world_size, world.rank, 64, 256, 4, 2, 128
    w_up = rank_tensor(100, (experts, W * n_loc, hidden), torch.bfloat16, seed=20) * 0.1
    w_down = rank_tensor(100, (experts, hidden, W * n_loc), torch.bfloat16, seed=21) * 0.1
    mine = slice(me * n_loc, (me + 1) * n_loc)
    x, idx, wts = moe_inputs(me, t_loc, hidden, experts, topk, seed=22)
    h, routing = loom.ag_moe(x, idx, wts, w_up[:, mine].contiguous(), activation="gelu", algo=algo,
                             expert_major=expert_major)
    if W < 2 and algo == "fused":
        pytest.skip("the fused algorithms need 2 or more ranks")
    ranks = 1 if expert_major else W
    assert h.shape == (routing.max_rows, n_loc) and routing.shape == (W * t_loc, topk, experts, ranks, 1)
    # The grouped rows: row dest_rows[t, s] of h is gelu(gathered x[t] @ w_up[e, mine].T), e = gathered idx[t, s].
    ins = [moe_inputs(r, t_loc, hidden, experts, topk, seed=22) for r in range(W)]
    xg, idxg = torch.cat([i[0] for i in ins]), torch.cat([i[1] for i in ins])
    want_h = torch.nn.functional.gelu(torch.einsum("th,tsnh->tsn", xg.double(), w_up[:, mine].double()[idxg.long()]))
    assert_close(h[routing.dest_rows.long()], want_h, 1e-2)
    assert torch.equal(routing.weights, torch.cat([i[2] for i in ins]))
    out = loom.moe_rs(h, w_down[:, :, mine].contiguous(), routing, out=poisoned((t_loc, hidden), torch.float32),
                      algo=algo)
    assert_close(out, moe_reference(x, idx, wts, w_up, w_down), 2e-2)


def test_moe_route_permute_grouped_gemm_moe_ar(world):
    W, me, tokens, hidden, experts, topk, n_loc = world.world_size, world.rank, 48, 256, 8, 3, 64
    w_up = rank_tensor(100, (experts, W * n_loc, hidden), torch.bfloat16, seed=30) * 0.1
    w_down = rank_tensor(100, (experts, hidden, W * n_loc), torch.bfloat16, seed=31) * 0.1
    mine = slice(me * n_loc, (me + 1) * n_loc)
    x, idx, wts = moe_inputs(0, tokens, hidden, experts, topk, seed=32)  # the same batch on every rank
    routing = loom.moe_route(idx, wts, num_experts=experts, align=16)
    counts = torch.bincount(idx.flatten().long(), minlength=experts)
    assert torch.equal(routing.counts.long(), counts)
    sizes = (counts + 15) // 16 * 16
    assert torch.equal(routing.offsets.long(), torch.cat([sizes.new_zeros(1), sizes.cumsum(0)]))
    rows = loom.moe_permute(x, routing)
    assert torch.equal(rows[routing.dest_rows.long()], x[:, None].expand(-1, topk, -1))
    h = loom.grouped_gemm(rows, w_up[:, mine].contiguous(), routing.offsets, activation="gelu")
    out = loom.moe_ar(h, w_down[:, :, mine].contiguous(), routing, out=poisoned((tokens, hidden), torch.float32))
    assert_close(out, moe_reference(x, idx, wts, w_up, w_down), 2e-2)
    with pytest.raises(ValueError, match="moe_ar: routing must be a loom.MoeRouting"):
        loom.moe_ar(h, w_down[:, :, mine].contiguous(), routing.buffer)
    loom.release_moe_state()


# ---- torch integration -----------------------------------------------------------------------------------------------
def test_custom_ops_run_and_compile(world):
    x = sym_input(world, (2048,), torch.float32, seed=12)
    want = torch.stack(all_inputs(world, (2048,), torch.float32, seed=12)).double().sum(0)
    got = torch.ops.loom.all_reduce(x, world.id, "auto", "auto", "sum", 0)
    assert_close(got, want, 1e-6)

    def f(t):
        return loom.all_reduce(t, world=world) * 2 + 1

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    assert_close(compiled(x), want * 2 + 1, 1e-6)


def test_cuda_graph_replays_a_collective(world):
    x = sym_input(world, (8192,), torch.float32, seed=13)
    out = torch.empty_like(x)
    loom.all_reduce(x, out=out)  # the eager call that creates the algorithm's state
    sync(world)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        loom.all_reduce(x, out=out)
    for seed in (14, 15):
        x.copy_(rank_tensor(world.rank, x.shape, torch.float32, seed))
        out.fill_(float("nan"))
        sync(world)
        g.replay()
        torch.cuda.synchronize()
        want = torch.stack(all_inputs(world, x.shape, torch.float32, seed)).double().sum(0)
        assert_close(out, want, 1e-6)
    sync(world)


def test_tp_mlp_example(world):
    spec = importlib.util.spec_from_file_location("tp_mlp", ROOT / "python/examples/01_tp_mlp.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    err = mod.run(world, tokens=512 * world.world_size, hidden=1024, ffn=2048 * world.world_size)
    assert err < 2e-2, err
