"""Cross-check of the chain's model definition against Hugging Face ``Qwen3ForCausalLM``.

``transformers`` is a peer, not a dependency: where it is not installed this module is skipped
with the reason printed (it runs on the GPU machine, which has transformers 5.x).
Same weights (written by :func:`save_checkpoint`, read by ``from_pretrained``), same tokens:
``reference_fp32`` logits vs HF in FP32 (reduction class, FP32 tier), ``torch_bf16`` logits vs HF
in BF16 (reduction class, BF16 tier), and the reference logprobs vs HF FP32 log-softmax (logprob
class, FP32 tier).
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed here: the Hugging Face cross-check runs where it is "
                           "(the GPU machine has transformers 5.x)")

from rl_engine.chain.fixtures import make_fixture  # noqa: E402
from rl_engine.chain.model import Qwen3Model  # noqa: E402
from rl_engine.chain.weights import save_checkpoint  # noqa: E402


def _hf_model(path, dtype, device):
    from transformers import Qwen3ForCausalLM

    try:
        m = Qwen3ForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation="eager")
    except TypeError:  # transformers 4.x names it torch_dtype
        m = Qwen3ForCausalLM.from_pretrained(str(path), torch_dtype=dtype, attn_implementation="eager")
    return m.to(device).eval()


def _ours(model: Qwen3Model, tokens: torch.Tensor) -> torch.Tensor:
    n = int(tokens.numel())
    cu = torch.tensor([0, n], dtype=torch.int32, device=model.device)
    pos = torch.arange(n, dtype=torch.int64, device=model.device)
    with torch.no_grad():
        return model.logits(model.forward(tokens.to(model.device), pos, cu_seqlens=cu))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_weights):
    return save_checkpoint(tiny_weights, tmp_path_factory.mktemp("qwen3_tiny"))


def test_reference_fp32_matches_hf_fp32(checkpoint, tiny_weights, contract, device):
    hf = _hf_model(checkpoint, torch.float32, device)
    ours = Qwen3Model(tiny_weights, "reference_fp32")
    tol = contract.tolerance("forward", "reduction", "float32")
    tol_lp = contract.tolerance("forward", "logprob", "float32")
    for tokens in make_fixture("smoke", 21, tiny_weights.config.vocab_size).tokens:
        with torch.no_grad():
            ref = hf(input_ids=tokens[None].to(device)).logits[0].float()
        got = _ours(ours, tokens)
        torch.testing.assert_close(got, ref, atol=tol.atol, rtol=tol.rtol)
        tgt = tokens[1:].to(device)
        hf_lp = torch.log_softmax(ref[:-1], dim=-1).gather(-1, tgt[:, None])[:, 0]
        n = int(tokens.numel())
        cu = torch.tensor([0, n], dtype=torch.int32, device=device)
        with torch.no_grad():
            h = ours.forward(tokens.to(device), torch.arange(n, device=device), cu_seqlens=cu)
            lp = ours.logprobs(h[:-1], tgt)
        torch.testing.assert_close(lp, hf_lp, atol=tol_lp.atol, rtol=tol_lp.rtol)


def test_torch_bf16_matches_hf_bf16(checkpoint, tiny_weights, contract, device):
    hf = _hf_model(checkpoint, torch.bfloat16, device)
    ours = Qwen3Model(tiny_weights, "torch_bf16")
    tol = contract.tolerance("forward", "reduction", "bfloat16")
    for tokens in make_fixture("smoke", 22, tiny_weights.config.vocab_size).tokens:
        with torch.no_grad():
            ref = hf(input_ids=tokens[None].to(device)).logits[0].float()
        got = _ours(ours, tokens)
        torch.testing.assert_close(got, ref, atol=tol.atol, rtol=tol.rtol)
