"""Checks of "masked means absent" (docs/declared-semantics.md), shared by the CPU tests
(tests/ops/test_masked_absent.py) and the GPU tests at Qwen3-8B-like shapes.

Each check runs an op twice on the same shapes: once with finite values everywhere, once with a
non-finite value (NaN, +inf or -inf) planted at positions the compared outputs cannot see. The
compared outputs must be bitwise equal (no tolerance: the same kernels see the same visible
operands at the same positions) and the outputs that *do* see the planted value must not be
finite. A failed check raises AssertionError naming the output, the count and the first index.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

POISONS = {"nan": float("nan"), "+inf": float("inf"), "-inf": float("-inf")}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a float tensor as integers (NaN payloads and signed zeros compared too)."""
    t = t.detach().cpu().contiguous()
    return t.view({torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[t.dtype])


def assert_same_bits(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: {a.shape}/{a.dtype} vs {b.shape}/{b.dtype}"
    same = bits(a) == bits(b)
    if not bool(same.all()):
        idx = tuple(int(i) for i in torch.nonzero(~same)[0])
        raise AssertionError(f"{what}: {int((~same).sum())} of {same.numel()} elements differ, first at "
                             f"{list(idx)}: {float(a[idx])} vs {float(b[idx])}")


def assert_not_finite_rows(t: torch.Tensor, what: str) -> None:
    """Every row (first axis) of ``t`` holds at least one non-finite value."""
    if t.shape[0] == 0:
        return
    ok = torch.isfinite(t.detach().float().reshape(t.shape[0], -1)).all(dim=1)
    if bool(ok.any()):
        raise AssertionError(f"{what}: {int(ok.sum())} rows that see a NaN/inf are finite, first row {int(ok.nonzero()[0])}")


@dataclass(frozen=True)
class Shape:
    heads: int
    kv_heads: int
    head_dim: int


def _rand(shape, g, dtype, device, scale=1.0):
    return (torch.randn(tuple(shape), generator=g) * scale).to(torch.bfloat16).to(dtype).to(device)


def _cu(lens, device):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def _run_varlen(impl, q, k, v, do, cu_q, cu_k, scale, backward):
    q, k, v = (t.clone().requires_grad_(backward) for t in (q, k, v))
    out = impl(q, k, v, cu_q, cu_k, scale)
    if not backward:
        return out.detach(), None, None, None
    out.backward(do)
    return out.detach(), q.grad, k.grad, v.grad


def check_future_keys(impl, shape: Shape, lens_q, lens_k, poison: float, *, dtype, device, seed=0, backward=True):
    """Prefill / chunked prefill: plant ``poison`` in k and v at one key ``p_b`` of every sequence.

    Queries at positions < ``p_b`` cannot see it: their output and dq must be bitwise unchanged;
    queries at positions >= ``p_b`` see it: their output rows must not be finite.
    """
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(lens_q), sum(lens_k)
    h, hkv, d = shape.heads, shape.kv_heads, shape.head_dim
    q, do = _rand((tq, h, d), g, dtype, device), _rand((tq, h, d), g, dtype, device)
    k, v = _rand((tk, hkv, d), g, dtype, device), _rand((tk, hkv, d), g, dtype, device)
    cu_q, cu_k = _cu(lens_q, device), _cu(lens_k, device)
    scale = d ** -0.5
    k2, v2 = k.clone(), v.clone()
    blind, seeing = [], []  # query rows that cannot / can see the planted key
    qs = ks = 0
    for lq, lk in zip(lens_q, lens_k):
        if lq:
            off = lk - lq  # position of query 0
            p = max(off, lk - max(1, lq // 3))  # a key some queries of this sequence cannot see
            k2[ks + p] = poison
            v2[ks + p, :, ::3] = poison
            blind += [qs + i for i in range(lq) if off + i < p]
            seeing += [qs + i for i in range(lq) if off + i >= p]
        qs, ks = qs + lq, ks + lk
    assert blind and seeing, "the case must have queries on both sides of the planted key"
    base = _run_varlen(impl, q, k, v, do, cu_q, cu_k, scale, backward)
    bad = _run_varlen(impl, q, k2, v2, do, cu_q, cu_k, scale, backward)
    blind_t = torch.tensor(blind, device=q.device)
    assert_same_bits(base[0][blind_t], bad[0][blind_t], "out of queries that cannot see the NaN/inf key")
    assert_not_finite_rows(bad[0][torch.tensor(seeing, device=q.device)], "out of queries that see the NaN/inf key")
    if backward:
        assert_same_bits(base[1][blind_t], bad[1][blind_t], "dq of queries that cannot see the NaN/inf key")


def check_blind_queries(impl, shape: Shape, lens_q, lens_k, poison: float, *, dtype, device, seed=1):
    """Backward: plant ``poison`` in q and dO of one query row ``r_b`` of every sequence, then in its
    dO alone.

    dk / dv of the keys after that query's position (it cannot see them) must be bitwise unchanged,
    and so must every other query's output and dq. The keys it sees must not come out finite: every
    element of their dv (each is a sum holding ``p * dO``, dO all ``poison``; with q finite, p is
    finite, so only the dO operand carries the poison: a kernel that zeroes non-finite operands in
    masked tiles must restore NaN where a visible one meets them) and a value in each row of their dk.
    """
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(lens_q), sum(lens_k)
    h, hkv, d = shape.heads, shape.kv_heads, shape.head_dim
    q, do = _rand((tq, h, d), g, dtype, device), _rand((tq, h, d), g, dtype, device)
    k, v = _rand((tk, hkv, d), g, dtype, device), _rand((tk, hkv, d), g, dtype, device)
    cu_q, cu_k = _cu(lens_q, device), _cu(lens_k, device)
    scale = d ** -0.5
    base = _run_varlen(impl, q, k, v, do, cu_q, cu_k, scale, True)
    for poison_q in (True, False):
        q2, do2 = q.clone(), do.clone()
        later_keys, other_rows, seen_keys = [], [], []
        qs = ks = 0
        for lq, lk in zip(lens_q, lens_k):
            if lq:
                off = lk - lq
                r = lq // 3  # a query that cannot see the keys after position off + r
                if poison_q:
                    q2[qs + r, :, ::2] = poison
                do2[qs + r] = poison
                later_keys += [ks + j for j in range(off + r + 1, lk)]
                seen_keys += [ks + j for j in range(off + r + 1)]
                other_rows += [qs + i for i in range(lq) if i != r]
            qs, ks = qs + lq, ks + lk
        assert later_keys, "the case must have keys the planted query cannot see"
        what = "q and dO" if poison_q else "dO"
        bad = _run_varlen(impl, q2, k, v, do2, cu_q, cu_k, scale, True)
        keys_t = torch.tensor(later_keys, device=q.device)
        rows_t = torch.tensor(other_rows, device=q.device)
        assert_same_bits(base[2][keys_t], bad[2][keys_t], f"dk of keys the query with NaN/inf {what} cannot see")
        assert_same_bits(base[3][keys_t], bad[3][keys_t], f"dv of keys the query with NaN/inf {what} cannot see")
        assert_same_bits(base[0][rows_t], bad[0][rows_t], f"out of the other queries (NaN/inf {what})")
        assert_same_bits(base[1][rows_t], bad[1][rows_t], f"dq of the other queries (NaN/inf {what})")
        seen_t = torch.tensor(seen_keys, device=q.device)
        finite = torch.isfinite(bad[3][seen_t].float())
        if bool(finite.any()):
            raise AssertionError(f"dv of keys the query with NaN/inf {what} sees: {int(finite.sum())} finite elements")
        assert_not_finite_rows(bad[2][seen_t], f"dk of keys the query with NaN/inf {what} sees")


def check_other_sequences(impl, shape: Shape, lens, poisoned: int, poison: float, *, dtype, device, seed=2):
    """Packed varlen: fill q, k, v and dO of sequence ``poisoned`` with ``poison``; every output
    and gradient of the other sequences must be bitwise unchanged."""
    g = torch.Generator().manual_seed(seed)
    t = sum(lens)
    h, hkv, d = shape.heads, shape.kv_heads, shape.head_dim
    q, do = _rand((t, h, d), g, dtype, device), _rand((t, h, d), g, dtype, device)
    k, v = _rand((t, hkv, d), g, dtype, device), _rand((t, hkv, d), g, dtype, device)
    cu = _cu(lens, device)
    a, b = int(cu[poisoned]), int(cu[poisoned + 1])
    assert b > a, "the poisoned sequence must not be empty"
    q2, k2, v2, do2 = q.clone(), k.clone(), v.clone(), do.clone()
    for tns in (q2, k2, v2, do2):
        tns[a:b] = poison
    keep = torch.cat([torch.arange(0, a), torch.arange(b, t)]).to(q.device)
    scale = d ** -0.5
    base = _run_varlen(impl, q, k, v, do, cu, cu, scale, True)
    bad = _run_varlen(impl, q2, k2, v2, do2, cu, cu, scale, True)
    for name, x, y in zip(("out", "dq", "dk", "dv"), base, bad):
        assert_same_bits(x[keep], y[keep], f"{name} of the sequences next to the NaN/inf one")


def check_decode_past_length(impl, shape: Shape, lens, s_max: int, poison: float, *, dtype, device, seed=3):
    """Decode: cache slots at and after ``cache_seqlens[b]`` hold ``poison`` instead of finite junk;
    the output must be bitwise unchanged. Then the last visible slot holds it: output not finite."""
    g = torch.Generator().manual_seed(seed)
    bsz = len(lens)
    h, hkv, d = shape.heads, shape.kv_heads, shape.head_dim
    q = _rand((bsz, h, d), g, dtype, device)
    kc, vc = _rand((bsz, s_max, hkv, d), g, dtype, device), _rand((bsz, s_max, hkv, d), g, dtype, device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    kc2, vc2 = kc.clone(), vc.clone()
    for b, n in enumerate(lens):
        kc2[b, n:] = poison
        vc2[b, n:] = poison
    scale = d ** -0.5
    with torch.no_grad():
        base = impl(q, kc, vc, seqlens, scale)
        bad = impl(q, kc2, vc2, seqlens, scale)
        assert_same_bits(base, bad, "decode out with NaN/inf past cache_seqlens")
        kc3, vc3 = kc.clone(), vc.clone()
        rows = [b for b, n in enumerate(lens) if n > 0]
        for b in rows:
            vc3[b, lens[b] - 1] = poison
        seen = impl(q, kc3, vc3, seqlens, scale)
    assert_not_finite_rows(seen[torch.tensor(rows, device=q.device)], "decode out that sees a NaN/inf value")


def _bil_run(impl, logits, targets, mask, g):
    x = logits.clone().requires_grad_(True)
    out = impl(x, targets, mask, 0.7)
    out.backward(g)
    return out.detach(), x.grad


def check_logp_mask(impl, poison: float, *, device=torch.device("cpu"), shape=(3, 7, 300), host_torch=False):
    """Masked rows of logits hold ``poison``, their targets are out of range and their upstream
    gradient is ``poison``: every output and dlogits row is bitwise the finite run's (masked rows
    are exactly 0 in both).

    ``host_torch``: ``impl`` is PyTorch's own CPU eager kernels (the FP32 reference, torch_bf16).
    CI once saw the first of two identical reference calls 10 ulps off and every later call equal
    to every other host's (a warm-up effect of the host's kernels, not of the masking). So the
    finite run is made again: when the first two differ, a third must equal the second (else the
    host is not reproducible and the check fails, saying so), and the second is the base. The
    project's kernels get no such allowance.
    """
    gen = torch.Generator().manual_seed(13)
    b, s, v = shape
    logits = (torch.randn(b, s, v, generator=gen) * 3).to(device)
    targets = torch.randint(0, v, (b, s), generator=gen).to(device)
    mask = (torch.rand(b, s, generator=gen) > 0.35).to(device)
    mask[0, :2] = False
    g = torch.randn(b, s, generator=gen).to(device)
    base = _bil_run(impl, logits, targets, mask, g)
    if host_torch:
        again = _bil_run(impl, logits, targets, mask, g)
        if not all(bool((bits(a) == bits(b)).all()) for a, b in zip(base, again)):
            third = _bil_run(impl, logits, targets, mask, g)
            for a, b, what in zip(again, third, ("out", "dlogits")):
                assert bool((bits(a) == bits(b)).all()), (
                    f"the host's PyTorch kernels are not reproducible run to run: {what} differs between the second "
                    f"and the third call on the same finite input ({int((bits(a) != bits(b)).sum())} elements)")
            base = again  # the first call was the odd one out
    logits2, targets2, g2 = logits.clone(), targets.clone(), g.clone()
    logits2[~mask] = poison
    targets2[~mask] = -100
    g2[~mask] = poison
    bad = _bil_run(impl, logits2, targets2, mask, g2)
    assert_same_bits(base[0], bad[0], "batch_invariant_logp out with NaN/inf in masked rows")
    assert_same_bits(base[1], bad[1], "batch_invariant_logp dlogits with NaN/inf in masked rows")
    assert bool((bad[0][~mask] == 0).all()) and bool((bad[1][~mask] == 0).all())


def check_pack_padding(pack_fn, unpack_fn, dtype, poison: float, *, device=torch.device("cpu")):
    """pack: padding slots of x (``s >= L_b``) hold ``poison``: the packed rows and dx are bitwise
    the finite run's (dx is 0 in the padding). unpack: the upstream gradient in the padding is
    ``poison``: the packed dx is bitwise unchanged."""
    gen = torch.Generator().manual_seed(14)
    lens = [3, 0, 6, 1]
    bsz, s, e = len(lens), 6, 8
    cu = torch.tensor([0, 3, 3, 9, 10], dtype=torch.int32, device=device)
    x = torch.randn(bsz, s, e, generator=gen).to(torch.bfloat16).to(dtype).to(device)
    dy = torch.randn(sum(lens), e, generator=gen).to(torch.bfloat16).to(dtype).to(device)
    pad = (torch.arange(s)[None, :] >= torch.tensor(lens)[:, None]).to(device)
    x2 = x.clone()
    x2[pad] = poison

    def run_pack(xx):
        xx = xx.clone().requires_grad_(True)
        y = pack_fn(xx, cu)
        y.backward(dy)
        return y.detach(), xx.grad

    for a, b_, what in zip(run_pack(x), run_pack(x2), ("pack out", "pack dx")):
        assert_same_bits(a, b_, f"{what} with NaN/inf in the padding")
    packed = x[~pad].clone()
    g = torch.randn(bsz, s, e, generator=gen).to(torch.bfloat16).to(dtype).to(device)
    g2 = g.clone()
    g2[pad] = poison

    def run_unpack(gg):
        pp = packed.clone().requires_grad_(True)
        unpack_fn(pp, cu, s).backward(gg)
        return pp.grad

    assert_same_bits(run_unpack(g), run_unpack(g2), "unpack dx with NaN/inf upstream gradient in the padding")


def check_prefill_rows_equal_decode(varlen_impl, decode_impl, shape: Shape, length: int, poison: float, *,
                                    device, queries, seed=4):
    """Issue #17 as reported: with ``poison`` in k and v at the last key of a ``length``-token
    prefill, each earlier query's prefill row equals, bitwise, its own decode step (which never
    loads that slot), and the prefill rows equal those of the all-finite prefill."""
    g = torch.Generator().manual_seed(seed)
    h, hkv, d = shape.heads, shape.kv_heads, shape.head_dim
    q = _rand((length, h, d), g, torch.bfloat16, device)
    k, v = _rand((length, hkv, d), g, torch.bfloat16, device), _rand((length, hkv, d), g, torch.bfloat16, device)
    cu = _cu([length], device)
    k2, v2 = k.clone(), v.clone()
    k2[length - 1] = poison
    v2[length - 1] = poison
    scale = d ** -0.5
    with torch.no_grad():
        clean = varlen_impl(q, k, v, cu, cu, scale)
        dirty = varlen_impl(q, k2, v2, cu, cu, scale)
        rows = torch.tensor(list(queries), device=q.device)
        assert_same_bits(clean[rows], dirty[rows], "prefill rows before the NaN/inf key")
        for i in queries:
            lens = torch.tensor([i + 1], dtype=torch.int32, device=device)
            step = decode_impl(q[i:i + 1], k2[None], v2[None], lens, scale)
            assert_same_bits(step[0], dirty[i], f"decode step of query {i} vs its prefill row")
