#!/usr/bin/env python3
"""Run kevin's eager-baseline plans on a GPU: check them against PyTorch in float64 and time them
against PyTorch eager. Needs python3 with numpy, cupy and torch (CUDA); no cargo.

The plans come from the Rust lowering (src/baseline/):
    kevin tasks [--dir TASKS] baseline --plans DIR [--tasks a,b]
writes one JSON per task and preset plus kernels.cu (no GPU needed; the test
`KEVIN_BASELINE_DUMP_DIR=DIR cargo test -p kevin --lib baseline::tests::dump_plans` writes the
same for tasks/ and tests/data/baseline/). For every plan asked for, this script

  * compiles kernels.cu once with CuPy's NVRTC and allocates the plan's buffers with torch;
  * draws inputs with the task's PyTorch module (`get_inputs`, on the GPU), fills every other
    buffer with NaN (i64: its minimum), runs the plan twice (kernels through CuPy; GEMMs as
    torch.mm / bmm / mv on views of the plan's buffers, the cuBLAS calls PyTorch itself makes;
    convolutions as aten.convolution, the cuDNN calls PyTorch makes),
    and compares each output after each run with the module run in float64 (the task's
    tolerance; i64 exactly);
  * at the gpu preset, times the plan and the module in PyTorch eager (TF32 and reduced-precision
    GEMM reductions off on both sides; a non-contiguous
    output is made contiguous, as writing it into an output buffer would) with CUDA events around
    each call, L2 flushed before each, the two interleaved, median of --reps; and counts both
    sides' kernels with the PyTorch profiler (per-kernel GPU times go to --json).

Usage: python3 scripts/baseline_gpu.py DIR [--preset small|gpu|both] [--tasks a,b] [--reps 30]
                                           [--budget-s 4] [--time-only] [--json OUT]

--time-only skips the float64 comparison at the gpu preset (a task at KernelBench's sizes, whose
float64 convolutions would take minutes; the small preset still checks the same plan).
--budget-s caps each side's timed runs per task: a plan whose warm-up run takes longer than
budget / reps gets fewer repetitions (at least 3), and the count is reported.

Plans of other task folders (e.g. a `kevin tasks import-kernelbench` output): `kevin tasks --dir
FOLDER baseline --plans DIR` (or KEVIN_BASELINE_DUMP_TASKS=FOLDER next to KEVIN_BASELINE_DUMP_DIR).
benches/kernelbench-gpu.sh runs the whole KernelBench comparison with it.
"""

import argparse
import glob
import json
import os
import statistics
import sys
import time
import traceback

import numpy as np
import torch
import cupy
from torch.profiler import ProfilerActivity, profile

TORCH_DTYPE = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "i64": torch.int64}


