"""Bad input gets a clear exception that names the problem; nothing crashes."""
import numpy as np
import pytest

import kcap
from kcap.testing.synth import copy_with_changes, tiny_llama


@pytest.fixture
def good(tmp_path):
    return tiny_llama(str(tmp_path / "good.gguf"))


def test_missing_file(tmp_path):
    with pytest.raises(kcap.GGUFError, match="no such file"):
        kcap.load(tmp_path / "nope.gguf")


def test_wrong_magic(tmp_path, good):
    bad = tmp_path / "bad.gguf"
    data = bytearray(open(good, "rb").read())
    data[:4] = b"GGML"
    bad.write_bytes(bytes(data))
    with pytest.raises(kcap.GGUFError, match="not a GGUF file"):
        kcap.load(bad)


@pytest.mark.parametrize("keep_fraction", [0.0001, 0.01, 0.5, 0.999])
def test_truncated_file(tmp_path, good, keep_fraction):
    data = open(good, "rb").read()
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(data[: max(5, int(len(data) * keep_fraction))])
    with pytest.raises(kcap.GGUFError, match="truncated"):
        kcap.load(bad)


def test_unknown_architecture(tmp_path, good):
    bad = copy_with_changes(good, str(tmp_path / "arch.gguf"), metadata_overrides={"general.architecture": "mamba9"})
    with pytest.raises(kcap.UnknownArchitectureError, match="unknown architecture 'mamba9'.*gemma3.*llama"):
        kcap.load(bad)


def test_unsupported_tensor_type(tmp_path):
    # IQ2_XXS (GGML type 16, 66 bytes per 256 elements) is a real GGUF type kcap does not decode.
    good = tiny_llama(str(tmp_path / "good256.gguf"), n_embd=256, n_ff=256)
    iq_tensor = ("blk.0.attn_q.weight", "IQ2_XXS", (256, 256), np.zeros((256, 66), dtype=np.uint8))
    bad = copy_with_changes(good, str(tmp_path / "iq2.gguf"), drop_tensors={"blk.0.attn_q.weight"},
                            add_tensors=[iq_tensor])
    with pytest.raises(kcap.FormatError, match="'blk.0.attn_q.weight' has type IQ2_XXS"):
        kcap.load(bad)


def test_missing_tensor(tmp_path, good):
    bad = copy_with_changes(good, str(tmp_path / "missing.gguf"), drop_tensors={"blk.1.ffn_up.weight"})
    with pytest.raises(kcap.ModelError, match="missing tensor 'blk.1.ffn_up.weight'"):
        kcap.load(bad)


def test_missing_hyperparameter(tmp_path, good):
    bad = copy_with_changes(good, str(tmp_path / "nohp.gguf"), drop_metadata={"llama.embedding_length"})
    with pytest.raises(kcap.MissingMetadataError, match="llama.embedding_length"):
        kcap.load(bad)


def test_prompt_longer_than_context(smollm):
    text = "word " * (smollm.n_ctx + 10)
    with pytest.raises(kcap.ContextOverflowError, match="does not fit the context"):
        smollm.generate(text, max_tokens=1)


def test_not_a_file_at_all(tmp_path):
    (tmp_path / "dir.gguf").mkdir()
    with pytest.raises(kcap.GGUFError, match="directory"):
        kcap.load(tmp_path / "dir.gguf")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(kcap.GGUFError, match="not a GGUF file"):
        kcap.load(empty)


# Metadata counts are checked before anything is sized by them, and every failure is a kcap error.
@pytest.mark.parametrize("key,value,message", [
    ("llama.block_count", 2**26, r"llama.block_count = 67108864: the file has tensors for 2 blocks"),
    ("llama.block_count", 0, r"llama.block_count = 0: must be at least 1"),
    ("llama.attention.head_count", 0, r"llama.attention.head_count = 0: must be at least 1"),
    ("llama.attention.head_count", 2**31, r"llama.attention.head_count = 2147483648: out of range"),
    ("llama.attention.head_count_kv", 0, r"head_count_kv = 0: must be at least 1"),
    ("llama.block_count", 2.0, r"llama.block_count = 2.0: expected an integer"),
    ("llama.attention.layer_norm_rms_epsilon", float("nan"), r"layer_norm_rms_epsilon = nan: expected a finite number"),
])
def test_bad_counts_are_model_errors(tmp_path, good, key, value, message):
    import time

    bad = copy_with_changes(good, str(tmp_path / "counts.gguf"), metadata_overrides={key: value})
    start = time.perf_counter()
    with pytest.raises(kcap.ModelError, match=message):
        kcap.load(bad)
    assert time.perf_counter() - start < 5  # refused from the metadata, not after sizing anything


