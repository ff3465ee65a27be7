"""The engine's decode step as a CUDA graph (issue #19): a graph replay gives the eager step's bits,
and continuous batching stays bitwise batch-invariant with graphs on, on both kernel backends; at
Qwen3-8B shapes too (synthetic weights). On a machine without a GPU only the refusal runs."""

from __future__ import annotations

import pytest
import torch

from rl_engine.backends.registry import KERNEL_BACKENDS, availability
from rl_engine.errors import InputError
from rl_engine.rollout import generate
from rl_engine.rollout.compare import compare_completions

PROMPTS = ([5, 17, 300], [42, 7], [100, 200, 300, 400])
BUDGETS = [2, 5, 3]
FILTERED = dict(temperature=0.8, top_k=64, top_p=0.9, seed=1234)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")


def test_a_cuda_graph_off_a_gpu_is_refused_before_anything_runs(rollout_model):
    if rollout_model.device.type == "cuda":
        pytest.skip("the model is on a GPU here")
    with pytest.raises(InputError, match="cuda_graph=True needs a CUDA device"):
        generate(rollout_model, PROMPTS, 2, cuda_graph=True)


def _model(weights, backend):
    from rl_engine.chain.model import Qwen3Model

    ok, why = availability(backend)
    if not ok:
        pytest.skip(why)
    return Qwen3Model(weights, backend)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("sampling", [FILTERED, dict(temperature=1.0, seed=7), dict(temperature=0.0)],
                         ids=["top-k-top-p", "t1", "greedy"])
def test_graph_replays_give_the_eager_bits_in_every_schedule(rollout_weights, backend, sampling):
    model = _model(rollout_weights, backend)
    eager_alone = [generate(model, [p], [b], seq_ids=[i], max_batch=1, cuda_graph=False, **sampling).completions[0]
                   for i, (p, b) in enumerate(zip(PROMPTS, BUDGETS))]
    for max_batch in (1, 2, 3):
        res = generate(model, PROMPTS, BUDGETS, max_batch=max_batch, cuda_graph=True, **sampling)
        assert res.decode_steps > 0
        rep = compare_completions(eager_alone, res.completions)
        assert rep.equal and rep.compared == (0, 1, 2), (max_batch, rep.summary())


@pytest.mark.gpu
@needs_cuda
def test_graph_engine_batch_invariance_at_qwen3_8b_shapes():
    """Qwen3-8B shapes (36 layers, V = 151936, synthetic weights): a sequence's tokens and logprobs are
    the same bits alone, in a full static batch and joining a running batch mid-way, graphs on."""
    from rl_engine.chain.config import get_config
    from rl_engine.chain.weights import synthetic_weights

    weights = synthetic_weights(get_config("qwen3-8b"), 0, logit_scale=2.0, device="cuda")
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 151936, (n,), generator=g).tolist() for n in (37, 5, 120, 64)]
    budgets = [4, 9, 3, 6]
    for backend in KERNEL_BACKENDS:
        model = _model(weights, backend)
        alone = [generate(model, [p], [b], seq_ids=[i], max_batch=1, **FILTERED).completions[0]
                 for i, (p, b) in enumerate(zip(prompts, budgets))]
        static = generate(model, prompts, budgets, max_batch=4, **FILTERED)
        joined = generate(model, prompts, budgets, max_batch=2, **FILTERED)
        assert any(a[2] > 0 for a in joined.admissions), joined.admissions  # someone joined mid-way
        for other in (static, joined):
            rep = compare_completions(alone, other.completions)
            assert rep.equal and rep.compared == (0, 1, 2, 3), (backend, rep.summary())
        del model
    del weights
    torch.cuda.empty_cache()



@pytest.mark.gpu
@needs_cuda
def test_one_pass_decode_attention_keeps_the_engine_bits_at_qwen3_8b_shapes():
    """cuda_bf16 at Qwen3-8B shapes: with every decode step's attention in the one-pass form (the
    library's form from 16 sequences up), a sequence's tokens and logprobs in a static batch and
    joining a running batch mid-way are the bits it has alone in the two-launch form (the library's
    form at these batch sizes). Control: another seed's completions differ."""
    from rl_engine.chain.config import get_config
    from rl_engine.chain.weights import synthetic_weights
    from rl_engine.ops.attention import cuda as at_cuda

    weights = synthetic_weights(get_config("qwen3-8b"), 0, logit_scale=2.0, device="cuda")
    model = _model(weights, "cuda_bf16")
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 151936, (n,), generator=g).tolist() for n in (70, 3, 129, 64)]
    budgets = [5, 8, 3, 6]
    old = at_cuda.set_decode_form("two_launch")
    try:
        alone = [generate(model, [p], [b], seq_ids=[i], max_batch=1, **FILTERED).completions[0]
                 for i, (p, b) in enumerate(zip(prompts, budgets))]
        at_cuda.set_decode_form("one_pass")
        static = generate(model, prompts, budgets, max_batch=4, **FILTERED)
        joined = generate(model, prompts, budgets, max_batch=2, **FILTERED)
        other = generate(model, prompts, budgets, max_batch=4, **{**FILTERED, "seed": 4321})
    finally:
        at_cuda.set_decode_form(old)
    assert any(a[2] > 0 for a in joined.admissions), joined.admissions
    for run in (static, joined):
        rep = compare_completions(alone, run.completions)
        assert rep.equal and rep.compared == (0, 1, 2, 3), rep.summary()
    assert not compare_completions(alone, other.completions).equal
    del model, weights
    torch.cuda.empty_cache()
