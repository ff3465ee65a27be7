"""The Qwen3 dense chain: config, weights, model (training and rollout styles), fixtures, parity.

Public pieces: :class:`~rl_engine.chain.config.Qwen3Config` and ``PRESETS``;
:func:`~rl_engine.chain.weights.synthetic_weights` / :func:`~rl_engine.chain.weights.load_checkpoint`;
:class:`~rl_engine.chain.model.Qwen3Model` and its ``KVCache``;
:func:`~rl_engine.chain.scoring.score_teacher_forcing` and :func:`~rl_engine.chain.scoring.score_rollout`; :func:`~rl_engine.chain.fixtures.make_fixture`;
:func:`~rl_engine.chain.parity.check_parity`; the gate cell
:func:`~rl_engine.chain.gate.chain_parity_cell`. Nothing is imported eagerly here.
"""
