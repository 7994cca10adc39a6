"""A structure-aware GGUF fuzzer: it parses a valid file into its parts (metadata entries with
their value types, tensor infos, data), applies mutations that know the layout and the keys
kcap reads, writes the result back, and loads it in a forked child (limits on time and
address space) to see what happens.

Every mutation is a plain dict (an "op"), so a mutant is reproducible from its seed file and
its ops alone: a failing input is kept as a JSON recipe (tests/fixtures/fuzz_corpus.json) and
the regression test replays it.

Outcomes of one input: "loaded" (it loaded and evaluated a token), "refused" (a KcapError),
and the findings: "exception" (any other exception, its type named), "oom" (a MemoryError
under the address-space limit: something was sized by a count before it was checked),
"hang" (past the time limit), "crash" (the child died from a signal).

    python scripts/fuzz_gguf.py --inputs 2000 --seed 1        (a longer budget)
"""
from __future__ import annotations

import json
import os
import random
import resource
import signal
import struct
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# GGUF value types (as kcap.gguf reads them).
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALAR = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f", BOOL: "<?",
           UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}

FINDINGS = ("exception", "oom", "hang", "crash")


@dataclass
class RawGGUF:
    """A GGUF file's parts, as written: kvs are [key, vtype, value] (an array value is
    [element vtype, list]); tensors are [name, shape, ggml type, data offset]."""
    version: int
    kvs: list
    tensors: list
    data: bytes
    alignment: int = 32

    def copy(self) -> "RawGGUF":
        return RawGGUF(self.version, json.loads(json.dumps(self.kvs, allow_nan=True)),
                       json.loads(json.dumps(self.tensors)), self.data, self.alignment)


