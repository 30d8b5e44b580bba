"""Cross-check kevin's PyTorch rendering and fp64 interpreter against PyTorch.

    KEVIN_XCHECK_DIR=/tmp/xcheck cargo test -p kevin --lib dump_cross_check -- --ignored
    python3 scripts/torch_xcheck.py /tmp/xcheck

Runs every rendered Model in float64 on the task's small-preset inputs and compares with the
interpreter's outputs (relative error < 1e-9). Needs torch.
"""
import glob
import json
import sys

import torch

bad = 0
files = sorted(glob.glob(f"{sys.argv[1]}/*.json"))
for f in files:
    d = json.load(open(f))
    ns = {}
    exec(d["module"], ns)
    ns["get_inputs"]()  # the rendered get_inputs must run too
    n_in = len(d["inputs"])
    xs = [torch.tensor(v, dtype=torch.float64).reshape(s) for v, s in zip(d["inputs"], d["shapes"])]
    with torch.no_grad():
        out = ns["Model"]()(*xs)
    out = out if isinstance(out, tuple) else (out,)
    for o, ref, s in zip(out, d["outputs"], d["shapes"][n_in:]):
        r = torch.tensor(ref, dtype=torch.float64).reshape(s)
        err = ((o.to(torch.float64) - r).abs() / (1 + r.abs())).max().item()
        if tuple(o.shape) != tuple(s) or not err < 1e-9:
            bad += 1
            print("MISMATCH", f, tuple(o.shape), tuple(s), err)
print(f"checked {len(files)} tasks, {bad} mismatches")
sys.exit(1 if bad else 0)
