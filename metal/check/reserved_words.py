"""Flags MSL-reserved words used as names in what the Metal compiler would see.

g++ under metal/check/metal_stand_in.h cannot tell that `thread`, `half`, `kernel` ... are
reserved in MSL (an identifier named `half` compiles as C++), so this scans each .metal
translation unit after preprocessing (g++ -E, line markers kept) and reports, for lines that
come from kernels/ or metal/ (not the stand-in, not system headers), a reserved word used as
a member (`t.thread`) or declared as a variable (`const int half = ...`). A heuristic, not a
parser; it catches the ways a name is usually introduced and used.

    python3 metal/check/reserved_words.py FILE.i ...   (exit 1 on any use)

It found KcapThread::thread (now KcapThread::index) and a local `half` in kernels/rope.h.
"""
from __future__ import annotations

import re
import sys

# MSL 4 (address spaces), 5.1 (function qualifiers), 2.1 (scalar types the language adds).
RESERVED = ("device", "constant", "thread", "threadgroup", "threadgroup_imageblock", "ray_data", "object_data",
            "kernel", "vertex", "fragment", "half", "bfloat", "uchar", "ushort", "uint", "ulong")

WORDS = "|".join(RESERVED)
MEMBER = re.compile(r"(?:\.|->)\s*(" + WORDS + r")\b")
DECLARED = re.compile(r"\b(?:int|unsigned|float|bool|auto|char|short|long|uint|ushort|uchar|kcap_\w+|float[234]|uint[234])"
                      r"\s*[*&]?\s+(" + WORDS + r")\s*(?:=|;|,|\)|\[)")
MARKER = re.compile(r'^# \d+ "([^"]+)"')


def scan(path: str) -> list[tuple[str, str, str]]:
    hits, source = [], ""
    for line in open(path, encoding="utf-8", errors="replace"):
        marker = MARKER.match(line)
        if marker:
            source = marker.group(1)
            continue
        if "metal/check/" in source or not re.search(r"(^|/)(kernels|metal)/", source):
            continue
        for pattern in (MEMBER, DECLARED):
            for match in pattern.finditer(line):
                hits.append((match.group(1), source, line.strip()))
    return hits


def main(paths: list[str]) -> int:
    new = set()
    for path in paths:
        new.update(scan(path))
    for word, source, text in sorted(new):
        print(f"error: MSL reserves '{word}', used as a name: {source}: {text}")
    return 1 if new else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
