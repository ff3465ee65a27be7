"""Continuous-batching generation on the project's kernels (``docs/rollout.md``).

Shape glossary: B_max engine slots (``max_batch``), S_max KV-cache positions per slot, P prompt
length, C completion length, V vocab, E hidden.

The engine owns one static :class:`rl_engine.chain.model.KVCache` [B_max, S_max, Hkv, D] per layer
and per-slot state tensors (the token to feed, its position, the sequence id, whether the slot is
live). A queued prompt is prefilled **alone** into a free slot (a packed forward over its P tokens
writing K/V into that row of the cache), its first token is drawn from the prefill's last row, and
it then joins the decode steps: every step runs one decode forward over slots ``[0, b)``, where
``b`` is the smallest batch-size bucket (:data:`BUCKET_SIZES`, or B_max) above the highest live
slot (B_max is at most the number of sequences; idle slots inside the bucket are fed token 0 at
position 0 and their results discarded; slots above it are not stepped). A slot whose sequence
drew a stop token or reached its token budget is refilled from the queue, lowest free slot first,
before the next step.

Why a sequence's tokens and logprobs do not depend on the batch around it: its prefill runs alone;
every decode op is batch-invariant (a row's bits depend only on that row: ``det_gemm``,
``rms_norm``, ``attention_decode`` with its fixed KV blocks, ``lm_head``); the sampler keys its
noise by (seed, sequence id, position), never by the slot, and every sampling step acts on one row
(:mod:`rl_engine.rollout.sampling`). ``tests/rollout/test_rollout_engine.py`` shows it bitwise (alone, in a
full static batch, joining a running batch mid-way) with a row-keyed sampler as negative control.

CUDA graph (``cuda_graph=True``, the default on a GPU): the step state lives in device tensors of
fixed shape and the whole decode step (36 layers, the head, sampling, the state update) is one
CUDA graph per bucket (only the full batch while :data:`BUCKETS_ON_CUDA` is off) captured when
the engine is built, replayed once per step; the ops run in their
capture-safe form (:meth:`rl_engine.chain.model.Qwen3Model.capture_safe_ops`: the only checks
left out are the ones that read device values, and the engine guarantees those: prompt ids are
validated on the host, drawn tokens come from ``argmax`` over ``[0, V)``, positions stay below
``S_max``, which the plan validated), with the backend's fused launches added where it has them
(:meth:`~rl_engine.chain.model.Qwen3Model.decode_ops`, :data:`FUSED_ON_CUDA`: the same bits as
the separate ops). The graph computes exactly what the eager step computes
(same kernels, same launch arguments), so a replay gives the eager step's bits
(``tests/chain/test_capture_gpu.py``). Per step the host reads one small tensor (which slots
finished) and copies the drawn tokens and their logprobs out of the graph's output buffers.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any

import torch

from rl_engine.chain.config import Qwen3Config
from rl_engine.chain.model import KVCache, Qwen3Model
from rl_engine.errors import InputError
from rl_engine.rollout.sampling import Sampler, SamplingParams

DEFAULT_MAX_BATCH = 8
PACKED_ON_CUDA = True
"""Whether the engine's forwards on a GPU run q/k/v and gate/up as one product each
(``Qwen3Model.forward(packed=True)``: two launches instead of five per layer, the same bits; on the
H200 the stacked shapes' det_gemm tiles gave the separate products' bits, and at M = 1 ran 13.4 us for
q/k/v (q + k + v: 21.0 us) and 52.0 us for gate/up (56.0 us), ``tools/det_gemm_decode_sweep.py``).
On since the engine's GPU tests passed with it on the H200 (``evidence/2026-12-01-h200-decode-5c38f19/``)."""


def packed_projections(device: torch.device) -> bool:
    """Whether the engine runs the packed form on ``device`` (:data:`PACKED_ON_CUDA`)."""
    return device.type != "cuda" or PACKED_ON_CUDA


FUSED_ON_CUDA = True
"""Whether the engine's forwards on a GPU take the backend's fused launches
(:meth:`rl_engine.chain.model.Qwen3Model.decode_ops`: residual add + RMSNorm in one launch;
qk_norm, RoPE and the K/V cache write in one; same bits, tested). On since the fused launches' bit
tests and the engine's GPU tests passed with it on the H200
(``evidence/2026-12-01-h200-decode-9575b6e/``); on the CPU the engine always takes them."""


