"""The sampler on its own (no model): rows are independent of the batch, ties and filters are
deterministic, and every bad argument of ``generate`` is refused before any kernel runs."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from rl_engine.errors import InputError
from rl_engine.ops.logp import logp
from rl_engine.rollout import SamplingParams, generate
from rl_engine.rollout.sampling import (MIN_TEMPERATURE, RowKeyedSampler, Sampler, kept_mask, row_keys,
                                       uniforms)

LOGP = partial(logp, backend="triton_cuda_bf16")
SETTINGS = [SamplingParams(1.0, seed=3), SamplingParams(0.7, top_k=5, top_p=0.8, seed=11),
            SamplingParams(0.0)]


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32) if x.dtype == torch.float32 else x


@pytest.fixture(scope="module")
def logits(device):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(5, 777, generator=g) * 3).to(device)  # V = 777: not a multiple of any vector width


def _draw(sampler, logits, params, rows):
    dev = logits.device
    seq = torch.tensor([10 + r for r in rows], device=dev)
    pos = torch.tensor([3 + 2 * r for r in rows], device=dev)
    return sampler.sample(LOGP, logits[rows].contiguous(), seq, torch.arange(len(rows), device=dev), pos, params)


@pytest.mark.parametrize("params", SETTINGS, ids=["T1", "T0.7-k5-p0.8", "greedy"])
def test_a_row_draws_the_same_bits_alone_and_in_any_batch(logits, params):
    full_tok, full_lp = _draw(Sampler(), logits, params, [0, 1, 2, 3, 4])
    perm_tok, perm_lp = _draw(Sampler(), logits, params, [4, 2, 0, 3, 1])
    for i, r in enumerate([4, 2, 0, 3, 1]):
        tok, lp = _draw(Sampler(), logits, params, [r])
        assert int(tok) == int(full_tok[r]) == int(perm_tok[i])
        assert torch.equal(_bits(lp), _bits(full_lp[r : r + 1])) and torch.equal(_bits(lp), _bits(perm_lp[i : i + 1]))


def test_the_same_check_catches_a_row_keyed_sampler(logits):
    """Negative control: keyed by the batch row, a reordered batch draws other tokens."""
    params = SETTINGS[0]
    rows = [4, 2, 0, 3, 1]
    full_tok, _ = _draw(RowKeyedSampler(), logits, params, [0, 1, 2, 3, 4])
    perm_tok, _ = _draw(RowKeyedSampler(), logits, params, rows)
    assert any(int(perm_tok[i]) != int(full_tok[r]) for i, r in enumerate(rows))


def test_noise_depends_on_seed_sequence_and_position():
    base = row_keys(5, torch.tensor([1]), torch.tensor([7]))
    for other in (row_keys(6, torch.tensor([1]), torch.tensor([7])), row_keys(5, torch.tensor([2]), torch.tensor([7])),
                  row_keys(5, torch.tensor([1]), torch.tensor([8])), row_keys(5 + (1 << 32), torch.tensor([1]),
                                                                             torch.tensor([7]))):
        assert int(other) != int(base)
    u = uniforms(base, 4096)
    assert u.dtype == torch.float64 and bool((u > 0).all()) and bool((u < 1).all()) and u.unique().numel() == 4096


def test_greedy_takes_the_lowest_id_among_ties_and_the_unscaled_logprob(device):
    lg = torch.tensor([[0.0, 2.0, 1.0, 2.0], [3.0, 3.0, 3.0, 3.0]], device=device)
    tok, lp = Sampler().sample(LOGP, lg, torch.tensor([0, 1], device=device), torch.arange(2, device=device),
                               torch.tensor([1, 1], device=device),
                               SamplingParams(0.0, top_k=1, top_p=0.5))
    assert tok.tolist() == [1, 0]
    assert torch.equal(_bits(lp), _bits(LOGP(logits=lg, targets=tok, temperature=1.0)))


def test_top_k_keeps_exactly_k_with_ties_broken_by_the_lower_id(device):
    lg = torch.tensor([[1.0, 5.0, 5.0, 5.0, 0.0, 5.0]], device=device)
    mask = kept_mask(lg, SamplingParams(1.0, top_k=2))
    assert mask[0].tolist() == [False, True, True, False, False, False]
    # uniform logits, top-k 2: the renormalised distribution gives each kept token exactly 1/2
    one = torch.tensor([0], device=device)
    tok, lp = Sampler().sample(LOGP, torch.zeros(1, 8, device=device), one, one, one + 1,
                               SamplingParams(1.0, top_k=2, seed=9))
    assert int(tok) in (0, 1) and float(lp) == float(torch.tensor(-math.log(2.0), dtype=torch.float32))


def test_top_p_keeps_the_smallest_prefix_that_reaches_p():
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.2, 0.1]])  # ranks: 1 (0.4), 2 (0.2), 3 (0.2), 0 (0.1), 4 (0.1)
    lg = probs.log()
    assert kept_mask(lg, SamplingParams(1.0, top_p=0.3))[0].tolist() == [False, True, False, False, False]
    assert kept_mask(lg, SamplingParams(1.0, top_p=0.5))[0].tolist() == [False, True, True, False, False]
    assert kept_mask(lg, SamplingParams(1.0, top_p=0.9))[0].tolist() == [True, True, True, True, False]
    assert kept_mask(lg, SamplingParams(1.0, top_p=1.0)) is None  # 1 is no filter, not a rounding question
    # top-k first, then top-p on the top-k set: k=2 keeps ids 1, 2 (0.4, 0.2 -> 2/3, 1/3)
    assert kept_mask(lg, SamplingParams(1.0, top_k=2, top_p=0.7))[0].tolist() == [False, True, True, False, False]


# ---------------------------------------------------------------- bad input, before any launch
@pytest.fixture(scope="module")
def no_launch_model(rollout_weights):
    """A model whose every op raises: a bad argument must be refused before any of them runs."""
    from rl_engine.chain.model import OpTable, Qwen3Model

    def launched(op, **kwargs):
        raise AssertionError(f"{op} ran before the bad input was refused")

    class NoLaunch(OpTable):
        def impl(self, op):
            return partial(launched, op)

    model = Qwen3Model(rollout_weights, "triton_cuda_bf16")
    model.ops = NoLaunch("triton_cuda_bf16")
    return model


V, MAX_POS = 512, 256
BAD = {
    "token-above-V": (dict(prompts=[[1, V]]), "outside the vocabulary"),
    "negative-token": (dict(prompts=[[-1, 2]]), "outside the vocabulary"),
    "float-token": (dict(prompts=[[1, 2.0]]), "not an integer"),
    "empty-prompt": (dict(prompts=[[1], []]), "empty prompt"),
    "no-prompt-list": (dict(prompts="1 2 3"), "list of token-id lists"),
    "beyond-positions": (dict(prompts=[[1] * 250], max_new_tokens=7), "max_position_embeddings"),
    "beyond-cache": (dict(prompts=[[1] * 5], max_new_tokens=4, s_max=8), "s_max"),
    "top-p-zero": (dict(top_p=0.0), "top_p"),
    "top-p-above-one": (dict(top_p=1.5), "top_p"),
    "top-p-nan": (dict(top_p=float("nan")), "top_p"),
    "top-k-zero": (dict(top_k=0), "top_k"),
    "top-k-float": (dict(top_k=2.5), "top_k"),
    "negative-temperature": (dict(temperature=-0.1), "temperature"),
    "inf-temperature": (dict(temperature=float("inf")), "temperature"),
    "underflowing-temperature": (dict(temperature=1e-38), "smallest accepted temperature"),
    "subnormal-temperature": (dict(temperature=1e-45), "smallest accepted temperature"),
    "temperature-below-minimum": (dict(temperature=MIN_TEMPERATURE / 2), "smallest accepted temperature"),
    "temperature-above-fp32": (dict(temperature=1e39), "largest FP32"),
    "float-seed": (dict(seed=1.5), "seed"),
    "str-seed": (dict(seed="3"), "seed"),
    "bool-seed": (dict(seed=True), "seed"),
    "negative-seed": (dict(seed=-1), "seed"),
    "huge-seed": (dict(seed=1 << 64), "seed"),
    "zero-new-tokens": (dict(max_new_tokens=0), "max_new_tokens"),
    "budgets-count": (dict(max_new_tokens=[1, 2, 3]), "budgets for"),
    "zero-max-batch": (dict(max_batch=0), "max_batch"),
    "stop-outside-V": (dict(stop_token_ids=[V]), "stop_token_ids"),
    "duplicate-seq-ids": (dict(seq_ids=[3, 3]), "distinct"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input_is_refused_before_any_kernel(no_launch_model, case):
    kwargs, words = BAD[case]
    call = dict(prompts=[[1, 2], [3]], max_new_tokens=2)
    call.update(kwargs)
    assert no_launch_model.config.vocab_size == V and no_launch_model.config.max_position_embeddings == MAX_POS
    with pytest.raises(InputError, match=words):
        generate(no_launch_model, call.pop("prompts"), call.pop("max_new_tokens"), **call)


def test_the_no_launch_model_does_refuse_to_run(no_launch_model):
    """Control for the test above: valid input reaches an op, which raises."""
    with pytest.raises(AssertionError, match="ran before"):
        generate(no_launch_model, [[1, 2]], 1)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
def test_the_one_kernel_draw_computes_the_reference_scores_bit_for_bit(device, temperature):
    """The fused Gumbel-max kernel (gumbel_triton) against the sampler's float64 torch path: every
    score s + G (float64 bits) and the drawn token, at V = 777 and at the Qwen3 vocabulary's tail
    width (two chunks of the kernel), with tied maxima (inside a chunk and across chunks), -inf logits
    and a row of -inf only; on the CPU in the Triton interpreter, on the H200 with
    the GPU's float64 units. Control: a key off by one gives other scores."""
    from rl_engine.rollout import sampling as ref
    from rl_engine.rollout.gumbel_triton import gumbel_argmax

    g = torch.Generator().manual_seed(int(temperature * 10))
    for v in (777, 151936 % 4096 + 4096):
        z = (torch.randn(4, v, generator=g) * 3).to(device)
        z[1, 100] = z[1, 3] = z[1].max() + 50.0  # a tie far above the noise: the lower id must win
        z[2, ::7] = float("-inf")
        if v > 4096:  # more than one chunk of the kernel: a tie across chunks, and a row of -inf only
            z[3, 4200] = z[3, 10] = z[3].max() + 50.0
            z[0] = float("-inf")
        params = SamplingParams(temperature, seed=99)
        keys = row_keys(params.seed, torch.tensor([5, 6, 7, 8], device=device), torch.tensor([0, 1, 2, 300], device=device))
        want = ref.scaled_logits(z, params).to(torch.float64) + ref.gumbel_noise(uniforms(keys, v))
        tokens, scores = gumbel_argmax(z, keys, temperature, return_scores=True)
        assert torch.equal(scores.view(torch.int64), want.view(torch.int64))
        assert torch.equal(tokens, torch.argmax(want, dim=1)) and int(tokens[1]) == 3
        if v > 4096:
            assert int(tokens[3]) == 10 and int(tokens[0]) == 0
        _, other = gumbel_argmax(z, keys + 1, temperature, return_scores=True)
        assert not torch.equal(other.view(torch.int64), want.view(torch.int64))


