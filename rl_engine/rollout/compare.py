"""Bitwise comparison of two sets of completions, as a report of every mismatch (never a bare bool)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from rl_engine.rollout.engine import Completion


@dataclass(frozen=True)
class CompletionReport:
    """``compared``: sequence ids present on both sides; ``mismatches``: one line per difference, e.g.
    ``seq 2: token 1 is 417 vs 33`` or ``seq 0: logprob 3 bits 0xc0a1b2c3 vs 0xc0a1b2c4 (-5.05 vs -5.05)``."""

    compared: tuple[int, ...]
    mismatches: tuple[str, ...]

    @property
    def equal(self) -> bool:
        return bool(self.compared) and not self.mismatches

    def summary(self) -> str:
        if self.equal:
            return f"{len(self.compared)} sequences bitwise equal"
        return f"{len(self.mismatches)} mismatches over {len(self.compared)} sequences:\n  " + "\n  ".join(
            self.mismatches or ("no common sequence ids",))


def _bits(x: torch.Tensor) -> list[int]:
    return [v & 0xFFFFFFFF for v in x.contiguous().view(torch.int32).tolist()]


def compare_completions(lhs: Iterable[Completion], rhs: Iterable[Completion]) -> CompletionReport:
    """Compare the completions with the same ``seq_id`` on both sides, token ids and FP32 logprob bits.

    Sequences present on one side only are not compared (so one sequence run alone can be checked
    against a batch). Lists the first differing token and the first differing logprob of each sequence,
    and differing lengths, prompts or finish reasons.
    """
    left = {c.seq_id: c for c in lhs}
    right = {c.seq_id: c for c in rhs}
    common = tuple(sorted(set(left) & set(right)))
    out: list[str] = []
    for sid in common:
        a, b = left[sid], right[sid]
        if a.prompt != b.prompt:
            out.append(f"seq {sid}: the prompts differ")
            continue
        ta, tb = a.tokens.tolist(), b.tokens.tolist()
        if len(ta) != len(tb):
            out.append(f"seq {sid}: {len(ta)} tokens vs {len(tb)}")
        for i, (x, y) in enumerate(zip(ta, tb)):
            if x != y:
                out.append(f"seq {sid}: token {i} is {x} vs {y}")
                break
        if a.logprobs.dtype != torch.float32 or b.logprobs.dtype != torch.float32:
            out.append(f"seq {sid}: logprobs are {a.logprobs.dtype} vs {b.logprobs.dtype}, expected float32")
            continue
        for i, (x, y) in enumerate(zip(_bits(a.logprobs), _bits(b.logprobs))):
            if x != y:
                out.append(f"seq {sid}: logprob {i} bits {x:#010x} vs {y:#010x} "
                           f"({float(a.logprobs[i])!r} vs {float(b.logprobs[i])!r})")
                break
        if a.finish_reason != b.finish_reason:
            out.append(f"seq {sid}: finish reason {a.finish_reason} vs {b.finish_reason}")
    return CompletionReport(common, tuple(out))
