"""The capability table and the planner: every stage of both real models routed once at load
time; refusals name the layer, stage, formats, dims and each candidate's rejection."""
import json

import numpy as np

import pytest

import kcap
from kcap import _core
from kcap.cli import main as cli_main
from conftest import MODEL_PATHS
from kcap.testing.synth import tiny_gemma3, tiny_llama


def test_table_rows_are_unique_and_complete():
    rows = _core.capability_rows()
    names = [r["kernel"] for r in rows]
    assert len(names) == len(set(names))
    cpu = [r for r in rows if r["backend"] == "cpu"]
    assert all(r["compiled"] for r in cpu)
    # One exact-format matmul row per format kcap decodes, never a family row; the q8_1 rows
    # (activations="q8_1") for every quantized format, none for the float formats.
    matmul_formats = sorted(r["operand_formats"][0][0] for r in cpu if r["op"] == "matmul" and r["input_encoding"] == "f32")
    assert matmul_formats == sorted(_core.supported_formats())
    quantized = sorted(set(_core.supported_formats()) - {"F32", "F16", "BF16"})
    for prefix, tokens in (("cpu.matmul_q8.", (1, None)), ("cpu.matvec_q8.", (1, 1))):
        q8 = [r for r in cpu if r["kernel"].startswith(prefix)]
        assert sorted(r["operand_formats"][0][0] for r in q8) == quantized
        assert all(r["input_encoding"] == "q8_1" and (r["tokens_min"], r["tokens_max"]) == tokens for r in q8)
    assert all(len(r["operand_formats"][0]) == 1 for r in cpu if r["op"] == "matmul")


@pytest.mark.parametrize("name", sorted(MODEL_PATHS))
def test_explain_json_routes_every_stage(name, capsys):
    path = MODEL_PATHS[name]()
    assert cli_main(["explain", path, "--json"]) == 0
    routes = json.loads(capsys.readouterr().out)
    for key in ("layer", "stage", "formats", "kernel", "backend"):
        assert all(key in r for r in routes)
    assert {r["backend"] for r in routes} == {"cpu"}
    n_layers = 18 if name == "gemma3_270m" else 30
    assert {r["layer"] for r in routes} == set(range(-1, n_layers))
    by_stage = {(r["layer"], r["stage"]): r for r in routes}
    # The kernel decodes exactly the operand's format.
    for r in routes:
        if r["op"] == "matmul":
            fmt = r["formats"].split()[0].split("=")[1]
            assert r["kernel"] == f"cpu.matmul.{fmt.lower()}", r
    if name == "gemma3_270m":
        assert by_stage[(0, "attn_q")]["formats"] == "W=Q5_0"
        assert by_stage[(0, "attn_v")]["formats"] == "W=Q8_0"
        assert by_stage[(0, "ffn_down")]["formats"] == "W=Q6_K"
        assert "sliding_window" in by_stage[(0, "attention")]["features"]
        assert "sliding_window" not in by_stage[(5, "attention")]["features"]
        assert (0, "attn_q_norm") in by_stage and (0, "post_ffw_norm") in by_stage
        assert by_stage[(-1, "output")]["formats"] == "W=Q8_0"  # tied to token_embd
    else:
        assert by_stage[(0, "attn_q")]["formats"] == "W=Q4_1"
        assert "rope_normal" in by_stage[(0, "rope")]["features"]


def test_explain_table_text(capsys):
    assert cli_main(["explain", MODEL_PATHS["smollm2_135m"]()]) == 0
    out = capsys.readouterr().out
    assert "cpu.matmul.q4_1" in out and "attention" in out


def test_no_row_for_a_stage_is_a_routing_error_with_reasons(tmp_path):
    path = tiny_gemma3(str(tmp_path / "g.gguf"), weight_type="Q5_0")
    with pytest.raises(kcap.RoutingError) as err:
        kcap.load(path, excluded_kernels=["cpu.matmul.q5_0"])
    message = str(err.value)
    assert "layer 0 stage 'attn_q' (matmul)" in message
    assert "W=Q5_0" in message and "K=64 N=128" in message
    assert "cpu.matmul.q5_0: excluded by the caller" in message
    assert "cpu.matmul.q4_0: operand 0 (blk.0.attn_q.weight) is Q5_0, row decodes {Q4_0}" in message


def test_feature_without_a_row_is_refused_not_dropped(tmp_path):
    path = tiny_gemma3(str(tmp_path / "g.gguf"))
    with pytest.raises(kcap.RoutingError, match="stage 'attention'.*sliding_window"):
        kcap.load(path, excluded_kernels=["cpu.attention"])


def test_rows_that_split_a_block_are_refused():
    # A Q8_0 row of 48 elements would split a 32-element block: refused, never truncated.
    spec = _core.ModelSpec()
    with pytest.raises(kcap.FormatError, match="48"):
        spec.add_tensor("w", 8, [48, 4], np.zeros(4 * 51, dtype=np.uint8))


def test_explain_other_backend_is_refused_clearly(tmp_path):
    path = tiny_llama(str(tmp_path / "m.gguf"))
    with pytest.raises(kcap.BackendUnavailableError, match="unknown backend 'vulkan'"):
        kcap.load(path, backend="vulkan")
