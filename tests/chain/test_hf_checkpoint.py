"""Real checkpoints, both ways (issue #35): what ``transformers`` saves, the chain loads, and the reverse.

A small ``Qwen3ForCausalLM`` is made and saved by ``transformers`` itself (``save_pretrained``: one
``model.safetensors``, or shards with ``model.safetensors.index.json``), untied and tied. It must
load through :func:`load_checkpoint` / :meth:`Qwen3Config.from_json` bit for bit, and the chain's
``reference_fp32`` logits must match ``transformers``' FP32 logits within the contract (reduction
class, FP32 tier). The reverse direction (:func:`save_checkpoint` -> ``from_pretrained``) and the
two round trips are checked bit for bit. Each refusal (missing shard, wrong dtype, unknown or
missing tensor, an untied config without ``lm_head``, a tied head that differs, configs the chain
cannot run) is a named error, next to a control that loads. See docs/checkpoints.md.
"""

from __future__ import annotations

import copy
import json
import math
import shutil

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed here: install the test extra (pip install -e .[test])")

from safetensors.torch import load_file, save_file  # noqa: E402

from rl_engine.chain.config import ConfigError, Qwen3Config  # noqa: E402
from rl_engine.chain.fixtures import make_fixture  # noqa: E402
from rl_engine.chain.model import Qwen3Model  # noqa: E402
from rl_engine.chain.weights import (INDEX_FILE, WeightError, load_checkpoint, save_checkpoint,  # noqa: E402
                                     synthetic_weights)
from rl_engine.gate.compare import compare_accuracy  # noqa: E402

HF_FIELDS = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=128)
SHARD_SIZE = "100KB"
"""About 210 KB of BF16 weights untied: three shards (two when tied)."""
SEED = 35

LAYOUTS = {"single": (False, None), "sharded": (False, SHARD_SIZE), "tied": (True, None),
           "tied-sharded": (True, SHARD_SIZE)}


def _hf_model(tie: bool) -> torch.nn.Module:
    """A BF16 ``Qwen3ForCausalLM`` with seeded weights that make a loader error visible.

    ``transformers``' own init leaves every norm weight at exactly 1 (a dropped or swapped norm
    would pass) and gives logits near 0 (the tolerance would hide everything), so every parameter
    is redrawn: norms ``1 + 0.1 N``, projections ``N / sqrt(in)``, the embedding ``N`` (untied) or
    ``2 N / sqrt(E)`` (tied, it is the head), ``lm_head`` ``2 N / sqrt(E)``: logits of O(1).
    """
    cfg = transformers.Qwen3Config(**HF_FIELDS, tie_word_embeddings=tie)
    model = transformers.Qwen3ForCausalLM(cfg)
    gen = torch.Generator().manual_seed(SEED)
    e = HF_FIELDS["hidden_size"]
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):  # a tied head is listed once, as the embedding
            x = torch.randn(p.shape, generator=gen)
            if p.dim() == 1:
                p.copy_(1 + 0.1 * x)
            elif name == "lm_head.weight" or (tie and "embed_tokens" in name):
                p.copy_(2 * x / math.sqrt(e))
            elif "embed_tokens" in name:
                p.copy_(x)
            else:
                p.copy_(x / math.sqrt(p.shape[1]))
    return model.to(torch.bfloat16).eval()


def _from_pretrained(path, dtype: torch.dtype, device) -> torch.nn.Module:
    try:
        m = transformers.Qwen3ForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation="eager")
    except TypeError:  # transformers 4.x names it torch_dtype
        m = transformers.Qwen3ForCausalLM.from_pretrained(str(path), torch_dtype=dtype, attn_implementation="eager")
    return m.to(device).eval()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.uint8)


