"""GRPO-style steps on the micro model (rl_engine.rl.grpo): on the project's kernels the importance
ratio is exactly 1.0 for every sampled token of every step, the optimizer changes the weights, the
next rollout samples from the changed weights, and the control paths are reported beside it."""

from __future__ import annotations

import json

import pytest
import torch

from rl_engine.errors import InputError
from rl_engine.jsonio import strict_json
from rl_engine.rl.grpo import (ADV_EPSILON, CLIP_EPS, GRPOTrainer, PathSpec, RLSettings, even_token_reward,
                               group_advantages, make_prompts, ppo_clip_loss)
from rl_engine.rl.metrics import METRIC_NAMES
from rl_engine.rollout import score_completions

POLICY = "triton_cuda_bf16"
PLAIN = "torch_bf16"  # rollout and teacher forcing in plain PyTorch BF16
MIXED = "triton_cuda_bf16:torch_bf16"  # our rollout, a plain-PyTorch trainer
STEPS, N, G, C = 2, 2, 2, 3


@pytest.fixture(scope="module")
def run(micro_weights):
    """Two steps, and between them the step-0 completions scored again with the updated weights."""
    prompts = make_prompts(N, 3, micro_weights.config.vocab_size, 0)
    trainer = GRPOTrainer(micro_weights, prompts, RLSettings(steps=STEPS, group=G, max_new_tokens=C),
                          backend=POLICY, controls=[PLAIN, MIXED])
    first = trainer.step()
    comps = first.paths[POLICY].completions
    rescored = score_completions(trainer.model(POLICY), comps, RLSettings().sampling)
    second = trainer.step()
    return trainer, [first, second], rescored


def test_policy_ratio_is_exactly_one_for_every_token_of_every_step(run):
    _, steps, _ = run
    for res in steps:
        p = res.record["paths"][POLICY]
        assert p["role"] == "policy" and p["ratio_exactly_one"]
        assert p["ratio_min"] == 1.0 and p["ratio_max"] == 1.0
        assert p["rollout_corr/kl"] == 0.0 and p["rollout_corr/k3_kl"] == 0.0
        assert p["rollout_corr/chi2_token"] == 0.0 and p["rollout_corr/chi2_seq"] == 0.0
        assert p["max_abs_dlogp"] == 0.0
        assert p["bitwise_equal_tokens"] == p["active_tokens"] == N * G * C
        # the training logprobs (autograd on) are the rollout's bits, token by token
        pr = res.paths[POLICY]
        for comp, train in zip(pr.completions, pr.train_logprobs):
            assert torch.equal(train.view(torch.int32), comp.logprobs.view(torch.int32))


def test_the_update_changes_the_weights_and_the_next_rollout_samples_from_them(run):
    _, (first, second), rescored = run
    assert first.record["update"]["changed_elements"] > 0 and first.record["update"]["changed_tensors"] > 0
    assert first.record["weights_digest"] != second.record["weights_digest"]
    assert first.record["paths"][POLICY]["grad_norm"] > 0
    # the step-0 samples scored with the step-1 weights: other logprobs (the model is rebuilt from them)
    before = torch.cat([c.logprobs for c in first.paths[POLICY].completions])
    after = torch.cat(rescored)
    assert not torch.equal(before, after)
    # sequence ids are distinct over the run
    assert first.record["seq_ids"] == [0, N * G - 1] and second.record["seq_ids"] == [N * G, 2 * N * G - 1]


def test_control_paths_are_reported(run):
    """The plain PyTorch BF16 path (rollout and teacher forcing on torch_bf16) and the mixed path
    (our rollout, a torch_bf16 trainer) are measured on the same weights and never update them.

    On this project's CPU hosts the plain path comes out bitwise equal at the micro shapes (oneDNN's
    BF16 GEMM gives a row the same bits at every M up to these K, and the decode and packed
    attention rows agree; docs/rl-step.md): only its self-consistency is asserted, whatever the
    host. The mixed path always differs (BF16-rounded logits on one side, FP32 on the other)."""
    _, steps, _ = run
    for res in steps:
        for label in (PLAIN, MIXED):
            p = res.record["paths"][label]
            assert p["role"] == "control" and set(METRIC_NAMES) <= set(p)
            exact = p["bitwise_equal_tokens"] == p["active_tokens"]
            assert p["ratio_exactly_one"] == exact and (p["rollout_corr/kl"] == 0.0) == exact
            assert "grad_norm" not in p
        mixed = res.record["paths"][MIXED]
        assert mixed["rollout_backend"] == POLICY and mixed["train_backend"] == PLAIN
        assert mixed["rollout_shared_with"] == POLICY  # the policy's rollout, not a second one
        assert mixed["completions"] == res.record["paths"][POLICY]["completions"]
        assert mixed["bitwise_equal_tokens"] < mixed["active_tokens"]
        assert not mixed["ratio_exactly_one"] and mixed["rollout_corr/kl"] != 0.0
        assert mixed["training/rollout_probs_diff_max"] > 0


def test_the_step_record_is_strict_json(run):
    _, steps, _ = run
    for res in steps:
        text = json.dumps(strict_json(res.record), allow_nan=False)
        back = json.loads(text)
        assert back["paths"][POLICY]["ratio_min"] == 1.0 and set(back["paths"]) == {POLICY, PLAIN, MIXED}
        assert len(back["paths"][POLICY]["completions"]) == N * G


