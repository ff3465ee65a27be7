"""Scoring a batch of sequences with the Qwen3 model in the two execution styles RL uses.

Shape glossary: B sequences, L_b tokens of sequence b, P_b its prompt length, C_b = L_b - P_b its
completion length, N = sum C_b scored (active) tokens.

* :func:`score_teacher_forcing` — training style: one packed varlen forward over whole sequences,
  the logprob of token t+1 given tokens <= t.
* :func:`score_rollout` — rollout style: prefill every prompt into a static KV cache, then decode
  token by token for all B sequences at once, fed the batch's own completion tokens.

Both return FP32 [N] in :meth:`SeqBatch.active_index` order, and both accept a ``recorder``
(``recorder(site, x)``, e.g. :class:`rl_engine.chain.parity.ActivationRecorder`): the model then
runs on a :class:`RecordingOps` table, which hands it every op output of every layer, and the
scoring hands it the logprobs under ``logp``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rl_engine.chain.model import KVCache, OpTable, Qwen3Model
from rl_engine.errors import InputError

SAMPLING = {"temperature": 1.0, "top_k": None, "top_p": None,
            "tokens": "fed from the fixture (teacher-forced decode), not sampled"}
"""Sampling settings of both styles, recorded with every result (``docs/pitfalls.md`` P11)."""


class RecordingOps:
    """An op table that runs ``inner`` and hands every output to ``recorder(prefix + site, out)``.

    The recorder sees the tensor the model goes on with, so a recorder that changes it in place
    (:class:`rl_engine.chain.parity.PlantedChange`) changes the rest of the forward too.
    """

    def __init__(self, inner: OpTable, recorder: Callable[[str, torch.Tensor], None], prefix: str = ""):
        self.inner, self.recorder, self.prefix = inner, recorder, prefix

    def impl(self, op: str) -> Callable[..., Any]:
        return self.inner.impl(op)

    def __call__(self, site: str, op: str, **kwargs: Any) -> torch.Tensor:
        out = self.inner(site, op, **kwargs)
        self.recorder(self.prefix + site, out)
        return out

    def scope(self, prefix: str) -> RecordingOps:
        return RecordingOps(self.inner, self.recorder, prefix)

    def accepts(self, op: str, param: str) -> bool:
        return self.inner.accepts(op, param)

    def has(self, op: str) -> bool:
        """False: a recording sees every site's own output, so the model runs no fused launch."""
        return False


def _table(model: Qwen3Model, recorder: Any) -> Any:
    return None if recorder is None else RecordingOps(model.ops, recorder)


# -- batches of sequences ------------------------------------------------------------------------
@dataclass(frozen=True)
class SeqBatch:
    """Sequences to score: token ids [L_b] int64 per sequence, and the prompt length P_b of each.

    The active tokens of sequence b are its completion tokens ``tokens[b][P_b:]`` (C_b = L_b - P_b
    of them, C_b >= 1, P_b >= 1); token ``t`` is scored given tokens ``< t``.
    """

    tokens: tuple[torch.Tensor, ...]
    prompt_lens: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.prompt_lens):
            raise InputError(f"{len(self.tokens)} sequences but {len(self.prompt_lens)} prompt lengths")
        for b, (tok, p) in enumerate(zip(self.tokens, self.prompt_lens)):
            if tok.dim() != 1 or tok.dtype != torch.int64:
                raise InputError(f"sequence {b}: expected [L] int64 token ids, got {list(tok.shape)} {tok.dtype}")
            if not 1 <= p < tok.numel():
                raise InputError(f"sequence {b}: prompt length {p} must be in [1, L-1] with L={tok.numel()}")

    @property
    def batch(self) -> int:
        return len(self.tokens)

    def completion_lens(self) -> list[int]:
        return [int(t.numel()) - p for t, p in zip(self.tokens, self.prompt_lens)]

    @property
    def active_tokens(self) -> int:
        return sum(self.completion_lens())

    def subset(self, idx: Sequence[int]) -> SeqBatch:
        return SeqBatch(tuple(self.tokens[i] for i in idx), tuple(self.prompt_lens[i] for i in idx))

    def active_index(self) -> list[tuple[int, int]]:
        """(sequence, position of the scored token) of every active token, in output order."""
        return [(b, p) for b, (tok, pl) in enumerate(zip(self.tokens, self.prompt_lens))
                for p in range(pl, int(tok.numel()))]