def test_granite_logit_scale_of_zero_is_refused(tmp_path):
    from test_conformance import FIXTURES

    bad = copy_with_changes(str(FIXTURES / "granite-f32.gguf"), str(tmp_path / "g.gguf"),
                            metadata_overrides={"granite.logit_scale": 0.0})
    with pytest.raises(kcap.ModelError, match="granite.logit_scale = 0"):
        kcap.load(bad)


@pytest.mark.parametrize("name,value,error", [
    ("n_ctx", 0, kcap.InvalidArgumentError), ("n_ctx", -5, kcap.InvalidArgumentError),
    ("n_ctx", 2.5, kcap.InvalidArgumentTypeError), ("n_threads", 0, kcap.InvalidArgumentError),
    ("n_threads", 5000, kcap.InvalidArgumentError), ("n_threads", True, kcap.InvalidArgumentTypeError),
    ("max_batch", 0, kcap.InvalidArgumentError),
])
def test_load_arguments_are_checked_not_coerced(good, name, value, error):
    with pytest.raises(error, match=name):
        kcap.load(good, **{name: value})


def test_a_thread_that_cannot_start_is_an_error_not_a_hang(good):
    from kcap.testing.fuzz import under_address_sanitizer

    if under_address_sanitizer():
        pytest.skip("AddressSanitizer reserves its shadow memory up front: an address-space limit aborts it")
    # Under a 2 GiB address-space limit the stacks of 1000 workers (2 to 8 MiB each) cannot all
    # be mapped: the pool stops the workers it started and raises (it used to wait for ever).
    import subprocess
    import sys

    code = (
        "import resource, kcap\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        "try:\n"
        f"    kcap.load({good!r}, n_threads=1000)\n"
        "except kcap.KcapError as e:\n"
        "    print('refused:', e)\n"
        "else:\n"
        "    print('loaded')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused: could not start CPU thread"), done.stdout


@pytest.mark.parametrize("ids,error,message", [
    ([1, 2.0], kcap.InvalidArgumentTypeError, r"id \[1\] = 2.0 is not an integer"),
    ([1, True], kcap.InvalidArgumentTypeError, r"id \[1\] = True"),
    (np.array([1, 2**32 + 2], dtype=np.int64), kcap.InvalidArgumentError, r"id \[1\] = 4294967298 is outside"),
    ([-1], kcap.InvalidArgumentError, r"id \[0\] = -1 is outside"),
])
def test_token_ids_are_checked_not_coerced(good, ids, error, message):
    model = kcap.load(good)
    model.eval([3, 4])
    with pytest.raises(error, match=message):
        model.eval(ids)
    with pytest.raises(error, match=message):
        model.logits(ids)  # and the cache is left as it was
    assert model._cached == [3, 4]
    with pytest.raises(error, match=message):
        model.detokenize(ids) if model.tokenizer is not None else model.eval(ids)


def test_error_classes_are_kcap_errors_and_python_ones():
    from kcap.sampling import Sampler, SamplerConfig

    with pytest.raises(kcap.KcapError):
        SamplerConfig(temperature=-1.0)
    with pytest.raises(ValueError):
        SamplerConfig(temperature=-1.0)
    with pytest.raises(kcap.NumericalError, match="NaN"):
        Sampler(SamplerConfig(temperature=1.0, seed=1)).sample(np.array([0.0, np.nan], dtype=np.float32))


def test_a_tiny_temperature_samples_the_argmax():
    # 1 / 1e-40 overflows float32: the sampler takes the limit (the argmax) instead of failing
    # on NaN weights.
    from kcap.sampling import Sampler, SamplerConfig

    logits = np.array([0.5, 3.0, 2.9, -1.0], dtype=np.float32)
    for temperature in (1e-40, 5e-324):
        assert Sampler(SamplerConfig(temperature=temperature, seed=3)).sample(logits) == 1


