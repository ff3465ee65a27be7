"""Bridges from other libraries' models to the project's kernels.

* :mod:`rl_engine.integrations.transformers` — ``apply(model, backend)`` routes a Hugging Face
  ``transformers`` ``Qwen3ForCausalLM`` (or ``Qwen3Model``) through the project's ops, and
  ``logprobs(model, input_ids)`` gives the chain's per-token FP32 logprobs (``docs/integrations.md``).

Nothing is imported here: ``transformers`` is an optional dependency, loaded when ``apply`` runs.
"""
