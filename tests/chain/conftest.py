import pytest
import torch


@pytest.fixture(scope="session")
def chain_preset() -> str:
    """P1's tiny model on a GPU; on the CPU the same model with a 5000-token vocabulary
    (``tiny-smoke``), because the Triton interpreter needs ~15 s per logprob-head call at V = 151936."""
    return "tiny" if torch.cuda.is_available() else "tiny-smoke"


@pytest.fixture(scope="session")
def tiny_weights(chain_preset, device):
    from rl_engine.chain.config import get_config
    from rl_engine.chain.weights import synthetic_weights

    return synthetic_weights(get_config(chain_preset), 0, logit_scale=2.0, device=device)


MICRO = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False,
             max_position_embeddings=256)


@pytest.fixture(scope="session")
def micro_weights(device):
    """A 2-layer Qwen3 far smaller than tiny, for tests of machinery (localisation, negative controls)
    whose subject is not the model size: one Triton interpreter forward costs ~1 s instead of ~4 s."""
    from rl_engine.chain.config import Qwen3Config
    from rl_engine.chain.weights import synthetic_weights

    return synthetic_weights(Qwen3Config(**MICRO), 0, logit_scale=2.0, device=device)
