#!/usr/bin/env python3
"""kevin's eager baseline against torch eager, task by task, from the two sides' JSON of one run:

    kevin tasks --dir IMPORT baseline --preset gpu --json kevin-gpu.json
    python3 scripts/baseline_gpu.py PLANS --preset gpu --time-only --json torch-gpu.json
    python3 scripts/kernelbench_table.py kevin-gpu.json torch-gpu.json [--json table.json]

Prints the share of tasks within +-15% of eager and the median ratio (kevin / eager), the same
for tasks with and without cuDNN steps, then every task outside 15%. The ratio takes kevin's
time from its own runner (what candidates are timed against) and eager's from the original
module; `plan_cupy_ms` is kevin's plan run through CuPy by baseline_gpu.py, for reference.
Needs only the standard library."""
import argparse
import json
import statistics


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kevin")
    ap.add_argument("torch")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    kevin = {r["task"]: r for r in json.load(open(args.kevin))["tasks"] if "median_ms" in r}
    torch = {r["task"]: r for r in json.load(open(args.torch))["results"] if "torch_ms" in r}
    rows = []
    for name in sorted(set(kevin) & set(torch)):
        k, t = kevin[name], torch[name]
        rows.append({
            "task": name,
            "kevin_ms": k["median_ms"],
            "torch_ms": t["torch_ms"],
            "plan_cupy_ms": t.get("kevin_ms"),
            "ratio": k["median_ms"] / t["torch_ms"],
            "cudnn_steps": k.get("cudnn_steps", 0),
            "torch_kernels": len(t.get("torch_kernels", [])),
            "kevin_kernels": len(t.get("kevin_kernels", [])),
        })
    if not rows:
        print("no task timed on both sides")
        return 1

    def line(label, rs):
        qs = [r["ratio"] for r in rs]
        within = sum(0.85 <= q <= 1.15 for q in qs)
        return (f"{label}: {len(rs)} tasks, {within} within +-15% of eager ({100 * within / len(rs):.1f}%), "
                f"median kevin/eager {statistics.median(qs):.3f}")

    print(line("baseline vs eager", rows))
    for label, part in [("  with cuDNN steps", [r for r in rows if r["cudnn_steps"]]),
                        ("  without", [r for r in rows if not r["cudnn_steps"]])]:
        if part:
            print(line(label, part))
    missing = sorted(set(kevin) ^ set(torch))
    if missing:
        print(f"  timed on one side only: {', '.join(missing)}")
    for r in rows:
        if not 0.85 <= r["ratio"] <= 1.15:
            print(f"  outside: {r['task']:52} kevin {r['kevin_ms']:9.4f} ms  eager {r['torch_ms']:9.4f} ms"
                  f"  ratio {r['ratio']:.2f}")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
