"""Spec of the token embedding: a row gather ``weight[ids]`` (elementwise class, exact copies).

Invariance, forward: row-wise in ``ids`` (row t of the output depends only on ``ids[t]``), so
the generic ``batch``, ``chunk`` and ``padding`` transforms apply; ``layout`` feeds ``weight``
as a row-strided view (a slice of a wider table).

Invariance, gradient: ``dweight`` is not row-local (row v sums every token with id v), so the
generic row comparison does not apply. The custom transforms compare exactly the rows whose
value the transformed run must reproduce:

* ``batch``   - a subset of tokens (a row alone, a reversed subset): the rows of ids that occur
                 once in the canonical case (they depend only on that one token); and every token
                 of half of the distinct ids kept in original order: all those ids' rows,
                 duplicated ids included (same addends in the same order).
* ``chunk``   - tokens in chunks of sizes 1, 3, 5, ...: per chunk, the rows of the ids whose every
                 occurrence lies inside that chunk.
* ``padding`` - junk tokens (valid ids, some shared with the real tokens) left and right with a zero
                 upstream gradient: the whole ``dweight`` (an FP32 sum that starts at +0 never
                 changes its bits when +0 is added).
* ``layout``  - ``weight`` as a row-strided view and the upstream gradient as a row-strided view:
                 the whole ``dweight``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rl_engine.ops.embedding.op import embedding_cuda, embedding_triton
from rl_engine.ops.embedding.reference import embedding_reference
from rl_engine.ops.embedding.torch_bf16 import embedding_torch_bf16
from rl_engine.ops.execute import make_upstream, run_forward, run_gradient
from rl_engine.ops.spec import Case, OpSpec, Pair, Workload, make_generator, randint, randn
from rl_engine.ops.transforms import plant_ulp, rowwise_transforms


def _table(w: Workload, seed: int, device: torch.device) -> torch.Tensor:
    return randn((w.vocab, w.hidden), make_generator(seed), device=device)


def _cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    weight = _table(w, seed, device)
    cases = []
    for i, t in enumerate(w.token_counts):
        g = make_generator(seed + 1 + i)
        ids = randint(w.vocab, (t,), g, device=device)
        if t > 1:  # the first and last rows of the table (``docs/pitfalls.md`` P9 boundaries)
            ids[0] = 0
            ids[-1] = w.vocab - 1
        cases.append(Case(id=f"T{t}-V{w.vocab}-E{w.hidden}", inputs={"ids": ids, "weight": weight},
                          seed=seed + 1 + i))
    return cases


def _grad_cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    t = w.grad_token_count
    weight = _table(w, seed, device)
    g = make_generator(seed + 100)
    ids = randint(w.vocab, (t,), g)
    ids[1::3] = ids[0]  # one id repeated at every third token: a real segment sum
    if t > 4:
        ids[t // 2] = ids[2]
    return [Case(id=f"T{t}-V{w.vocab}-E{w.hidden}-dup", inputs={"ids": ids.to(device), "weight": weight},
                 seed=seed + 100)]


# -- gradient invariance transforms --------------------------------------------------------------


def _canonical_grad(impl, case: Case):
    probe = run_forward(impl, case.inputs)
    up = make_upstream(probe, case.seed + 7)
    outs, grads, _ = run_gradient(impl, case.inputs, ("weight",), upstream=up)
    return outs[0], grads["weight"], up[0]


def _run_grad(impl, inputs: dict[str, Any], up: torch.Tensor):
    outs, grads, _ = run_gradient(impl, inputs, ("weight",), upstream=(up,))
    return outs[0], grads["weight"]


def _counts(ids: torch.Tensor) -> dict[int, int]:
    out: dict[int, int] = {}
    for v in ids.tolist():
        out[v] = out.get(v, 0) + 1
    return out


def _pairs_for(label: str, out_c, dw_c, out_t, dw_t, rows: list[int], compare_ids: list[int],
               plant: bool) -> list[Pair]:
    dev = out_c.device
    r = torch.tensor(rows, dtype=torch.long, device=dev)
    pairs = [Pair(f"{label}: output", out_c.index_select(0, r), out_t)]
    if compare_ids:
        v = torch.tensor(compare_ids, dtype=torch.long, device=dev)
        dt = dw_t.index_select(0, v)
        pairs.append(Pair(f"{label}: dweight rows {compare_ids}", dw_c.index_select(0, v),
                          plant_ulp(dt) if plant else dt))
    elif plant:
        pairs[0] = Pair(pairs[0].label, pairs[0].canonical, plant_ulp(out_t))
    return pairs


def _sub(case: Case, rows: list[int], up: torch.Tensor):
    r = torch.tensor(rows, dtype=torch.long, device=case.inputs["ids"].device)
    inputs = dict(case.inputs)
    inputs["ids"] = case.inputs["ids"].index_select(0, r).contiguous()
    return inputs, up.index_select(0, r.to(up.device)).contiguous()


def _grad_batch(impl, case: Case, plant: bool) -> list[Pair]:
    out_c, dw_c, up = _canonical_grad(impl, case)
    ids = case.inputs["ids"].tolist()
    t = len(ids)
    counts = _counts(case.inputs["ids"])
    subsets: list[tuple[str, list[int], list[int]]] = []
    for label, rows in [("row 0 alone", [0]), (f"row {t - 1} alone", [t - 1]),
                        ("rows reversed", list(range(t - 1, 0, -2)))]:
        if rows and rows[0] < t:
            uniq = sorted({ids[r] for r in rows if counts[ids[r]] == 1})
            subsets.append((label, rows, uniq))
    distinct = sorted(counts)
    keep = set(distinct[::2])
    rows = [i for i, v in enumerate(ids) if v in keep]
    if rows:
        subsets.append((f"all tokens of ids {sorted(keep)} in order", rows, sorted(keep)))
    pairs: list[Pair] = []
    for label, rows, cmp_ids in subsets:
        inputs, up_s = _sub(case, rows, up)
        out_t, dw_t = _run_grad(impl, inputs, up_s)
        pairs += _pairs_for(label, out_c, dw_c, out_t, dw_t, rows, cmp_ids, plant and not pairs)
    return pairs


def _grad_chunk(impl, case: Case, plant: bool) -> list[Pair]:
    out_c, dw_c, up = _canonical_grad(impl, case)
    ids = case.inputs["ids"].tolist()
    t = len(ids)
    counts = _counts(case.inputs["ids"])
    sizes, start, k = [1, 3, 5], 0, 0
    outs, dws, cmp_all = [], [], []
    while start < t:
        rows = list(range(start, min(t, start + sizes[k % 3])))
        inputs, up_s = _sub(case, rows, up)
        out_t, dw_t = _run_grad(impl, inputs, up_s)
        local = _counts(inputs["ids"])
        cmp_ids = sorted(v for v in local if local[v] == counts[v])
        outs.append(out_t)
        if cmp_ids:
            dws.append(dw_t.index_select(0, torch.tensor(cmp_ids, device=dw_t.device)))
            cmp_all += cmp_ids
        start, k = rows[-1] + 1, k + 1
    out_t = torch.cat(outs, 0)
    label = f"{k} chunks of sizes 1,3,5,..."
    if not dws:
        return [Pair(f"{label}: output", out_c, plant_ulp(out_t) if plant else out_t)]
    dw_t = torch.cat(dws, 0)
    v = torch.tensor(cmp_all, dtype=torch.long, device=dw_c.device)
    return [Pair(f"{label}: output", out_c, out_t),
            Pair(f"{label}: dweight rows of ids complete in a chunk", dw_c.index_select(0, v),
                 plant_ulp(dw_t) if plant else dw_t)]


def _grad_padding(impl, case: Case, plant: bool) -> list[Pair]:
    out_c, dw_c, up = _canonical_grad(impl, case)
    ids = case.inputs["ids"]
    v = case.inputs["weight"].shape[0]
    gen = make_generator(case.seed + 99)
    junk_l = torch.cat([ids[:1], randint(v, (1,), gen, device=ids.device)])
    junk_r = torch.cat([randint(v, (2,), gen, device=ids.device), ids[-1:]])
    inputs = dict(case.inputs)
    inputs["ids"] = torch.cat([junk_l, ids, junk_r]).contiguous()
    zl = torch.zeros((2, up.shape[1]), dtype=up.dtype, device=up.device)
    zr = torch.zeros((3, up.shape[1]), dtype=up.dtype, device=up.device)
    out_p, dw_t = _run_grad(impl, inputs, torch.cat([zl, up, zr], 0))
    label = "2 left + 3 right junk tokens with zero upstream"
    return [Pair(f"{label}: output", out_c, out_p[2:2 + ids.shape[0]]),
            Pair(f"{label}: dweight", dw_c, plant_ulp(dw_t) if plant else dw_t)]


def _strided(x: torch.Tensor) -> torch.Tensor:
    wide = torch.full((x.shape[0], x.shape[1] + 8), float("nan"), dtype=x.dtype, device=x.device)
    wide[:, : x.shape[1]] = x
    return wide[:, : x.shape[1]]


def _layout(impl, case: Case, direction: str, plant: bool) -> list[Pair]:
    label = "weight and upstream with row stride padded by 8"
    inputs = dict(case.inputs)
    inputs["weight"] = _strided(case.inputs["weight"])
    if direction == "forward":
        (out_c,) = run_forward(impl, case.inputs)
        (out_t,) = run_forward(impl, inputs)
        return [Pair(f"{label}: output", out_c, plant_ulp(out_t) if plant else out_t)]
    out_c, dw_c, up = _canonical_grad(impl, case)
    out_t, dw_t = _run_grad(impl, inputs, _strided(up))
    return [Pair(f"{label}: output", out_c, out_t),
            Pair(f"{label}: dweight", dw_c, plant_ulp(dw_t) if plant else dw_t)]


def _dispatch(forward_fn: Callable, grad_fn: Callable) -> Callable:
    def transform(impl, case: Case, direction: str, plant: bool) -> list[Pair]:
        if direction == "forward":
            return forward_fn(impl, case, direction, plant)
        return grad_fn(impl, case, plant)

    return transform


_ROWWISE = rowwise_transforms(row_inputs=("ids",), grad_inputs=())

SPEC = OpSpec(
    name="embedding",
    summary="token embedding weight[ids], ids [T] int64, weight [V, E] bf16 -> [T, E] bf16 (exact row copies)",
    build_cases=_cases,
    build_grad_cases=_grad_cases,
    outputs=("y",),
    grad_inputs=("weight",),
    impls={
        "reference_fp32": embedding_reference,
        "torch_bf16": embedding_torch_bf16,
        "triton_cuda_bf16": embedding_triton,
        "cuda_bf16": embedding_cuda,
    },
    transforms={
        "batch": _dispatch(_ROWWISE["batch"], _grad_batch),
        "chunk": _dispatch(_ROWWISE["chunk"], _grad_chunk),
        "padding": _dispatch(_ROWWISE["padding"], _grad_padding),
        "layout": _layout,
        "tp": "no reduction in the forward row copy; a vocab-parallel embedding (ids outside a rank's "
              "shard masked, then an all-reduce) is a different op that rl_engine does not provide",
    },
)
