"""Teacher-forcing scores of sampled completions under their sampling distribution (the RL form of parity).

A trainer recomputes the logprob of each sampled token with a packed teacher-forcing forward over
``prompt + completion``; for the policy-gradient ratio to be exactly 1 on-policy, that number must
be the rollout's, bit for bit. :func:`score_completions` does the trainer's side with the same ops:
one packed varlen forward (as :func:`rl_engine.chain.scoring.score_teacher_forcing`), the FP32
``lm_head`` logits of the rows that predict completion tokens, and the same top-k / top-p mask and
``logp`` call as the sampler (:func:`rl_engine.rollout.sampling.sampling_logprobs`). See
``docs/rollout.md``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rl_engine.chain.model import Qwen3Model
from rl_engine.errors import InputError
from rl_engine.rollout.engine import Completion
from rl_engine.rollout.sampling import SamplingParams, sampling_logprobs


def score_completions(model: Qwen3Model, completions: Sequence[Completion], params: SamplingParams, *,
                      micro_batch: int | None = None) -> list[torch.Tensor]:
    """FP32 logprobs [C_i] of each completion's tokens, by teacher forcing, under ``params``.

    ``completions``: from :func:`rl_engine.rollout.generate` (prompt P_i ids and tokens [C_i]).
    Each sequence ``prompt + tokens`` (L_i = P_i + C_i ids) is one packed varlen forward row block;
    row ``P_i - 1 + c`` predicts token ``c``. ``micro_batch`` splits the sequences into groups of that
    many forwards (the result must not depend on it). Returns CPU float32 tensors in input order.

    Raises
    ------
    InputError
        An empty completion, or ``micro_batch`` < 1.
    """
    if micro_batch is not None and (isinstance(micro_batch, bool) or not isinstance(micro_batch, int)
                                    or micro_batch < 1):
        raise InputError(f"micro_batch: expected an integer >= 1, got {micro_batch!r}")
    for i, c in enumerate(completions):
        if c.tokens.numel() == 0:
            raise InputError(f"completions[{i}]: no tokens to score")
    n = len(completions)
    step = micro_batch or max(n, 1)
    out: list[torch.Tensor] = []
    with torch.no_grad():
        for lo in range(0, n, step):
            out.extend(lp.cpu() for lp in packed_completion_logprobs(model, completions[lo : lo + step], params))
    return out


def packed_completion_logprobs(model: Qwen3Model, completions: Sequence[Completion],
                               params: SamplingParams) -> list[torch.Tensor]:
    """FP32 logprobs [C_i] of each completion's tokens from **one** packed varlen forward over every
    ``prompt + tokens`` (row ``P_i - 1 + c`` predicts token ``c``; FP32 ``lm_head`` logits of those
    rows only; :func:`~rl_engine.rollout.sampling.sampling_logprobs` with the model's ``logp`` op), on
    the model's device. Records autograd when the caller does: :func:`score_completions` runs it under
    ``torch.no_grad()``, the RL step (:mod:`rl_engine.rl.grpo`) with gradients. One definition for
    both, so the trainer's logprobs are the scorer's bits. Completions must be non-empty (the
    callers check)."""
    dev = model.device
    seqs = [torch.cat([torch.tensor(c.prompt, dtype=torch.int64), c.tokens.to(torch.int64)]) for c in completions]
    lens = [int(s.numel()) for s in seqs]
    cu = [0]
    for m in lens:
        cu.append(cu[-1] + m)
    ids = torch.cat(seqs).to(dev)
    positions = torch.cat([torch.arange(m, dtype=torch.int64) for m in lens]).to(dev)
    hidden = model.forward(ids, positions, cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=dev))
    rows = torch.cat([torch.arange(start + len(c.prompt) - 1, start + lens[j] - 1, dtype=torch.int64)
                      for j, (c, start) in enumerate(zip(completions, cu[:-1]))]).to(dev)
    targets = torch.cat([c.tokens.to(torch.int64) for c in completions]).to(dev)
    logits = model.logits(hidden.index_select(0, rows))
    lp = sampling_logprobs(model.ops.impl("logp"), logits, targets, params)
    return list(torch.split(lp, [int(c.tokens.numel()) for c in completions]))