def _same_as_hf(weights, hf_state: dict[str, torch.Tensor]) -> None:
    """Every tensor of ``weights`` equals the HF state dict's bit for bit (tied: the head is the embedding)."""
    ours = weights.state_dict()
    hf = {k: v for k, v in hf_state.items() if not k.endswith("rotary_emb.inv_freq")}
    if weights.config.tie_word_embeddings:
        assert weights.lm_head is weights.embed_tokens
        hf.pop("lm_head.weight", None)  # transformers lists the shared tensor under both names
    assert ours.keys() == hf.keys()
    for k in ours:
        assert ours[k].dtype == hf[k].dtype and torch.equal(_bits(ours[k]), _bits(hf[k])), k


def _logits(model: Qwen3Model, tokens: torch.Tensor) -> torch.Tensor:
    n = int(tokens.numel())
    cu = torch.tensor([0, n], dtype=torch.int32, device=model.device)
    pos = torch.arange(n, dtype=torch.int64, device=model.device)
    with torch.no_grad():
        return model.logits(model.forward(tokens.to(model.device), pos, cu_seqlens=cu))


def _assert_logits_match_hf(weights, hf_fp32, contract, path: str, seed: int) -> None:
    ours = Qwen3Model(weights.upcast(), "reference_fp32")
    tol = contract.tolerance("forward", "reduction", "float32")
    for i, tokens in enumerate(make_fixture("smoke", seed, weights.config.vocab_size).tokens):
        with torch.no_grad():
            ref = hf_fp32(input_ids=tokens[None].to(hf_fp32.device)).logits[0].float()
        report = compare_accuracy(f"{path}.seq{i}.logits", _logits(ours, tokens), ref, tol)
        assert report.passed, report.summary()


@pytest.fixture(scope="module")
def hf_models():
    return {tie: _hf_model(tie) for tie in (False, True)}


@pytest.fixture(scope="module")
def hf_saved(hf_models, tmp_path_factory):
    """Layout name -> a checkpoint directory written by ``save_pretrained``."""
    out = {}
    for name, (tie, shard) in LAYOUTS.items():
        d = tmp_path_factory.mktemp(f"hf_{name}")
        hf_models[tie].save_pretrained(str(d), **({"max_shard_size": shard} if shard else {}))
        out[name] = d
    return out