class _Reader:
    def __init__(self, buf: bytes):
        self.buf, self.pos = buf, 0

    def scalar(self, vtype: int):
        fmt = _SCALAR[vtype]
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar(UINT64)
        s = self.buf[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return s

    def value(self, vtype: int):
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            elem, count = self.scalar(UINT32), self.scalar(UINT64)
            return [elem, [self.value(elem) for _ in range(count)]]
        return self.scalar(vtype)


def parse(buf: bytes) -> RawGGUF:
    """The parts of a well-formed file (the seeds; not meant for malformed ones)."""
    r = _Reader(buf)
    assert buf[:4] == b"GGUF"
    r.pos = 4
    version, n_tensors, n_kv = r.scalar(UINT32), r.scalar(UINT64), r.scalar(UINT64)
    kvs = []
    for _ in range(n_kv):
        key = r.string()
        vtype = r.scalar(UINT32)
        kvs.append([key, vtype, r.value(vtype)])
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        shape = [r.scalar(UINT64) for _ in range(r.scalar(UINT32))]
        tensors.append([name, shape, r.scalar(UINT32), r.scalar(UINT64)])
    alignment = next((v for k, _, v in kvs if k == "general.alignment"), 32)
    start = (r.pos + alignment - 1) // alignment * alignment
    return RawGGUF(version, kvs, tensors, buf[start:], alignment)


def _pack_value(vtype: int, value) -> bytes:
    if vtype == STRING:
        b = str(value).encode("utf-8")
        return struct.pack("<Q", len(b)) + b
    if vtype == ARRAY:
        if isinstance(value, dict):  # {"nested": depth}: arrays of one array, depth deep (no recursion here)
            return struct.pack("<IQ", ARRAY, 1) * value["nested"] + struct.pack("<IQ", INT32, 0)
        elem, items = value
        return struct.pack("<IQ", elem, len(items)) + b"".join(_pack_value(elem, v) for v in items)
    fmt = _SCALAR[vtype]
    if fmt in ("<f", "<d"):
        return struct.pack(fmt, float(value))
    if fmt == "<?":
        return struct.pack(fmt, bool(value))
    bits = struct.calcsize(fmt) * 8
    return struct.pack(fmt, _wrap(int(value), bits, fmt.islower() and fmt != "<?"))


def _wrap(value: int, bits: int, signed: bool) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if signed and value >= 1 << (bits - 1) else value


def serialize(g: RawGGUF) -> bytes:
    out = bytearray(b"GGUF" + struct.pack("<IQQ", g.version, len(g.tensors), len(g.kvs)))
    for key, vtype, value in g.kvs:
        out += _pack_value(STRING, key) + struct.pack("<I", vtype) + _pack_value(vtype, value)
    for name, shape, ggml_type, offset in g.tensors:
        out += _pack_value(STRING, name) + struct.pack("<I", len(shape))
        out += b"".join(struct.pack("<Q", d & (2**64 - 1)) for d in shape)
        out += struct.pack("<IQ", ggml_type & 0xFFFFFFFF, offset & (2**64 - 1))
    # The declared alignment pads the header, unless it is absurd (a 2^31 one would write a 2 GB
    # file): then 32, which leaves the data off the declared alignment (another malformation).
    align = g.alignment if isinstance(g.alignment, int) and 0 < g.alignment <= 1 << 20 else 32
    out += b"\0" * (-len(out) % align)
    return bytes(out) + g.data


# --- mutations --------------------------------------------------------------------------

# Values that break counts, sizes and types: zero, negative, just past 32 bits, huge, not finite.
INTERESTING_INTS = [0, 1, -1, 2, 3, 7, 255, 65535, 2**31 - 1, 2**31, 2**32, 2**32 + 2, 2**26, 2**61 + 1, 2**63 - 1]
INTERESTING_FLOATS = [0.0, -0.0, -1.0, 1e-45, 1e38, float("inf"), float("-inf"), float("nan")]
# Keys (after "<arch>.") kcap reads: counts, sizes, scalings, windows, experts.
ARCH_KEYS = ["block_count", "embedding_length", "feed_forward_length", "context_length", "attention.head_count",
             "attention.head_count_kv", "attention.key_length", "attention.value_length",
             "attention.layer_norm_rms_epsilon", "attention.sliding_window", "attention.sliding_window_pattern",
             "rope.dimension_count", "rope.freq_base", "rope.scaling.type", "rope.scaling.factor",
             "rope.scaling.original_context_length", "expert_count", "expert_used_count",
             "expert_feed_forward_length", "vocab_size", "final_logit_softcapping", "attn_logit_softcapping"]
TOKENIZER_KEYS = ["tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                  "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id",
                  "tokenizer.ggml.eos_token_id", "tokenizer.chat_template"]


def _random_value(rng: random.Random):
    """[vtype, value] of any type."""
    kind = rng.randrange(6)
    if kind == 0:
        return [rng.choice([UINT32, INT32, UINT64, INT64, UINT8]), rng.choice(INTERESTING_INTS)]
    if kind == 1:
        return [rng.choice([FLOAT32, FLOAT64]), rng.choice(INTERESTING_FLOATS)]
    if kind == 2:
        return [BOOL, rng.random() < 0.5]
    if kind == 3:
        return [STRING, rng.choice(["", "yarn", "linear", "llama", "gpt2", "x" * 300, "\u2581", "32"])]
    if kind == 4:
        return [ARRAY, [INT32, [rng.choice(INTERESTING_INTS) for _ in range(rng.randrange(4))]]]
    return [ARRAY, [STRING, ["a", "b c", ""][: rng.randrange(4)]]]


def random_op(g: RawGGUF, rng: random.Random) -> dict:
    """One mutation of g's structure, as a replayable dict."""
    arch = next((v for k, _, v in g.kvs if k == "general.architecture"), "llama")
    kind = rng.randrange(13)
    if kind <= 2 and g.kvs:  # a key kcap reads gets another value (often another type)
        keys = [k for k, _, _ in g.kvs if k.startswith(arch + ".") or k in TOKENIZER_KEYS] or [k for k, _, _ in g.kvs]
        key = rng.choice(keys)
        vtype, value = _random_value(rng)
        original_type, original = next((t, v) for k, t, v in g.kvs if k == key)
        if rng.random() < 0.5 and original_type in _SCALAR and original_type != BOOL:  # the type kept
            vtype = original_type
            value = rng.choice(INTERESTING_FLOATS if vtype in (FLOAT32, FLOAT64) else INTERESTING_INTS)
        elif rng.random() < 0.5 and original_type == ARRAY and original[1]:  # the array cut or an entry changed
            elem, items = original
            items = list(items[: rng.randrange(len(items) + 1)])
            if items and elem in _SCALAR and elem != BOOL:
                items[rng.randrange(len(items))] = rng.choice(
                    INTERESTING_FLOATS if elem in (FLOAT32, FLOAT64) else INTERESTING_INTS)
            vtype, value = ARRAY, [elem, items]
        return {"op": "set", "key": key, "vtype": vtype, "value": value}
    if kind == 3:  # a key the file lacks
        vtype, value = _random_value(rng)
        return {"op": "set", "key": f"{arch}.{rng.choice(ARCH_KEYS)}", "vtype": vtype, "value": value}
    if kind == 4 and g.kvs:
        key, vtype, value = rng.choice(g.kvs)
        return {"op": "duplicate_key", "key": key, "vtype": vtype,
                "value": value if vtype in (STRING, ARRAY, BOOL) else rng.choice(INTERESTING_INTS)
                if vtype not in (FLOAT32, FLOAT64) else rng.choice(INTERESTING_FLOATS)}
    if kind == 5 and g.kvs:
        return {"op": "drop_key", "key": rng.choice(g.kvs)[0]}
    if kind == 6 and g.tensors:
        t = rng.choice(g.tensors)
        shape = list(t[1])
        i = rng.randrange(max(1, len(shape)))
        change = rng.choice(["zero", "double", "half", "huge", "wrap", "add_dim", "drop_dim"])
        if change == "add_dim":
            shape.append(rng.choice([1, 2, 3]))
        elif change == "drop_dim" and shape:
            shape.pop()
        elif shape:
            shape[i] = {"zero": 0, "double": shape[i] * 2, "half": max(1, shape[i] // 2), "huge": 2**40,
                        "wrap": 2**61 + 1}[change] if change != "drop_dim" else shape[i]
        return {"op": "tensor_shape", "tensor": t[0], "shape": shape}
    if kind == 7 and g.tensors:
        return {"op": "tensor_type", "tensor": rng.choice(g.tensors)[0],
                "type": rng.choice([0, 1, 2, 8, 12, 14, 30, 39, 4, 5, 31, 99, 2**31])}
    if kind == 8 and g.tensors:
        t = rng.choice(g.tensors)
        other = rng.choice(g.tensors)
        offset = rng.choice([t[3] + 1, t[3] + g.alignment, other[3], 0, 2**40, 2**63 - 1, t[3] - g.alignment])
        return {"op": "tensor_offset", "tensor": t[0], "offset": offset}
    if kind == 9 and g.tensors:
        t = rng.choice(g.tensors)
        return rng.choice([{"op": "drop_tensor", "tensor": t[0]}, {"op": "duplicate_tensor", "tensor": t[0]},
                           {"op": "rename_tensor", "tensor": t[0], "name": rng.choice(g.tensors)[0]}])
    if kind == 10:
        return {"op": "nest", "key": f"{arch}.nested", "depth": rng.choice([2, 50, 5000])}
    if kind == 11:
        return {"op": "set", "key": "general.alignment", "vtype": rng.choice([UINT32, STRING, BOOL, FLOAT32]),
                "value": rng.choice([0, 1, 3, 16, 64, 2**31])}
    # byte level: flips in the header, or a truncation
    if rng.random() < 0.7:
        return {"op": "flip", "at_fraction": rng.random(), "header": True, "xor": rng.randrange(1, 256)}
    return {"op": "truncate", "at_fraction": rng.random()}


def apply_ops(seed: bytes, ops: list[dict]) -> bytes:
    """The mutant of a seed file: structural ops on its parts, then byte-level ops in order."""
    g = parse(seed).copy()
    byte_ops = []
    for op in ops:
        kind = op["op"]
        if kind == "set":
            g.kvs = [kv for kv in g.kvs if kv[0] != op["key"]] + [[op["key"], op["vtype"], op["value"]]]
            if op["key"] == "general.alignment" and op["vtype"] == UINT32:
                g.alignment = op["value"]
        elif kind == "duplicate_key":
            g.kvs.append([op["key"], op["vtype"], op["value"]])
        elif kind == "drop_key":
            g.kvs = [kv for kv in g.kvs if kv[0] != op["key"]]
        elif kind == "nest":
            g.kvs.append([op["key"], ARRAY, {"nested": op["depth"]}])
        elif kind in ("tensor_shape", "tensor_type", "tensor_offset", "drop_tensor", "duplicate_tensor",
                      "rename_tensor"):
            for i, t in enumerate(g.tensors):
                if t[0] != op["tensor"]:
                    continue
                if kind == "tensor_shape":
                    t[1] = op["shape"]
                elif kind == "tensor_type":
                    t[2] = op["type"]
                elif kind == "tensor_offset":
                    t[3] = op["offset"]
                elif kind == "drop_tensor":
                    g.tensors.pop(i)
                elif kind == "duplicate_tensor":
                    g.tensors.append(list(t))
                else:
                    t[0] = op["name"]
                break
        else:
            byte_ops.append(op)
    out = bytearray(serialize(g))
    header_end = len(out) - len(g.data)
    for op in byte_ops:
        if op["op"] == "flip":
            span = header_end if op.get("header") else len(out)
            at = min(span - 1, int(op["at_fraction"] * span))
            out[at] ^= op["xor"]
        elif op["op"] == "truncate":
            del out[max(4, int(op["at_fraction"] * len(out))):]
    return bytes(out)


# --- running one input ------------------------------------------------------------------

@dataclass
class Outcome:
    kind: str  # loaded, refused, exception, oom, hang, crash
    detail: str = ""


def under_address_sanitizer() -> bool:
    """True in a process with AddressSanitizer loaded (scripts/sanitize.sh): it reserves its
    shadow memory up front, so an address-space limit (RLIMIT_AS) would abort it."""
    try:
        with open("/proc/self/maps") as maps:
            return "libasan" in maps.read()
    except OSError:
        return False


def run_input(data: bytes, workdir: str, time_limit: float = 20.0, memory_limit: int = 4 << 30) -> Outcome:
    """Loads data as a GGUF file in a forked child (CPU backend, one thread), evaluates a token
    if it loads, and reports what happened. The child's address space is limited to
    memory_limit (not under AddressSanitizer, which then reports oversized allocations itself)."""
    import kcap  # imported once in the parent: the children inherit it

    path = os.path.join(workdir, "input.gguf")
    with open(path, "wb") as f:
        f.write(data)
    asan = under_address_sanitizer()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_fd)
        code, message = 0, ""
        try:
            if not asan:
                resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
            signal.alarm(int(time_limit) + 5)  # a second guard besides the parent's kill
            model = kcap.load(path, backend="cpu", n_threads=1)
            model.eval([0])
        except kcap.KcapError as error:
            code, message = 10, f"{type(error).__name__}: {error}"
        except MemoryError as error:
            code, message = 11, f"MemoryError: {error}"
        except BaseException as error:  # noqa: BLE001 (every other exception is a finding)
            code, message = 12, f"{type(error).__name__}: {error}"
        os.write(write_fd, message.encode("utf-8", "replace")[:2000])
        os._exit(code)
    os.close(write_fd)
    deadline = time.monotonic() + time_limit
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.005)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_fd)
        return Outcome("hang", f"past {time_limit} s")
    with os.fdopen(read_fd, "rb") as f:
        message = f.read().decode("utf-8", "replace")
    if os.WIFSIGNALED(status):
        return Outcome("crash", f"signal {os.WTERMSIG(status)}")
    code = os.WEXITSTATUS(status)
    return {0: Outcome("loaded"), 10: Outcome("refused", message), 11: Outcome("oom", message)}.get(
        code, Outcome("exception", message or f"exit code {code}"))