def test_engine_checks_ids_and_context_before_allocating(good):
    # The engine's own entry points (under Model): an array of floats or bools is refused, not
    # truncated; an int64 id past 32 bits is refused, not wrapped; a decode of 10^12 steps is a
    # context overflow before 4 TB of results are allocated.
    engine = kcap.load(good).engine
    with pytest.raises(kcap.ModelError, match="token ids must be integers, got an array of dtype float64"):
        engine.eval(np.array([1.5]), False)
    with pytest.raises(kcap.ModelError, match="dtype bool"):
        engine.eval(np.array([True]), False)
    with pytest.raises(kcap.ModelError, match="token id 4294967298 .* outside the vocabulary"):
        engine.eval(np.array([2**32 + 2], dtype=np.int64), False)
    with pytest.raises(kcap.ContextOverflowError, match="1000000000000 new tokens"):
        engine.decode_greedy(1, 10**12)
    assert engine.n_past == 0
    assert engine.eval(np.array([1, 2], dtype=np.int64), False).shape == (engine.n_vocab,)


def test_an_interrupt_between_chunks_leaves_the_cache_as_python_sees_it(good, monkeypatch):
    # A KeyboardInterrupt delivered as an engine call returns (the prefill's second chunk): the
    # engine's cache is cut back to the tokens the model has recorded. Chunks of 32 tokens: the
    # file's context holds 256.
    model = kcap.load(good, max_batch=32)
    calls = {"n": 0}
    real_eval = model.engine.eval

    class Interrupting:
        def __getattr__(self, name):
            return getattr(model.engine_real, name)

        def eval(self, tokens, all_logits, cancel=None):
            calls["n"] += 1
            out = real_eval(tokens, all_logits, cancel=cancel)
            if calls["n"] == 2:
                raise KeyboardInterrupt
            return out

    model.engine_real = model.engine
    model.engine = Interrupting()
    chunk = model.prefill_chunk
    ids = [1 + i % 100 for i in range(2 * chunk + 5)]
    with pytest.raises(KeyboardInterrupt):
        model.eval(ids)
    assert model._cached == ids[:chunk]
    assert model.engine_real.n_past == chunk


_RSS_CYCLES = """
import gc, json, sys
import kcap

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6

def cycle(path):
    model = kcap.load(path)
    model.eval([2, 3, 4])
    del model
    gc.collect()
    return rss_mb()

before = cycle(sys.argv[1])
after = [cycle(sys.argv[2]) for _ in range(12)]
print(json.dumps({"before": before, "after": after}))
"""