def _cu(lengths: Sequence[int], device: torch.device) -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + int(n))
    return torch.tensor(cu, dtype=torch.int32, device=device)


class TokenKeys:
    """Global token keys for recording: key = offset[b] + position, one per (sequence, position)."""

    def __init__(self, batch: SeqBatch):
        self.offsets = [0]
        for tok in batch.tokens:
            self.offsets.append(self.offsets[-1] + int(tok.numel()))
        self.total = self.offsets[-1]

    def key(self, b: int, pos: int) -> int:
        return self.offsets[b] + pos

    def locate(self, key: int) -> tuple[int, int]:
        for b in range(len(self.offsets) - 1):
            if key < self.offsets[b + 1]:
                return b, key - self.offsets[b]
        raise IndexError(key)


# -- the two styles ------------------------------------------------------------------------------
def score_teacher_forcing(model: Qwen3Model, batch: SeqBatch, *, head: str = "linear_logp",
                          temperature: float = 1.0, micro_batch: int | None = None,
                          recorder: Any = None) -> torch.Tensor:
    """Training style: packed varlen forward over whole sequences, logprob of token t+1 given <= t.

    Returns FP32 [N] for the active (completion) tokens in :meth:`SeqBatch.active_index` order.
    ``micro_batch`` splits the sequences into consecutive groups of that many, scored by separate
    forwards (the result must not depend on it: ``docs/pitfalls.md`` P1).
    ``recorder`` sees every op output (module docstring).
    """
    dev = model.device
    groups = [list(range(batch.batch))]
    if micro_batch is not None:
        if micro_batch < 1:
            raise InputError(f"micro_batch must be >= 1, got {micro_batch}")
        groups = [list(range(i, min(i + micro_batch, batch.batch))) for i in range(0, batch.batch, micro_batch)]
    model.check_positions(0, max((int(t.numel()) for t in batch.tokens), default=1) - 1)  # once, for every forward below
    keys = TokenKeys(batch) if recorder is not None else None
    ops = _table(model, recorder)
    out = []
    with torch.no_grad():
        for grp in groups:
            sub = batch.subset(grp)
            lens = [int(t.numel()) for t in sub.tokens]
            ids = torch.cat(list(sub.tokens)).to(dev)
            positions = torch.cat([torch.arange(n, dtype=torch.int64) for n in lens]).to(dev)
            cu = _cu(lens, dev)
            if recorder is not None:
                recorder.set_rows([keys.key(b, p) for b in grp for p in range(int(batch.tokens[b].numel()))])
            hidden = model.forward(ids, positions, cu_seqlens=cu, checked=True, ops=ops)
            rows, targets = [], []
            start = 0
            for tok, pl, n in zip(sub.tokens, sub.prompt_lens, lens):
                rows.extend(range(start + pl - 1, start + n - 1))
                targets.append(tok[pl:])
                start += n
            rows_t = torch.tensor(rows, dtype=torch.int64, device=dev)
            h_act = hidden.index_select(0, rows_t)
            lp = model.logprobs(h_act, torch.cat(targets).to(dev), head=head, temperature=temperature)
            if recorder is not None:
                recorder.set_rows([keys.key(b, p - 1) for b in grp
                                   for p in range(batch.prompt_lens[b], int(batch.tokens[b].numel()))])
                recorder("logp", lp)
            out.append(lp)
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float32, device=dev)


