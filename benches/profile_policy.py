#!/usr/bin/env python3
"""Where a decode step of the burn policy goes on a GPU (issue 18: "profile first").

For each case it runs `kevin bench policy` several times, differing only in the number of new
tokens, and takes differences between the runs, so that prefill, warm-up, first-use compilation
and process start cancel out. Three kinds of run per token count:

- plain: wall time per decode step (the bench's own timing, no logging);
- cubecl's execution log (profiling level "minimal": every kernel launch named, no
  synchronisation): kernel launches per decode step, by kernel;
- cubecl's per-kernel profile (level "basic": every launch timed on the GPU, which serialises
  the launches): GPU time per decode step, by kernel.

The ratio GPU time / wall time is how busy the GPU is during a decode step; the rest is host
overhead (launch submission, fusion, shape handling, the per-step read of sampled tokens).

Learner cases (`learner:SHAPE:DTYPE:BATCH:SEQ`) take the difference of 1 and 2 timed learner
steps the same way.

Usage (on the GPU machine): python3 benches/profile_policy.py --kevin PATH --out DIR CASE...
  CASE = gen:SHAPE:DTYPE:BATCH:N1,N2[,N3]   e.g. gen:tiny:f32:64:32,96,160
         learner:SHAPE:DTYPE:BATCH:SEQ       e.g. learner:qwen2-0.5b:bf16:8:1024
         ncu:SHAPE:DTYPE:BATCH:N:SKIP:COUNT  Nsight Compute durations of COUNT launches after
                                             SKIP (pick SKIP inside the decode steps)
Writes DIR/profile.json and DIR/profile.md and prints the table last.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

UNITS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
DURATION = re.compile(r"^\|\s*([0-9.]+)(ns|µs|us|ms|s)\s*\|\s*(.*)$")


def run_bench(kevin, workdir, level, args):
    """One `kevin bench policy` run in its own folder; returns (bench JSON, log lines)."""
    os.makedirs(workdir, exist_ok=True)
    log = os.path.join(workdir, "cubecl.log")
    toml = os.path.join(workdir, "cubecl.toml")
    if level != "none":
        with open(toml, "w") as f:
            f.write(f'[profiling.logger]\nlevel = "{level}"\nfile = "{log}"\nappend = false\n')
    out_json = os.path.join(workdir, "bench.json")
    cmd = [kevin, "bench", "policy", "--device", "cuda", "--json", out_json] + args
    t = time.time()
    p = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True)
    wall = time.time() - t
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-3000:])
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    with open(out_json) as f:
        bench = json.load(f)["kevin"]
    lines = []
    if level != "none" and os.path.exists(log):
        with open(log, errors="replace") as f:
            lines = f.read().splitlines()
    print(f"  {level:7} {' '.join(args)}: {wall:.1f} s, {len(lines)} log lines", flush=True)
    return bench, lines


def launches(lines):
    c = collections.Counter()
    for line in lines:
        if line.startswith("Executing "):
            c[line[len("Executing "):].strip()] += 1
    return c


def gpu_times(lines):
    t = collections.Counter()
    n = collections.Counter()
    for line in lines:
        m = DURATION.match(line.strip())
        if m:
            t[m.group(3).strip()] += float(m.group(1)) * UNITS[m.group(2)]
            n[m.group(3).strip()] += 1
    return t, n


def short(name, width=70):
    name = re.sub(r"\s+", " ", name)
    return name if len(name) <= width else name[: width - 3] + "..."


def diff(a, b, steps):
    keys = set(a) | set(b)
    return {k: (b[k] - a[k]) / steps for k in keys if b[k] != a[k]}


def gen_case(kevin, root, shape, dtype, batch, ns):
    base = ["--shape", shape, "--dtype", dtype, "--batches", str(batch), "--prompt", "256",
            "--train-steps", "0"]
    per = {}
    for n in ns:
        args = base + ["--new-tokens", str(n)]
        tag = f"{shape}-{dtype}-bs{batch}-n{n}"
        plain, _ = run_bench(kevin, os.path.join(root, tag, "none"), "none", args)
        _, lmin = run_bench(kevin, os.path.join(root, tag, "minimal"), "minimal", args)
        _, lbas = run_bench(kevin, os.path.join(root, tag, "basic"), "basic", args)
        g = plain["generate"][0]
        per[n] = {"seconds": g["seconds"], "passes": g["forward_passes"],
                  "tokens_per_s": g["tokens_per_s"],
                  "launch": launches(lmin), "gpu": gpu_times(lbas)[0]}
    lo, hi = ns[0], ns[-1]
    steps = per[hi]["passes"] - per[lo]["passes"]
    # Wall time from the last two points: the first run of a shape can still compile kernels
    # inside its timed call.
    w0 = ns[-2]
    wall = (per[hi]["seconds"] - per[w0]["seconds"]) / (per[hi]["passes"] - per[w0]["passes"])
    launch = diff(per[lo]["launch"], per[hi]["launch"], steps)
    gpu = diff(per[lo]["gpu"], per[hi]["gpu"], steps)
    # Linearity check with a middle point: launches per step from (lo, mid) against (lo, hi).
    check = None
    if len(ns) > 2:
        mid = ns[1]
        s2 = per[mid]["passes"] - per[lo]["passes"]
        check = sum(diff(per[lo]["launch"], per[mid]["launch"], s2).values())
    top = sorted(gpu.items(), key=lambda kv: -kv[1])[:12]
    return {
        "case": f"generate {shape} {dtype} batch {batch}",
        "new_tokens": ns, "decode_steps_differenced": steps,
        "wall_ms_per_step": wall * 1e3,
        "launches_per_step": sum(launch.values()),
        "launches_per_step_check": check,
        "gpu_ms_per_step": sum(gpu.values()) * 1e3,
        "gpu_busy": sum(gpu.values()) / wall if wall > 0 else None,
        "distinct_kernels_per_step": len(launch),
        "top_kernels": [{"name": short(k), "gpu_us_per_step": v * 1e6,
                         "launches_per_step": launch.get(k, 0.0)} for k, v in top],
        "tokens_per_s_at_hi": per[hi]["tokens_per_s"],
        "runs": {str(n): {"seconds": per[n]["seconds"], "passes": per[n]["passes"],
                          "launches": sum(per[n]["launch"].values()),
                          "gpu_s_profiled": sum(per[n]["gpu"].values())} for n in ns},
    }


def learner_case(kevin, root, shape, dtype, batch, seq):
    base = ["--shape", shape, "--dtype", dtype, "--batches", "1", "--new-tokens", "2",
            "--prompt", "16", "--train-batch", str(batch), "--train-seq", str(seq)]
    per = {}
    for steps in (1, 2):
        args = base + ["--train-steps", str(steps)]
        tag = f"learn-{shape}-{dtype}-{batch}x{seq}-s{steps}"
        plain, _ = run_bench(kevin, os.path.join(root, tag, "none"), "none", args)
        _, lmin = run_bench(kevin, os.path.join(root, tag, "minimal"), "minimal", args)
        _, lbas = run_bench(kevin, os.path.join(root, tag, "basic"), "basic", args)
        per[steps] = {"plain": plain["learner"], "launch": launches(lmin),
                      "gpu": gpu_times(lbas)[0]}
    launch = diff(per[1]["launch"], per[2]["launch"], 1)
    gpu = diff(per[1]["gpu"], per[2]["gpu"], 1)
    wall = per[2]["plain"]["step_seconds"]
    top = sorted(gpu.items(), key=lambda kv: -kv[1])[:12]
    return {
        "case": f"learner {shape} {dtype} {batch}x{seq}",
        "wall_ms_per_step": wall * 1e3,
        "launches_per_step": sum(launch.values()),
        "gpu_ms_per_step": sum(gpu.values()) * 1e3,
        "gpu_busy": sum(gpu.values()) / wall if wall > 0 else None,
        "distinct_kernels_per_step": len(launch),
        "top_kernels": [{"name": short(k), "gpu_us_per_step": v * 1e6,
                         "launches_per_step": launch.get(k, 0.0)} for k, v in top],
        "tokens_per_s": per[2]["plain"]["tokens_per_s"],
    }


def ncu_case(kevin, root, shape, dtype, batch, n, skip, count):
    """Kernel durations from Nsight Compute over `count` launches after `skip` (a window inside
    the decode steps), without cubecl's own per-kernel synchronisation."""
    workdir = os.path.join(root, f"ncu-{shape}-{dtype}-bs{batch}-n{n}")
    os.makedirs(workdir, exist_ok=True)
    cmd = ["ncu", "--clock-control", "none", "--metrics", "gpu__time_duration.sum", "--csv",
           "--launch-skip", str(skip), "--launch-count", str(count), kevin, "bench", "policy",
           "--device", "cuda", "--shape", shape, "--dtype", dtype, "--batches", str(batch),
           "--prompt", "256", "--new-tokens", str(n), "--train-steps", "0"]
    t = time.time()
    p = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True)
    print(f"  ncu {shape} {dtype} bs{batch}: {time.time() - t:.1f} s, rc {p.returncode}", flush=True)
    import csv
    import io
    rows = [r for r in csv.reader(io.StringIO(p.stdout)) if len(r) > 10]
    if not rows:
        sys.stderr.write(p.stdout[-2000:] + p.stderr[-2000:])
        return {"case": f"ncu {shape}", "error": "no CSV rows"}
    head = rows[0]
    name_i, metric_i, unit_i, value_i = (head.index("Kernel Name"), head.index("Metric Name"),
                                         head.index("Metric Unit"), head.index("Metric Value"))
    per = collections.Counter()
    cnt = collections.Counter()
    scale = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0}
    for r in rows[1:]:
        if r[metric_i] != "gpu__time_duration.sum":
            continue
        per[r[name_i]] += float(r[value_i].replace(",", "")) * scale.get(r[unit_i], 1e-9)
        cnt[r[name_i]] += 1
    top = sorted(per.items(), key=lambda kv: -kv[1])[:15]
    return {"case": f"ncu window {shape} {dtype} batch {batch}", "launches": sum(cnt.values()),
            "gpu_ms": sum(per.values()) * 1e3,
            "top_kernels": [{"name": short(k, 90), "gpu_us": v * 1e6, "launches": cnt[k]}
                            for k, v in top]}


