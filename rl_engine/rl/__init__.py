"""RL steps on the project's kernels (``docs/rl-step.md``).

:mod:`rl_engine.rl.metrics` computes the training / rollout mismatch metrics under verl's names
(``rollout_corr/...``, ``training/rollout_probs_diff_*``) and the project's own (``ratio_min``,
``ratio_max``, ``bitwise_equal_tokens``, ...); :mod:`rl_engine.rl.grpo` runs GRPO-style steps
(sample with :func:`rl_engine.rollout.generate`, teacher forcing with autograd, PPO clipped loss,
an optimizer step on FP32 master weights) and reports those metrics per step and path.
"""

from rl_engine.rl.metrics import METRIC_NAMES, VERL_NAMES, mismatch_metrics

__all__ = ["METRIC_NAMES", "VERL_NAMES", "mismatch_metrics"]
