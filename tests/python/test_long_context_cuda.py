"""Device memory of the CUDA backend: what the engine says it allocated (Engine::device_bytes,
every cudaMalloc of the backend), what its plan reserves, what the device lost
(cudaMemGetInfo), and that none of it moves over a 10,000-token generation.

Without a CUDA device only the refusals run (cuda_mem_info raises, a CPU engine holds no device
memory). On a device the model is the exact layout of Gemma 3 270M with random weights
(tests/fixtures/layouts; the real file does not travel to the GPU machine). The 32,768-token
runs with logits against the CPU are bench/cuda_long_context.py's (minutes, not a unit test).
"""
from __future__ import annotations

import gc
import json
from pathlib import Path

import numpy as np
import pytest

import kcap
from kcap import _core
from kcap.model import referenced_tensors
from kcap.testing import synth

LAYOUTS = Path(__file__).resolve().parent.parent / "fixtures" / "layouts"
MIB = 1 << 20
# What cudaMemGetInfo may lose beyond device_bytes once a model is loaded: cudaMalloc rounds
# each allocation up (to 2 MiB pages for the large ones), about 250 allocations here (measured on
# the H200: 4 MiB for this model at 8,192 positions; 204 MiB for the Llama-3-8B layout, with more
# and larger allocations, at 32,768).
LOAD_SLACK = 96 * MIB
# After the first steps: also the kernels' code (loaded on first launch) and the captured decode
# graphs (measured: 44 MiB in all for this model at 10,240 positions).
RUN_SLACK = 192 * MIB


def device_available() -> bool:
    try:
        _core.cuda_mem_info()
        return True
    except kcap.BackendUnavailableError:
        return False


def free_bytes() -> int:
    gc.collect()  # an engine another test left in a reference cycle frees its memory now, not mid-test
    return _core.cuda_mem_info()[0]


def kv_plan_bytes(spec, n_ctx: int, kv_type: str) -> int:
    """The plan's KV cache on CUDA: n_ctx rows of K and V for every layer with its own cache
    (sliding-window layers included; a kv_shared layer reads another's)."""
    elem = 2 if kv_type == "f16" else 4
    return sum(n_ctx * layer.n_head_kv * (layer.head_dim + layer.head_dim_v) * elem
               for layer in spec.layers if layer.kv_source_layer < 0)


def weight_bytes(model) -> int:
    return sum(model.gguf.tensors[name].data.nbytes for name in referenced_tensors(model.spec))


def test_without_a_device_there_is_no_device_memory(tmp_path):
    path = synth.tiny_llama(str(tmp_path / "tiny.gguf"))
    assert kcap.load(path, backend="cpu", n_ctx=64).engine.device_bytes == 0
    if not device_available():
        with pytest.raises(kcap.BackendUnavailableError, match="cuda_mem_info"):
            _core.cuda_mem_info()


@pytest.fixture(scope="module")
def gemma_layout(tmp_path_factory) -> str:
    if not device_available():
        pytest.skip("no CUDA device")
    layout = json.loads((LAYOUTS / "gemma3_270m.json").read_text())
    return synth.from_layout(layout, str(tmp_path_factory.mktemp("long") / "gemma3_270m.gguf"))


def test_device_bytes_is_the_plan_and_what_the_device_lost(gemma_layout):
    n_ctx = 8192
    free_before = free_bytes()
    f32 = kcap.load(gemma_layout, backend="cuda", n_ctx=n_ctx, kv_type="f32")
    taken = free_before - free_bytes()
    f16 = kcap.load(gemma_layout, backend="cuda", n_ctx=n_ctx, kv_type="f16")
    kv16 = kv_plan_bytes(f16.spec, n_ctx, "f16")
    kv32 = kv_plan_bytes(f32.spec, n_ctx, "f32")
    weights = weight_bytes(f32)
    other = f32.engine.device_bytes - weights - kv32
    print(f"device_bytes {f32.engine.device_bytes / MIB:.2f} MiB = weights {weights / MIB:.2f} + KV {kv32 / MIB:.2f} "
          f"+ other {other / MIB:.2f}; cudaMemGetInfo lost {taken / MIB:.2f} MiB")
    # The two engines differ by the cache's element only: exactly the f16 cache's bytes apart.
    assert f32.engine.device_bytes - f16.engine.device_bytes == kv32 - kv16 == kv16
    # The weights are uploaded once each (a tied embedding and LM head share a copy); the rest
    # is activations for max_batch tokens, the two rope tables (n_ctx x 256 floats each), split-K
    # partials, the decode state (measured: 38.8 MiB).
    assert 0 <= other <= 64 * MIB, other
    # What the device lost is what the backend allocated, up to cudaMalloc's rounding.
    assert f32.engine.device_bytes <= taken <= f32.engine.device_bytes + LOAD_SLACK, (taken, f32.engine.device_bytes)


def test_device_memory_is_flat_over_a_10000_token_generation(gemma_layout):
    n_ctx = 10_240
    free_before = free_bytes()
    model = kcap.load(gemma_layout, backend="cuda", n_ctx=n_ctx, kv_type="f16")
    allocated = model.engine.device_bytes
    prompt = [int(t) for t in np.random.default_rng(3).integers(0, model.n_vocab, 20)]
    samples = []  # (tokens generated, device_bytes, bytes the device lost since before the load)
    count = 0
    for _ in model.generate_ids(prompt, max_tokens=10_000, ignore_eos=True):
        count += 1
        if count % 1000 == 0:
            samples.append((count, model.engine.device_bytes, free_before - free_bytes()))
    assert count == 10_000
    # The same again on the device's own loop (decode_greedy: the greedy graph replayed), to the
    # end of the context.
    model.reset()
    model.engine.eval(np.array(prompt, np.int32))
    token = prompt[-1]
    while model.engine.n_past < n_ctx:
        out = model.engine.decode_greedy(token, min(1000, n_ctx - model.engine.n_past))
        token = int(out[-1])
        samples.append((model.engine.n_past, model.engine.device_bytes, free_before - free_bytes()))
    print("tokens, device_bytes, lost:", [(n, b, t) for n, b, t in samples])
    assert all(b == allocated for _, b, _ in samples), samples
    lost = {t for _, _, t in samples}
    assert len(lost) == 1, f"the device's free memory moved during the generation: {sorted(lost)}"
    assert allocated <= lost.pop() <= allocated + RUN_SLACK
