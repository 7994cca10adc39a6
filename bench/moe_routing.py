"""How a mixture-of-experts file routes a prompt: per layer, the experts its router chose for a
prompt of random token ids, how many tokens the busiest expert got, and how full grouped tiles of
16, 32 and 64 token slots would be (each expert's slots padded to whole tiles, as the CUDA
grouped expert rows do). A synthetic file whose router sends every token to the same few
experts benchmarks a dense GEMM, not a mixture of experts; this is the check.

    python bench/moe_routing.py MODEL.gguf [--tokens 512] [--backend cpu]
"""
import argparse
import math

import numpy as np

import kcap


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--backend", default="cpu")
    args = ap.parse_args(argv)
    m = kcap.load(args.model, backend=args.backend)
    ids = np.random.default_rng(0).integers(0, m.n_vocab, args.tokens).astype(np.int32)
    ran, _ = m.engine.trace(ids, False, True)
    print(f"{args.model}: {args.tokens} random token ids")
    print("layer  experts used  busiest expert (tokens)  16-slot tiles full  32  64")
    for entry in ran:
        if "experts" not in entry:
            continue
        chosen = entry["experts"]
        counts = np.bincount(chosen.ravel())
        used = counts[counts > 0]
        fill = [chosen.size / (sum(math.ceil(c / tile) for c in used) * tile) for tile in (16, 32, 64)]
        print(f"{entry['layer']:5d}  {len(used):12d}  {used.max():23d}  {fill[0]:18.0%}  {fill[1]:.0%}  {fill[2]:.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