def score_rollout(model: Qwen3Model, batch: SeqBatch, *, head: str = "linear_logp", temperature: float = 1.0,
                  recorder: Any = None, cache_fill: float = float("nan")) -> torch.Tensor:
    """Rollout style: prefill every prompt (packed varlen, K/V into a static cache), then decode
    token by token for all B sequences at once, fed the batch's own completion tokens.

    Decode step ``s`` feeds token ``P_b + s`` of every sequence b (one step = B tokens) and scores
    token ``P_b + s + 1``; the prefill's last row scores token ``P_b``. A sequence whose
    completion is shorter than the longest keeps being fed a dummy token (id 0 at position
    ``L_b - 1``, a slot no later step of that sequence reads) whose results are discarded, so
    every step has B rows. The cache has ``S_max = max_b L_b`` slots. Every position of the plan
    is validated once, before the prefill, so the decode steps read no device value on the host.
    Sampling settings: temperature as given, no top-k, no top-p (the tokens are the fixture's, not
    sampled).

    Returns FP32 [N] in :meth:`SeqBatch.active_index` order.
    """
    dev = model.device
    cfg = model.config
    bsz = batch.batch
    comp = batch.completion_lens()
    steps = max(comp) - 1
    s_max = max(int(t.numel()) for t in batch.tokens)
    model.check_positions(0, s_max - 1, s_max)  # every position below fits the RoPE table and the cache
    keys = TokenKeys(batch) if recorder is not None else None
    ops = _table(model, recorder)
    per_seq: list[list[torch.Tensor]] = [[] for _ in range(bsz)]
    with torch.no_grad():
        cache = KVCache.allocate(cfg, bsz, s_max, model.dtype, dev, fill=cache_fill)
        # prefill
        plens = list(batch.prompt_lens)
        ids = torch.cat([t[:p] for t, p in zip(batch.tokens, plens)]).to(dev)
        positions = torch.cat([torch.arange(p, dtype=torch.int64) for p in plens]).to(dev)
        cu = _cu(plens, dev)
        if recorder is not None:
            recorder.set_rows([keys.key(b, p) for b in range(bsz) for p in range(plens[b])])
        hidden = model.forward(ids, positions, cu_seqlens=cu, cache=cache, checked=True, ops=ops)
        last = torch.tensor([int(c) - 1 for c in cu[1:].tolist()], dtype=torch.int64, device=dev)
        targets = torch.stack([t[p] for t, p in zip(batch.tokens, plens)]).to(dev)
        lp = model.logprobs(hidden.index_select(0, last), targets, head=head, temperature=temperature)
        if recorder is not None:
            recorder.set_rows([keys.key(b, plens[b] - 1) for b in range(bsz)])
            recorder("logp", lp)
        for b in range(bsz):
            per_seq[b].append(lp[b : b + 1])
        # decode
        for s in range(steps):
            live = [s < comp[b] - 1 for b in range(bsz)]
            step_ids = torch.tensor([int(batch.tokens[b][plens[b] + s]) if live[b] else 0 for b in range(bsz)],
                                    dtype=torch.int64, device=dev)
            step_pos = torch.tensor([plens[b] + s if live[b] else plens[b] + comp[b] - 1 for b in range(bsz)],
                                    dtype=torch.int64, device=dev)
            step_tgt = torch.tensor([int(batch.tokens[b][plens[b] + s + 1]) if live[b] else 0 for b in range(bsz)],
                                    dtype=torch.int64, device=dev)
            if recorder is not None:
                recorder.set_rows([keys.key(b, plens[b] + s) if live[b] else -1 for b in range(bsz)])
            hidden = model.forward(step_ids, step_pos, cache=cache, decode=True, checked=True, ops=ops)
            lp = model.logprobs(hidden, step_tgt, head=head, temperature=temperature)
            if recorder is not None:
                recorder("logp", lp)
            for b in range(bsz):
                if live[b]:
                    per_seq[b].append(lp[b : b + 1])
    parts = [torch.cat(p) for p in per_seq]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float32, device=dev)
