import pytest

# The rollout tests' 1-layer micro Qwen3 (tests/rollout/conftest.py: GQA 4/2, head dim 16, V = 512):
# an RL step runs a rollout, a teacher-forcing forward with autograd and a backward through every
# op of the chain, ~7 s per step for 4 sequences in the Triton interpreter on a 2-core machine
# (the tiny-smoke preset costs ~13 s per engine step alone).
MICRO = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False,
             max_position_embeddings=256)


@pytest.fixture(scope="session")
def micro_config():
    from rl_engine.chain.config import Qwen3Config

    return Qwen3Config(**MICRO)


@pytest.fixture(scope="session")
def micro_weights(micro_config, device):
    from rl_engine.chain.weights import synthetic_weights

    return synthetic_weights(micro_config, 0, logit_scale=2.0, device=device)