# -- the pieces, without a model -------------------------------------------------------------------
def test_group_advantages():
    a = group_advantages([1.0, 0.0, 0.5, 0.5], 2)
    s = 2.0 ** 0.5 / 2  # the unbiased std of {1, 0}
    assert a.dtype == torch.float64
    assert a.tolist() == [0.5 / (s + ADV_EPSILON), -0.5 / (s + ADV_EPSILON), 0.0, 0.0]
    with pytest.raises(InputError):
        group_advantages([1.0, 0.0, 1.0], 2)
    with pytest.raises(InputError):
        group_advantages([1.0, 0.0], 1)
    with pytest.raises(InputError):
        group_advantages([1.0, 0.0], 2, epsilon=0.0)


def test_ppo_clip_loss_on_policy_and_clipped():
    adv = torch.tensor([1.0, -2.0, 0.5])
    lp = torch.tensor([-1.0, -2.0, -3.0], requires_grad=True)
    loss, ratio, clipped = ppo_clip_loss(lp, lp.detach().clone(), adv)
    assert ratio.tolist() == [1.0, 1.0, 1.0] and not clipped.any()
    assert float(loss.detach()) == float(-adv.mean())
    loss.backward()
    assert torch.equal(lp.grad, -adv / 3)  # d/dlp of -A exp(lp - old) at ratio 1, token-mean
    # ratio e^1 with A > 0: the clipped term 1 + eps is taken and carries no gradient
    lp2 = torch.tensor([0.0], requires_grad=True)
    loss2, _, clipped2 = ppo_clip_loss(lp2, torch.tensor([-1.0]), torch.tensor([1.0]))
    upper = torch.tensor(1 + CLIP_EPS, dtype=torch.float32)  # the clamp bound as the FP32 loss holds it
    assert clipped2.tolist() == [True] and float(loss2.detach()) == -float(upper)
    loss2.backward()
    assert lp2.grad.tolist() == [0.0]


@pytest.mark.parametrize("optimizer,weight_decay", [("adamw", 0.0), ("adamw", 0.1), ("sgd", 0.0), ("sgd", 0.1)])
def test_the_per_tensor_update_is_torch_optim_bit_for_bit(micro_config, optimizer, weight_decay):
    """Policy's update (one tensor at a time, as each gradient completes) against torch.optim's
    single-tensor step on the same FP32 masters and BF16 gradients, three steps, every bit; and the
    BF16 leaves it rounds are the masters rounded."""
    from rl_engine.chain.weights import synthetic_weights
    from rl_engine.rl.grpo import Policy

    w = synthetic_weights(micro_config, 1, logit_scale=2.0)
    settings = RLSettings(optimizer=optimizer, lr=1e-2, weight_decay=weight_decay)
    pol = Policy(w, settings)
    ref = {n: m.clone() for n, m in pol.master.items()}
    if optimizer == "adamw":
        opt = torch.optim.AdamW(list(ref.values()), lr=1e-2, betas=settings.betas, eps=settings.adam_eps,
                                weight_decay=weight_decay, foreach=False)
    else:
        opt = torch.optim.SGD(list(ref.values()), lr=1e-2, weight_decay=weight_decay, foreach=False)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        leaves = pol.leaves()
        loss = sum((leaf.float() * torch.randn(leaf.shape, generator=gen)).sum() for leaf in leaves.values())
        grads = torch.autograd.grad(loss, list(leaves.values()), retain_graph=True)
        for (n, r), g in zip(ref.items(), grads):
            r.grad = g.to(torch.float32)
        opt.step()
        pol.backward(loss)
        info = pol.step()
        assert info["changed_elements"] > 0 and info["grad_norm"] > 0
        for n, m in pol.master.items():
            assert torch.equal(m.view(torch.int32), ref[n].view(torch.int32)), n
            assert torch.equal(pol.leaves()[n].detach().view(torch.int16), m.to(torch.bfloat16).view(torch.int16))
            assert pol.leaves()[n].grad is None


def test_default_clip_matches_the_contract_clip_interval(contract):
    assert contract.clip_interval == (1 - CLIP_EPS, 1 + CLIP_EPS)


def test_reward_and_prompts():
    assert even_token_reward(torch.tensor([2, 3, 4, 5])) == 0.5
    assert even_token_reward(torch.tensor([], dtype=torch.int64)) == 0.0
    assert make_prompts(2, 3, 512, 0) == make_prompts(2, 3, 512, 0) != make_prompts(2, 3, 512, 1)
    assert all(0 <= t < 512 for p in make_prompts(4, 5, 512, 3) for t in p)


@pytest.mark.parametrize("kw,word", [(dict(group=1), "group"), (dict(steps=0), "steps"),
                                     (dict(clip_eps=1.5), "clip_eps"), (dict(optimizer="lion"), "optimizer"),
                                     (dict(temperature=-1.0), "temperature"), (dict(lr=0.0), "lr"),
                                     (dict(adv_epsilon=0.0), "adv_epsilon")])
def test_bad_settings_are_refused(kw, word):
    with pytest.raises(InputError) as exc:
        RLSettings(**kw)
    assert word in str(exc.value)


def test_bad_runs_are_refused_before_a_model_is_built(micro_weights):
    with pytest.raises(InputError, match="outside the vocabulary"):
        GRPOTrainer(micro_weights, [[1, 2, 9999]], RLSettings())
    with pytest.raises(InputError, match="distinct"):
        GRPOTrainer(micro_weights, [[1, 2]], RLSettings(), controls=[POLICY])
    with pytest.raises(InputError, match="ROLLOUT_BACKEND:TRAIN_BACKEND"):
        PathSpec.parse("a:b:c")
    assert PathSpec.parse("x:y").label == "x:y" and PathSpec.parse("x").label == "x"
