"""Adapters for peer libraries, shipped with the package and imported only when asked for.

* ``hf_transformers`` — Hugging Face Qwen3 building blocks (RMSNorm, rotary embedding, MLP
  activation, eager attention); runs on the CPU.
* ``liger`` — Liger-Kernel's RMSNorm, RoPE, SwiGLU and fused linear cross-entropy (as a logprob);
  needs a CUDA GPU.

An adapter whose library is missing is a backend that cannot run, with the reason (asking for it
exits 2).
"""

from __future__ import annotations

import importlib

from rl_engine.backends.backend import Backend

ADAPTERS = {
    "hf_transformers": "rl_engine.backends.adapters.hf_transformers",
    "liger": "rl_engine.backends.adapters.liger",
}


def load(name: str) -> Backend:
    """The adapter's backend; raises BackendUnavailable when its library is missing."""
    return importlib.import_module(ADAPTERS[name]).make_plugin()
