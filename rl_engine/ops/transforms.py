"""Reusable invariance transforms for row-wise ops (every input row gives one output row).

Row-wise means: the inputs named in ``row_inputs`` carry the packed-token axis T as dim 0, every
output carries T as dim 0, and row ``t`` of every output depends only on row ``t`` of the row
inputs (plus shared parameters such as weights). For such ops:

* ``batch``   - a row computed alone, and a subset of rows in another order with other
                 neighbours, equals the same rows of the canonical batch;
* ``chunk``   - the rows processed in chunks of sizes 1, 3, 5, 7 and the rest, concatenated, equal the whole;
* ``padding`` - the rows embedded between junk rows (left and right padding) equal the packed rows;
* ``layout``  - row inputs with a padded row stride (non-contiguous views) and parameters in a
                 non-contiguous layout where the op accepts one equal the contiguous run.

Gradient invariance compares the gradients of the row inputs row by row (``batch``, ``chunk``,
``padding``) and every gradient (``layout``). Parameter gradients sum over rows, so they are not
row-local and are compared only under ``layout``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from rl_engine.ops.execute import make_upstream, run_forward, run_gradient
from rl_engine.ops.spec import Case, Pair, TransformFn, standard_normal

_INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
             torch.float64: torch.int64}


def plant_ulp(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` whose first element is moved by one unit in the last place (raw bits + 1).

    Used by negative controls: built as a bit pattern, never as a decimal literal (``docs/pitfalls.md`` P7).
    """
    out = t.detach().clone()
    if out.numel() == 0:
        return out
    flat = out.reshape(-1)
    if out.dtype in _INT_VIEW:
        bits = flat.view(_INT_VIEW[out.dtype])
        bits[0] = bits[0] + 1
    else:
        flat[0] = flat[0] + 1
    return out


def _select_rows(inputs: dict[str, Any], row_inputs: Sequence[str], idx: torch.Tensor) -> dict[str, Any]:
    out = dict(inputs)
    for n in row_inputs:
        out[n] = inputs[n].index_select(0, idx.to(inputs[n].device)).contiguous()
    return out


def _row_subsets(t: int) -> list[tuple[str, list[int]]]:
    subs: list[tuple[str, list[int]]] = [("row 0 alone", [0])]
    if t > 1:
        subs.append((f"row {t - 1} alone", [t - 1]))
        mid = t // 2
        subs.append((f"row {mid} alone", [mid]))
        rev = list(range(t - 1, 0, -2))  # odd-ish subset, reversed order, other neighbours
        subs.append((f"{len(rev)} rows reversed", rev))
    return subs


def _run(impl, inputs, row_inputs, grad_inputs, direction, upstream):
    if direction == "forward":
        return run_forward(impl, inputs), {}
    outs, grads, _ = run_gradient(impl, inputs, grad_inputs, upstream=upstream)
    return outs, grads


