"""GRPO-style policy-gradient steps on the project's kernels: sample, score, update, repeat (``docs/rl-step.md``).

Shape glossary: N prompts, G completions per prompt (the group), B = N G sequences, C_b completion
length of sequence b, T = sum C_b active tokens, V vocab.

One step, for the current BF16 weights:

1. **Rollout**: :func:`rl_engine.rollout.generate` samples G completions of each prompt (B
   sequences, prompt ``i``'s group at indices ``i G .. i G + G - 1``) with sequence ids
   ``step * B + b``, distinct over the run, under the recorded sampling settings.
2. **Reward**: :func:`even_token_reward`, a verifiable rule on the tokens alone: the fraction of
   completion tokens whose id is even (in [0, 1]).
3. **Advantages**: :func:`group_advantages`, ``A = (r - mean_group) / (std_group + epsilon)`` with the
   unbiased group standard deviation (GRPO, Shao et al. 2024, "DeepSeekMath", section 4.1.2; the
   form verl computes). ``epsilon`` (:data:`ADV_EPSILON`) is part of the estimator (it keeps a
   group whose rewards tie at ``A = 0``), not a tolerance.
4. **Training logprobs**: :func:`teacher_forcing_logprobs`, one packed varlen forward over
   ``prompt + completion`` of every sequence with autograd on, the FP32 ``lm_head`` logits of the
   rows that predict completion tokens, and the sampler's own logprob formula
   (:func:`rl_engine.rollout.sampling.sampling_logprobs`): the computation of
   :func:`rl_engine.rollout.score_completions`, with gradients.
5. **Loss**: :func:`ppo_clip_loss`, the PPO clipped surrogate (Schulman et al. 2017) with the
   rollout's logprobs as the behaviour policy, ``ratio = exp(train_lp - rollout_lp)``, clip
   ``[1 - clip_eps, 1 + clip_eps]``, averaged over the T active tokens.
6. **Update**: backward through the project's ops (each a ``torch.library`` op with its autograd);
   each BF16 gradient, once complete, upcast to FP32 and one optimizer step run on that weight's
   FP32 master (AdamW or SGD, :class:`RLSettings`; :class:`Policy`); the masters rounded to BF16
   for the next step. Every model is built fresh
   from those BF16 weights each step (:class:`Policy`), so nothing packed or cached from the old
   weights (``Qwen3Model.packed_projections``, the RoPE table) survives into the next rollout.

With the project's batch-invariant kernels the training logprob of every sampled token is the
rollout's, bit for bit, so the importance ratio of step 5 is exactly 1.0 and the mismatch
metrics (:mod:`rl_engine.rl.metrics`) are zero. **Control paths** (``controls``) measure the same
step on other backends: a rollout on one backend and teacher forcing on another (the same backend
for both is the plain PyTorch setting), with the same prompts, sequence ids and BF16 weights; they
report their reward, loss and mismatch metrics but never update the weights.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from numbers import Integral, Real
from typing import Any

import torch

from rl_engine.chain.config import Qwen3Config
from rl_engine.chain.model import Qwen3Model
from rl_engine.chain.weights import Qwen3Weights, weights_from_named
from rl_engine.errors import InputError
from rl_engine.rl.metrics import mismatch_metrics, pad_rows, ratio_exactly_one
from rl_engine.rollout.engine import Completion, GenerationResult, generate, plan_generation
from rl_engine.rollout.sampling import SamplingParams
from rl_engine.rollout.score import packed_completion_logprobs

ADV_EPSILON = 1e-6
"""The ``epsilon`` of the group-normalised advantage ``(r - mean) / (std + epsilon)`` (verl's GRPO
default): an algorithm constant that keeps a group of equal rewards at advantage 0."""

CLIP_EPS = 0.2
"""PPO's clip range: the ratio is clipped to ``[1 - 0.2, 1 + 0.2]`` (Schulman et al. 2017)."""

REWARD_DEFINITION = "fraction of completion tokens whose token id is even (0 for an empty completion)"

OPTIMIZERS = ("adamw", "sgd")


# -- reward, advantages, loss ------------------------------------------------------------------------
def even_token_reward(tokens: torch.Tensor) -> float:
    """The verifiable reward of one completion: the fraction of its tokens [C] (int64) with an even id."""
    if tokens.numel() == 0:
        return 0.0
    return float((tokens % 2 == 0).sum()) / int(tokens.numel())


