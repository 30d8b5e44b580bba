#!/usr/bin/env python3
"""Torch eager, side by side with kevin's GPU baseline (issue 4's fidelity and latency figures).

Needs python3 with torch (CUDA) and a GPU; no cargo. It

  * reads the task suite from `kevin tasks --json` (each task's KernelBench-style PyTorch module at
    the GPU preset), builds the module and its inputs on the GPU in the task's dtypes (TF32 off, as
    kevin's baseline), and times `forward` with CUDA events around each call, the L2 flushed before
    each of 50 timed calls (after 5 warm-up calls): the median, as kevin reports its baseline;
  * builds one trivial extension with torch.utils.cpp_extension.load_inline and times it (the cost
    a KernelBench-style harness pays per candidate, to compare with NVRTC + module load);
  * with --kevin-json EVAL.json (from `kevin eval --backend cuda --json`), prints per task kevin's
    baseline ms / torch eager ms and flags the tasks outside +-15%.

Usage (on the GPU machine):
  ./kevin tasks --json > /tmp/tasks.json
  python3 benches/torch_eager.py --tasks-json /tmp/tasks.json --kevin-json /tmp/eval.json \
      --out /tmp/torch.json [--no-inline]
"""

import argparse
import json
import statistics
import sys
import time


def time_task(torch, task, reps, warmup, flush):
    ns = {}
    exec(compile(task["torch_gpu"], task["name"], "exec"), ns)
    torch.manual_seed(0)
    model = ns["Model"](*ns["get_init_inputs"]()).cuda()
    inputs = [x.cuda() if hasattr(x, "cuda") else x for x in ns["get_inputs"]()]
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    times = []
    with torch.no_grad():
        for i in range(warmup + reps):
            flush.add_(1)  # write > 2x L2: a cold cache, as kevin's timer
            start.record()
            out = model(*inputs)
            # A view (a transpose) costs torch nothing, but kevin's baseline must write the output
            # buffer: make non-contiguous outputs contiguous, as writing them out would.
            for o in out if isinstance(out, (tuple, list)) else [out]:
                if hasattr(o, "is_contiguous") and not o.is_contiguous():
                    o.contiguous()
            end.record()
            end.synchronize()
            if i >= warmup:
                times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_load_inline(torch):
    from torch.utils.cpp_extension import load_inline

    cuda_src = """
    __global__ void add_one(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }
    void launch(torch::Tensor x) { add_one<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), x.numel()); }
    """
    cpp_src = "void launch(torch::Tensor x);"
    t0 = time.time()
    mod = load_inline(
        name=f"kevin_trivial_{int(t0)}",
        cpp_sources=cpp_src,
        cuda_sources=cuda_src,
        functions=["launch"],
        verbose=False,
    )
    x = torch.zeros(1024, device="cuda")
    mod.launch(x)
    torch.cuda.synchronize()
    return time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks-json", required=True, help="output of `kevin tasks --json`")
    ap.add_argument("--kevin-json", help="output of `kevin eval --backend cuda --json` to compare with")
    ap.add_argument("--out", help="write the figures here as JSON")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-inline", action="store_true", help="skip the load_inline timing")
    ap.add_argument("--only", nargs="*", help="only these tasks")
    args = ap.parse_args()

    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(max(2 * l2 // 4, 1 << 20), dtype=torch.float32, device="cuda")

    tasks = json.load(open(args.tasks_json))
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "tasks": {}}
    for t in tasks:
        if args.only and t["name"] not in args.only:
            continue
        if not t.get("torch_gpu"):
            continue
        try:
            ms = time_task(torch, t, args.reps, args.warmup, flush)
            out["tasks"][t["name"]] = {"torch_eager_ms": ms, "level": t["level"]}
        except Exception as e:  # one task's failure must not hide the others
            out["tasks"][t["name"]] = {"error": f"{type(e).__name__}: {e}"}
        torch.cuda.empty_cache()
    if not args.no_inline:
        try:
            out["load_inline_s"] = time_load_inline(torch)
        except Exception as e:
            out["load_inline_error"] = f"{type(e).__name__}: {e}"

    rows = []
    if args.kevin_json:
        kevin = {r["task"]: r for r in json.load(open(args.kevin_json))["results"]}
        for name, tt in sorted(out["tasks"].items()):
            k = kevin.get(name, {}).get("outcome", {})
            base = k.get("baseline_ms")
            if base is None or "torch_eager_ms" not in tt:
                continue
            ratio = base / tt["torch_eager_ms"]
            tt["kevin_baseline_ms"] = base
            tt["ratio"] = ratio
            rows.append((name, base, tt["torch_eager_ms"], ratio))
        ratios = [r[3] for r in rows]
        if ratios:
            inside = sum(1 for r in ratios if 0.85 <= r <= 1.15)
            out["fidelity"] = {
                "tasks": len(ratios),
                "within_15pct": inside,
                "median_ratio": statistics.median(ratios),
                "geomean_ratio": statistics.geometric_mean(ratios),
            }
    if args.out:
        json.dump(out, open(args.out, "w"), indent=1)
    print(f"{'task':30} {'kevin ms':>10} {'torch ms':>10} {'ratio':>7}")
    for name, base, tms, ratio in rows:
        flag = "" if 0.85 <= ratio <= 1.15 else "  <-- outside +-15%"
        print(f"{name:30} {base:10.4f} {tms:10.4f} {ratio:7.3f}{flag}")
    for name, tt in sorted(out["tasks"].items()):
        if "error" in tt:
            print(f"{name:30} torch error: {tt['error']}")
    if "fidelity" in out:
        f = out["fidelity"]
        print(f"fidelity: {f['within_15pct']}/{f['tasks']} within +-15%, median ratio {f['median_ratio']:.3f}, geomean {f['geomean_ratio']:.3f}")
    if "load_inline_s" in out:
        print(f"load_inline (one trivial extension): {out['load_inline_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