def rowwise_transforms(
    row_inputs: Sequence[str],
    grad_inputs: Sequence[str],
    *,
    layout_inputs: Sequence[str] = (),
) -> dict[str, TransformFn]:
    """Build ``batch``, ``chunk``, ``padding`` and ``layout`` transforms for a row-wise op.

    ``layout_inputs`` are extra (non-row) inputs that the op accepts in a transposed layout
    (e.g. a weight passed as ``W.t()``); the layout transform feeds them as transposed views.
    """
    row_grads = [n for n in grad_inputs if n in row_inputs]

    def compare_rows(label, outs_c, grads_c, outs_t, grads_t, rows, plant) -> list[Pair]:
        pairs = []
        idx = torch.tensor(rows, dtype=torch.long)
        for i, (c, t) in enumerate(zip(outs_c, outs_t)):
            cc = c.index_select(0, idx.to(c.device))
            tt = plant_ulp(t) if (plant and i == 0 and not grads_t) else t
            pairs.append(Pair(f"{label}: output {i}", cc, tt))
        for n in row_grads:
            if n in grads_c:
                cc = grads_c[n].index_select(0, idx.to(grads_c[n].device))
                tt = plant_ulp(grads_t[n]) if plant and n == row_grads[0] else grads_t[n]
                pairs.append(Pair(f"{label}: d{n}", cc, tt))
        return pairs

    def upstream_rows(upstream, rows):
        idx = torch.tensor(rows, dtype=torch.long)
        return tuple(u.index_select(0, idx.to(u.device)) for u in upstream)

    def canonical(impl, case, direction):
        if direction == "forward":
            return run_forward(impl, case.inputs), {}, None
        probe = run_forward(impl, case.inputs)
        upstream = make_upstream(probe, case.seed + 7)
        outs, grads, used = run_gradient(impl, case.inputs, grad_inputs, upstream=upstream)
        return outs, grads, used

    def batch(impl: Callable[..., Any], case: Case, direction: str, plant: bool) -> list[Pair]:
        outs_c, grads_c, up = canonical(impl, case, direction)
        t = case.inputs[row_inputs[0]].shape[0]
        pairs: list[Pair] = []
        for label, rows in _row_subsets(t):
            sub = _select_rows(case.inputs, row_inputs, torch.tensor(rows))
            outs_t, grads_t = _run(impl, sub, row_inputs, grad_inputs, direction,
                                   None if up is None else upstream_rows(up, rows))
            pairs += compare_rows(label, outs_c, grads_c, outs_t, grads_t, rows, plant and not pairs)
        return pairs

    def chunk(impl: Callable[..., Any], case: Case, direction: str, plant: bool) -> list[Pair]:
        outs_c, grads_c, up = canonical(impl, case, direction)
        t = case.inputs[row_inputs[0]].shape[0]
        bounds, start = [], 0
        for size in (1, 3, 5, 7):  # odd chunks first, then the remainder as one chunk
            if start >= t:
                break
            bounds.append((start, min(t, start + size)))
            start += size
        if start < t:
            bounds.append((start, t))
        outs_parts: list[list[torch.Tensor]] = []
        grad_parts: dict[str, list[torch.Tensor]] = {n: [] for n in row_grads}
        for lo, hi in bounds:
            rows = list(range(lo, hi))
            sub = _select_rows(case.inputs, row_inputs, torch.tensor(rows))
            o, g = _run(impl, sub, row_inputs, grad_inputs, direction,
                        None if up is None else upstream_rows(up, rows))
            outs_parts.append(list(o))
            for n in row_grads:
                if n in g:
                    grad_parts[n].append(g[n])
        outs_t = [torch.cat([p[i] for p in outs_parts], 0) for i in range(len(outs_c))]
        grads_t = {n: torch.cat(v, 0) for n, v in grad_parts.items() if v}
        label = f"{len(bounds)} chunks (1, 3, 5, 7, rest)"
        return compare_rows(label, outs_c, grads_c, outs_t, grads_t, list(range(t)), plant)

    def padding(impl: Callable[..., Any], case: Case, direction: str, plant: bool) -> list[Pair]:
        outs_c, grads_c, up = canonical(impl, case, direction)
        t = case.inputs[row_inputs[0]].shape[0]
        padded = dict(case.inputs)
        gen = torch.Generator().manual_seed(case.seed + 99)
        left, right = 2, 3
        for n in row_inputs:
            x = case.inputs[n]
            if x.is_floating_point():
                junk_l = standard_normal((left,) + tuple(x.shape[1:]), gen).to(x.dtype).to(x.device)
                junk_r = standard_normal((right,) + tuple(x.shape[1:]), gen).to(x.dtype).to(x.device)
            else:
                junk_l = x[:1].expand((left,) + tuple(x.shape[1:])).clone()
                junk_r = x[-1:].expand((right,) + tuple(x.shape[1:])).clone()
            padded[n] = torch.cat([junk_l, x, junk_r], 0)
        rows_in_padded = list(range(left, left + t))
        if direction == "forward":
            outs_p, grads_p = run_forward(impl, padded), {}
        else:
            pad_up = []
            for u in up:
                zl = torch.zeros((left,) + tuple(u.shape[1:]), dtype=u.dtype, device=u.device)
                zr = torch.zeros((right,) + tuple(u.shape[1:]), dtype=u.dtype, device=u.device)
                pad_up.append(torch.cat([zl, u, zr], 0))
            outs_p, grads_p, _ = run_gradient(impl, padded, grad_inputs, upstream=tuple(pad_up))
        idx = torch.tensor(rows_in_padded)
        outs_t = [o.index_select(0, idx.to(o.device)) for o in outs_p]
        grads_t = {n: grads_p[n].index_select(0, idx.to(grads_p[n].device)) for n in row_grads if n in grads_p}
        return compare_rows(f"{left} left + {right} right padding rows", outs_c, grads_c, outs_t, grads_t,
                            list(range(t)), plant)

    def layout(impl: Callable[..., Any], case: Case, direction: str, plant: bool) -> list[Pair]:
        outs_c, grads_c, up = canonical(impl, case, direction)
        strided = dict(case.inputs)
        for n in row_inputs:
            x = case.inputs[n]
            if x.is_floating_point() and x.dim() >= 2:
                wide = torch.full(tuple(x.shape[:-1]) + (x.shape[-1] + 8,), float("nan"),
                                  dtype=x.dtype, device=x.device)
                wide[..., : x.shape[-1]] = x
                strided[n] = wide[..., : x.shape[-1]]
        for n in layout_inputs:
            w = case.inputs[n]
            strided[n] = w.t().contiguous().t()
        label = "row stride padded by 8" + (f"; {', '.join(layout_inputs)} column-major" if layout_inputs else "")
        if direction == "forward":
            outs_t, grads_t = run_forward(impl, strided), {}
        else:
            outs_t, grads_t, _ = run_gradient(impl, strided, grad_inputs, upstream=up)
        pairs = []
        for i, (c, t) in enumerate(zip(outs_c, outs_t)):
            pairs.append(Pair(f"{label}: output {i}", c, plant_ulp(t) if plant and i == 0 and direction == "forward" else t))
        for j, n in enumerate(grad_inputs):
            if n in grads_c:
                g = grads_t[n]
                pairs.append(Pair(f"{label}: d{n}", grads_c[n], plant_ulp(g) if plant and j == 0 else g))
        return pairs

    return {"batch": batch, "chunk": chunk, "padding": padding, "layout": layout}