class Plan:
    """An EagerPlan bound to torch buffers: a list of zero-argument launches."""

    def __init__(self, plan, module):
        self.buffers = [
            torch.empty(max(b["elems"], 1), dtype=TORCH_DTYPE[b["dtype"]], device="cuda") for b in plan["buffers"]
        ]
        self.calls, self.names = [], []
        for step in plan["steps"]:
            if "Kernel" in step:
                k = step["Kernel"]
                fn = module.get_function(k["kernel"])
                args = tuple(self.arg(a) for a in k["args"])
                grid, block = tuple(k["grid"]), tuple(k["block"])
                self.calls.append(lambda fn=fn, g=grid, b=block, a=args: fn(g, b, a))
                self.names.append(k["kernel"])
            elif "Conv" in step:
                self.calls.append(self.conv(step["Conv"]))
                self.names.append("conv")
            elif "BatchNorm" in step:
                self.calls.append(self.batch_norm(step["BatchNorm"]))
                self.names.append("batch_norm")
            else:
                self.calls.append(self.gemm(step["Gemm"]))
                self.names.append("gemm")

    def arg(self, a):
        ((kind, v),) = a.items()
        if kind == "Buffer":
            return np.uint64(self.buffers[v].data_ptr())
        return {"I32": np.int32, "I64": np.int64, "F32": np.float32}[kind](v)

    def gemm(self, g):
        A, B, C = self.buffers[g["a"]], self.buffers[g["b"]], self.buffers[g["c"]]
        m, n, k, bt = g["m"], g["n"], g["k"], g["batch"]
        a = A.as_strided((bt, m, k), (g["stride_a"], 1, m) if g["trans_a"] else (g["stride_a"], k, 1))
        b = B.as_strided((bt, k, n), (g["stride_b"], 1, k) if g["trans_b"] else (g["stride_b"], n, 1))
        c = C.as_strided((bt, m, n), (g["stride_c"], n, 1))
        if bt == 1 and n == 1:
            return lambda: torch.mv(a[0], b[0, :, 0], out=c[0, :, 0])
        if bt == 1:
            return lambda: torch.mm(a[0], b[0], out=c[0])
        return lambda: torch.bmm(a, b, out=c)

    def conv(self, c):
        """A convolution step as PyTorch eager runs it (cuDNN), written into the plan's y."""
        n, ch, f, g = c["n"], c["c"], c["f"], c["groups"]
        sp, k, out = c["spatial"], c["kernel"], c["out"]

        def view(i, shape):
            return self.buffers[i][: int(np.prod(shape))].view(*shape)

        x = view(c["x"], [n, ch, *sp])
        wshape = [ch, f // g, *k] if c["transposed"] else [f, ch // g, *k]
        w = view(c["w"], wshape)
        b = None if c["bias"] is None else view(c["bias"], [f])
        y = view(c["y"], [n, f, *out])
        opad = [0] * len(sp)
        if c["transposed"]:
            opad = [
                o - ((i - 1) * s - 2 * p + d * (kk - 1) + 1)
                for o, i, s, p, d, kk in zip(out, sp, c["stride"], c["padding"], c["dilation"], k)
            ]
        args = (x, w, b, c["stride"], c["padding"], c["dilation"], c["transposed"], opad, g)
        conv_out = getattr(torch.ops.aten.convolution, "out", None)
        if conv_out is not None:
            return lambda: conv_out(*args, out=y)
        return lambda: y.copy_(torch.ops.aten.convolution(*args))

    def batch_norm(self, b):
        """A training-mode batch norm as PyTorch eager runs it (cuDNN for these), into the plan's y."""
        n, c, sp = b["n"], b["c"], b["s"]

        def view(i, shape):
            return self.buffers[i][: int(np.prod(shape))].view(*shape)

        x, y = view(b["x"], [n, c, sp, 1]), view(b["y"], [n, c, sp, 1])
        w, bias = view(b["w"], [c]), view(b["b"], [c])
        return lambda: y.copy_(torch.batch_norm(x, w, bias, None, None, True, 0.1, b["eps"], True))

    def run(self):
        for c in self.calls:
            c()


def poison(bufs):
    for b in bufs:
        b.fill_(float("nan") if b.is_floating_point() else -(2**63))


def compare(got, want, tol):
    """(number of bad elements, first bad index, worst |err| / allowed)."""
    got = got.reshape(-1)
    want = want.reshape(-1).to(got.device)
    if not got.is_floating_point():
        bad = got != want
        worst = float(bad.any())
    else:
        g, w = got.double(), want.double()
        allowed = tol["atol"] + tol["rtol"] * w.abs()
        err = (g - w).abs()
        bad = ~(err <= allowed)  # NaN counts as bad
        worst = float(torch.nan_to_num(err / allowed, nan=float("inf")).max())
    n_bad = int(bad.sum())
    first = int(bad.nonzero()[0, 0]) if n_bad else -1
    return n_bad, first, worst


def kernels_of(fn):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    evs = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [(e.name[:90], e.time_range.elapsed_us()) for e in evs]


def run_one(spec, module, flush, reps, budget_s, time_only):
    torch.manual_seed(0)
    ns = {}
    exec(compile(spec["module"], spec["task"], "exec"), ns)
    model, get_inputs = ns["Model"](), ns["get_inputs"]
    torch.set_default_device("cuda")
    try:
        inputs = get_inputs()
    finally:
        torch.set_default_device(None)
    plan = Plan(spec["plan"], module)
    n_in = spec["inputs"]
    for buf, x in zip(plan.buffers, inputs):
        buf.copy_(x.reshape(-1))
    check = not (time_only and spec["preset"] == "gpu")
    ref = refs = None
    if check:
        with torch.no_grad():
            ref = model(*[x.double() if x.is_floating_point() else x for x in inputs])
        refs = list(ref) if isinstance(ref, tuple) else [ref]
    res = {"task": spec["task"], "preset": spec["preset"], "launches": len(plan.calls), "outputs": {}}
    ok = True
    for attempt in range(2 if check else 0):
        poison(plan.buffers[n_in:])
        plan.run()
        torch.cuda.synchronize()
        for j, name in enumerate(spec["outputs"]):
            n_bad, first, worst = compare(plan.buffers[n_in + j], refs[j], spec["tolerance"])
            prev = res["outputs"].get(name, {"bad": 0, "worst": 0.0})
            res["outputs"][name] = {"bad": max(prev["bad"], n_bad), "worst": max(prev["worst"], worst)}
            if n_bad:
                ok = False
                got = float(plan.buffers[n_in + j].reshape(-1)[first])
                want = float(refs[j].reshape(-1)[first])
                res["outputs"][name]["first"] = f"run {attempt + 1} [{first}] got {got} want {want}"
    res["ok"] = ok
    if spec["preset"] == "gpu":

        def eager():
            out = model(*inputs)
            for o in out if isinstance(out, tuple) else (out,):
                if not o.is_contiguous():
                    o.contiguous()

        def timed(fn):
            flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            return s.elapsed_time(e)

        with torch.no_grad():
            slowest = 0.0
            for _ in range(3):
                slowest = max(slowest, timed(plan.run), timed(eager))
            n = max(3, min(reps, int(budget_s * 1e3 / max(slowest, 1e-3))))
            res["reps"] = n
            tk, tt = [], []
            for _ in range(n):
                tk.append(timed(plan.run))
                tt.append(timed(eager))
            res["kevin_ms"], res["torch_ms"] = statistics.median(tk), statistics.median(tt)
            res["kevin_iqr"] = float(np.subtract(*np.percentile(tk, [75, 25])))
            res["torch_iqr"] = float(np.subtract(*np.percentile(tt, [75, 25])))
            res["kevin_kernels"] = kernels_of(plan.run)
            res["torch_kernels"] = kernels_of(eager)
    del plan, inputs, ref, refs
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--preset", default="both", choices=["small", "gpu", "both"])
    ap.add_argument("--tasks", default="")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--budget-s", type=float, default=4.0)
    ap.add_argument("--time-only", action="store_true")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    # GEMMs accumulate in f32 (no TF32, no reduced-precision split-K), as the plan's Gemm says;
    # the same flags hold for the PyTorch side.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    presets = ["small", "gpu"] if args.preset == "both" else [args.preset]
    wanted = set(t for t in args.tasks.split(",") if t)
    specs = []
    for path in sorted(glob.glob(os.path.join(args.dir, "*.json"))):
        spec = json.load(open(path))
        if spec["preset"] in presets and (not wanted or spec["task"] in wanted):
            specs.append(spec)
    t0 = time.time()
    source = open(os.path.join(args.dir, "kernels.cu")).read()
    module = cupy.RawModule(code=source, options=("--std=c++17",))
    module.compile()
    print(f"kernels.cu compiled by CuPy/NVRTC in {time.time() - t0:.1f} s; {len(specs)} plans", flush=True)
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")  # > 2x the H200's 60 MB L2
    results = []
    for spec in specs:
        try:
            r = run_one(spec, module, flush, args.reps, args.budget_s, args.time_only)
        except Exception:
            r = {"task": spec["task"], "preset": spec["preset"], "ok": False, "error": traceback.format_exc()}
        results.append(r)
        line = f"{'PASS' if r['ok'] else 'FAIL'}  {r['task']:28} {r['preset']:5}"
        if "error" in r:
            line += "  " + r["error"].strip().splitlines()[-1]
        else:
            worst = max((o["worst"] for o in r["outputs"].values()), default=float("nan"))
            line += f"  err/tol {worst:6.3f}"
            for name, o in r["outputs"].items():
                if "first" in o:
                    line += f"  {name}: {o['bad']} bad, first {o['first']}"
            if "kevin_ms" in r:
                ratio = r["kevin_ms"] / r["torch_ms"]
                line += (
                    f"  kevin {r['kevin_ms']:.4f} ms ({r['launches']}/{len(r['kevin_kernels'])} k)"
                    f"  torch {r['torch_ms']:.4f} ms ({len(r['torch_kernels'])} k)  kevin/torch {ratio:.2f}"
                )
        print(line, flush=True)
        if args.json:  # rewritten after every task, so a run cut short keeps what it measured
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results},
                      open(args.json, "w"), indent=1)
    timed = [r for r in results if "kevin_ms" in r]
    if timed:
        ratios = [r["kevin_ms"] / r["torch_ms"] for r in timed]
        within = sum(0.85 <= q <= 1.15 for q in ratios)
        print(f"{sum(r['ok'] for r in results)}/{len(results)} plans pass; timed {len(timed)}: "
              f"{within} within +-15% of torch eager; median kevin/torch {statistics.median(ratios):.3f}, "
              f"geomean {float(np.exp(np.mean(np.log(ratios)))):.3f}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