def test_loading_and_freeing_a_model_does_not_grow_rss(tmp_path):
    # 12 load / eval / free cycles of Gemma 3 270M (a 253 MB file). Freed, a model leaves less
    # than a tenth of its file's size in RSS over what a tiny model's cycle left (glibc's arenas
    # used to keep all of it: +297 MB here, measured with the engine's malloc_trim taken out), and
    # RSS ends within 5 MB of where the second cycle left it.
    # The cycles run in a fresh interpreter with PYTHONMALLOC=malloc: Python's own small-object
    # arenas (1 MiB each, released only when wholly empty) fragment over the loader's hundreds of
    # thousands of short-lived objects (a vocabulary's strings) and grew RSS by up to 5 MB over
    # 12 cycles after a thousand earlier tests, with no allocation left live (heaptrack: the same
    # bytes outstanding after 3 and 13 cycles). Through malloc the engine's trim covers them too,
    # so what is measured is memory the process keeps, not where Python's allocator parked it.
    import json
    import os
    import subprocess
    import sys

    from conftest import MODEL_PATHS

    path = MODEL_PATHS["gemma3_270m"]()
    warm = tiny_llama(str(tmp_path / "warm.gguf"), weight_type="F32")
    env = dict(os.environ, PYTHONMALLOC="malloc")
    out = subprocess.run(
        [sys.executable, "-c", _RSS_CYCLES, str(warm), str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    rss = json.loads(out.stdout.strip().splitlines()[-1])
    before, after = rss["before"], rss["after"]
    shown = [round(before, 1)] + [round(v, 1) for v in after]
    assert len(after) == 12
    assert after[0] - before < 0.1 * os.path.getsize(path) / 1e6, shown
    assert after[-1] - after[1] < 5.0, shown


def test_check_finite_names_the_first_stage_that_writes_nan(tmp_path):
    # A NaN planted in layer 1's FFN norm weight: with check_finite the load's first eval raises
    # NumericalError naming that layer's norm stage; without it the NaN reaches the logits and the
    # sampler refuses them (also a NumericalError, but it cannot say where the NaN came from).
    from kcap.gguf import GGUFFile
    from kcap.testing.synth import tiny_llama

    path = tiny_llama(str(tmp_path / "nan.gguf"), weight_type="F32")
    offset = GGUFFile(path).tensors["blk.1.ffn_norm.weight"].offset
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(np.array([np.nan], dtype=np.float32).tobytes())
    with pytest.raises(kcap.NumericalError, match=r"stage '[a-z_+]*ffn_norm' of layer 1 .* wrote nan"):
        kcap.load(path, check_finite=True).eval([1, 2, 3])
    logits = kcap.load(path).eval([1, 2, 3])
    assert np.isnan(logits).any()
    with pytest.raises(kcap.NumericalError, match="NaN"):
        kcap.load(path).generate_ids([1, 2, 3], max_tokens=1, temperature=0.7, seed=1).__next__()
    with pytest.raises(kcap.BackendUnavailableError, match="check_finite is implemented on the cpu backend only"):
        kcap.load(path, backend="cuda", check_finite=True) if kcap._core.cuda_device_available() else \
            kcap._core.Engine(kcap.load(path).spec, backend="cuda", check_finite=True)


def test_ctrl_c_during_a_long_prefill_lands_quickly_and_leaves_the_model_consistent(gemma):
    # SIGINT during a 3000-token prefill of Gemma 3 270M (CPU), mid-chunk:
    # KeyboardInterrupt within half a second (the engine checks for signals between stages,
    # Python between chunks), and the engine's cache holds exactly the tokens the model
    # recorded, whole chunks only (stop_a_long_prompt_mid_chunk checks that).
    import os
    import signal

    from conftest import stop_a_long_prompt_mid_chunk

    model = gemma

    def prompt(ids):
        with pytest.raises(KeyboardInterrupt):
            model.eval(ids)

    ids, latency, _, cached = stop_a_long_prompt_mid_chunk(
        model, prompt, lambda: os.kill(os.getpid(), signal.SIGINT))
    assert latency < 0.5, latency
    # The rows the interrupted chunk wrote past n_past are never read: going on from the cut
    # gives the logits of an uninterrupted run.
    more = ids[cached:cached + 37]
    resumed = model.eval(more)
    model.reset()
    np.testing.assert_array_equal(resumed, model.eval(ids[:cached + 37]))
    print(f"interrupt latency {latency * 1000:.1f} ms after {cached} tokens")
    model.reset()


FIXTURES = __import__("pathlib").Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "conformance"


@pytest.mark.parametrize("fixture,changes,message", [
    # Sliding windows the family always has: llama.cpp refuses the file without the key.
    ("gpt-oss-f32", dict(drop_metadata=["gpt-oss.attention.sliding_window"]), r"gpt-oss.attention.sliding_window"),
    ("gemma4-f32", dict(drop_metadata=["gemma4.attention.sliding_window"]),
     r"gemma4.attention.sliding_window is missing"),
    # Gemma 4's full-attention layers rotate the part of the head rope_freqs gives.
    ("gemma4-f32", dict(drop_tensors=["rope_freqs.weight"]), r"missing tensor 'rope_freqs.weight'"),
    # The token list and the embedding's rows must agree.
    ("llama3-f32", dict(metadata_overrides={"tokenizer.ggml.tokens": [f"t{i}" for i in range(386)]}),
     r"tokenizer.ggml.tokens has 386 tokens but token_embd.weight has 384 rows"),
    # Metadata that disagrees with the tensors kcap reads the shapes from.
    ("deepseek3-f32", dict(metadata_overrides={"deepseek2.attention.head_count_kv": 3}),
     r"deepseek2.attention.head_count_kv = 3; a file with attn_k_b / attn_v_b has 1"),
    ("deepseek2-kvb-f32", dict(metadata_overrides={"deepseek2.attention.head_count_kv": 1}),
     r"head_count_kv = 1; a file with attn_kv_b has 4"),
    ("llama3-f32", dict(metadata_overrides={"llama.feed_forward_length": 100}),
     r"llama.feed_forward_length = 100 but blk.0.ffn_up.weight has"),
    ("deepseek2-f32", dict(metadata_overrides={"deepseek2.feed_forward_length": 50}),
     r"deepseek2.feed_forward_length = 50 but blk.0.ffn_up.weight has 96 rows"),
    # Biases the architecture always has (llama.cpp requires them).
    ("starcoder2-f32", dict(drop_tensors=["blk.1.attn_output.bias"]), r"missing tensor 'blk.1.attn_output.bias'"),
    ("starcoder2-f32", dict(drop_tensors=["blk.0.ffn_down.bias"]), r"missing tensor 'blk.0.ffn_down.bias'"),
    ("starcoder2-f32", dict(drop_tensors=["output_norm.bias"]), r"missing tensor 'output_norm.bias'"),
    ("gpt2-f32", dict(drop_tensors=["output_norm.bias"]), r"missing tensor 'output_norm.bias'"),
    # Without a rope base llama.cpp rotates by 10,000, transformers' Gemma 3 / 4 by 1,000,000.
    ("gemma3-f32", dict(drop_metadata=["gemma3.rope.freq_base"]), r"missing metadata key 'gemma3.rope.freq_base'"),
    ("gemma4-f32", dict(drop_metadata=["gemma4.rope.freq_base"]), r"missing metadata key 'gemma4.rope.freq_base'"),
])
def test_files_that_would_run_wrong_are_refused(tmp_path, fixture, changes, message):
    # Each of these loaded before and ran with a default in place of what the file lacks.
    bad = copy_with_changes(str(FIXTURES / f"{fixture}.gguf"), str(tmp_path / "bad.gguf"), **changes)
    with pytest.raises(kcap.ModelError, match=message):
        kcap.load(bad, backend="cpu")


def test_gemma_files_without_softcaps_get_llama_cpps_caps(tmp_path):
    # Gemma 2 files converted before llama.cpp wrote the softcaps: llama.cpp (and transformers'
    # Gemma2Config) cap attention at 50 and the final logits at 30; Gemma 4's final logits at 30.
    from kcap.arch import build_spec
    from kcap.gguf import GGUFFile

    gemma2 = copy_with_changes(str(FIXTURES / "gemma2-f32.gguf"), str(tmp_path / "g2.gguf"),
                               drop_metadata=["gemma2.attn_logit_softcapping", "gemma2.final_logit_softcapping"])
    spec = build_spec(GGUFFile(gemma2))
    assert spec.final_softcap == 30.0 and {layer.attn_softcap for layer in spec.layers} == {50.0}
    assert build_spec(GGUFFile(str(FIXTURES / "gemma2-f32.gguf"))).final_softcap == 3.0  # the file's own
    gemma4 = copy_with_changes(str(FIXTURES / "gemma4-f32.gguf"), str(tmp_path / "g4.gguf"),
                               drop_metadata=["gemma4.final_logit_softcapping"])
    assert build_spec(GGUFFile(gemma4)).final_softcap == 30.0


def test_gemma2_without_a_window_slides_over_4096_tokens(tmp_path):
    # llama.cpp and transformers' Gemma2Config default the window to 4096 when the file has none.
    from kcap.arch import build_spec
    from kcap.gguf import GGUFFile

    path = copy_with_changes(str(FIXTURES / "gemma2-f32.gguf"), str(tmp_path / "g.gguf"),
                             drop_metadata=["gemma2.attention.sliding_window"])
    windows = [layer.sliding_window for layer in build_spec(GGUFFile(path)).layers]
    assert windows[:2] == [4096, 0] and windows[0::2] == [4096] * len(windows[0::2])