def markdown(results, header):
    out = [header, "", "| case | wall ms/step | GPU ms/step | GPU busy | launches/step | kernels |",
           "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        if "wall_ms_per_step" not in r:
            continue
        busy = f"{100 * r['gpu_busy']:.0f}%" if r.get("gpu_busy") is not None else "-"
        out.append(f"| {r['case']} | {r['wall_ms_per_step']:.2f} | {r['gpu_ms_per_step']:.2f} | "
                   f"{busy} | {r['launches_per_step']:.0f} | {r['distinct_kernels_per_step']} |")
    for r in results:
        if "launches" in r:
            out += ["", f"{r['case']}: {r['launches']} launches, {r['gpu_ms']:.2f} ms of GPU time",
                    "", "| kernel | GPU µs | launches |", "| --- | --- | --- |"]
            out += [f"| `{k['name']}` | {k['gpu_us']:.1f} | {k['launches']} |"
                    for k in r["top_kernels"]]
            continue
        if "top_kernels" not in r:
            continue
        out += ["", f"Top kernels by GPU time, {r['case']}:", "",
                "| kernel | GPU µs/step | launches/step |", "| --- | --- | --- |"]
        for k in r["top_kernels"]:
            out.append(f"| `{k['name']}` | {k['gpu_us_per_step']:.1f} | "
                       f"{k['launches_per_step']:.1f} |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kevin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("cases", nargs="+")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    root = tempfile.mkdtemp(prefix="kevin-profile-")
    kevin = os.path.abspath(a.kevin)
    results = []
    for case in a.cases:
        kind, shape, dtype, batch, rest = case.split(":", 4)
        print(f"{case}", flush=True)
        if kind == "ncu":
            n, skip, count = (int(x) for x in rest.split(":"))
            r = ncu_case(kevin, root, shape, dtype, int(batch), n, skip, count)
        elif kind == "gen":
            r = gen_case(kevin, root, shape, dtype, int(batch), [int(x) for x in rest.split(",")])
        elif kind == "learner":
            r = learner_case(kevin, root, shape, dtype, int(batch), int(rest))
        else:
            raise SystemExit(f"{case}: kind must be gen or learner")
        results.append(r)
        # Written after every case, so a run cut short by its time limit keeps what it measured.
        with open(os.path.join(a.out, "profile.json"), "w") as f:
            json.dump({"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
                       "results": results}, f, indent=1)
        md = markdown(results, f"`{' '.join(sys.argv)}`, {time.strftime('%Y-%m-%d')}")
        with open(os.path.join(a.out, "profile.md"), "w") as f:
            f.write(md)
    print(md)


if __name__ == "__main__":
    main()
