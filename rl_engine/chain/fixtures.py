"""Seeded token fixtures for chain parity: sequences with a prompt and a completion.

A fixture is B sequences of token ids drawn uniformly from ``[0, V)`` by a CPU
``torch.Generator`` seeded with the fixture's seed (so every machine gets the same ids), with
prompt lengths P_b and completion lengths C_b. The active tokens are the completion tokens:
N = sum C_b. Its hash is ``sha256`` over the seed, the vocabulary size, the lengths and the raw
int64 token bytes, recorded with every result so a run can be tied to its exact input.

Layouts:

* ``smoke`` — 3 short sequences (6 active tokens, 2 decode steps; two sequences finish early), for
  the tiny chain in the Triton interpreter.
* ``p1`` — docs/pitfalls.md P1: 8 sequences of lengths 5..12, prompt length 1 (every token after the
  first is scored: 60 active tokens).
* ``p8`` — docs/pitfalls.md P8: one sequence, a 16-token prompt and 9 completion tokens, i.e. a 16-token
  prefill + 8 decode steps against a 24-token teacher-forced pass (25 ids; the last one is only a
  target).
* ``qwen3-8b`` — 8 sequences with prompts of 7 to 3963 tokens and 128-150 completion tokens each
  (1115 active tokens), one of them beyond 4096 positions (prompt 3963 + completion 150 = 4113).
  Until 2026-11-30 it was 4 sequences with 256-300 completion tokens (1110 active tokens, the
  layout of ``evidence/2026-11-29-*``): twice the decode steps for the same token count, and the
  gate's rollout decode is bound by per-step launch overhead, not by the batch.
* :func:`scaled_layout` — 4 sequences with about ``N`` active tokens (CLI ``--tokens``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch

from rl_engine.chain.scoring import SeqBatch
from rl_engine.errors import InputError

LAYOUTS: dict[str, tuple[tuple[int, int], ...]] = {
    "smoke": ((5, 3), (8, 2), (3, 1)),
    "p1": tuple((1, n - 1) for n in range(5, 13)),
    "p8": ((16, 9),),
    "qwen3-8b": ((3963, 150), (517, 128), (1031, 141), (64, 135), (255, 139), (130, 144), (7, 131), (700, 147)),
}


@dataclass(frozen=True)
class Fixture:
    """B token sequences (CPU int64 [L_b]) with prompt / completion lengths, a seed and a hash."""

    name: str
    seed: int
    vocab_size: int
    prompt_lens: tuple[int, ...]
    completion_lens: tuple[int, ...]
    tokens: tuple[torch.Tensor, ...]

    @property
    def active_tokens(self) -> int:
        return sum(self.completion_lens)

    @property
    def max_positions(self) -> int:
        return max(p + c for p, c in zip(self.prompt_lens, self.completion_lens))

    def batch(self) -> SeqBatch:
        return SeqBatch(self.tokens, self.prompt_lens)

    def hash(self) -> str:
        """sha256 of the seed, V, the lengths and the raw token ids (little-endian int64)."""
        h = hashlib.sha256()
        h.update(f"rl_engine.chain.fixture/1:seed={self.seed}:V={self.vocab_size}:".encode())
        h.update(f"prompts={list(self.prompt_lens)}:completions={list(self.completion_lens)}:".encode())
        for t in self.tokens:
            h.update(t.to(torch.int64).contiguous().numpy().astype("<i8").tobytes())
        return h.hexdigest()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "seed": self.seed, "vocab_size": self.vocab_size,
                "fixture_hash": self.hash(), "sequences": len(self.tokens),
                "prompt_lens": list(self.prompt_lens), "completion_lens": list(self.completion_lens),
                "active_tokens": self.active_tokens, "max_positions": self.max_positions,
                "token_draw": "uniform over [0, V) from torch.Generator('cpu').manual_seed(seed), "
                              "sequences drawn in order"}


def make_fixture(layout: str | tuple[tuple[int, int], ...], seed: int, vocab_size: int, *,
                 name: str | None = None) -> Fixture:
    """Draw a fixture. ``layout`` is a name of :data:`LAYOUTS` or ``((P_b, C_b), ...)``.

    Raises
    ------
    InputError
        Unknown layout name, or a prompt or completion length below 1.
    """
    if isinstance(layout, str):
        if layout not in LAYOUTS:
            raise InputError(f"unknown fixture layout {layout!r}; known: {', '.join(LAYOUTS)}")
        name = name or layout
        layout = LAYOUTS[layout]
    if not layout:
        raise InputError("a fixture needs at least one sequence")
    for b, (p, c) in enumerate(layout):
        if p < 1 or c < 1:
            raise InputError(f"sequence {b}: prompt ({p}) and completion ({c}) lengths must be >= 1")
    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed))
    tokens = tuple(torch.randint(0, vocab_size, (p + c,), generator=g, dtype=torch.int64) for p, c in layout)
    return Fixture(name=name or "custom", seed=int(seed), vocab_size=int(vocab_size),
                   prompt_lens=tuple(p for p, _ in layout), completion_lens=tuple(c for _, c in layout),
                   tokens=tokens)


def scaled_layout(active_tokens: int, *, sequences: int = 4, long_prompt: int | None = None,
                  max_positions: int | None = None) -> tuple[tuple[int, int], ...]:
    """About ``active_tokens`` completion tokens over ``sequences`` sequences with varied prompts.

    Completion lengths differ by a few tokens (the longest sequence decodes alone at the end);
    prompts are 7, 61, 255, 1021, ... tokens; ``long_prompt`` replaces the first prompt (e.g. 3963
    for a sequence beyond 4096 positions). With ``max_positions`` every prompt is shortened (to at
    least 1 token) so that prompt + completion fits.

    Raises
    ------
    InputError
        Fewer tokens than sequences, or a completion that cannot fit ``max_positions``.
    """
    if active_tokens < sequences:
        raise InputError(f"--tokens must be >= the number of sequences ({sequences}), got {active_tokens}")
    base = active_tokens // sequences
    prompts = [7, 61, 255, 1021, 33, 129, 511, 17]
    layout = []
    left = active_tokens
    for b in range(sequences):
        c = base + (b % 3) if b < sequences - 1 else left
        c = max(1, min(c, left - (sequences - 1 - b)))
        left -= c
        layout.append([prompts[b % len(prompts)], c])
    if long_prompt is not None:
        layout[0][0] = long_prompt
    if max_positions is not None:
        for b, (p, c) in enumerate(layout):
            if c + 1 > max_positions:
                raise InputError(f"sequence {b}: {c} completion tokens do not fit max_position_embeddings "
                                 f"{max_positions}; use more sequences or fewer tokens")
            layout[b][0] = max(1, min(p, max_positions - c))
    return tuple((p, c) for p, c in layout)
