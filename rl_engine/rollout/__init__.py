"""Rollout: sampling completions on the project's batch-invariant kernels (``docs/rollout.md``).

:func:`generate` runs a continuous-batching engine (:mod:`rl_engine.rollout.engine`) with a
counter-based, batch-invariant Gumbel-max sampler (:mod:`rl_engine.rollout.sampling`);
:func:`score_completions` scores the same tokens by teacher forcing under the same sampling
distribution (:mod:`rl_engine.rollout.score`).
"""

from rl_engine.rollout.engine import Completion, Engine, GenerationResult, generate
from rl_engine.rollout.sampling import SamplingParams
from rl_engine.rollout.score import score_completions

__all__ = ["Completion", "Engine", "GenerationResult", "SamplingParams", "generate", "score_completions"]
