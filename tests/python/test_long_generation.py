"""A 10,000-token generation on the CPU keeps its memory flat once the KV cache has its size.

The CPU backend's cache grows with the sequence (cpp/cpu/kv_cache.cpp: each layer's K and V
rows at least double when a position passes their capacity), so a long generation may take
memory only in those steps; everything else a token does (activations, logits, the sampler,
the Python generator) must reuse what the previous token freed. Measured as the resident set
(/proc/self/statm) of this process, on a small synthetic Llama with a 10,240-token context.
The CUDA counterpart (device memory over a long generation) is test_long_context_cuda.py.
"""
from __future__ import annotations

import ctypes
import gc
import sys

import pytest

import kcap
from kcap.testing.synth import tiny_llama

N_CTX = 10_240
PROMPT = list(range(1, 11))  # 10 tokens: the cache grows 10, 20, ... 5120, 10240 (at position 5121)
GENERATED = 10_000
SAMPLE_EVERY = 250
LAST_GROWTH = 5121  # the position whose K/V takes the cache to its full 10,240 rows
# A flat stretch may still move by a few pages (the Python objects of the token list, glibc's
# bookkeeping); a cache that kept growing would add 0.5 KB per position here (2 layers, K and
# V of 32 floats): 0.5 MB every 1,000 tokens, 2 MB over the stretch checked below.
FLAT_BYTES = 1 << 20

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def anon_huge_pages_kb() -> int:
    """The process's anonymous memory held in transparent huge pages (kB), for the failure messages."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


PR_SET_THP_DISABLE = 41
PR_GET_THP_DISABLE = 42


@pytest.fixture
def no_transparent_huge_pages():
    """Keeps the kernel from collapsing this process's pages into 2 MB huge pages while the test runs.

    numpy asks for huge pages (madvise) on its arrays of 4 MB and more, and the suite's earlier tests
    leave such arrays in this process; khugepaged may collapse one while a generation runs, and the
    resident set then jumps by up to 2 MB less the pages already there (a CI run saw 2,016 kB, one
    2 MB page less 32 resident 4 kB pages, in the middle of a flat stretch). That is the kernel
    filling pages of memory allocated before the test, not memory the generation takes, so the test
    turns it off for the process (prctl PR_SET_THP_DISABLE) and restores the setting after.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    before = libc.prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0)
    if before < 0 or libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
        pytest.fail(f"prctl(PR_SET_THP_DISABLE) failed: errno {ctypes.get_errno()}")
    yield
    libc.prctl(PR_SET_THP_DISABLE, before, 0, 0, 0)


def generate_sampling_rss(model) -> dict[int, int]:
    """Greedy generation of GENERATED tokens after PROMPT (eos ignored): position -> RSS."""
    samples = {}
    count = 0
    for _ in model.generate_ids(PROMPT, max_tokens=GENERATED, ignore_eos=True):
        count += 1
        if count % SAMPLE_EVERY == 0:
            samples[len(PROMPT) + count] = rss_bytes()
    assert count == GENERATED
    return samples


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    path = tiny_llama(str(tmp_path_factory.mktemp("long") / "tiny_long.gguf"), context_length=N_CTX)
    # One thread: a model this small gains nothing from more, and waking a pool of two for each of
    # its stages made the two generations take 19-47 s on a 2-core machine (idle or busy), one
    # thread 14-15 s.
    return kcap.load(path, backend="cpu", n_ctx=N_CTX, n_threads=1)


def test_rss_is_flat_once_the_cache_has_its_size(long_model, no_transparent_huge_pages):
    model = long_model
    gc.collect()
    before = rss_bytes()
    huge_before = anon_huge_pages_kb()
    cold = generate_sampling_rss(model)
    # Cold: the growth is the cache's (10,240 rows of 2 layers x (K + V) x 32 f32) and a few
    # pages, and none of it after the cache's last growth. The cache doubles as it grows, and
    # the allocator may keep the smaller buffers it freed (their sizes sum to less than the
    # last one's) in the resident set: at most twice the cache (a clean CI run measured 10.17 MB
    # against a 5.24 MB cache; a run here 6.07 MB).
    cache_bytes = N_CTX * 2 * 2 * 32 * 4
    grown = max(cold.values()) - before
    assert grown <= 2 * cache_bytes + 4 * FLAT_BYTES, (
        f"RSS grew {grown / 1e6:.2f} MB; the cache is {cache_bytes / 1e6:.2f} MB")
    after_growth = {pos: rss for pos, rss in cold.items() if pos >= LAST_GROWTH + SAMPLE_EVERY}
    first = min(after_growth)
    drift = max(after_growth.values()) - after_growth[first]
    assert drift <= FLAT_BYTES, (
        f"RSS moved {drift / 1e6:.2f} MB between positions {first} and {max(after_growth)}, after the cache's "
        f"last growth; transparent huge pages {huge_before} -> {anon_huge_pages_kb()} kB")
    # Warm: the same generation again over the cache as it is (reset keeps its rows): flat from
    # the first sample to the last.
    model.reset()
    warm = generate_sampling_rss(model)
    drift = max(warm.values()) - min(warm.values())
    assert drift <= FLAT_BYTES, (
        f"RSS moved {drift / 1e6:.2f} MB over a 10,000-token generation with the cache at its size: "
        f"{[round(v / 1e6, 2) for v in warm.values()]}; transparent huge pages {huge_before} -> "
        f"{anon_huge_pages_kb()} kB")