def _copy(src, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    load_checkpoint(dst)  # control: the untouched copy loads
    return dst


# -- transformers -> rl_engine ----------------------------------------------------------------
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_transformers_checkpoint_loads_and_matches_hf_fp32(layout, hf_saved, hf_models, contract, device):
    tie, sharded = LAYOUTS[layout]
    path = hf_saved[layout]
    stored = {k for f in path.glob("*.safetensors") for k in load_file(str(f))}
    if sharded:
        index = json.loads((path / INDEX_FILE).read_text())
        assert len(set(index["weight_map"].values())) >= 2
    assert ("lm_head.weight" in stored) is not tie  # transformers does not store a tied head

    config = Qwen3Config.from_json(path)
    assert config == Qwen3Config(**HF_FIELDS, tie_word_embeddings=tie)
    w = load_checkpoint(path, device=device)
    assert w.config == config and w.dtype == torch.bfloat16
    _same_as_hf(w, hf_models[tie].state_dict())
    _assert_logits_match_hf(w, _from_pretrained(path, torch.float32, device), contract, f"hf_{layout}", SEED)


# -- round trips, both ways ---------------------------------------------------------------------
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_round_trips_both_ways(tie, hf_saved, hf_models, tmp_path, contract, device):
    # transformers -> load_checkpoint -> save_checkpoint -> from_pretrained: the same parameters
    w = load_checkpoint(hf_saved["tied-sharded" if tie else "sharded"])
    save_checkpoint(w, tmp_path / "ours")
    back = _from_pretrained(tmp_path / "ours", torch.bfloat16, "cpu")
    assert back.config.tie_word_embeddings is tie
    _same_as_hf(w, back.state_dict())
    assert hf_models[tie].state_dict().keys() == back.state_dict().keys()

    # save_checkpoint -> from_pretrained -> save_pretrained (sharded) -> load_checkpoint: the same weights
    cfg = Qwen3Config(**HF_FIELDS, tie_word_embeddings=tie)
    mine = synthetic_weights(cfg, SEED, logit_scale=2.0, device=device)
    save_checkpoint(mine, tmp_path / "mine")
    _from_pretrained(tmp_path / "mine", torch.bfloat16, "cpu").save_pretrained(
        str(tmp_path / "via_hf"), max_shard_size=SHARD_SIZE)
    again = load_checkpoint(tmp_path / "via_hf")
    assert again.config == cfg
    _same_as_hf(again, mine.state_dict())
    # and transformers computes what the chain computes on the checkpoint the chain wrote
    _assert_logits_match_hf(mine, _from_pretrained(tmp_path / "mine", torch.float32, device), contract,
                            f"ours_{'tied' if tie else 'untied'}", SEED + 1)


# -- refusals, each next to a control that loads ----------------------------------------------
def _rewrite_shard(path, name_in_shard: str, mutate) -> str:
    """Apply ``mutate(state_dict)`` to the file holding ``name_in_shard``; returns that file's name."""
    for f in sorted(path.glob("*.safetensors")):
        sd = load_file(str(f))
        if name_in_shard in sd:
            mutate(sd)
            save_file(sd, str(f), metadata={"format": "pt"})
            return f.name
    raise AssertionError(f"{name_in_shard} is in no shard of {path}")


def _rewrite_index(path, mutate) -> None:
    index = json.loads((path / INDEX_FILE).read_text())
    mutate(index["weight_map"])
    (path / INDEX_FILE).write_text(json.dumps(index))


def test_missing_shard_is_named(hf_saved, tmp_path):
    path = _copy(hf_saved["sharded"], tmp_path)
    shard = json.loads((path / INDEX_FILE).read_text())["weight_map"]["model.norm.weight"]
    (path / shard).unlink()
    with pytest.raises(WeightError, match=rf"{INDEX_FILE}: names shard {shard} \(holding "):
        load_checkpoint(path)


def test_index_that_misplaces_a_tensor_is_named(hf_saved, tmp_path):
    path = _copy(hf_saved["sharded"], tmp_path)
    shards = sorted({f.name for f in path.glob("*.safetensors")})
    name = "model.layers.1.mlp.up_proj.weight"

    def move(weight_map):
        weight_map[name] = next(s for s in shards if s != weight_map[name])
    _rewrite_index(path, move)
    with pytest.raises(WeightError, match=rf"{name}: listed in {INDEX_FILE} under model-\d+-of-\d+\.safetensors, "
                                          r"but stored in"):
        load_checkpoint(path)


def test_fp32_checkpoint_is_refused_not_cast(hf_saved, hf_models, tmp_path):
    load_checkpoint(hf_saved["single"])  # control: the BF16 save loads
    copy.deepcopy(hf_models[False]).float().save_pretrained(str(tmp_path))
    with pytest.raises(WeightError, match=r"model\.embed_tokens\.weight: expected dtype bfloat16, got float32 in "
                                          r"model\.safetensors.*never cast"):
        load_checkpoint(tmp_path)
    as_stored = load_checkpoint(tmp_path, dtype=torch.float32)  # asked for FP32: loads, values unchanged
    assert as_stored.dtype == torch.float32
    assert torch.equal(as_stored.layers[1].down_proj, load_checkpoint(hf_saved["single"]).layers[1].down_proj.float())


def test_unknown_tensor_is_named_with_its_shard(hf_saved, tmp_path):
    path = _copy(hf_saved["sharded"], tmp_path)
    extra = "model.layers.0.mlp.extra.weight"

    def add(sd):
        sd[extra] = torch.zeros(8, dtype=torch.bfloat16)
    shard = _rewrite_shard(path, "model.layers.0.mlp.up_proj.weight", add)
    _rewrite_index(path, lambda wm: wm.__setitem__(extra, shard))
    with pytest.raises(WeightError, match=rf"{extra}: unexpected tensor in {shard}"):
        load_checkpoint(path)


def test_missing_tensor_is_named(hf_saved, tmp_path):
    path = _copy(hf_saved["sharded"], tmp_path)
    gone = "model.layers.1.mlp.down_proj.weight"
    _rewrite_shard(path, gone, lambda sd: sd.pop(gone))
    _rewrite_index(path, lambda wm: wm.pop(gone))
    with pytest.raises(WeightError, match=rf"{gone}: missing from the checkpoint"):
        load_checkpoint(path)


def test_untied_config_without_lm_head_is_refused(hf_saved, tmp_path):
    path = _copy(hf_saved["tied"], tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(cfg, tie_word_embeddings=False)))
    with pytest.raises(WeightError, match=r"lm_head\.weight: missing from the checkpoint .*tie_word_embeddings=true"):
        load_checkpoint(path)