def fused_launches(device: torch.device) -> bool:
    """Whether the engine takes the fused launches on ``device`` (:data:`FUSED_ON_CUDA`)."""
    return device.type != "cuda" or FUSED_ON_CUDA


BUCKET_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""Decode batch-size buckets: a step runs over slots ``[0, b)`` for the smallest bucket ``b`` (or the
engine's slot count) above the highest live slot, so the end of a run, when most slots are idle,
does not pay for every slot. A row's bits do not depend on the batch, so the bucket cannot change
them (``tests/rollout/test_rollout_engine.py``)."""

BUCKETS_ON_CUDA = True
"""Whether an engine on a GPU steps in buckets (one CUDA graph per bucket, captured when the engine is
built). On since the engine's graph tests passed with it on the H200; on the CPU the engine always
steps in buckets."""


def bucket_sizes(max_batch: int) -> tuple[int, ...]:
    """The buckets of an engine with ``max_batch`` slots: the :data:`BUCKET_SIZES` below it and itself."""
    return tuple(sorted({b for b in BUCKET_SIZES if b < max_batch} | {max_batch}))


@dataclass(frozen=True)
class Completion:
    """One generated sequence.

    ``tokens`` [C] int64 (CPU): the drawn tokens, the stop token included when one ended it;
    ``logprobs`` [C] float32 (CPU): each token's logprob under the sampling distribution
    (``docs/rollout.md``); ``finish_reason``: ``"stop"`` or ``"length"``.
    """

    seq_id: int
    prompt: tuple[int, ...]
    tokens: torch.Tensor
    logprobs: torch.Tensor
    finish_reason: str


@dataclass
class GenerationResult:
    """The completions in prompt order, the sampling settings and the counts behind tokens/s
    (``max_batch``: the slots the engine ran, ``min(max_batch, N)``)."""

    completions: list[Completion]
    sampling: SamplingParams
    max_batch: int
    s_max: int
    decode_steps: int
    prefills: int
    wall_s: float
    admissions: tuple[tuple[int, int, int], ...] = ()
    """``(seq_id, slot, decode steps run before its prefill)`` per sequence, in admission order."""
    bucket_steps: tuple[tuple[int, int], ...] = ()
    """``(bucket size, decode steps run at that size)``, by size (:data:`BUCKET_SIZES`)."""
    cuda_graph: bool = False
    """Whether the decode steps replayed CUDA graphs."""
    graph_fallback: str | None = None
    """Why graphs were asked for but the steps ran eagerly (:attr:`Engine.graph_fallback`), else None."""

    @property
    def generated_tokens(self) -> int:
        return sum(int(c.tokens.numel()) for c in self.completions)

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_s if self.wall_s > 0 else float("inf")


@dataclass
class _Request:
    index: int
    seq_id: int
    prompt: tuple[int, ...]
    budget: int
    tokens: list[torch.Tensor] = field(default_factory=list)
    logprobs: list[torch.Tensor] = field(default_factory=list)
    finish_reason: str | None = None


# -- validation (before any kernel launch) ----------------------------------------------------------
def _int_like(v: Any) -> bool:
    return isinstance(v, Integral) and not isinstance(v, bool)


def _check_prompts(prompts: Any, vocab: int) -> list[tuple[int, ...]]:
    if isinstance(prompts, torch.Tensor) or not isinstance(prompts, Sequence) or isinstance(prompts, (str, bytes)):
        raise InputError(f"prompts: expected a list of token-id lists, got {type(prompts).__name__}")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, torch.Tensor):
            if p.dim() != 1 or p.dtype != torch.int64:
                raise InputError(f"prompts[{i}]: expected a [P] int64 tensor, got {list(p.shape)} {p.dtype}")
            p = p.tolist()
        if isinstance(p, (str, bytes)) or not isinstance(p, Sequence):
            raise InputError(f"prompts[{i}]: expected a list of token ids, got {type(p).__name__}")
        if len(p) == 0:
            raise InputError(f"prompts[{i}]: empty prompt (at least one token is needed to condition on)")
        for j, t in enumerate(p):
            if not _int_like(t):
                raise InputError(f"prompts[{i}][{j}]: token id {t!r} is not an integer")
            if not 0 <= int(t) < vocab:
                raise InputError(f"prompts[{i}][{j}]: token id {int(t)} is outside the vocabulary [0, {vocab})")
        out.append(tuple(int(t) for t in p))
    return out


def _check_budgets(max_new_tokens: Any, n: int) -> list[int]:
    if _int_like(max_new_tokens):
        budgets = [int(max_new_tokens)] * n
    elif isinstance(max_new_tokens, Sequence) and not isinstance(max_new_tokens, (str, bytes)):
        if len(max_new_tokens) != n:
            raise InputError(f"max_new_tokens: {len(max_new_tokens)} budgets for {n} prompts")
        if not all(_int_like(b) for b in max_new_tokens):
            raise InputError(f"max_new_tokens: expected integers, got {list(max_new_tokens)!r}")
        budgets = [int(b) for b in max_new_tokens]
    else:
        raise InputError(f"max_new_tokens: expected an integer or one integer per prompt, got {max_new_tokens!r}")
    for i, b in enumerate(budgets):
        if b < 1:
            raise InputError(f"max_new_tokens: expected >= 1, got {b} (prompt {i})")
    return budgets


def _check_seq_ids(seq_ids: Any, n: int) -> list[int]:
    if seq_ids is None:
        return list(range(n))
    if isinstance(seq_ids, (str, bytes)) or not isinstance(seq_ids, Sequence) or len(seq_ids) != n:
        raise InputError(f"seq_ids: expected one integer per prompt ({n}), got {seq_ids!r}")
    if not all(_int_like(s) and 0 <= int(s) < 1 << 63 for s in seq_ids):
        raise InputError(f"seq_ids: expected integers in [0, 2^63), got {list(seq_ids)!r}")
    ids = [int(s) for s in seq_ids]
    if len(set(ids)) != n:
        raise InputError("seq_ids: must be distinct (two sequences with one id would draw the same noise)")
    return ids


def _check_stop(stop_token_ids: Any, vocab: int) -> tuple[int, ...]:
    if stop_token_ids is None:
        return ()
    if isinstance(stop_token_ids, (str, bytes)) or not isinstance(stop_token_ids, (Sequence, set, frozenset)):
        raise InputError(f"stop_token_ids: expected a list of token ids, got {stop_token_ids!r}")
    for t in stop_token_ids:
        if not _int_like(t) or not 0 <= int(t) < vocab:
            raise InputError(f"stop_token_ids: {t!r} is not a token id in [0, {vocab})")
    return tuple(sorted({int(t) for t in stop_token_ids}))


# -- the engine -----------------------------------------------------------------------------------------
class Engine:
    """A continuous-batching generator over ``max_batch`` static slots (module docstring).

    ``model``: a :class:`Qwen3Model` on a kernel backend. ``s_max``: positions per cache slot (a
    prompt plus its budget must fit). ``sampler``: :class:`Sampler` (tests pass the negative
    control :class:`rl_engine.rollout.sampling.RowKeyedSampler`). ``cuda_graph``: capture the
    decode step in a CUDA graph (default: on when the model is on a CUDA device and a kernel
    backend); the graph is captured for ``params`` and ``stop_token_ids``, which :meth:`run` must
    then be given unchanged.

    Raises
    ------
    InputError
        ``max_batch`` < 1, ``s_max`` < 2 or beyond the model's positions, ``cuda_graph=True``
        off a CUDA device or on a non-kernel backend, or ``cuda_graph`` without ``params``.
    """

    def __init__(self, model: Qwen3Model, max_batch: int, s_max: int, *, sampler: Sampler | None = None,
                 cuda_graph: bool | None = None, params: SamplingParams | None = None,
                 stop_token_ids: tuple[int, ...] = (), buckets: bool | None = None):
        if not _int_like(max_batch) or max_batch < 1:
            raise InputError(f"max_batch: expected an integer >= 1, got {max_batch!r}")
        if not _int_like(s_max) or s_max < 2:
            raise InputError(f"s_max: expected an integer >= 2, got {s_max!r}")
        if s_max > model.config.max_position_embeddings:
            raise InputError(f"s_max {s_max} exceeds the model's max_position_embeddings "
                             f"{model.config.max_position_embeddings}")
        from rl_engine.backends.registry import KERNEL_BACKENDS

        graphable = model.device.type == "cuda" and model.backend in KERNEL_BACKENDS
        if cuda_graph is None:
            cuda_graph = graphable and params is not None
        if cuda_graph and not graphable:  # before anything is allocated or launched
            raise InputError(f"cuda_graph=True needs a CUDA device and a kernel backend ({', '.join(KERNEL_BACKENDS)}); "
                             f"the model is {model.backend} on {model.device}")
        if cuda_graph and params is None:
            raise InputError("cuda_graph=True: the graph is captured for one SamplingParams; pass params=")
        self.model = model
        self.max_batch = int(max_batch)
        self.s_max = int(s_max)
        self.sampler = sampler or Sampler()
        dev = model.device
        self.cache = KVCache.allocate(model.config, self.max_batch, self.s_max, model.dtype, dev)
        # per-slot step state (static tensors: the CUDA graph captures the step over these)
        self.slot_token = torch.zeros(self.max_batch, dtype=torch.int64, device=dev)
        self.slot_pos = torch.zeros(self.max_batch, dtype=torch.int64, device=dev)
        self.slot_seq = torch.zeros(self.max_batch, dtype=torch.int64, device=dev)
        self.slot_count = torch.zeros(self.max_batch, dtype=torch.int64, device=dev)  # tokens drawn so far
        self.slot_budget = torch.zeros(self.max_batch, dtype=torch.int64, device=dev)
        self.slot_live = torch.zeros(self.max_batch, dtype=torch.bool, device=dev)
        self.slot_ids = torch.arange(self.max_batch, dtype=torch.int64, device=dev)
        # the capture-safe table only leaves out checks of device values; eager steps use the same
        # form so both paths launch the same kernels (the engine guarantees those values itself)
        if model.backend not in KERNEL_BACKENDS:
            self._ops = model.ops
        else:
            self._ops = model.decode_ops() if fused_launches(dev) else model.capture_safe_ops()
        self._logp = self._ops.impl("logp")
        if buckets is None:
            buckets = dev.type != "cuda" or BUCKETS_ON_CUDA
        self.buckets = bucket_sizes(self.max_batch) if buckets else (self.max_batch,)
        self.bucket_steps: dict[int, int] = {}
        """Decode steps run per bucket size (for tests and reports)."""
        self._views = {b: self._bucket_views(b) for b in self.buckets}
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = {}
        self._graph_key = (params, tuple(stop_token_ids))
        self.graph_fallback: str | None = None
        """Why the engine runs its decode step eagerly although graphs were asked for (None when the
        graphs were captured or not asked for): a capture failed twice (:meth:`_capture`)."""
        if cuda_graph:  # the graphs read this stop-token tensor: the engine keeps it alive
            self._graph_stop = torch.tensor(tuple(stop_token_ids), dtype=torch.int64, device=dev)
            for b in self.buckets:
                if not self._capture(params, self._graph_stop, b):
                    break

    # -- pieces -----------------------------------------------------------------------------------
    def _slot_cache(self, slot: int) -> KVCache:
        """A one-row view of the static cache (writes land in row ``slot``), NaN-filled first so a
        read of a position this sequence has not written shows up as NaN."""
        for t in (*self.cache.k, *self.cache.v):
            t[slot].fill_(float("nan"))
        return KVCache([k[slot : slot + 1] for k in self.cache.k], [v[slot : slot + 1] for v in self.cache.v])

    def _sample(self, hidden: torch.Tensor, seq_ids: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
                params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model.logits(hidden, ops=self._ops)
        return self.sampler.sample(self._logp, logits, seq_ids, slots, positions, params)

    def _prefill(self, slot: int, req: _Request, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        dev = self.model.device
        p = len(req.prompt)
        ids = torch.tensor(req.prompt, dtype=torch.int64, device=dev)
        positions = torch.arange(p, dtype=torch.int64, device=dev)
        cu = torch.tensor([0, p], dtype=torch.int32, device=dev)
        hidden = self.model.forward(ids, positions, cu_seqlens=cu, cache=self._slot_cache(slot),
                                    packed=packed_projections(dev))
        seq = torch.tensor([req.seq_id], dtype=torch.int64, device=dev)
        return self._sample(hidden[p - 1 : p], seq, self.slot_ids[slot : slot + 1],
                            torch.tensor([p], dtype=torch.int64, device=dev), params)

    def _bucket_views(self, b: int) -> dict[str, Any]:
        """Views of slots ``[0, b)`` of the slot state and of every cache row (writes land in the
        engine's own tensors)."""
        names = ("slot_token", "slot_pos", "slot_seq", "slot_count", "slot_budget", "slot_live", "slot_ids")
        views: dict[str, Any] = {n: getattr(self, n)[:b] for n in names}
        views["cache"] = KVCache([k[:b] for k in self.cache.k], [v[:b] for v in self.cache.v])
        return views

    def _decode_step(self, params: SamplingParams, stop: torch.Tensor, b: int | None = None) -> tuple[torch.Tensor, ...]:
        """One decode step over slots ``[0, b)`` (default: every slot), as tensor ops on the slot state
        (no per-slot Python).

        Feeds ``slot_token`` at ``slot_pos``, draws the next token of every slot, and advances the
        state: live slots take the drawn token at the next position, idle or just-finished slots
        are fed token 0 at position 0 (a row no sequence reads). Returns tokens, logprobs, and the
        ``stopped`` / ``finished`` masks [b] bool.
        """
        v = self._views[self.max_batch if b is None else b]
        # checked: every position a slot is fed is below s_max <= max_position_embeddings (the plan and
        # the constructor validated that), so the step reads no device value on the host
        hidden = self.model.forward(v["slot_token"], v["slot_pos"], cache=v["cache"], decode=True, checked=True,
                                    ops=self._ops, packed=packed_projections(self.model.device))
        tok, lp = self._sample(hidden, v["slot_seq"], v["slot_ids"], v["slot_pos"] + 1, params)
        live = v["slot_live"]
        stopped = live & torch.isin(tok, stop)
        v["slot_count"].add_(live.to(torch.int64))
        finished = stopped | (live & (v["slot_count"] >= v["slot_budget"]))
        live.copy_(live & ~finished)
        v["slot_token"].copy_(torch.where(live, tok, torch.zeros_like(tok)))
        v["slot_pos"].copy_(torch.where(live, v["slot_pos"] + 1, torch.zeros_like(v["slot_pos"])))
        return tok, lp, stopped, finished

    def _capture(self, params: SamplingParams, stop: torch.Tensor, b: int) -> bool:
        """Capture :meth:`_decode_step` over slots ``[0, b)`` of the static slot state in a CUDA graph;
        True when it was captured.

        :func:`rl_engine.graphs.capture` runs the step eagerly on its side stream first (Triton
        compiles, the CUDA libraries load, the allocator grows: none of that can happen inside a
        capture) with every slot idle (token 0 at position 0: it writes position 0 of each cache
        row, which a prefill NaN-fills before a sequence uses the row); the slot state is then
        reset, and the capture records the launches without running them. A failed capture is
        tried once more; a second failure is not hidden: the engine drops every graph, runs its
        step eagerly (the same kernels, so the same bits, only slower), records the reason in
        :attr:`graph_fallback` (and so in :attr:`GenerationResult.graph_fallback`) and warns.
        """
        import warnings

        from rl_engine.graphs import GraphCaptureError, capture

        state = (self.slot_token, self.slot_pos, self.slot_count, self.slot_live)
        saved = [t.clone() for t in state]

        def reset() -> None:
            for t, v in zip(state, saved):
                t.copy_(v)

        def step() -> tuple[torch.Tensor, ...]:
            tok, lp, stopped, finished = self._decode_step(params, stop, b)
            return tok, lp, torch.stack([finished, stopped])

        errors = []
        for _ in range(2):
            try:
                graph, out = capture(step, after_warmup=reset, device=self.model.device)
            except GraphCaptureError as exc:
                errors.append(str(exc))
                reset()
                continue
            self.graphs[b] = (graph, out)
            return True
        self.graphs.clear()
        self.graph_fallback = f"bucket {b}: {errors[-1]} (twice)"
        warnings.warn(f"rl_engine rollout: the decode step could not be captured in a CUDA graph ({self.graph_fallback}); "
                      "this engine runs it eagerly: the same bits, slower", RuntimeWarning, stacklevel=3)
        return False

    @property
    def graph(self) -> torch.cuda.CUDAGraph | None:
        """The CUDA graph of the full batch (None without graphs)."""
        entry = self.graphs.get(self.max_batch)
        return entry[0] if entry else None

    def bucket_for(self, live_slots: int) -> int:
        """The bucket a step runs when the highest live slot is ``live_slots - 1``."""
        return next(b for b in self.buckets if b >= live_slots)

    def step(self, params: SamplingParams, stop: torch.Tensor,
             b: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One decode step over slots ``[0, b)`` (a bucket; default every slot), graph replay or eager;
        returns tokens [b] int64, logprobs [b] FP32 (fresh tensors, safe to keep) and ``done`` [2, b]
        bool (finished, stopped)."""
        b = self.max_batch if b is None else b
        self.bucket_steps[b] = self.bucket_steps.get(b, 0) + 1
        if b not in self.graphs:
            tok, lp, stopped, finished = self._decode_step(params, stop, b)
            return tok, lp, torch.stack([finished, stopped])
        graph, (tok, lp, done) = self.graphs[b]
        graph.replay()
        return tok.clone(), lp.clone(), done.clone()

    # -- the loop ---------------------------------------------------------------------------------
    def run(self, requests: list[_Request], params: SamplingParams,
            stop_token_ids: tuple[int, ...]) -> tuple[int, int, list[tuple[int, int, int]]]:
        """Generate every request (in queue order); returns (decode steps, prefills, admissions).

        Raises InputError when the engine holds a CUDA graph captured for other ``params`` or
        ``stop_token_ids``."""
        if self.graphs and (params, tuple(stop_token_ids)) != self._graph_key:
            raise InputError("the engine's CUDA graph was captured for other sampling settings or stop tokens")
        dev = self.model.device
        stop = torch.tensor(stop_token_ids, dtype=torch.int64, device=dev)
        queue = deque(requests)
        slots: list[_Request | None] = [None] * self.max_batch
        steps = prefills = 0
        admissions: list[tuple[int, int, int]] = []
        step_tok: list[torch.Tensor] = []  # [B_max] per decode step; requests keep (step, slot) indices
        step_lp: list[torch.Tensor] = []
        where: dict[int, list[tuple[int, int]]] = {}

        with torch.no_grad():
            while True:
                # refill free slots from the queue: each prompt is prefilled alone into its slot
                for s in range(self.max_batch):
                    while slots[s] is None and queue:
                        req = queue.popleft()
                        admissions.append((req.seq_id, s, steps))
                        tok, lp = self._prefill(s, req, params)
                        prefills += 1
                        req.tokens.append(tok)
                        req.logprobs.append(lp)
                        is_stop = bool(torch.isin(tok, stop).any()) if stop.numel() else False
                        if req.budget <= 1 or is_stop:
                            req.finish_reason = "stop" if is_stop else "length"
                            continue
                        slots[s] = req
                        where[req.index] = []
                        self.slot_token[s] = tok[0]
                        self.slot_pos[s] = len(req.prompt)
                        self.slot_seq[s] = req.seq_id
                        self.slot_count[s] = 1
                        self.slot_budget[s] = req.budget
                        self.slot_live[s] = True
                live = [s for s in range(self.max_batch) if slots[s] is not None]
                if not live:
                    break
                b = self.bucket_for(live[-1] + 1)
                tok, lp, done_t = self.step(params, stop, b)
                if b < self.max_batch:  # the per-step outputs are stacked: pad to every slot
                    tok = torch.nn.functional.pad(tok, (0, self.max_batch - b))
                    lp = torch.nn.functional.pad(lp, (0, self.max_batch - b))
                step_tok.append(tok)
                step_lp.append(lp)
                done = done_t.tolist()  # the one host read per step
                for s in live:
                    req = slots[s]
                    where[req.index].append((steps, s))
                    if done[0][s]:
                        req.finish_reason = "stop" if done[1][s] else "length"
                        slots[s] = None
                steps += 1
            if steps:  # one gather per request from the per-step outputs
                all_tok, all_lp = torch.stack(step_tok), torch.stack(step_lp)
                for req in requests:
                    idx = where.get(req.index)
                    if idx:
                        st = torch.tensor([i for i, _ in idx], dtype=torch.int64, device=dev)
                        sl = torch.tensor([j for _, j in idx], dtype=torch.int64, device=dev)
                        req.tokens.append(all_tok[st, sl])
                        req.logprobs.append(all_lp[st, sl])
        return steps, prefills, admissions


@dataclass(frozen=True)
class GenerationPlan:
    """The checked arguments of one :func:`generate` call (see there)."""

    params: SamplingParams
    prompts: tuple[tuple[int, ...], ...]
    budgets: tuple[int, ...]
    seq_ids: tuple[int, ...]
    stop_token_ids: tuple[int, ...]
    max_batch: int
    s_max: int


def plan_generation(config: Qwen3Config, prompts: Any, max_new_tokens: Any, *, temperature: Any = 1.0,
                    top_k: Any = None, top_p: Any = None, seed: Any = 0, stop_token_ids: Any = None,
                    max_batch: Any = DEFAULT_MAX_BATCH, seq_ids: Any = None, s_max: Any = None) -> GenerationPlan:
    """Check every argument of :func:`generate` against ``config`` (no weights, no kernels).

    Raises InputError as listed in :func:`generate`. The command calls it before building a model.
    """
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    plist = _check_prompts(prompts, config.vocab_size)
    budgets = _check_budgets(max_new_tokens, len(plist))
    ids = _check_seq_ids(seq_ids, len(plist))
    stop = _check_stop(stop_token_ids, config.vocab_size)
    if not _int_like(max_batch) or max_batch < 1:
        raise InputError(f"max_batch: expected an integer >= 1, got {max_batch!r}")
    if s_max is not None and (not _int_like(s_max) or s_max < 2):
        raise InputError(f"s_max: expected None or an integer >= 2, got {s_max!r}")
    # the last drawn token is never fed back (P + C - 1 positions are written), but P + C is the
    # length of the finished sequence, which must be scorable by teacher forcing: ask for P + C
    for i, (p, b) in enumerate(zip(plist, budgets)):
        if len(p) + b > config.max_position_embeddings:
            raise InputError(f"prompts[{i}]: {len(p)} prompt tokens + max_new_tokens {b} exceed the model's "
                             f"max_position_embeddings {config.max_position_embeddings}")
        if s_max is not None and len(p) + b > s_max:
            raise InputError(f"prompts[{i}]: {len(p)} prompt tokens + max_new_tokens {b} exceed the cache's "
                             f"s_max {s_max}")
    if s_max is None:
        s_max = max((len(p) + b for p, b in zip(plist, budgets)), default=2)
    return GenerationPlan(params, tuple(plist), tuple(budgets), tuple(ids), stop, int(max_batch), int(s_max))


def generate(model: Qwen3Model, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], *,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None, seed: int = 0,
             stop_token_ids: Sequence[int] | None = None, max_batch: int = DEFAULT_MAX_BATCH,
             seq_ids: Sequence[int] | None = None, s_max: int | None = None,
             sampler: Sampler | None = None, cuda_graph: bool | None = None,
             buckets: bool | None = None) -> GenerationResult:
    """Sample completions of ``prompts`` with continuous batching; see ``docs/rollout.md``.

    Parameters
    ----------
    model
        A :class:`Qwen3Model` (BF16 weights on a kernel backend, or ``reference_fp32``).
    prompts
        N prompts, each a non-empty list (or [P] int64 tensor) of token ids in [0, V).
    max_new_tokens
        Token budget C_max >= 1, one for all prompts or one per prompt.
    temperature, top_k, top_p, seed
        The sampling distribution (:class:`rl_engine.rollout.sampling.SamplingParams`): temperature
        >= 0 (0 = greedy, lowest token id on ties), top_k >= 1 or None, top_p in (0, 1] or None,
        seed an integer in [0, 2^64).
    stop_token_ids
        A drawn token in this set ends its sequence (and is kept as its last token).
    max_batch
        At most this many sequences run at once (the engine has ``min(max_batch, N)`` slots); more
        prompts than slots wait in a queue (never truncated).
    seq_ids
        The sequence ids that key the sampling noise (default ``0 .. N-1``, the prompt index). A
        sequence's tokens depend only on (seed, its id, its prompt, the settings), so passing the same
        id reproduces it in any batch.
    s_max
        Cache positions per slot (default ``max_b (P_b + C_b)``).
    cuda_graph
        Replay the decode step as one CUDA graph (default: on for a kernel backend on a CUDA
        device; :class:`Engine`). The bits are the eager step's. A capture that fails twice makes
        the engine run eagerly with a ``RuntimeWarning``; ``GenerationResult.graph_fallback`` says why.
    buckets
        Step over the smallest batch-size bucket holding every live slot (:data:`BUCKET_SIZES`;
        default: on the CPU, and on a GPU when :data:`BUCKETS_ON_CUDA`). The bits do not change.

    Returns
    -------
    GenerationResult
        ``completions[i]``: tokens [C_i] int64 and their FP32 logprobs [C_i] under the sampling
        distribution (the temperature-scaled, top-k / top-p filtered, renormalised softmax; for
        temperature 0 the unscaled, unfiltered softmax), ``finish_reason`` "stop" or "length".

    Raises
    ------
    InputError
        Before any kernel runs: a token id outside [0, V), an empty prompt, P + C beyond
        ``max_position_embeddings`` or ``s_max``, ``top_p`` outside (0, 1], ``top_k`` < 1, a negative
        or non-finite temperature, a seed that is not an integer in [0, 2^64), a ``max_new_tokens``,
        ``max_batch`` or ``seq_ids`` of the wrong kind; ``cuda_graph=True`` off a CUDA device or on a
        backend that is not a kernel backend.
    """
    plan = plan_generation(model.config, prompts, max_new_tokens, temperature=temperature, top_k=top_k,
                           top_p=top_p, seed=seed, stop_token_ids=stop_token_ids, max_batch=max_batch,
                           seq_ids=seq_ids, s_max=s_max)
    params, plist, s_max, max_batch = plan.params, plan.prompts, plan.s_max, plan.max_batch
    t0 = time.perf_counter()
    if not plist:
        return GenerationResult([], params, int(max_batch), int(s_max), 0, 0, 0.0)
    # never more slots than sequences: an idle slot costs a full row of every decode op (a batch of
    # one prompt at max_batch=8 would run lm_head over 8 rows); the bits do not depend on it
    slots = min(int(max_batch), len(plist))
    engine = Engine(model, slots, int(s_max), sampler=sampler, cuda_graph=cuda_graph, params=params,
                    stop_token_ids=plan.stop_token_ids, buckets=buckets)
    reqs = [_Request(i, sid, p, b) for i, (sid, p, b) in enumerate(zip(plan.seq_ids, plist, plan.budgets))]
    steps, prefills, admissions = engine.run(reqs, params, plan.stop_token_ids)
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
    wall = time.perf_counter() - t0
    completions = [Completion(r.seq_id, r.prompt, torch.cat(r.tokens).cpu(), torch.cat(r.logprobs).cpu(),
                              r.finish_reason or "length") for r in reqs]
    return GenerationResult(completions, params, slots, int(s_max), steps, prefills, wall,
                            tuple(admissions), tuple(sorted(engine.bucket_steps.items())),
                            cuda_graph=bool(engine.graphs), graph_fallback=engine.graph_fallback)


__all__ = ["Completion", "Engine", "GenerationPlan", "GenerationResult", "generate", "plan_generation",
           "DEFAULT_MAX_BATCH", "BUCKET_SIZES", "bucket_sizes"]
