"""Train/rollout logprob parity of the Qwen3 chain, model-level accuracy, first-divergence search.

For one backend: score the fixture's completion tokens training-style (packed teacher forcing)
and rollout-style (prefill + KV-cache decode) and compute WS1 §8 metrics with
:func:`rl_engine.gate.compare.chain_metrics` (``lhs`` = training style, ``rhs`` = rollout style,
the roles the contract fixes) under the ``ws1`` and ``strict`` profiles. Each side is also
compared with the FP32 reference chain (``reference_fp32``, training style): max / mean / P99 /
P99.9 of ``|logp - logp_ref|`` (an observation; the chain has no element-wise threshold).

First divergence: when the two styles' logprobs are not bitwise equal, both styles are re-run
with an :class:`ActivationRecorder` that keeps, for every op output of every layer and every
token position both styles compute, a 2 x 64-bit digest of the row's raw bits. The first op in
forward order where any token's digest differs is named with the first (lowest position) token
that differs there; a second pair of runs captures that token's row at that op and reports the
first differing element with both values and bit patterns.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rl_engine.chain.fixtures import Fixture
from rl_engine.chain.model import Qwen3Model
from rl_engine.chain.scoring import SAMPLING, SeqBatch, TokenKeys, score_rollout, score_teacher_forcing
from rl_engine.contract import Contract
from rl_engine.gate.compare import _quantile, chain_metrics

PROFILES = ("ws1", "strict")
_INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


# -- activation recording ------------------------------------------------------------------------
_WEIGHTS_CACHE: dict[tuple[int, str], torch.Tensor] = {}


def _digest_weights(width: int, device: torch.device) -> torch.Tensor:
    """[width, 2] int64 fixed pseudo-random weights in [1, 2^15): the digest is a weighted sum of
    the raw integer bits of a row. Products stay below 2^46 and sums of up to 2^14 of them below
    2^61, so nothing overflows and any single-element change alters the digest."""
    key = (width, str(device))
    if key not in _WEIGHTS_CACHE:
        g = torch.Generator(device="cpu")
        g.manual_seed(20240917 + width)
        _WEIGHTS_CACHE[key] = torch.randint(1, 1 << 15, (width, 2), generator=g, dtype=torch.int64).to(device)
    return _WEIGHTS_CACHE[key]


def row_digest(x: torch.Tensor) -> torch.Tensor:
    """[T, ...] float tensor -> [T, 2] int64 digest of each row's raw bits (+0 and -0 differ)."""
    t = x.shape[0]
    flat = x.detach().reshape(t, -1).contiguous()
    iv = flat.view(_INT_VIEW[flat.dtype]).to(torch.int64)
    out = torch.zeros((t, 2), dtype=torch.int64, device=flat.device)
    chunk = 16384
    for lo in range(0, flat.shape[1], chunk):
        part = iv[:, lo : lo + chunk]
        w = _digest_weights(part.shape[1], flat.device)
        out[:, 0] += (part * w[:, 0]).sum(dim=1)
        out[:, 1] += (part * w[:, 1]).sum(dim=1)
    return out


class ActivationRecorder:
    """Recorder passed to the scoring functions (``recorder(site, x)``, fed by their recording op table).

    The scoring function calls :meth:`set_rows` with the global key (see
    :class:`~rl_engine.chain.scoring.TokenKeys`) of every row of the next forward call (-1 for
    rows to ignore); each op output is then reduced to per-row digests. With ``capture`` (a set of
    keys) the full rows of those tokens are also kept (on the CPU) for every op.
    """

    def __init__(self, n_keys: int, capture: Sequence[int] = ()):
        self.n_keys = n_keys
        self.order: list[str] = []
        self.digests: dict[str, torch.Tensor] = {}
        self.seen: dict[str, torch.Tensor] = {}
        self.capture = set(int(k) for k in capture)
        self.captured: dict[tuple[str, int], torch.Tensor] = {}
        self._rows: list[int] = []
        self._rows_t: torch.Tensor | None = None

    def set_rows(self, keys: Sequence[int]) -> None:
        self._rows = [int(k) for k in keys]
        self._rows_t = None

    def __call__(self, where: str, x: torch.Tensor) -> None:
        if x.shape[0] != len(self._rows):
            raise RuntimeError(f"recorder: {where} has {x.shape[0]} rows but {len(self._rows)} keys were set")
        dev = x.device
        if self._rows_t is None or self._rows_t.device != dev:
            self._rows_t = torch.tensor(self._rows, dtype=torch.int64, device=dev)
        if where not in self.digests:
            self.order.append(where)
            self.digests[where] = torch.zeros((self.n_keys, 2), dtype=torch.int64, device=dev)
            self.seen[where] = torch.zeros(self.n_keys, dtype=torch.bool, device=dev)
        valid = self._rows_t >= 0
        keys = self._rows_t[valid]
        if keys.numel():
            dig = row_digest(x)[valid]
            self.digests[where][keys] = dig
            self.seen[where][keys] = True
        if self.capture:
            for i, k in enumerate(self._rows):
                if k in self.capture:
                    self.captured[(where, k)] = x[i].detach().reshape(-1).cpu().clone()


