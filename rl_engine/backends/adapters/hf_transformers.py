"""Hugging Face ``transformers`` Qwen3 building blocks behind the rl_engine op API.

Provided ops (all with autograd): ``rms_norm`` and ``qk_norm`` (``Qwen3RMSNorm``), ``rope``
(``apply_rotary_pos_emb`` with cos/sin rounded to the input dtype as ``Qwen3RotaryEmbedding``
returns them), ``silu`` and ``swiglu`` (``ACT2FN["silu"]``, the ``Qwen3MLP`` activation), and
``attention`` (``eager_attention_forward`` with a causal mask, one sequence at a time). The
adapter claims batch invariance for each of them on the library's behalf, so the gate tests it;
a failure is a finding about the library, reported with the comparator's numbers.
"""

from __future__ import annotations

import torch

from rl_engine.backends.backend import Backend, plugin_backend
from rl_engine.errors import BackendUnavailable
from rl_engine.ops._validate import check_cu_seqlens, check_tensor


def _import():
    try:
        from transformers.activations import ACT2FN
        from transformers.models.qwen3 import modeling_qwen3 as m
    except Exception as exc:  # ImportError, or a transformers without Qwen3
        raise BackendUnavailable(
            f"backend hf_transformers needs the 'transformers' package with Qwen3 support: {type(exc).__name__}: {exc}"
        ) from exc
    return m, ACT2FN


def _norm(m, x: torch.Tensor, weight: torch.Tensor, eps: float, order: str) -> torch.Tensor:
    if order != "hf":
        raise NotImplementedError(f"hf_transformers implements only the 'hf' RMSNorm order, not {order!r}")
    module = m.Qwen3RMSNorm(weight.shape[0], eps=eps).to(device=x.device)
    return torch.func.functional_call(module, {"weight": weight}, (x,))


def make_plugin() -> Backend:
    m, act = _import()
    silu_fn = act["silu"]

    def rms_norm(x, weight, eps, order="hf"):
        check_tensor("x", x, dtype=torch.bfloat16, ndim=2)
        return _norm(m, x, weight, eps, order)

    def qk_norm(x, weight, eps, order="hf"):
        check_tensor("x", x, dtype=torch.bfloat16, ndim=3)
        return _norm(m, x, weight, eps, order)

    def rope(x, cos, sin):
        check_tensor("x", x, dtype=torch.bfloat16, ndim=3)
        q = x.transpose(0, 1).unsqueeze(0)  # [1, H, T, D]
        c = torch.cat([cos, cos], dim=-1).to(x.dtype).unsqueeze(0)  # [1, T, D], rounded like HF's rotary
        s = torch.cat([sin, sin], dim=-1).to(x.dtype).unsqueeze(0)
        out, _ = m.apply_rotary_pos_emb(q, q, c, s, unsqueeze_dim=1)
        return out.squeeze(0).transpose(0, 1)

    def silu(x):
        return silu_fn(x)

    def swiglu(gate, up):
        return silu_fn(gate) * up

    class _AttnModule(torch.nn.Module):
        def __init__(self, groups: int):
            super().__init__()
            self.num_key_value_groups = groups

    def attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale):
        check_tensor("q", q, dtype=torch.bfloat16, ndim=3)
        cq = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0])
        ck = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0])
        module = _AttnModule(q.shape[1] // k.shape[1])
        module.train(False)
        parts = [q.new_zeros((0,) + tuple(q.shape[1:]))]
        for b in range(len(cq) - 1):
            lq, lk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
            if lq == 0:
                continue
            qb = q[cq[b]:cq[b + 1]].transpose(0, 1).unsqueeze(0)
            kb = k[ck[b]:ck[b + 1]].transpose(0, 1).unsqueeze(0)
            vb = v[ck[b]:ck[b + 1]].transpose(0, 1).unsqueeze(0)
            i = torch.arange(lq, device=q.device)[:, None]
            j = torch.arange(lk, device=q.device)[None, :]
            mask = torch.zeros(lq, lk, dtype=q.dtype, device=q.device)
            mask = mask.masked_fill(j > (lk - lq + i), torch.finfo(q.dtype).min)[None, None]
            out, _ = m.eager_attention_forward(module, qb, kb, vb, mask, scaling=scale, dropout=0.0)
            parts.append(out.squeeze(0))  # [Lq, H, D]
        return torch.cat(parts, dim=0)

    ops = {"rms_norm": rms_norm, "qk_norm": qk_norm, "rope": rope, "silu": silu, "swiglu": swiglu, "attention": attention}
    return plugin_backend("hf_transformers", ops, backward=True, batch_invariant=True, origin="adapter",
                          description="Hugging Face transformers Qwen3 building blocks (eager PyTorch)")
