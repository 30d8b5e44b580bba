#!/usr/bin/env python3
"""The comparison of benches/timing_lease.sh: reads the `kevin eval --json` files it wrote into
OUT (idle-a1..R, idle-b1..R, leased1..R, shared1) and writes OUT/timing_lease.md and
OUT/timing_lease.json: per task, the median speedup (baseline ms / kernel ms) of each mode
against the idle runs' median, with the baseline and kernel time ratios. Exit status 0 when
every task's leased speedup is within TOLERANCE of idle (and correct in every run), else 1.

Usage: benches/timing_lease_compare.py OUT REPEAT TOLERANCE
"""
import json, statistics, sys, os

out, repeat, tol = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

def load(name):
    with open(os.path.join(out, name + ".json")) as f:
        data = json.load(f)
    runs = {}
    for r in data["results"]:
        o = r["outcome"]
        if o.get("kind") == "correct":
            runs[r["task"]] = (o["baseline_ms"] / o["kernel_ms"], o["baseline_ms"], o["kernel_ms"])
        else:
            runs[r["task"]] = None
    return runs

def median_of(names):
    runs = [load(n) for n in names]
    tasks = sorted(set().union(*runs))
    med, bad = {}, []
    for t in tasks:
        vals = [r.get(t) for r in runs]
        if any(v is None for v in vals):
            bad.append(t)
            continue
        med[t] = tuple(statistics.median(v[k] for v in vals) for k in range(3))
    return med, bad

idle_a = [f"idle-a{i}" for i in range(1, repeat + 1)]
idle_b = [f"idle-b{i}" for i in range(1, repeat + 1)]
modes = {
    "idle (second half) vs idle (first half)": (median_of(idle_b), median_of(idle_a)),
    "leased load vs idle": (median_of([f"leased{i}" for i in range(1, repeat + 1)]), median_of(idle_a + idle_b)),
    "unleased load (--timing shared, 1 run) vs idle": (median_of(["shared1"]), median_of(idle_a + idle_b)),
}

report = {"repeat": repeat, "tolerance": tol, "comparisons": {}}
md = [f"# Timing under a concurrent generation load (issue 17, item 7)\n",
      f"Median of {repeat} `kevin eval --kernels tasks/solutions --backend cuda` runs per mode "
      f"(the unleased contrast: one run); load: `kevin bench policy --device cuda --dtype bf16 "
      f"--batches 64 --train-steps 0 --load-seconds ...` on the same GPU. Ratio = mode / reference; "
      f"target: every task's leased speedup within {tol:.0%} of idle.\n"]
ok = True
for title, ((got, got_bad), (ref, ref_bad)) in modes.items():
    rows = []
    for t in sorted(set(got) & set(ref)):
        s = got[t][0] / ref[t][0]
        b = got[t][1] / ref[t][1]
        k = got[t][2] / ref[t][2]
        rows.append({"task": t, "speedup_ref": ref[t][0], "speedup": got[t][0],
                     "speedup_ratio": s, "baseline_ratio": b, "kernel_ratio": k})
    dev = [abs(r["speedup_ratio"] - 1) for r in rows]
    summary = {
        "tasks": len(rows),
        "not_correct": sorted(set(got_bad) | set(ref_bad)),
        "max_speedup_deviation": max(dev) if dev else None,
        "over_3pct": sum(d > 0.03 for d in dev),
        "over_10pct": sum(d > 0.10 for d in dev),
        "over_tolerance": [r["task"] for r in rows if abs(r["speedup_ratio"] - 1) > tol],
        "max_baseline_ratio": max((r["baseline_ratio"] for r in rows), default=None),
    }
    report["comparisons"][title] = {"summary": summary, "rows": rows}
    if title.startswith("leased"):
        ok = ok and not summary["over_tolerance"] and not summary["not_correct"]
    md.append(f"\n## {title}\n")
    md.append(f"- tasks compared: {summary['tasks']}; not correct in some run: "
              f"{', '.join(summary['not_correct']) or 'none'}")
    if dev:
        md.append(f"- largest speedup deviation: {max(dev):.1%}; over 3%: {summary['over_3pct']}; "
                  f"over 10%: {summary['over_10pct']}; largest baseline time ratio: "
                  f"{summary['max_baseline_ratio']:.2f}x")
    md.append("\n| task | speedup (reference) | speedup | speedup ratio | baseline ms ratio | kernel ms ratio |")
    md.append("| --- | --- | --- | --- | --- | --- |")
    for r in sorted(rows, key=lambda r: -abs(r["speedup_ratio"] - 1)):
        flag = " **" if abs(r["speedup_ratio"] - 1) > tol else ""
        md.append(f"| {r['task']}{flag} | {r['speedup_ref']:.3f}x | {r['speedup']:.3f}x | "
                  f"{r['speedup_ratio']:.3f} | {r['baseline_ratio']:.3f} | {r['kernel_ratio']:.3f} |")
report["leased_within_tolerance"] = ok
md.insert(2, f"**Result: {'every task within' if ok else 'NOT every task within'} {tol:.0%} under the leased load.**\n")
with open(os.path.join(out, "timing_lease.json"), "w") as f:
    json.dump(report, f, indent=1)
with open(os.path.join(out, "timing_lease.md"), "w") as f:
    f.write("\n".join(md) + "\n")
for title, c in report["comparisons"].items():
    s = c["summary"]
    print(f"{title}: {s['tasks']} tasks, max deviation "
          f"{(s['max_speedup_deviation'] or 0):.1%}, over 3%: {s['over_3pct']}, over 10%: {s['over_10pct']}")
print(f"leased within {tol:.0%} on every task: {ok}")
sys.exit(0 if ok else 1)
