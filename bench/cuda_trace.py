"""Kernel timeline of decode steps or a prefill chunk as they run (the captured decode graph's
kernel nodes with programmatic dependent launch overlapping them), from CUPTI through
torch.profiler, not serialized as under Nsight Compute:

    python3 bench/cuda_trace.py MODEL.gguf [--depth N] [--steps S] [--prefill TOKENS]
        [--activations f32|q8_1|bf16] [--csv OUT.csv]
    python3 bench/cuda_trace.py OUT.csv --summary [--steps S | --prefill N]

Decode: prefills DEPTH random tokens, replays the decode graph twice unprofiled, then profiles
S decode steps. --prefill TOKENS profiles one prefill chunk of that many tokens instead. Prints
per kernel (template arguments kept): launches per step, the mean time from its start to its
end (with programmatic dependent launch a kernel starts before its predecessor ends and waits,
so this overstates its work), and the mean time by which its end moved past both the latest
earlier end and its own start ("critical": the part of the step the kernel alone accounts
for), then per step the time, the gaps with no kernel running (the host's time between decode
steps) and the sum of the kernels' durations; --csv writes every kernel event (name, start,
end in us). The device's clock: compare kernels within a run."""
from __future__ import annotations

import argparse
import csv
from collections import defaultdict


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", help="the GGUF file, or with --summary a CSV this script wrote")
    parser.add_argument("--summary", action="store_true", help="summarize the CSV given as model")
    parser.add_argument("--depth", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prefill", type=int, default=0)
    parser.add_argument("--activations", default="f32")
    parser.add_argument("--csv", default="")
    args = parser.parse_args()
    if args.summary:
        with open(args.model, newline="") as f:
            rows = list(csv.DictReader(f))
        events = [(r["name"], float(r["start_us"]), float(r["end_us"])) for r in rows]
        return report(sorted(events, key=lambda e: e[1]), 1 if args.prefill else args.steps)

    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    import kcap

    tokens = max(args.prefill, args.depth, 1)
    model = kcap.load(args.model, backend="cuda", n_ctx=tokens + args.steps + 256, kv_type="f16",
                      activations=args.activations)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.n_vocab, tokens).astype(np.int32)
    if args.prefill:
        model.engine.eval(ids, False)  # warm: the same chunk once unprofiled
        model.engine.reset()
    else:
        model.engine.eval(ids, False)
        for t in (5, 6):
            model.engine.eval(np.array([t], dtype=np.int32), False)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        if args.prefill:
            model.engine.eval(ids, False)
        else:
            for t in range(args.steps):
                model.engine.eval(np.array([7 + t], dtype=np.int32), False)
        torch.cuda.synchronize()
    events = []
    for e in prof.events():
        if e.device_type.name != "CUDA" or "memcpy" in e.name.lower() or "memset" in e.name.lower():
            continue
        start = e.time_range.start
        events.append((e.name, float(start), float(start + e.time_range.elapsed_us())))
    events.sort(key=lambda e: e[1])
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["name", "start_us", "end_us"])
            writer.writerows(events)
    return report(events, 1 if args.prefill else args.steps)


def report(events: list[tuple[str, float, float]], steps: int) -> int:
    if not events:
        print("no kernel events recorded")
        return 1
    span = events[-1][2] - events[0][1]
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    last_end = events[0][1]
    gaps = 0.0
    for name, start, end in events:
        entry = by_name[name]
        entry[0] += 1
        entry[1] += end - start
        gaps += max(0.0, start - last_end)
        entry[2] += max(0.0, end - max(last_end, start))
        last_end = max(last_end, end)
    busy = sum(v[1] for v in by_name.values())
    print(f"{'kernel':64s} {'per step':>8s} {'us each':>8s} {'critical':>9s} {'share':>6s}")
    for name, (count, dur, crit) in sorted(by_name.items(), key=lambda kv: -kv[1][2]):
        print(f"{name[:64]:64s} {count / steps:8.1f} {dur / count:8.2f} {crit / steps:9.1f} {crit / span:6.1%}")
    print(f"step {span / steps:.1f} us ({len(events) / steps:.0f} kernels), gaps {gaps / steps:.1f} us, "
          f"kernels' durations summed {busy / steps:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
