#!/usr/bin/env python3
"""Peak device memory: kevin's GPU harness against torch eager on the same ops and sizes
(issue 17, item 5: within 3x on three large tasks).

Needs python3 with torch (CUDA) and a GPU; no cargo. For each task of `kevin tasks --json`
(by default the KernelBench-size tasks of benches/data/large-tasks) it builds the task's
KernelBench-style PyTorch module at the GPU preset, and measures torch eager's peak with
torch.cuda.max_memory_allocated over creating the inputs and one forward call (inputs, outputs,
intermediates and cuBLAS's workspace: what a KernelBench-style harness holds at least). kevin's
figure is the most memory one evaluation request took in a cuda worker (its memory pool's
high-water mark, harness buffers, the worker's own and the candidate's scratch), printed by
`kevin eval` and written to its --json as device_memory_peak_bytes: run one `kevin eval` per task
so each figure is that task's. The task's computed need (`kevin tasks --json`,
device_memory.gpu.peak_bytes, what the cuda environment's admission checks) is shown too.

Usage (on the GPU machine, from the repository root):
  D=benches/data/large-tasks
  ./kevin tasks --dir $D --json > /tmp/large.json
  for t in relu_large softmax_large matmul_large; do
    ./kevin eval --backend cuda --dir $D --kernels $D/solutions --tasks $t --json /tmp/eval-$t.json
  done
  python3 benches/harness_memory.py --tasks-json /tmp/large.json --kevin-json /tmp/eval-*.json \
      --out benches/results/harness-memory-h200.md
"""

import argparse
import gc
import json
import sys

GIB = float(1 << 30)


def torch_peak(torch, task):
    ns = {}
    exec(compile(task["torch_gpu"], task["name"], "exec"), ns)
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    with torch.no_grad():
        model = ns["Model"](*ns["get_init_inputs"]()).cuda()
        inputs = [x.cuda() if hasattr(x, "cuda") else x for x in ns["get_inputs"]()]
        out = model(*inputs)
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out, inputs, model
    gc.collect()
    torch.cuda.empty_cache()
    return peak


def kevin_peaks(paths):
    """task -> harness peak bytes, from `kevin eval --json` files (one task per file)."""
    peaks = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        peak = data.get("device_memory_peak_bytes")
        tasks = [r["task"] for r in data.get("results", [])]
        if peak is None or len(tasks) != 1:
            sys.exit(f"{path}: want one task and device_memory_peak_bytes (a cuda `kevin eval --tasks T`)")
        outcome = data["results"][0]["outcome"]["kind"]
        peaks[tasks[0]] = (peak, outcome)
    return peaks


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks-json", required=True, help="`kevin tasks --dir D --json` output")
    ap.add_argument("--kevin-json", nargs="*", default=[], help="`kevin eval --json` files, one task each")
    ap.add_argument("--out", help="also write the table (markdown) here")
    ap.add_argument("--max-ratio", type=float, default=3.0, help="fail when kevin/torch exceeds this")
    args = ap.parse_args()

    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    with open(args.tasks_json) as f:
        tasks = json.load(f)
    kevin = kevin_peaks(args.kevin_json)
    rows, worst = [], 0.0
    for task in tasks:
        name = task["name"]
        t = torch_peak(torch, task)
        need = task.get("device_memory", {}).get("gpu", {}).get("peak_bytes")
        k, outcome = kevin.get(name, (None, None))
        ratio = k / t if k else None
        if ratio:
            worst = max(worst, ratio)
        rows.append((name, t, k, outcome, need, ratio))
        print(f"{name}: torch {t / GIB:.2f} GiB, kevin {k / GIB if k else float('nan'):.2f} GiB ({outcome}), "
              f"need {need / GIB if need else float('nan'):.2f} GiB, ratio {ratio if ratio else float('nan'):.2f}",
              flush=True)
    dev = torch.cuda.get_device_name(0)
    lines = [
        f"# Harness peak device memory vs torch eager ({dev})",
        "",
        "kevin: the cuda worker's memory-pool high-water mark over one request (`kevin eval`'s "
        "device_memory_peak_bytes); torch: torch.cuda.max_memory_allocated over the inputs and one "
        "forward; need: `kevin tasks`' computed peak (admission, includes the largest scratch a "
        "candidate may ask for and the worker's fixed 256 MiB).",
        "",
        "| task | torch eager GiB | kevin harness GiB | outcome | computed need GiB | kevin / torch |",
        "| --- | ---: | ---: | --- | ---: | ---: |",
    ]
    for name, t, k, outcome, need, ratio in rows:
        fmt = lambda b: f"{b / GIB:.2f}" if b else "-"
        lines.append(f"| {name} | {fmt(t)} | {fmt(k)} | {outcome or '-'} | {fmt(need)} | "
                     f"{f'{ratio:.2f}x' if ratio else '-'} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)
    if kevin and worst > args.max_ratio:
        sys.exit(f"kevin's harness peak is {worst:.2f}x torch eager's (limit {args.max_ratio}x)")


if __name__ == "__main__":
    main()
