"""Cross-check `kevin tasks import-kernelbench` against PyTorch running the original problems.

    kevin tasks import-kernelbench KernelBench/ --out /tmp/kb
    python3 scripts/kernelbench_crosscheck.py --src KernelBench/ --tasks /tmp/kb \
        [--kevin target/release/kevin] [--json out.json]

For every imported task (its description names the problem file), kevin writes the task's
small-preset inputs and fp64 reference (`kevin tasks dump`). The original file is run with its
size constants set to the small preset: `Model(*get_init_inputs())` in float64, its parameters
set from kevin's inputs (`<layer>_weight` / `<layer>_bias` of a linear layer, `<name>` of an
nn.Parameter), `forward` on kevin's inputs in get_inputs()'s order. The output must match kevin's
reference within the task's tolerance (index outputs exactly). Needs torch (CPU is enough).
"""
import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True, help="KernelBench's folder (with level1/, level2/)")
    ap.add_argument("--tasks", required=True, help="the folder import-kernelbench wrote")
    ap.add_argument("--kevin", default="target/release/kevin")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    names = sorted(f[:-5] for f in os.listdir(args.tasks) if f.endswith(".toml"))
    for name in names:
        with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
            subprocess.run(
                [args.kevin, "tasks", "--dir", args.tasks, "dump", name, "--out", tmp.name],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            d = json.load(open(tmp.name))
        origin = d["description"].split(":")[0].removeprefix("KernelBench ").strip()
        try:
            err, ok = check(os.path.join(args.src, origin), d)
            why = "" if ok else f"max error {err:.3g} over the tolerance"
        except Exception as e:  # noqa: BLE001 - any failure is a row of the report
            ok, err, why = False, float("nan"), f"{type(e).__name__}: {e}"
        rows.append({"task": name, "file": origin, "ok": ok, "max_err": err, "why": why})
        print(f"{'ok ' if ok else 'BAD'}  {name:<60} {why}")
    bad = sum(not r["ok"] for r in rows)
    print(f"checked {len(rows)} imported problems against PyTorch: {len(rows) - bad} agree, {bad} do not")
    if args.json:
        json.dump({"torch": torch.__version__, "rows": rows}, open(args.json, "w"), indent=1)
    sys.exit(1 if bad else 0)


def at_sizes(value, name, sizes):
    """A module-level assignment's value with kevin's sizes put in: `name` itself, or `name_i` for
    the i-th item of a tuple (the importer's names), so values derived from them follow."""
    if isinstance(value, (ast.Tuple, ast.List)):
        if len(value.elts) == 1:
            value.elts = [at_sizes(value.elts[0], name, sizes)]
        else:
            value.elts = [at_sizes(e, f"{name}_{i}", sizes) for i, e in enumerate(value.elts)]
        return value
    return ast.Constant(sizes[name]) if name in sizes else value


def load(path, sizes):
    """Runs the problem file with its size constants at kevin's values, set where they are
    assigned, so that constants computed from them (`bias_shape = (out_channels, 1, 1)`) agree."""
    tree = ast.parse(open(path).read(), path)
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    node.value = at_sizes(node.value, t.id, sizes)
                elif isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    # D, H, W = 16, 32, 32
                    node.value.elts = [
                        at_sizes(v, n.id, sizes) if isinstance(n, ast.Name) else v
                        for n, v in zip(t.elts, node.value.elts)
                    ]
    ast.fix_missing_locations(tree)
    ns = {"__name__": "kernelbench_problem"}
    exec(compile(tree, path, "exec"), ns)
    return ns


def parameter(params, name):
    """The model's parameter for kevin's input `name`: an nn.Parameter of that name, or
    `<layer>_<weight|bias>`; the importer adds `_<n>` to a name that a size already takes."""
    candidates = [name]
    base, _, n = name.rpartition("_")
    if base and n.isdigit():
        candidates.append(base)
    for c in candidates:
        if c in params:
            return params[c]
        layer, _, which = c.rpartition("_")
        if f"{layer}.{which}" in params:
            return params[f"{layer}.{which}"]
    raise KeyError(f"no parameter of the model for kevin's input {name}")


def check(path, d):
    ns = load(path, d["sizes"])
    torch.manual_seed(0)
    model = ns["Model"](*ns["get_init_inputs"]()).double()
    theirs = ns["get_inputs"]()
    # An i64 input (labels, indices) stays integers, as get_inputs() draws it.
    dtype = lambda t: torch.int64 if t.get("dtype") == "i64" else torch.float64  # noqa: E731
    ins = {t["name"]: torch.tensor(t["data"], dtype=dtype(t)).reshape(t["shape"]) for t in d["inputs"]}
    order = [t["name"] for t in d["inputs"]]
    # forward's tensors are kevin's first inputs, in order; numbers stay as get_inputs() gives them.
    args, k = [], 0
    for v in theirs:
        if isinstance(v, torch.Tensor):
            args.append(ins[order[k]])
            k += 1
        else:
            args.append(v)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n in order[k:]:
            parameter(params, n).copy_(ins[n])
        out = model(*args)
    ref = d["outputs"][0]
    want = torch.tensor(ref["data"], dtype=torch.float64).reshape(ref["shape"])
    got = out.to(torch.float64)
    if tuple(got.shape) != tuple(want.shape):
        raise ValueError(f"shape {tuple(out.shape)} against kevin's {tuple(want.shape)}")
    if ref["dtype"] == "i64":
        return float((got != want).sum()), bool((got == want).all())
    tol = d["tolerance"]
    excess = (got - want).abs() - (tol["atol"] + tol["rtol"] * want.abs())
    return float((got - want).abs().max()), bool((excess <= 0).all())


if __name__ == "__main__":
    main()