class PlantedChange:
    """A negative control for localisation: flips the lowest bit of element ``index`` of the row of
    token ``key`` in the output of op ``where`` (in place, so it propagates downstream)."""

    def __init__(self, inner: ActivationRecorder | None, where: str, key: int, index: int = 0):
        self.inner, self.where, self.key, self.index = inner, where, int(key), int(index)
        self.applied = 0
        self._rows: list[int] = []

    def set_rows(self, keys: Sequence[int]) -> None:
        self._rows = [int(k) for k in keys]
        if self.inner is not None:
            self.inner.set_rows(keys)

    def __call__(self, where: str, x: torch.Tensor) -> None:
        if where == self.where and self.key in self._rows:
            i = self._rows.index(self.key)
            row = x[i].reshape(-1)
            iv = row.view(_INT_VIEW[row.dtype])
            iv[self.index] ^= 1
            self.applied += 1
        if self.inner is not None:
            self.inner(where, x)


def _split_where(where: str) -> tuple[int | None, str]:
    if where.startswith("layer"):
        head, op = where.split(".", 1)
        return int(head[len("layer"):]), op
    return None, where


def _hex(v: int, width: int) -> str:
    return f"0x{v & ((1 << width) - 1):0{width // 4}X}"


def first_divergence_from(train: ActivationRecorder, rollout: ActivationRecorder, batch: SeqBatch) -> dict[str, Any] | None:
    """The first op (forward order) where any token both styles computed differs, and its first token."""
    keys = TokenKeys(batch)
    for where in train.order:
        if where not in rollout.digests:
            continue
        both = train.seen[where] & rollout.seen[where]
        diff = both & (train.digests[where] != rollout.digests[where]).any(dim=1)
        n_diff = int(diff.sum())
        if n_diff == 0:
            continue
        cand = [keys.locate(int(k)) for k in torch.nonzero(diff).reshape(-1).tolist()]
        b, pos = min(cand, key=lambda bp: (bp[1], bp[0]))
        layer, op = _split_where(where)
        prompt = batch.prompt_lens[b]
        return {"where": where, "layer": layer, "op": op,
                "token": {"seq": b, "pos": pos, "key": keys.key(b, pos),
                          "role": "prompt" if pos < prompt - 1 else "scoring (its output scores an active token)"},
                "differing_tokens": n_diff, "compared_tokens": int(both.sum())}
    return None


def _element_detail(a: torch.Tensor, b: torch.Tensor) -> dict[str, Any]:
    iv = _INT_VIEW[a.dtype]
    ai, bi = a.view(iv), b.view(iv)
    ne = torch.nonzero(ai != bi).reshape(-1)
    width = torch.finfo(a.dtype).bits
    if ne.numel() == 0:
        return {"differing_elements": 0}
    i = int(ne[0])
    d = (a.double() - b.double()).abs()
    return {"differing_elements": int(ne.numel()), "row_width": int(a.numel()), "first_element": i,
            "train_value": float(a[i]), "rollout_value": float(b[i]),
            "train_bits": _hex(int(ai[i]), width), "rollout_bits": _hex(int(bi[i]), width),
            "max_abs_diff_in_row": float(d[torch.isfinite(d)].max()) if bool(torch.isfinite(d).any()) else math.inf}


def localize_first_divergence(model: Qwen3Model, batch: SeqBatch, *, head: str = "linear_logp",
                              temperature: float = 1.0, detail: bool = True,
                              rollout_hook: Any = None, train_hook: Any = None) -> dict[str, Any] | None:
    """Re-run both styles recording activations; name the first token and layer/op that differ.

    ``rollout_hook`` / ``train_hook`` wrap the recorder (e.g. a :class:`PlantedChange` for the
    negative control). Returns ``None`` when every recorded activation is bitwise equal.
    """
    keys = TokenKeys(batch)

    def run(capture: Sequence[int] = ()) -> tuple[ActivationRecorder, ActivationRecorder]:
        rt, rr = ActivationRecorder(keys.total, capture), ActivationRecorder(keys.total, capture)
        score_teacher_forcing(model, batch, head=head, temperature=temperature,
                              recorder=_wrap(train_hook, rt))
        score_rollout(model, batch, head=head, temperature=temperature, recorder=_wrap(rollout_hook, rr))
        return rt, rr

    rt, rr = run()
    found = first_divergence_from(rt, rr, batch)
    if found is None or not detail:
        return found
    key = found["token"]["key"]
    ct, cr = run(capture=[key])
    a, b = ct.captured.get((found["where"], key)), cr.captured.get((found["where"], key))
    if a is not None and b is not None:
        found["element"] = _element_detail(a, b)
    return found