def group_advantages(rewards: Sequence[float], group: int, *, epsilon: float = ADV_EPSILON) -> torch.Tensor:
    """GRPO advantages [B] float64 of rewards [B] in groups of ``group`` consecutive sequences:
    ``(r - mean_g) / (std_g + epsilon)``, ``std_g`` the unbiased (``G - 1``) standard deviation.

    Raises InputError: ``group`` < 2 (no spread to normalise by) or not dividing B, ``epsilon`` <= 0.
    """
    if isinstance(group, bool) or not isinstance(group, Integral) or group < 2:
        raise InputError(f"group: expected an integer >= 2, got {group!r}")
    if len(rewards) % group:
        raise InputError(f"{len(rewards)} rewards do not split into groups of {group}")
    if not (isinstance(epsilon, Real) and math.isfinite(epsilon) and epsilon > 0):
        raise InputError(f"epsilon: expected a positive finite number, got {epsilon!r}")
    r = torch.tensor(list(rewards), dtype=torch.float64).reshape(-1, group)
    a = (r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, keepdim=True) + epsilon)
    return a.reshape(-1)


def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                  clip_eps: float = CLIP_EPS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO clipped policy loss over T active tokens, token-mean.

    ``logp`` [T] FP32 (the training logprobs, with autograd), ``old_logp`` [T] FP32 (the behaviour
    policy: the rollout's logprobs, constants), ``advantages`` [T] FP32 (each sequence's advantage
    repeated over its tokens). Per token ``ratio = exp(logp - old_logp)`` and
    ``loss_t = max(-A ratio, -A clip(ratio, 1 - clip_eps, 1 + clip_eps))``. Returns
    ``(loss [] FP32, ratio [T] FP32 detached, clipped [T] bool: where the clipped term was taken)``.
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    per_token = torch.maximum(unclipped, clipped)
    return per_token.mean(), ratio.detach(), (clipped > unclipped).detach()


def teacher_forcing_logprobs(model: Qwen3Model, completions: Sequence[Completion],
                             params: SamplingParams) -> list[torch.Tensor]:
    """FP32 logprobs [C_b] of each completion's tokens under ``params``, by teacher forcing, with autograd.

    The computation of :func:`rl_engine.rollout.score_completions` (:func:`rl_engine.rollout.score.packed_completion_logprobs`: one packed varlen forward over
    every ``prompt + tokens``; row ``P_b - 1 + c`` predicts token ``c``; FP32 ``lm_head`` logits;
    :func:`~rl_engine.rollout.sampling.sampling_logprobs` with the model's ``logp`` op), run with
    gradients enabled so a loss on the result reaches the weights. Tensors on the model's device.

    Raises InputError for an empty completion.
    """
    for i, c in enumerate(completions):
        if c.tokens.numel() == 0:
            raise InputError(f"completions[{i}]: no tokens to score")
    with torch.enable_grad():
        return packed_completion_logprobs(model, completions, params)


# -- settings ----------------------------------------------------------------------------------------
def _pos_int(name: str, v: Any, least: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, Integral) or v < least:
        raise InputError(f"{name}: expected an integer >= {least}, got {v!r}")
    return int(v)


