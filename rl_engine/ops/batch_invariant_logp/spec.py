"""Spec of ``batch_invariant_logp``: padded layout [B, S, V]; position (b, s) depends only on its row.

The generic row-wise transforms take a packed T axis, so this spec writes its own transforms over
the [B, S] layout (the :data:`rl_engine.ops.spec.TransformFn` contract: ``fn(impl, case, direction,
plant) -> [Pair]``):

* ``batch``   - each of the first, middle and last sequences scored alone (B = 1), and the batch in
                 reversed order, equal the same sequences of the canonical batch;
* ``chunk``   - the S axis processed in chunks of sizes 1, 3, 5, ... and concatenated equals the whole;
* ``padding`` - the valid tokens moved to a left-padded layout with S + 3 and to a right-padded
                 layout with S + 4 plus one all-padding sequence (padding logits NaN, padding
                 targets -100, random upstream gradients there) equal the canonical tokens;
* ``layout``  - logits as a strided view (B and S strides padded, V row padded by 8 NaN columns),
                 targets and mask with transposed storage, equal the contiguous run.

Gradients compare dlogits rows of the same tokens. With ``plant=True`` the transformed side of the
first output pair (forward) or the first dlogits pair (gradient) carries a one-ulp change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rl_engine.ops.batch_invariant_logp.op import batch_invariant_logp_cuda, batch_invariant_logp_triton
from rl_engine.ops.batch_invariant_logp.reference import batch_invariant_logp_reference
from rl_engine.ops.batch_invariant_logp.torch_bf16 import batch_invariant_logp_torch_bf16
from rl_engine.ops.execute import make_upstream, run_forward, run_gradient
from rl_engine.ops.logp.spec import draw_logits, draw_targets
from rl_engine.ops.spec import Case, OpSpec, Pair, Workload, make_generator, standard_normal
from rl_engine.ops.transforms import plant_ulp

IGNORE_ID = -100
"""Target id placed at masked positions of the cases (the Hugging Face ignore index): never read."""
MAX_SEQ_LEN = 256
"""Right-padded cases keep the workload's sequence lengths up to this (FP32 [B, S, V] logits at
V = 151936 cost 0.6 MB a row; the transforms hold several copies)."""


# --------------------------------------------------------------------------------------------------
# cases


def _case(lens: tuple[int, ...], side: str, v: int, seed: int, device: torch.device,
          temperature: float = 1.0) -> Case:
    b, s = len(lens), max(max(lens), 1)
    g = make_generator(seed)
    logits = draw_logits(b * s, v, g)
    targets = draw_targets(logits, g).view(b, s)
    logits = logits.view(b, s, v)
    pos = torch.arange(s)
    length = torch.tensor(lens)
    if side == "right":
        mask = pos[None, :] < length[:, None]
    else:
        mask = pos[None, :] >= (s - length)[:, None]
    targets = torch.where(mask, targets, torch.full_like(targets, IGNORE_ID))
    suffix = "" if temperature == 1.0 else f"-temp{temperature:g}"
    return Case(
        id=f"B{b}-S{s}-V{v}-{side}{suffix}",
        inputs={"logits": logits.to(device), "targets": targets.to(device), "mask": mask.to(device),
                "temperature": temperature},
        seed=seed,
    )


def _right_lens(w: Workload) -> tuple[int, ...]:
    return tuple(n for n in w.seq_lens if n <= MAX_SEQ_LEN)


def _left_lens(w: Workload) -> tuple[int, ...]:
    s = w.token_counts[1]  # an odd length: 7 (smoke), 257 (qwen3-8b)
    return (s, s // 2, 1)


def _cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    return [
        _case(_right_lens(w), "right", w.vocab, seed, device),
        _case(_left_lens(w), "left", w.vocab, seed + 1, device),
        _case((1,), "right", w.vocab, seed + 2, device),
        _case(_left_lens(w), "left", w.vocab, seed + 3, device, temperature=0.7),
    ]


def _grad_cases(w: Workload, seed: int, device: torch.device) -> list[Case]:
    return [
        _case(_right_lens(w), "right", w.vocab, seed, device),
        _case(_left_lens(w), "left", w.vocab, seed + 1, device, temperature=0.7),
    ]


# --------------------------------------------------------------------------------------------------
# transforms

_Run = tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]


def _canonical(impl: Callable[..., Any], case: Case, direction: str) -> tuple[_Run, torch.Tensor | None]:
    if direction == "forward":
        return (run_forward(impl, case.inputs), {}), None
    probe = run_forward(impl, case.inputs)
    (up,) = make_upstream(probe, case.seed + 7)
    outs, grads, _ = run_gradient(impl, case.inputs, ("logits",), upstream=(up,))
    return (outs, grads), up


def _run(impl: Callable[..., Any], inputs: dict[str, Any], direction: str, up: torch.Tensor | None) -> _Run:
    if direction == "forward":
        return run_forward(impl, inputs), {}
    outs, grads, _ = run_gradient(impl, inputs, ("logits",), upstream=(up,))
    return outs, grads


def _pick(t: torch.Tensor, where: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    return t if where is None else t[where[0].to(t.device), where[1].to(t.device)]


def _pairs(label: str, canon: _Run, trans: _Run, where_c, where_t, direction: str, plant: bool) -> list[Pair]:
    """Pairs for the output and (gradient direction) dlogits of the same tokens; ``where_*`` are
    (b, s) index tensors, or None for the whole tensor."""
    (outs_c, grads_c), (outs_t, grads_t) = canon, trans
    out_t = _pick(outs_t[0], where_t)
    pairs = [Pair(f"{label}: logprobs", _pick(outs_c[0], where_c),
                  plant_ulp(out_t) if plant and direction == "forward" else out_t)]
    if direction == "gradient":
        d_t = _pick(grads_t["logits"], where_t)
        pairs.append(Pair(f"{label}: dlogits", _pick(grads_c["logits"], where_c), plant_ulp(d_t) if plant else d_t))
    return pairs


def _sub(inputs: dict[str, Any], dim: int, idx: torch.Tensor) -> dict[str, Any]:
    out = dict(inputs)
    for n in ("logits", "targets", "mask"):
        out[n] = inputs[n].index_select(dim, idx.to(inputs[n].device)).contiguous()
    return out


def _batch(impl: Callable[..., Any], case: Case, direction: str, plant: bool) -> list[Pair]:
    canon, up = _canonical(impl, case, direction)
    b = case.inputs["logits"].shape[0]
    subsets = [(f"sequence {i} alone", [i]) for i in sorted({0, b // 2, b - 1})]
    if b > 1:
        subsets.append((f"{b} sequences reversed", list(range(b - 1, -1, -1))))
    pairs: list[Pair] = []
    for label, seqs in subsets:
        idx = torch.tensor(seqs)
        sub_up = None if up is None else up.index_select(0, idx.to(up.device))
        trans = _run(impl, _sub(case.inputs, 0, idx), direction, sub_up)
        pairs += _pairs(label, (tuple(o.index_select(0, idx.to(o.device)) for o in canon[0]),
                                {k: v.index_select(0, idx.to(v.device)) for k, v in canon[1].items()}),
                        trans, None, None, direction, plant and not pairs)
    return pairs


def _chunk(impl: Callable[..., Any], case: Case, direction: str, plant: bool) -> list[Pair]:
    canon, up = _canonical(impl, case, direction)
    s = case.inputs["logits"].shape[1]
    bounds, start, sizes = [], 0, (1, 3, 5)
    while start < s:
        size = sizes[len(bounds) % len(sizes)]
        bounds.append((start, min(s, start + size)))
        start += size
    outs, grads = [], []
    for lo, hi in bounds:
        idx = torch.arange(lo, hi)
        sub_up = None if up is None else up.index_select(1, idx.to(up.device))
        o, g = _run(impl, _sub(case.inputs, 1, idx), direction, sub_up)
        outs.append(o[0])
        if g:
            grads.append(g["logits"])
    trans = ((torch.cat(outs, 1),), {"logits": torch.cat(grads, 1)} if grads else {})
    return _pairs(f"S in {len(bounds)} chunks of sizes 1,3,5,...", canon, trans, None, None, direction, plant)


def _relayout(case: Case, up: torch.Tensor | None, side: str, extra_s: int, extra_b: int):
    x, t, m = case.inputs["logits"], case.inputs["targets"], case.inputs["mask"]
    b, s, v = x.shape
    dev = x.device
    valid = torch.nonzero(m)
    bc, sc = valid[:, 0], valid[:, 1]
    rank = torch.cumsum(m.long(), 1)[bc, sc] - 1
    s2, b2 = s + extra_s, b + extra_b
    st = (s2 - m.sum(1)[bc] + rank) if side == "left" else rank
    x2 = torch.full((b2, s2, v), float("nan"), dtype=x.dtype, device=dev)
    x2[bc, st] = x[bc, sc]
    t2 = torch.full((b2, s2), IGNORE_ID, dtype=t.dtype, device=dev)
    t2[bc, st] = t[bc, sc]
    m2 = torch.zeros((b2, s2), dtype=torch.bool, device=dev)
    m2[bc, st] = True
    up2 = None
    if up is not None:
        gen = make_generator(case.seed + 99)
        up2 = standard_normal((b2, s2), gen).to(up.dtype).to(up.device)  # junk where masked
        up2[bc, st] = up[bc, sc]
    inputs = dict(case.inputs, logits=x2, targets=t2, mask=m2)
    return inputs, up2, (bc, sc), (bc, st)


def _padding(impl: Callable[..., Any], case: Case, direction: str, plant: bool) -> list[Pair]:
    canon, up = _canonical(impl, case, direction)
    pairs: list[Pair] = []
    for label, side, extra_s, extra_b in (("left padding, S + 3", "left", 3, 0),
                                          ("right padding, S + 4, one all-padding sequence", "right", 4, 1)):
        inputs, up2, where_c, where_t = _relayout(case, up, side, extra_s, extra_b)
        trans = _run(impl, inputs, direction, up2)
        pairs += _pairs(label, canon, trans, where_c, where_t, direction, plant and not pairs)
    return pairs


def _layout(impl: Callable[..., Any], case: Case, direction: str, plant: bool) -> list[Pair]:
    canon, up = _canonical(impl, case, direction)
    x, t, m = case.inputs["logits"], case.inputs["targets"], case.inputs["mask"]
    b, s, v = x.shape
    wide = torch.full((b, s + 2, v + 8), float("nan"), dtype=x.dtype, device=x.device)
    wide[:, 1:s + 1, :v] = x
    t_store = torch.empty((s, b), dtype=t.dtype, device=t.device)
    t_store.copy_(t.t())
    m_store = torch.empty((s, b), dtype=m.dtype, device=m.device)
    m_store.copy_(m.t())
    inputs = dict(case.inputs, logits=wide[:, 1:s + 1, :v], targets=t_store.t(), mask=m_store.t())
    trans = _run(impl, inputs, direction, up)
    return _pairs("logits strided (S and V padded, NaN filled); targets, mask transposed storage",
                  canon, trans, None, None, direction, plant)


SPEC = OpSpec(
    name="batch_invariant_logp",
    summary="masked log_softmax(logits / temperature)[target], logits [B, S, V] fp32 -> [B, S] fp32",
    build_cases=_cases,
    build_grad_cases=_grad_cases,
    outputs=("logprobs",),
    grad_inputs=("logits",),
    impls={
        "reference_fp32": batch_invariant_logp_reference,
        "torch_bf16": batch_invariant_logp_torch_bf16,
        "triton_cuda_bf16": batch_invariant_logp_triton,
        "cuda_bf16": batch_invariant_logp_cuda,
    },
    transforms={
        "batch": _batch,
        "chunk": _chunk,
        "padding": _padding,
        "layout": _layout,
        "tp": "the op takes whole [B, S, V] logit rows; a vocab-parallel split would need a cross-rank "
              "max / sum-exp merge that the contract does not declare",
    },
    float_outputs_fp32=("logprobs",),
)