@pytest.mark.parametrize("seed", [0, 99, (1 << 64) - 1, 0x9E3779B9, 1 << 40])
def test_the_key_kernel_is_the_torch_hash(device, seed):
    """``row_keys_kernel`` (one launch) gives ``row_keys``'s int64 bits (~100 torch launches) for
    sequence ids past 2^32 and positions up to 2^31, with seeds at both ends of [0, 2^64).
    Control: sequence ids and positions swapped give other keys."""
    from rl_engine.rollout.gumbel_triton import row_keys_kernel

    g = torch.Generator().manual_seed(seed & 0xFFFF)
    seq = torch.cat([torch.randint(0, 1 << 40, (300,), generator=g), torch.tensor([0, 1, (1 << 62) + 7])]).to(device)
    pos = torch.cat([torch.randint(0, 1 << 31, (300,), generator=g), torch.tensor([0, 5, 1])]).to(device)
    assert torch.equal(row_keys_kernel(seed, seq, pos), row_keys(seed, seq, pos))
    assert not torch.equal(row_keys_kernel(seed, pos, seq), row_keys(seed, seq, pos))
    with pytest.raises(InputError, match="positions"):
        row_keys_kernel(seed, seq, pos[:5])


def test_the_one_kernel_draw_refuses_bad_input():
    from rl_engine.rollout.gumbel_triton import gumbel_argmax

    z = torch.zeros(2, 8)
    keys = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(InputError, match="logits"):
        gumbel_argmax(z.double(), keys, 1.0)
    with pytest.raises(InputError, match="keys"):
        gumbel_argmax(z, keys[:1], 1.0)
    with pytest.raises(InputError, match="temperature"):
        gumbel_argmax(z, keys, 0.0)