def _pos_float(name: str, v: Any, *, zero_ok: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(float(v)) or (
            float(v) < 0 if zero_ok else float(v) <= 0):
        raise InputError(f"{name}: expected a finite number {'>= 0' if zero_ok else '> 0'}, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class RLSettings:
    """Everything that decides an RL run besides the model, the prompts and the backends (recorded).

    ``group`` G >= 2 completions per prompt; ``max_new_tokens`` C >= 1; sampling as
    :class:`~rl_engine.rollout.sampling.SamplingParams` (``seed`` keys the noise with the sequence ids);
    ``max_batch``: slots of the rollout engine; ``clip_eps``: PPO clip (:data:`CLIP_EPS`);
    ``adv_epsilon``: the advantage's epsilon (:data:`ADV_EPSILON`); ``optimizer`` ``adamw`` (decoupled
    weight decay, Loshchilov & Hutter 2019) or ``sgd`` (``w -= lr (g + weight_decay w)``), on FP32 masters, with
    ``lr``, ``betas``, ``adam_eps`` (AdamW's denominator constant) and ``weight_decay``.

    Raises InputError for any value out of range.
    """

    steps: int = 3
    group: int = 4
    max_new_tokens: int = 4
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    max_batch: int = 8
    clip_eps: float = CLIP_EPS
    adv_epsilon: float = ADV_EPSILON
    optimizer: str = "adamw"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _pos_int("steps", self.steps)
        _pos_int("group", self.group, 2)
        _pos_int("max_new_tokens", self.max_new_tokens)
        _pos_int("max_batch", self.max_batch)
        _ = self.sampling  # validates temperature, top_k, top_p, seed
        c = _pos_float("clip_eps", self.clip_eps)
        if c >= 1.0:
            raise InputError(f"clip_eps: expected a number in (0, 1), got {self.clip_eps!r}")
        _pos_float("adv_epsilon", self.adv_epsilon)
        if self.optimizer not in OPTIMIZERS:
            raise InputError(f"optimizer: expected one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        _pos_float("lr", self.lr)
        if (not isinstance(self.betas, tuple) or len(self.betas) != 2
                or not all(isinstance(b, Real) and not isinstance(b, bool) and 0.0 <= float(b) < 1.0
                           for b in self.betas)):
            raise InputError(f"betas: expected two numbers in [0, 1), got {self.betas!r}")
        _pos_float("adam_eps", self.adam_eps)
        _pos_float("weight_decay", self.weight_decay, zero_ok=True)

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["betas"] = list(self.betas)
        d["sampling"] = self.sampling.to_dict()
        d["reward"] = REWARD_DEFINITION
        d["advantage"] = "(r - mean_group) / (std_group + adv_epsilon), std unbiased (G - 1)"
        d["loss"] = "PPO clip, ratio = exp(train_lp - rollout_lp), token-mean over active tokens"
        d["master_weights"] = "float32, rounded to bfloat16 after every optimizer step"
        d["seq_ids"] = "step * (prompts * group) + index"
        return d


@dataclass(frozen=True)
class PathSpec:
    """One measured path: rollout on ``rollout`` and teacher forcing on ``train`` (backend names)."""

    rollout: str
    train: str

    @property
    def label(self) -> str:
        return self.rollout if self.rollout == self.train else f"{self.rollout}:{self.train}"

    @classmethod
    def parse(cls, spec: str) -> PathSpec:
        """``BACKEND`` (both sides) or ``ROLLOUT:TRAIN``. Raises InputError for anything else."""
        parts = spec.split(":") if isinstance(spec, str) else []
        if len(parts) not in (1, 2) or not all(p.strip() for p in parts):
            raise InputError(f"path {spec!r}: expected BACKEND or ROLLOUT_BACKEND:TRAIN_BACKEND")
        parts = [p.strip() for p in parts]
        return cls(parts[0], parts[-1])


def make_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """``n`` prompts of ``length`` token ids, uniform in [0, vocab), from a CPU ``torch.Generator``
    seeded with ``seed`` (the same prompts on every host)."""
    _pos_int("prompts", n)
    _pos_int("prompt_len", length)
    g = torch.Generator().manual_seed(_pos_int("prompt_seed", seed, 0))
    return torch.randint(0, vocab, (n, length), generator=g, dtype=torch.int64).tolist()


def check_run(config: Qwen3Config, prompts: Sequence[Sequence[int]], settings: RLSettings) -> None:
    """Check the prompts and budgets of every step against ``config`` (no weights, no kernels): the
    checks :func:`rl_engine.rollout.generate` makes, for the largest sequence ids of the run.

    Raises InputError."""
    n = len(prompts)
    if n == 0:
        raise InputError("prompts: at least one prompt is needed")
    b = n * settings.group
    expanded = [p for p in prompts for _ in range(settings.group)]
    last = (settings.steps - 1) * b
    plan_generation(config, expanded, settings.max_new_tokens, temperature=settings.temperature,
                    top_k=settings.top_k, top_p=settings.top_p, seed=settings.seed,
                    max_batch=settings.max_batch, seq_ids=list(range(last, last + b)))


# -- weights -----------------------------------------------------------------------------------------
class Policy:
    """FP32 master weights, their optimizer state, and the BF16 weights the models run on.

    ``weights``: BF16 :class:`Qwen3Weights` (the starting point; copied, never modified). The BF16
    weights of a step are :meth:`leaves` (fresh tensors, ``requires_grad``, one per Hugging Face
    name: a tied ``lm_head`` is the embedding leaf, so both uses add into one gradient).
    :meth:`backward` runs the loss's backward and updates each master **as soon as its leaf's
    gradient is complete** (a post-accumulate-grad hook): the BF16 gradient is upcast to FP32, the
    optimizer's per-tensor step runs (:meth:`update`), and the gradient is freed, so at most one
    FP32 gradient exists at a time (Qwen3-8B: 33 GB of masters, 66 GB of AdamW moments, 16 GB of
    BF16 weights, and BF16 gradients only while backward produces them). The leaves themselves are
    not touched until :meth:`step` rounds the masters to the next step's leaves, so everything that
    runs on them in between (the backward's saved tensors, the controls) sees this step's weights.
    A tensor that gets no gradient in a step is not updated in it (as ``torch.optim`` skips it).

    The per-tensor step is ``torch.optim``'s single-tensor algorithm, op for op
    (``tests/rl/test_rl_step.py`` checks the bits against ``torch.optim.AdamW(foreach=False)`` and
    ``torch.optim.SGD``): AdamW (Loshchilov & Hutter 2019) ``w *= 1 - lr wd``, ``m = lerp(m, g,
    1 - b1)``, ``v = b2 v + (1 - b2) g^2``, ``w -= lr / (1 - b1^t) m / (sqrt(v) / sqrt(1 - b2^t) +
    adam_eps)``; SGD ``w -= lr (g + wd w)``.
    """

    def __init__(self, weights: Qwen3Weights, settings: RLSettings):
        if weights.dtype != torch.bfloat16:
            raise InputError(f"the policy starts from bfloat16 weights, got {weights.dtype}")
        self.config = weights.config
        self.settings = settings
        self.provenance = dict(weights.provenance)
        self.master = {n: t.detach().to(torch.float32).clone() for n, t in weights.named_tensors()}
        self.state: dict[str, dict[str, Any]] = {}
        """Per tensor: ``step`` (its update count) and AdamW's ``exp_avg`` / ``exp_avg_sq`` (FP32)."""
        self.updates = 0
        self._armed = False
        self._sq: torch.Tensor | None = None
        self._leaves = {n: self._leaf(n, m.to(torch.bfloat16)) for n, m in self.master.items()}

    def _leaf(self, name: str, t: torch.Tensor) -> torch.Tensor:
        t.requires_grad_(True)

        def hook(leaf: torch.Tensor) -> None:
            if self._armed and leaf.grad is not None:
                self.update(name, leaf.grad)
                leaf.grad = None

        t.register_post_accumulate_grad_hook(hook)
        return t

    def leaves(self) -> dict[str, torch.Tensor]:
        """The current BF16 weights, ``name -> leaf tensor`` with ``requires_grad``."""
        return self._leaves

    def weights(self, *, trainable: bool) -> Qwen3Weights:
        """The current BF16 weights as a container: the leaves (``trainable``, for the training
        forward) or detached views of them (rollout: no autograd). A new container every call, so
        a model's packing of its container cannot reach another's."""
        tensors = self._leaves if trainable else {n: t.detach() for n, t in self._leaves.items()}
        prov = dict(self.provenance, rl_updates=self.updates)
        return weights_from_named(self.config, tensors, prov)

    @torch.no_grad()
    def update(self, name: str, grad: torch.Tensor) -> None:
        """One optimizer step of master ``name`` from its gradient (BF16 from the kernels; upcast
        to FP32 here). Adds the gradient's square sum to the step's ``grad_norm``."""
        s = self.settings
        p = self.master[name]
        g = grad.detach().to(torch.float32)
        sq = torch.sum(g * g, dtype=torch.float64)  # FP32 squares summed in float64 (a report, not a clip)
        self._sq = sq if self._sq is None else self._sq + sq
        st = self.state.setdefault(name, {"step": 0})
        st["step"] += 1
        if s.optimizer == "sgd":
            if s.weight_decay:
                g = g.add(p, alpha=s.weight_decay)
            p.add_(g, alpha=-s.lr)
            return
        if "exp_avg" not in st:
            st["exp_avg"] = torch.zeros_like(p)
            st["exp_avg_sq"] = torch.zeros_like(p)
        m, v, t = st["exp_avg"], st["exp_avg_sq"], st["step"]
        b1, b2 = s.betas
        if s.weight_decay:
            p.mul_(1 - s.lr * s.weight_decay)
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        bias1 = 1 - b1 ** t
        bias2_sqrt = (1 - b2 ** t) ** 0.5
        denom = (v.sqrt() / bias2_sqrt).add_(s.adam_eps)
        p.addcdiv_(m, denom, value=-(s.lr / bias1))

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` with every master updated as its gradient completes (class docstring)."""
        self._armed = True
        try:
            loss.backward()
        finally:
            self._armed = False

    def step(self) -> dict[str, Any]:
        """Finish the step: round the masters to the next BF16 leaves (one tensor at a time) and
        return ``grad_norm`` (L2 over this step's FP32 gradients) and how many BF16 tensors and
        elements the update changed."""
        changed_t = changed_e = elements = 0
        for n, m in self.master.items():
            new = m.detach().to(torch.bfloat16)
            diff = int((new.view(torch.int16) != self._leaves[n].detach().view(torch.int16)).sum())
            changed_e += diff
            changed_t += diff > 0
            elements += int(new.numel())
            self._leaves[n] = self._leaf(n, new)
        grad_norm = 0.0 if self._sq is None else float(self._sq) ** 0.5
        self._sq = None
        self.updates += 1
        return {"grad_norm": grad_norm, "changed_tensors": changed_t, "changed_elements": changed_e,
                "tensors": len(self._leaves), "elements": elements}

    def digest(self) -> str:
        """A digest of the current BF16 weights' bits (:class:`rl_engine.gate.digest.BitsDigest`)."""
        from rl_engine.gate.digest import BitsDigest

        d = BitsDigest()
        d.add_all((n, t.detach()) for n, t in self._leaves.items())
        return d.hexdigest()


# -- the trainer -------------------------------------------------------------------------------------
@dataclass
class PathResult:
    """One path of one step: the JSON-ready ``record`` and, for dumps, the completions with their
    training logprobs (CPU FP32, detached)."""

    record: dict[str, Any]
    completions: list[Completion] = field(default_factory=list)
    train_logprobs: list[torch.Tensor] = field(default_factory=list)


@dataclass
class StepResult:
    step: int
    record: dict[str, Any]
    paths: dict[str, PathResult]


class GRPOTrainer:
    """GRPO-style steps (module docstring) of ``weights`` on ``backend``, with ``controls`` measured alongside.

    ``prompts``: N token-id lists; ``backend``: the policy path, a backend name (rollout, teacher
    forcing and update there) or a :class:`PathSpec` / ``"ROLLOUT:TRAIN"`` string (sample on one
    backend, train on another: a mismatched policy, whose ratio is not 1); ``controls``:
    :class:`PathSpec` (or ``"B"`` / ``"R:T"`` strings) measured on the same weights each step without
    updating them; ``norm_order``: the contract's RMSNorm order (read from the contract when None);
    ``reward``: tokens [C] -> float (:func:`even_token_reward`). A rollout is run once per backend per
    step and shared by the paths that roll out there (the same call would give the same bits). Each
    :meth:`step` is one step; ``settings.steps`` is what a caller runs (its sequence ids are checked).

    Raises InputError (settings, prompts, a control equal to the policy path) before any model is built.
    """

    def __init__(self, weights: Qwen3Weights, prompts: Sequence[Sequence[int]], settings: RLSettings, *,
                 backend: PathSpec | str = "triton_cuda_bf16", controls: Sequence[PathSpec | str] = (),
                 norm_order: str | None = None,
                 reward: Callable[[torch.Tensor], float] = even_token_reward):
        check_run(weights.config, prompts, settings)
        self.settings = settings
        self.prompts = [list(map(int, p)) for p in prompts]
        self.policy_path = backend if isinstance(backend, PathSpec) else PathSpec.parse(backend)
        self.controls = [c if isinstance(c, PathSpec) else PathSpec.parse(c) for c in controls]
        labels = [self.policy_path.label] + [c.label for c in self.controls]
        if len(set(labels)) != len(labels):
            raise InputError(f"paths must be distinct (the policy path is {self.policy_path.label}), got {labels}")
        if norm_order is None:
            from rl_engine.contract import load_contract

            norm_order = load_contract().rms_norm_order
        self.norm_order = norm_order
        self.reward = reward
        self.policy = Policy(weights, settings)
        self.step_index = 0

    @property
    def device(self) -> torch.device:
        return next(iter(self.policy.master.values())).device

    def model(self, backend: str, *, trainable: bool = False) -> Qwen3Model:
        """A fresh model of the current weights on ``backend`` (``trainable``: on the autograd leaves)."""
        return Qwen3Model(self.policy.weights(trainable=trainable), backend, norm_order=self.norm_order)

    def _rollout(self, backend: str, seq_ids: list[int]) -> GenerationResult:
        s = self.settings
        expanded = [p for p in self.prompts for _ in range(s.group)]
        return generate(self.model(backend), expanded, s.max_new_tokens, temperature=s.temperature, top_k=s.top_k,
                        top_p=s.top_p, seed=s.seed, max_batch=s.max_batch, seq_ids=seq_ids)

    def _path(self, path: PathSpec, res: GenerationResult, *, update: bool, shared: str | None) -> PathResult:
        s = self.settings
        comps = res.completions
        model = self.model(path.train, trainable=update)  # a control builds no autograd graph
        t0 = time.perf_counter()
        train = teacher_forcing_logprobs(model, comps, res.sampling)
        dev = train[0].device
        roll = [c.logprobs for c in comps]
        rewards = [self.reward(c.tokens) for c in comps]
        adv = group_advantages(rewards, s.group, epsilon=s.adv_epsilon)
        lens = torch.tensor([int(c.tokens.numel()) for c in comps])
        adv_tok = torch.repeat_interleave(adv, lens).to(torch.float32).to(dev)
        loss, _, clipped = ppo_clip_loss(torch.cat(train), torch.cat(roll).to(dev), adv_tok, s.clip_eps)
        train_cpu = [t.detach().cpu() for t in train]
        old, mask = pad_rows(train_cpu)
        rol, _ = pad_rows(roll)
        metrics = mismatch_metrics(old, rol, mask)
        rec: dict[str, Any] = {
            "role": "policy" if update else "control", "rollout_backend": path.rollout, "train_backend": path.train,
            "rollout_shared_with": shared,
            "reward_mean": float(torch.tensor(rewards, dtype=torch.float64).mean()), "loss": float(loss.detach()),
            "pg_clipfrac": float(clipped.double().mean()), "ratio_exactly_one": ratio_exactly_one(metrics),
            **metrics,
        }
        if update:
            self.policy.backward(loss)
        del loss, train, model
        rec["train_wall_s"] = round(time.perf_counter() - t0, 3)
        rec["rewards"] = rewards
        rec["advantages"] = adv.tolist()
        rec["completions"] = [{"seq_id": c.seq_id, "prompt_index": i // s.group, "tokens": c.tokens.tolist(),
                               "finish_reason": c.finish_reason} for i, c in enumerate(comps)]
        return PathResult(rec, list(comps), train_cpu)

    def step(self) -> StepResult:
        """Run one step (rollout, score, loss on every path; backward and update on the policy path)."""
        t0 = time.perf_counter()
        k = self.step_index
        b = len(self.prompts) * self.settings.group
        seq_ids = list(range(k * b, (k + 1) * b))
        digest = self.policy.digest()
        rollouts: dict[str, tuple[GenerationResult, str, float]] = {}
        paths: dict[str, PathResult] = {}
        for i, path in enumerate([self.policy_path, *self.controls]):
            shared = None
            if path.rollout in rollouts:
                res, shared, wall = rollouts[path.rollout]
            else:
                t1 = time.perf_counter()
                res = self._rollout(path.rollout, seq_ids)
                wall = round(time.perf_counter() - t1, 3)
                rollouts[path.rollout] = (res, path.label, wall)
            pr = self._path(path, res, update=(i == 0), shared=shared)
            pr.record["rollout_wall_s"] = wall if shared is None else 0.0
            paths[path.label] = pr
        update = self.policy.step()
        paths[self.policy_path.label].record["grad_norm"] = update.pop("grad_norm")
        record = {"step": k, "seq_ids": [seq_ids[0], seq_ids[-1]], "weights_digest": digest,
                  "paths": {label: pr.record for label, pr in paths.items()}, "update": update,
                  "wall_s": round(time.perf_counter() - t0, 3)}
        self.step_index += 1
        return StepResult(k, record, paths)


__all__ = ["ADV_EPSILON", "CLIP_EPS", "GRPOTrainer", "PathSpec", "Policy", "RLSettings", "StepResult",
           "even_token_reward", "group_advantages", "make_prompts", "ppo_clip_loss", "teacher_forcing_logprobs"]
