"""The tolerance contract ws1-c1-v8: values, structure, and loud failures on malformed files.

The §5 tables are compared with the values parsed from the standard's markdown itself, so this
file holds no threshold numbers of its own.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import pytest

from rl_engine import OPS
from rl_engine.contract import CONTRACT_VERSION, default_contract_path, load_contract
from rl_engine.errors import ContractError

CLASSES = ("elementwise", "reduction", "logprob", "attention")
DTYPE_COLUMNS = ("float32", "bfloat16", "float16")  # column order of the §5 tables


def _standard_path() -> Path | None:
    candidates = [os.environ.get("RL_ENGINE_STANDARD"), "/work/shared/standard/ws1-precision-standard.md",
                  str(Path(__file__).resolve().parents[2] / "shared" / "standard" / "ws1-precision-standard.md")]
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    return None


@pytest.fixture(scope="module")
def standard_text() -> str:
    p = _standard_path()
    if p is None:
        reason = "the WS1 standard markdown (ws1-precision-standard.md) is not on this machine; set RL_ENGINE_STANDARD"
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    return p.read_text()


def _section(text: str, start: str, end: str) -> str:
    i = text.index(start)
    j = text.index(end, i + len(start))
    return text[i:j]


def _parse_table(section: str) -> tuple[list[str], dict[str, list[tuple[float, float]]]]:
    """Rows like ``Reduction<TAB>`1e-4 / 1e-4`<TAB>`5e-2 / 2e-2`<TAB>`1e-3 / 1e-3```."""
    header: list[str] = []
    rows: dict[str, list[tuple[float, float]]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.split("\t")]
        if len(cells) < 4:
            continue
        if cells[0].lower() == "op class":
            header = cells
            continue
        pairs = []
        for cell in cells[1:4]:
            m = re.fullmatch(r"`\s*([-+0-9.eE]+)\s*/\s*([-+0-9.eE]+)\s*`", cell)
            assert m, f"cannot parse table cell {cell!r} in line {line!r}"
            pairs.append((float(m.group(1)), float(m.group(2))))
        rows[cells[0].lower()] = pairs
    return header, rows


@pytest.fixture(scope="module")
def standard_tables(standard_text):
    fwd = _section(standard_text, "5.1 Forward accuracy", "5.2 Gradient accuracy")
    grad = _section(standard_text, "5.2 Gradient accuracy", "6. Threshold Provenance")
    return {"forward": _parse_table(fwd), "gradient": _parse_table(grad)}


def test_version():
    c = load_contract()
    assert CONTRACT_VERSION == "ws1-c1-v8"
    assert c.version == "ws1-c1-v8"
    assert c.data["supersedes"] == "ws1-c1-v7"
    assert default_contract_path().name == "ws1-c1-v8.json"
    ident = c.identity()
    assert ident["contract_version"] == "ws1-c1-v8" and re.fullmatch(r"[0-9a-f]{64}", ident["sha256"])


@pytest.mark.parametrize("direction", ["forward", "gradient"])
def test_section5_tables_equal_the_standard(direction, standard_tables):
    c = load_contract()
    header, rows = standard_tables[direction]
    assert "FP16 optional" in header[3], header
    assert sorted(rows) == sorted(CLASSES), f"§5 {direction} table rows: {sorted(rows)}"
    table = c.data[f"{direction}_accuracy"]
    assert sorted(table) == sorted(CLASSES)
    for cls, pairs in rows.items():
        assert sorted(table[cls]) == sorted(DTYPE_COLUMNS), f"{direction}/{cls} has dtype rows {sorted(table[cls])}"
        for dtype, (atol_std, rtol_std) in zip(DTYPE_COLUMNS, pairs):
            tol = c.tolerance(direction, cls, dtype)
            assert (tol.atol, tol.rtol) == (atol_std, rtol_std), (
                f"{direction}_accuracy/{cls}/{dtype}: contract {tol.atol} / {tol.rtol}, standard {atol_std} / {rtol_std}")
            assert tol.source == f"ws1-c1-v8:{direction}_accuracy/{cls}/{dtype}"


@pytest.mark.parametrize("direction", ["forward", "gradient"])
def test_fp16_rows_optional_and_others_not(direction):
    c = load_contract()
    for cls in CLASSES:
        rows = c.data[f"{direction}_accuracy"][cls]
        assert rows["float16"].get("optional") is True, f"{direction}/{cls}/float16 must be marked optional"
        assert not rows["float32"].get("optional", False)
        assert not rows["bfloat16"].get("optional", False)
    assert c.data["backend_profiles"]["fp16"]["required"] is False
    assert "fp16" not in c.required_backends()


def test_default_dtype_row_is_bfloat16():
    c = load_contract()
    for cls in CLASSES:
        assert c.tolerance("forward", cls) == c.tolerance("forward", cls, "bfloat16")


def test_tolerance_queries_that_do_not_exist_raise():
    c = load_contract()
    with pytest.raises(ContractError, match="direction"):
        c.tolerance("sideways", "elementwise")
    with pytest.raises(ContractError, match="forward_accuracy/nonsense/bfloat16"):
        c.tolerance("forward", "nonsense")
    with pytest.raises(ContractError, match="forward_accuracy/elementwise/float64"):
        c.tolerance("forward", "elementwise", "float64")
    with pytest.raises(ContractError, match="not assigned"):
        c.op_class("softmax")


def test_every_op_in_exactly_one_class():
    c = load_contract()
    for op in OPS:
        owners = [cls for cls, members in c.data["op_classes"].items() if op in members]
        assert len(owners) == 1, f"{op} is in classes {owners}"
        assert c.op_class(op) == owners[0]


def test_chain_metrics_and_statuses(standard_text):
    c = load_contract()
    names = c.chain_metric_names()
    for required in ("max_abs_dlogp", "mean_abs_dlogp", "approx_kl0", "clipfrac0"):
        assert required in names
    for name in names:
        m = c.chain_metric(name)
        assert m["status"] in ("in_force", "provisional"), (name, m["status"])
        assert m["decision"] == "gate"
        assert m["definition"]
    # §8.1: max_abs_dlogp's calibration covers 27 tokens -> provisional; the others are in force
    assert c.chain_metric("max_abs_dlogp")["status"] == "provisional"
    for name in ("mean_abs_dlogp", "approx_kl0", "clipfrac0"):
        assert c.chain_metric(name)["status"] == "in_force"
    assert c.data["chain"]["dlogp_definition"] == "lhs_logp - rhs_logp"
    # §8 table of the standard: every metric there either keeps its threshold or the changelog says why
    sec8 = _section(standard_text, "8. Chain-Level Logprob Parity", "8.1 ")
    changed = " ".join(ch["item"] for entry in c.data["changelog"] for ch in entry["changes"])
    seen = 0
    for line in sec8.splitlines():
        cells = [x.strip().strip("`") for x in line.split("\t")]
        if len(cells) == 4 and cells[0] in names:
            seen += 1
            std_value = float(cells[2])
            if c.chain_metric(cells[0])["threshold"] != std_value:
                assert cells[0] in changed, f"{cells[0]}: threshold differs from the standard without a changelog entry"
    assert seen >= 3, "could not parse the §8 metric table of the standard"


def test_clip_interval_is_a_policy_interval(standard_text):
    c = load_contract()
    ci = c.data["chain"]["clip_interval"]
    assert ci["kind"] == "policy_interval"
    lo, hi = c.clip_interval
    assert lo < 1.0 < hi
    m = re.search(r"clip_interval\s*=\s*\[([^\]]+)\]", standard_text)
    assert m, "standard §6.1 names the clip interval"
    assert [float(v) for v in m.group(1).split(",")] == [lo, hi]


def test_strict_profile():
    c = load_contract()
    assert c.chain_profile("strict")["dlogp_exactly_zero"] is True
    assert "ws1" in c.data["chain"]["profiles"]
    with pytest.raises(ContractError, match="unknown profile 'lenient'"):
        c.chain_profile("lenient")


def test_det_gemm_exception_fields():
    c = load_contract()
    d = c.det_gemm
    assert d["option"] == "B"
    assert d["leaf_accumulation"] == "float32"
    assert d["merge_dtype"] == "bfloat16"
    assert d["output_dtype"] == "bfloat16"
    assert d["split_topology"] == "mid_split"
    assert isinstance(d["tree_depth"], int) and d["tree_depth"] >= 1
    assert 1 in d["supported_splits"]
    for s in d["supported_splits"]:
        assert s & (s - 1) == 0 and s <= 2 ** d["tree_depth"]
    for key in ("leaf_width", "leaf_rule", "merge_rule", "rationale"):
        assert isinstance(d[key], str) and d[key]
    assert "det_gemm" in c.data["dtype_policy"]["accumulation_exceptions"]
    assert c.rms_norm_order == "hf"
    assert c.logits_dtype == "float32"


def test_invariance_is_bitwise_with_declared_nan_policy():
    c = load_contract()
    inv = c.data["invariance"]
    assert inv["mode"] == "bitwise" and inv["signed_zero_distinct"] is True
    assert c.nan_policy == "canonical_equal"
    assert "0x7FC0 == 0x7FC1" in inv["nan_policy_meaning"]


@pytest.mark.parametrize("name", ["fp8", "rocm", "ascend", "triton_fp8", "ROCm_bf16", "Ascend910"])
def test_out_of_scope_backends_raise(name):
    with pytest.raises(ContractError, match="out of scope"):
        load_contract().check_backend_profile(name)


def test_in_scope_profiles():
    c = load_contract()
    assert sorted(c.required_backends()) == ["cuda_bf16", "triton_cuda_bf16"]
    assert c.check_backend_profile("triton_cuda_bf16")["execution_dtype"] == "bfloat16"
    with pytest.raises(ContractError, match="no profile"):
        c.check_backend_profile("tpu_bf16")


@pytest.mark.parametrize("version, previous, topics", [
    ("ws1-c1-v3", "ws1-c1-v2", ("det_gemm", "nan_policy", "approx_kl0", "mean_abs_dlogp", "relative criterion", "strict")),
    ("ws1-c1-v4", "ws1-c1-v3", ("enable_fp_fusion", "nvcc_fmad", "masked means absent", "host-independent")),
    ("ws1-c1-v5", "ws1-c1-v4", ("cross_backend", "declared_bit_exact")),
    ("ws1-c1-v6", "ws1-c1-v5", ("lm_head", "det_gemm", "declared_bit_exact")),
    ("ws1-c1-v7", "ws1-c1-v6", ("declared_fma.attention", "mma.sync")),
    ("ws1-c1-v8", "ws1-c1-v7", ("declared_bit_exact", "attention", "logp", "chain", "declared_fma")),
])
def test_changelog_entries_with_reasons(version, previous, topics):
    c = load_contract()
    entries = [e for e in c.data["changelog"] if e["version"] == version]
    assert len(entries) == 1
    entry = entries[0]
    assert entry["from"] == previous
    assert entry["changes"]
    for ch in entry["changes"]:
        assert isinstance(ch["item"], str) and ch["item"].strip()
        assert isinstance(ch["reason"], str) and ch["reason"].strip(), f"change {ch['item']!r} has no reason"
    items = " ".join(ch["item"] for ch in entry["changes"])
    for topic in topics:
        assert topic in items, f"changelog lacks {topic!r}"


# ------------------------------------------------------------------------------------------------
# malformed contract files: each must raise ContractError naming the field


def _shipped() -> dict:
    return json.loads(default_contract_path().read_text())


def _write(tmp_path: Path, data, name: str = "contract.json") -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def test_shipped_copy_loads(tmp_path):
    c = load_contract(_write(tmp_path, _shipped()))
    assert c.version == "ws1-c1-v8"
    assert c.data == load_contract().data


def test_negative_atol_names_the_field(tmp_path):
    data = _shipped()
    row = data["forward_accuracy"]["reduction"]["bfloat16"]
    assert row["atol"] > 0
    row["atol"] = -row["atol"]
    with pytest.raises(ContractError) as ei:
        load_contract(_write(tmp_path, data))
    assert "forward_accuracy/reduction/bfloat16/atol" in str(ei.value)
    assert "minimum" in str(ei.value)


def test_missing_table_names_the_field(tmp_path):
    data = _shipped()
    del data["gradient_accuracy"]
    with pytest.raises(ContractError) as ei:
        load_contract(_write(tmp_path, data))
    assert "gradient_accuracy" in str(ei.value)


def test_missing_class_row_names_the_field(tmp_path):
    data = _shipped()
    del data["forward_accuracy"]["attention"]
    with pytest.raises(ContractError) as ei:
        load_contract(_write(tmp_path, data))
    assert "forward_accuracy" in str(ei.value) and "attention" in str(ei.value)


def test_wrong_type_names_the_field(tmp_path):
    data = _shipped()
    row = data["gradient_accuracy"]["logprob"]["bfloat16"]
    row["atol"] = str(row["atol"])
    with pytest.raises(ContractError) as ei:
        load_contract(_write(tmp_path, data))
    assert "gradient_accuracy/logprob/bfloat16/atol" in str(ei.value)
    assert "not of type 'number'" in str(ei.value)


def test_fp16_row_not_optional_names_the_field(tmp_path):
    data = _shipped()
    del data["forward_accuracy"]["elementwise"]["float16"]["optional"]
    with pytest.raises(ContractError) as ei:
        load_contract(_write(tmp_path, data))
    assert "forward_accuracy/elementwise/float16" in str(ei.value)


def test_invalid_json_names_file_and_line(tmp_path):
    text = default_contract_path().read_text()
    broken = text.replace('"supersedes": "ws1-c1-v7",', '"supersedes": "ws1-c1-v7"', 1)
    assert broken != text
    p = _write(tmp_path, broken)
    with pytest.raises(ContractError) as ei:
        load_contract(p)
    msg = str(ei.value)
    assert str(p) in msg and "not valid JSON" in msg and "line" in msg


def test_op_in_two_classes_names_the_field(tmp_path):
    data = _shipped()
    data["op_classes"]["reduction"].append("silu")
    with pytest.raises(ContractError) as ei:
        load_contract(_write(tmp_path, data))
    msg = str(ei.value)
    assert "op_classes/reduction" in msg and "'silu'" in msg and "elementwise" in msg


def test_op_without_class_names_it(tmp_path):
    data = _shipped()
    data["op_classes"]["elementwise"].remove("pack")
    with pytest.raises(ContractError) as ei:
        load_contract(_write(tmp_path, data))
    assert "op_classes" in str(ei.value) and "pack" in str(ei.value)


def test_bad_clip_interval_kind_names_the_field(tmp_path):
    data = _shipped()
    data["chain"]["clip_interval"]["kind"] = "tolerance"
    with pytest.raises(ContractError) as ei:
        load_contract(_write(tmp_path, data))
    assert "chain/clip_interval/kind" in str(ei.value)


def test_strict_profile_must_require_zero(tmp_path):
    data = _shipped()
    data["chain"]["profiles"]["strict"]["dlogp_exactly_zero"] = False
    with pytest.raises(ContractError) as ei:
        load_contract(_write(tmp_path, data))
    assert "chain/profiles/strict/dlogp_exactly_zero" in str(ei.value)


def test_det_gemm_split_not_power_of_two(tmp_path):
    data = _shipped()
    splits = data["declared_exceptions"]["det_gemm"]["supported_splits"]
    splits.append(max(splits) + 1)
    with pytest.raises(ContractError) as ei:
        load_contract(_write(tmp_path, data))
    assert "declared_exceptions/det_gemm/supported_splits" in str(ei.value)


def test_missing_file_raises(tmp_path):
    p = tmp_path / "nope" / "ws1-c1-v8.json"
    with pytest.raises(ContractError) as ei:
        load_contract(p)
    assert "not found" in str(ei.value) and str(p) in str(ei.value)


def test_loaded_contract_is_not_mutated_by_copies():
    a = load_contract()
    snapshot = copy.deepcopy(a.data)
    data = _shipped()
    data["forward_accuracy"]["elementwise"]["bfloat16"]["atol"] = -data["forward_accuracy"]["elementwise"]["bfloat16"]["atol"]
    assert load_contract().data == snapshot


def test_det_gemm_relative_factor_is_derived_from_the_tree(contract, tmp_path):
    """The det_gemm forward factor is tree_depth + 1 (declared); other ops keep the global factor."""
    import json

    from rl_engine.contract.loader import parse_contract
    from rl_engine.errors import ContractError

    depth = contract.det_gemm["tree_depth"]
    assert contract.relative_factor("forward", "det_gemm") == depth + 1
    assert contract.relative_factor("forward", "rms_norm") == contract.data["relative_criterion"]["forward_factor"]
    assert contract.relative_factor("gradient", "det_gemm") == contract.data["relative_criterion"]["backward_factor"]
    data = json.loads(contract.path.read_text())
    data["declared_exceptions"]["det_gemm"]["relative_criterion_forward_factor"] = depth + 2
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps(data))
    try:
        parse_contract(bad.read_text(), bad)
    except ContractError as exc:
        assert "declared_exceptions/det_gemm/relative_criterion_forward_factor" in str(exc)
    else:
        raise AssertionError("a factor that does not follow the tree depth must be rejected")


def test_supersedes_must_match_the_newest_changelog_entry(tmp_path):
    """``supersedes`` and the newest changelog entry's ``from`` name the same version (v6 once said
    v4). Control: the shipped file loads; a mismatched copy is refused, naming the field."""
    data = json.loads(default_contract_path().read_text())
    assert data["supersedes"] == data["changelog"][0]["from"] and data["changelog"][0]["version"] == data[
        "contract_version"]
    data["supersedes"] = "ws1-c1-v4"
    with pytest.raises(ContractError, match="supersedes"):
        load_contract(_write(tmp_path, data))


def test_v6_declares_lm_head_and_det_gemm_bit_exact_across_backends():
    """The v6 declaration itself (evidence/2026-12-03-h200-gate-da70509: every lm_head and det_gemm
    output bitwise equal across the backends): both in ``declared_bit_exact``, neither in
    ``not_declared``, so a cross-backend difference in either is red."""
    cb = load_contract().cross_backend
    for op in ("lm_head", "det_gemm"):
        assert op in cb.declared and op not in cb.not_declared


def test_v8_declares_every_op_and_the_chain_bit_exact_across_backends():
    """The v8 declaration: attention, logp, linear_logp and batch_invariant_logp join the declared
    ops and the chain cell is judged (strict both ways); the attention's declared FMA names the
    wgmma steps both backends run."""
    c = load_contract()
    cb = c.cross_backend
    assert set(cb.declared) == set(OPS) and not cb.not_declared and cb.chain_declared
    text = c.data["declared_exceptions"]["fp_contraction"]["declared_fma"]["attention"]
    assert "wgmma" in text and "__fmaf_rn" not in text