# ---------------------------------------------------------------- extreme temperatures, non-finite logits
def test_the_smallest_accepted_temperature_draws_the_argmax_with_finite_logprobs(logits):
    """At MIN_TEMPERATURE ordinary logits (here 3 x randn, top-2 gaps checked > 1e-3) give the argmax
    with finite logprobs (greedy in effect, never NaN). Control: at 1e-38, refused above, the FP32
    division alone overflows these logits to +inf (what made every logprob NaN before the refusal)."""
    top2 = logits.topk(2, dim=1).values
    assert bool(((top2[:, 0] - top2[:, 1]) > 1e-3).all())
    rows = list(range(logits.shape[0]))
    for params in (SamplingParams(MIN_TEMPERATURE, seed=5), SamplingParams(MIN_TEMPERATURE, top_k=7, top_p=0.5)):
        tok, lp = _draw(Sampler(), logits, params, rows)
        assert torch.equal(tok, torch.argmax(logits, dim=1)) and bool(torch.isfinite(lp).all())
    assert bool(torch.isinf(logits / torch.full((), 1e-38, dtype=torch.float32, device=logits.device)).any())


def _nonfinite_rows(v: int = 777) -> torch.Tensor:
    """Rows 0-3 non-finite, 4-6 finite (4 holds -inf entries: ordinary tokens of probability 0)."""
    z = torch.randn(7, v, generator=torch.Generator().manual_seed(7)) * 3
    z[0, 500] = float("inf")  # one +inf, not the lowest id of the row's finite maximum
    z[1, 30] = z[1, 600] = float("inf")  # two: the lower id
    z[2, 700] = z[2, 40] = float("nan")
    z[2, 5] = float("inf")  # NaN ranks above +inf
    z[3] = float("-inf")  # nothing finite: id 0
    z[4, ::3] = float("-inf")
    return z