def _wrap(hook: Any, rec: ActivationRecorder) -> Any:
    if hook is None:
        return rec
    hook.inner = rec
    return hook


# -- metrics -----------------------------------------------------------------------------------
def abs_stats(x: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """max / mean / P99 / P99.9 of ``|x - ref|`` (FP64 difference of the FP32 values)."""
    d = (x.detach().double().cpu() - ref.detach().double().cpu()).abs()
    if d.numel() == 0:
        return {"max_abs_dlogp": 0.0, "mean_abs_dlogp": 0.0, "p99_abs_dlogp": 0.0, "p999_abs_dlogp": 0.0}
    return {"max_abs_dlogp": float(d.max()), "mean_abs_dlogp": float(d.mean()),
            "p99_abs_dlogp": _quantile(d, 0.99), "p999_abs_dlogp": _quantile(d, 0.999)}


def flat_metrics(report: Any) -> dict[str, Any]:
    """A ChainReport as flat name -> value (plus p99/p999 and the bitwise count)."""
    out = {name: m["value"] for name, m in report.metrics.items()}
    out.update({"p99_abs_dlogp": report.p99_abs_dlogp, "p999_abs_dlogp": report.p999_abs_dlogp,
                "bitwise_equal_tokens": report.bitwise_equal_tokens, "active_tokens": report.active_tokens,
                "first_nonzero_token": report.first_nonzero_token, "passed": report.passed})
    return out


@dataclass
class StyleRun:
    """Both styles' FP32 logprobs [N] of one backend on one fixture, and their wall times."""

    backend: str
    train: torch.Tensor
    rollout: torch.Tensor | None
    seconds: dict[str, float] = field(default_factory=dict)
    kernel_ids: dict[str, str] = field(default_factory=dict)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_styles(model: Qwen3Model, batch: SeqBatch, *, head: str = "linear_logp", temperature: float = 1.0,
               rollout: bool = True) -> StyleRun:
    """Score ``batch`` training-style and (if ``rollout``) rollout-style on ``model``."""
    t0 = time.perf_counter()
    train = score_teacher_forcing(model, batch, head=head, temperature=temperature)
    _sync(model.device)
    t1 = time.perf_counter()
    roll = score_rollout(model, batch, head=head, temperature=temperature) if rollout else None
    _sync(model.device)
    t2 = time.perf_counter()
    secs = {"train_s": round(t1 - t0, 4)}
    if rollout:
        secs["rollout_s"] = round(t2 - t1, 4)
    return StyleRun(model.backend, train.float(), None if roll is None else roll.float(), secs, model.ops.kernel_ids())


def parity_report(run: StyleRun, contract: Contract, profiles: Sequence[str] = PROFILES,
                  reference: torch.Tensor | None = None) -> dict[str, Any]:
    """Chain metrics of one backend's run (per profile), and each side against the FP32 reference."""
    out: dict[str, Any] = {"backend": run.backend, "seconds": run.seconds, "profiles": {}}
    if run.rollout is not None:
        for p in profiles:
            rep = chain_metrics(run.train, run.rollout, contract.chain_thresholds(p))
            out["profiles"][p] = {"passed": rep.passed, "summary": rep.summary(), "metrics": rep.metrics,
                                  **{k: v for k, v in flat_metrics(rep).items() if k != "passed"}}
    if reference is not None:
        out["vs_reference"] = {"train": abs_stats(run.train, reference)}
        if run.rollout is not None:
            out["vs_reference"]["rollout"] = abs_stats(run.rollout, reference)
    return out


def check_parity(model: Qwen3Model, fixture: Fixture, contract: Contract, *, head: str = "linear_logp",
                 temperature: float = 1.0, reference: torch.Tensor | None = None,
                 profiles: Sequence[str] = PROFILES, localize: bool = True) -> dict[str, Any]:
    """Both styles on ``model`` + metrics + (on a mismatch) the first divergence. JSON-ready dict."""
    batch = fixture.batch()
    run = run_styles(model, batch, head=head, temperature=temperature)
    rep = parity_report(run, contract, profiles, reference)
    rep.update({"fixture": fixture.describe(), "head": head, "sampling": dict(SAMPLING, temperature=temperature),
                "kernel_ids": run.kernel_ids})
    bitwise = bool(torch.equal(run.train.view(torch.int32), run.rollout.view(torch.int32)))
    rep["bitwise_equal"] = bitwise
    rep["first_divergence"] = None
    if localize and not bitwise:
        rep["first_divergence"] = localize_first_divergence(model, batch, head=head, temperature=temperature)
    rep["_logp"] = {"train": run.train, "rollout": run.rollout}
    return rep