def test_tied_head_stored_must_equal_the_embedding(hf_saved, tmp_path):
    path = _copy(hf_saved["tied"], tmp_path)
    emb = "model.embed_tokens.weight"
    _rewrite_shard(path, emb, lambda sd: sd.__setitem__("lm_head.weight", sd[emb].clone()))
    w = load_checkpoint(path)  # control: a stored copy that equals the embedding is accepted
    assert w.lm_head is w.embed_tokens

    def differ(sd):
        sd["lm_head.weight"][0, 0] = -sd["lm_head.weight"][0, 0] + 1
    _rewrite_shard(path, emb, differ)
    with pytest.raises(WeightError, match=r"lm_head\.weight: tie_word_embeddings is true but lm_head\.weight in "
                                          r"model\.safetensors differs"):
        load_checkpoint(path)


@pytest.mark.parametrize("extra,word", [
    ({"attention_bias": True}, "attention_bias"),
    ({"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 1}, "sliding"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}}, "rope"),
], ids=["attention_bias", "sliding_window", "layer_types", "yarn"])
def test_transformers_configs_the_chain_cannot_run_are_refused(extra, word, tmp_path):
    transformers.Qwen3Config(**HF_FIELDS, tie_word_embeddings=False).save_pretrained(str(tmp_path / "ok"))
    assert Qwen3Config.from_json(tmp_path / "ok").rope_theta == HF_FIELDS["rope_theta"]  # control
    transformers.Qwen3Config(**HF_FIELDS, tie_word_embeddings=False, **extra).save_pretrained(str(tmp_path / "no"))
    with pytest.raises(ConfigError, match=word):
        Qwen3Config.from_json(tmp_path / "no")


def test_save_refuses_a_directory_holding_shards(hf_saved, tmp_path):
    path = _copy(hf_saved["sharded"], tmp_path)
    w = load_checkpoint(path)
    save_checkpoint(w, tmp_path / "fresh")  # control: an empty directory
    save_checkpoint(w, tmp_path / "fresh")  # and overwriting its own model.safetensors
    with pytest.raises(WeightError, match=r"already holds model-00001-of-0000\d\.safetensors"):
        save_checkpoint(w, path)


def test_rope_parameters_are_checked_even_beside_a_top_level_rope_theta():
    """A ``rope_theta`` at the top level (the transformers 4 layout) must not hide the transformers 5
    ``rope_parameters`` beside it: a non-default rope_type or a different theta is refused."""
    base = transformers.Qwen3Config(**HF_FIELDS, tie_word_embeddings=False).to_dict()
    assert Qwen3Config.from_dict(dict(base, rope_theta=HF_FIELDS["rope_theta"])).rope_theta == HF_FIELDS["rope_theta"]
    yarn = dict(base["rope_parameters"], rope_type="yarn", factor=4.0)
    with pytest.raises(ConfigError, match=r"rope_parameters\.rope_type 'yarn'"):
        Qwen3Config.from_dict(dict(base, rope_theta=HF_FIELDS["rope_theta"], rope_parameters=yarn))
    with pytest.raises(ConfigError, match=r"rope_theta 10000\.0 disagrees with rope_parameters\.rope_theta"):
        Qwen3Config.from_dict(dict(base, rope_theta=10000.0))
