import pytest

# A 1-layer Qwen3 (GQA 4/2, head dim 16, V = 512; tests/chain/conftest.py's micro model with one
# layer): the engine's subject is scheduling and sampling, not the model size. The smallest preset
# (tiny-smoke) costs ~13 s per engine step in the Triton interpreter on a shared 2-core machine,
# this one ~1.5 s; every op of the chain still runs, K/V go through the static cache.
MICRO = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False,
             max_position_embeddings=256)


@pytest.fixture(scope="session")
def rollout_weights(device):
    from rl_engine.chain.config import Qwen3Config
    from rl_engine.chain.weights import synthetic_weights

    return synthetic_weights(Qwen3Config(**MICRO), 0, logit_scale=2.0, device=device)


@pytest.fixture(scope="session")
def rollout_model(rollout_weights):
    from rl_engine.chain.model import Qwen3Model

    return Qwen3Model(rollout_weights, "triton_cuda_bf16")