# --- a campaign -------------------------------------------------------------------------

@dataclass
class Campaign:
    inputs: int = 0
    outcomes: dict = field(default_factory=dict)  # kind -> count
    refusals: dict = field(default_factory=dict)  # KcapError type -> count
    findings: list = field(default_factory=list)  # {"seed": name, "ops": [...], "outcome": kind, "detail": ...}

    def summary(self) -> str:
        lines = [f"{self.inputs} inputs: " + ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))]
        lines.append("refused by: " + ", ".join(f"{k} {v}" for k, v in sorted(self.refusals.items())))
        for f in self.findings[:20]:
            lines.append(f"FINDING {f['outcome']} on {f['seed']}: {f['detail'][:200]} ops={json.dumps(f['ops'])}")
        return "\n".join(lines)


def fuzz(seeds: dict[str, bytes], inputs: int, rng_seed: int, max_ops: int = 3, time_limit: float = 20.0,
         log=None) -> Campaign:
    """inputs mutants of the seeds (each 1 .. max_ops ops), with a fixed random seed."""
    rng = random.Random(rng_seed)
    campaign = Campaign()
    names = sorted(seeds)
    with tempfile.TemporaryDirectory() as workdir:
        for i in range(inputs):
            name = names[i % len(names)]
            parts = parse(seeds[name])
            ops = [random_op(parts, rng) for _ in range(rng.randint(1, max_ops))]
            outcome = run_input(apply_ops(seeds[name], ops), workdir, time_limit)
            campaign.inputs += 1
            campaign.outcomes[outcome.kind] = campaign.outcomes.get(outcome.kind, 0) + 1
            if outcome.kind == "refused":
                kind = outcome.detail.split(":", 1)[0]
                campaign.refusals[kind] = campaign.refusals.get(kind, 0) + 1
            if outcome.kind in FINDINGS:
                campaign.findings.append({"seed": name, "ops": ops, "outcome": outcome.kind, "detail": outcome.detail})
            if log is not None and (i + 1) % 100 == 0:
                log(f"{i + 1} inputs: {campaign.outcomes}")
    return campaign


def seed_files(fixtures: str | os.PathLike) -> dict[str, bytes]:
    """The seeds: a tiny Llama without a vocabulary and three conformance fixtures with one
    (byte-level BPE, SentencePiece, a mixture of experts) from the fixtures folder
    (tests/fixtures/conformance of the repository)."""
    from kcap.testing.synth import tiny_llama

    fixtures = Path(fixtures)
    seeds = {}
    with tempfile.TemporaryDirectory() as d:
        seeds["tiny_llama"] = Path(tiny_llama(os.path.join(d, "tiny.gguf"))).read_bytes()
    for name in ("qwen3-f32", "gemma3-f32", "qwen3moe-q8_0"):
        seeds[name] = (fixtures / f"{name}.gguf").read_bytes()
    return seeds
