"""Liger-Kernel behind the rl_engine op API (needs a CUDA GPU).

Provided ops: ``rms_norm`` (``LigerRMSNormFunction``, offset 0, casting mode ``"llama"``),
``rope`` (``liger_rotary_pos_emb``), ``swiglu`` (``LigerSiLUMulFunction``) and ``linear_logp``
(``LigerFusedLinearCrossEntropyFunction`` with ``reduction="none"``: the per-token loss is
``-logp``). Batch invariance is claimed on the library's behalf for each so the gate tests it.
"""

from __future__ import annotations

import torch

from rl_engine.backends.backend import Backend, plugin_backend
from rl_engine.errors import BackendUnavailable


def _available() -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, "liger needs a CUDA GPU"
    return True, "liger-kernel and a CUDA GPU present"


def make_plugin() -> Backend:
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except Exception as exc:
        raise BackendUnavailable(f"backend liger needs the 'liger-kernel' package: {type(exc).__name__}: {exc}") from exc

    def rms_norm(x, weight, eps, order="hf"):
        if order != "hf":
            raise NotImplementedError(f"the liger adapter judges the contract's 'hf' order only, not {order!r}")
        return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "llama", False)

    def rope(x, cos, sin):
        q = x.transpose(0, 1).unsqueeze(0).contiguous()
        c = torch.cat([cos, cos], dim=-1).to(x.dtype).unsqueeze(0)
        s = torch.cat([sin, sin], dim=-1).to(x.dtype).unsqueeze(0)
        out, _ = liger_rotary_pos_emb(q, q.clone(), c, s)
        return out.squeeze(0).transpose(0, 1)

    def swiglu(gate, up):
        return LigerSiLUMulFunction.apply(gate, up)

    def linear_logp(hidden, weight, targets, temperature=1.0):
        if temperature != 1.0:
            raise NotImplementedError("liger's fused linear cross-entropy has no temperature; judged at temperature 1 only")
        loss = LigerFusedLinearCrossEntropyFunction.apply(hidden, weight, targets, None, None, -100, 0.0, 0.0, "none")
        loss = loss[0] if isinstance(loss, tuple) else loss
        return -loss.float()

    ops = {"rms_norm": rms_norm, "rope": rope, "swiglu": swiglu, "linear_logp": linear_logp}
    return plugin_backend("liger", ops, backward=True, batch_invariant=True, origin="adapter",
                          description="Liger-Kernel 0.8.x Triton kernels", available=_available)