NONFINITE_TOKENS = [500, 30, 40, 0]
ALL_SETTINGS = SETTINGS + [SamplingParams(0.9, top_p=0.9, seed=2), SamplingParams(1.1, top_k=3, seed=4)]


@pytest.mark.parametrize("backend", ["triton_cuda_bf16", "cuda_bf16"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused-draw", "reference-draw"])
@pytest.mark.parametrize("params", ALL_SETTINGS, ids=["T1", "T0.7-k5-p0.8", "greedy", "p0.9", "k3"])
def test_a_non_finite_row_draws_rank_0_with_a_nan_logprob_and_leaves_other_rows_alone(
        device, backend, fused, params, monkeypatch):
    """docs/rollout.md "Non-finite logits": a row with NaN, +inf or only -inf draws its rank-0 token
    (lowest NaN id, else lowest +inf id, else 0) with logprob NaN, in every setting and on both draw
    paths; the finite rows give the bits they give in a batch without the non-finite rows, with
    finite logprobs."""
    from rl_engine.backends.registry import availability
    from rl_engine.rollout import sampling

    ok, why = availability(backend)
    if not ok:
        pytest.skip(why)
    if not fused:
        monkeypatch.setattr(sampling, "_fused_draw_available", lambda logits: False)
    logp_fn = partial(logp, backend=backend)
    z = _nonfinite_rows().to(device)
    seq, pos = torch.arange(7, device=device) + 10, torch.arange(7, device=device) * 5 + 3
    tok, lp = Sampler().sample(logp_fn, z, seq, torch.arange(7, device=device), pos, params)
    assert tok[:4].tolist() == NONFINITE_TOKENS
    assert bool(torch.isnan(lp[:4]).all()) and bool(torch.isfinite(lp[4:]).all())
    alone_tok, alone_lp = Sampler().sample(logp_fn, z[4:].contiguous(), seq[4:], torch.arange(3, device=device),
                                           pos[4:], params)
    assert torch.equal(tok[4:], alone_tok) and torch.equal(_bits(lp[4:]), _bits(alone_lp))


def test_top_p_keeps_rank_0_of_a_plus_inf_row():
    """The +inf row of issue #36: rank 0 (the +inf token) is kept. Control: the filter's comparison
    without the explicit rank-0 term (the formula before the fix) keeps nothing in that row, because
    its cumulative weights are NaN."""
    from rl_engine.rollout.sampling import exp_f64

    z = _nonfinite_rows()[:2]
    params = SamplingParams(1.0, top_p=0.9)
    mask = kept_mask(z, params)
    assert mask[0].nonzero().flatten().tolist() == [500] and mask[1].nonzero().flatten().tolist() == [30]
    sorted_s, _ = torch.sort(z, dim=1, descending=True, stable=True)
    w = exp_f64(sorted_s.to(torch.float64) - sorted_s[:, :1].to(torch.float64))
    cum = torch.cumsum(w, dim=1)
    before = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=1)
    assert not bool((before < cum[:, -1:] * params.top_p).any())
