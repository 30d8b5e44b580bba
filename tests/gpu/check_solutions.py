#!/usr/bin/env python3
"""Check kevin's reference solutions (tasks/solutions/<task>.cu) on a GPU, without cargo.

Needs python3 with numpy, cupy and torch (CUDA), and a GPU. For every task asked for (default: every
task that has a solution file), at the small and the GPU preset, it

  * generates random inputs with numpy from the task's input distributions, rounded to their dtype;
  * computes the reference in float64 with torch by interpreting the task's op-language program
    (a small recursive-descent parser mirroring src/ops; every built-in of the op language);
  * compiles the .cu with cupy.RawModule (--std=c++17 --device-as-default-execution-space, the
    launched kernels as name expressions), allocates NaN-filled outputs and scratch buffers,
    evaluates the `// kevin:` launch expressions and launches every kernel with scalars typed as
    the __global__ signature declares them;
  * runs the launch sequence twice on the same buffers, checks the outputs against the reference
    (|got - want| <= atol + rtol*|want|, i64 exactly, NaN/Inf where the reference is finite fails)
    after each run, and checks that inputs are unmodified;
  * at the GPU preset, times the launch sequence with CUDA events (L2 flushed before each rep) and
    the same program run op by op in torch eager in the task's dtypes (TF32 off), and prints both.

One line per task and preset: PASS/FAIL (first mismatch) and times. Each task runs in its own
child process by default (--no-isolate to run in-process), so a crash or sticky CUDA error in one
task cannot stop the others. A JSON summary goes to --json PATH.

Usage:
  python3 tests/gpu/check_solutions.py                       # all tasks with a solution, both presets
  python3 tests/gpu/check_solutions.py relu matmul --preset small --trials 5
  python3 tests/gpu/check_solutions.py --level 1 --json /tmp/l1.json
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
import traceback

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TASKS_DIR = os.path.join(ROOT, "tasks")
SOL_DIR = os.path.join(TASKS_DIR, "solutions")


def load_toml(path):
    try:
        import tomllib  # python >= 3.11

        with open(path, "rb") as f:
            return tomllib.load(f)
    except ImportError:
        pass
    try:
        import tomli

        with open(path, "rb") as f:
            return tomli.load(f)
    except ImportError:
        import toml

        with open(path) as f:
            return toml.load(f)


# ============================================================================================
# Op language: lexer, parser (mirrors src/ops/parse.rs), interpreter over torch tensors.

TOKEN_RE = re.compile(
    r"\s*(?:(?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z_][A-Za-z_0-9]*)|(?P<sym>[()\[\],:=+\-*/@]))"
)


def lex_line(line):
    toks, pos = [], 0
    line = line.split("#", 1)[0]
    while pos < len(line):
        if line[pos:].strip() == "":
            break
        m = TOKEN_RE.match(line, pos)
        if not m:
            raise ValueError(f"cannot lex {line[pos:]!r}")
        pos = m.end()
        if m.group("num") is not None:
            toks.append(("num", float(m.group("num"))))
        elif m.group("name") is not None:
            toks.append(("name", m.group("name")))
        else:
            toks.append(("sym", m.group("sym")))
    return toks


def logical_lines(src):
    """Joins lines while parentheses/brackets are open (newlines inside () or [] are ignored)."""
    out, cur, depth = [], "", 0
    for raw in src.split("\n"):
        line = raw.split("#", 1)[0]
        cur += " " + line
        depth += line.count("(") + line.count("[") - line.count(")") - line.count("]")
        if depth <= 0:
            if cur.strip():
                out.append(cur.strip())
            cur, depth = "", 0
    if cur.strip():
        out.append(cur.strip())
    return out


class Parser:
    def __init__(self, toks):
        self.t, self.i = toks, 0

    def peek(self, k=0):
        return self.t[self.i + k] if self.i + k < len(self.t) else (None, None)

    def eat(self, kind, val=None):
        k, v = self.peek()
        if k == kind and (val is None or v == val):
            self.i += 1
            return v
        return None

    def need(self, kind, val=None):
        v = self.eat(kind, val)
        if v is None:
            raise ValueError(f"expected {val or kind}, got {self.peek()}")
        return v

    def expr(self):
        e = self.term()
        while True:
            if self.eat("sym", "+") is not None:
                e = ("bin", "+", e, self.term())
            elif self.eat("sym", "-") is not None:
                e = ("bin", "-", e, self.term())
            else:
                return e

    def term(self):
        e = self.unary()
        while True:
            k, v = self.peek()
            if k == "sym" and v in ("*", "/", "@"):
                self.i += 1
                e = ("bin", v, e, self.unary())
            else:
                return e

    def unary(self):
        if self.eat("sym", "-") is not None:
            return ("neg", self.unary())
        return self.atom()

    def atom(self):
        k, v = self.peek()
        if k == "num":
            self.i += 1
            return ("num", v)
        if k == "name":
            self.i += 1
            if self.eat("sym", "(") is not None:
                args, kwargs = [], {}
                if self.eat("sym", ")") is None:
                    while True:
                        if self.peek()[0] == "name" and self.peek(1) == ("sym", "="):
                            name = self.need("name")
                            self.need("sym", "=")
                            kwargs[name] = self.expr()
                        else:
                            args.append(self.expr())
                        if self.eat("sym", ",") is None:
                            break
                    self.need("sym", ")")
                return ("call", v, args, kwargs)
            return ("var", v)
        if self.eat("sym", "(") is not None:
            e = self.expr()
            self.need("sym", ")")
            return e
        raise ValueError(f"unexpected token {self.peek()}")


def parse_program(src):
    prog = {"inputs": [], "outputs": [], "consts": {}, "stmts": []}
    for line in logical_lines(src):
        toks = lex_line(line)
        p = Parser(toks)
        if toks[0] == ("name", "input") or toks[0] == ("name", "output"):
            role = p.need("name")
            name = p.need("name")
            p.need("sym", ":")
            dtype = p.need("name")
            p.need("sym", "[")
            dims = []
            if p.eat("sym", "]") is None:
                while True:
                    k, v = p.peek()
                    p.i += 1
                    dims.append(int(v) if k == "num" else v)
                    if p.eat("sym", ",") is None:
                        break
                p.need("sym", "]")
            prog[role + "s"].append({"name": name, "dtype": dtype, "dims": dims})
        elif toks[0] == ("name", "const"):
            p.need("name")
            name = p.need("name")
            p.need("sym", "=")
            neg = p.eat("sym", "-") is not None
            val = p.need("num")
            prog["consts"][name] = -val if neg else val
        else:
            target = p.need("name")
            p.need("sym", "=")
            e = p.expr()
            if p.i != len(toks):
                raise ValueError(f"trailing tokens in {line!r}")
            prog["stmts"].append((target, e))
    return prog


UNARY = [
    "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "exp", "log", "abs", "neg", "sqrt",
    "rsqrt", "square", "softplus", "mish", "hardsigmoid", "hardswish",
]
REDUCE = ["sum", "mean", "max", "min", "prod", "argmax", "argmin", "logsumexp"]
# name -> [(param, kind, default)]; kind: T tensor, O optional tensor, F float, I int, B bool
PARAMS = {
    "leaky_relu": [("x", "T", None), ("slope", "F", 0.01)],
    "elu": [("x", "T", None), ("alpha", "F", 1.0)],
    "clamp": [("x", "T", None), ("lo", "F", None), ("hi", "F", None)],
    "hardtanh": [("x", "T", None), ("lo", "F", -1.0), ("hi", "F", 1.0)],
    "maximum": [("a", "T", None), ("b", "T", None)],
    "minimum": [("a", "T", None), ("b", "T", None)],
    "pow": [("a", "T", None), ("b", "T", None)],
    "softmax": [("x", "T", None), ("axis", "I", -1)],
    "log_softmax": [("x", "T", None), ("axis", "I", -1)],
    "cumsum": [("x", "T", None), ("axis", "I", -1)],
    "cumprod": [("x", "T", None), ("axis", "I", -1)],
    "l2norm": [("x", "T", None), ("axis", "I", -1), ("eps", "F", 1e-12)],
    "layer_norm": [("x", "T", None), ("weight", "O", None), ("bias", "O", None), ("eps", "F", 1e-5)],
    "rms_norm": [("x", "T", None), ("weight", "O", None), ("eps", "F", 1e-6)],
    "transpose": [("x", "T", None), ("a", "I", -2), ("b", "I", -1)],
}
for _u in UNARY:
    PARAMS[_u] = [("x", "T", None)]
for _r in REDUCE:
    PARAMS[_r] = [("x", "T", None), ("axis", "I", -1), ("keepdim", "B", False)]


class Interp:
    """Evaluates a parsed program with torch. exact=True: the fp64 reference (formulas of
    src/ops/kernels.rs); exact=False: what PyTorch eager would run (for timing)."""

    def __init__(self, prog, torch, exact):
        self.prog, self.torch, self.exact = prog, torch, exact
        self.F = torch.nn.functional

    def scalar(self, e):
        if e[0] == "num":
            return e[1]
        if e[0] == "neg":
            return -self.scalar(e[1])
        if e[0] == "var":
            if e[1] == "true":
                return True
            if e[1] == "false":
                return False
            if e[1] in self.prog["consts"]:
                return self.prog["consts"][e[1]]
        raise ValueError(f"not a scalar parameter: {e}")

    def run(self, env):
        env = dict(env)
        for target, e in self.prog["stmts"]:
            env[target] = self.ev(e, env)
        return {o["name"]: env[o["name"]] for o in self.prog["outputs"]}

    def as_tensor(self, v, like):
        if isinstance(v, (int, float)):
            return self.torch.tensor(float(v), dtype=like.dtype, device=like.device)
        return v

    def ev(self, e, env):
        torch, F = self.torch, self.F
        kind = e[0]
        if kind == "num":
            return e[1]
        if kind == "var":
            if e[1] in env:
                return env[e[1]]
            if e[1] in self.prog["consts"]:
                return self.prog["consts"][e[1]]
            raise ValueError(f"unknown name {e[1]}")
        if kind == "neg":
            return -self.ev(e[1], env)
        if kind == "bin":
            a, b = self.ev(e[2], env), self.ev(e[3], env)
            op = e[1]
            if op == "+":
                return a + b
            if op == "-":
                return a - b
            if op == "*":
                return a * b
            if op == "/":
                return a / b
            if op == "@":
                return torch.matmul(a, b)
        if kind == "call":
            return self.call(e[1], e[2], e[3], env)
        raise ValueError(f"bad expression {e}")

    def call(self, name, args, kwargs, env):
        torch, F, exact = self.torch, self.F, self.exact
        spec = PARAMS.get(name)
        if spec is None:
            raise ValueError(f"unknown function {name}")
        vals = {}
        for i, (p, k, d) in enumerate(spec):
            e = args[i] if i < len(args) else kwargs.get(p)
            if e is None:
                vals[p] = d
            elif k in ("T", "O"):
                vals[p] = self.ev(e, env)
            else:
                v = self.scalar(e)
                if k == "I":
                    if float(v) != int(v):
                        raise ValueError(f"parameter {p} of {name} must be an integer")
                    v = int(v)
                elif k == "F":
                    v = float(v)
                vals[p] = v
        x = vals.get("x")
        if name in UNARY:
            if name == "relu":
                return torch.clamp_min(x, 0.0)
            if name == "gelu":
                return F.gelu(x)
            if name == "gelu_tanh":
                return F.gelu(x, approximate="tanh")
            if name == "silu":
                return F.silu(x)
            if name == "sigmoid":
                return torch.sigmoid(x)
            if name == "tanh":
                return torch.tanh(x)
            if name == "exp":
                return torch.exp(x)
            if name == "log":
                return torch.log(x)
            if name == "abs":
                return torch.abs(x)
            if name == "neg":
                return -x
            if name == "sqrt":
                return torch.sqrt(x)
            if name == "rsqrt":
                return torch.rsqrt(x)
            if name == "square":
                return x * x
            if name == "softplus":
                if exact:
                    return torch.clamp_min(x, 0.0) + torch.log1p(torch.exp(-x.abs()))
                return F.softplus(x)
            if name == "mish":
                if exact:
                    return x * torch.tanh(torch.clamp_min(x, 0.0) + torch.log1p(torch.exp(-x.abs())))
                return F.mish(x)
            if name == "hardsigmoid":
                return F.hardsigmoid(x)
            if name == "hardswish":
                return F.hardswish(x)
        if name in REDUCE:
            ax, kd = vals["axis"], bool(vals["keepdim"])
            if name == "sum":
                return torch.sum(x, dim=ax, keepdim=kd)
            if name == "mean":
                return torch.mean(x, dim=ax, keepdim=kd)
            if name == "max":
                return torch.amax(x, dim=ax, keepdim=kd)
            if name == "min":
                return torch.amin(x, dim=ax, keepdim=kd)
            if name == "prod":
                return torch.prod(x, dim=ax, keepdim=kd)
            if name == "argmax":
                return torch.argmax(x, dim=ax, keepdim=kd)
            if name == "argmin":
                return torch.argmin(x, dim=ax, keepdim=kd)
            if name == "logsumexp":
                return torch.logsumexp(x, dim=ax, keepdim=kd)
        if name == "leaky_relu":
            return F.leaky_relu(x, vals["slope"])
        if name == "elu":
            return F.elu(x, vals["alpha"])
        if name in ("clamp", "hardtanh"):
            return torch.clamp(x, vals["lo"], vals["hi"])
        if name in ("maximum", "minimum", "pow"):
            a, b = vals["a"], vals["b"]
            if isinstance(a, (int, float)) and isinstance(b, (int, float)):
                raise ValueError(f"{name} of two scalars")
            like = a if not isinstance(a, (int, float)) else b
            a, b = self.as_tensor(a, like), self.as_tensor(b, like)
            return {"maximum": torch.maximum, "minimum": torch.minimum, "pow": torch.pow}[name](a, b)
        if name == "softmax":
            return torch.softmax(x, dim=vals["axis"])
        if name == "log_softmax":
            return torch.log_softmax(x, dim=vals["axis"])
        if name == "cumsum":
            return torch.cumsum(x, dim=vals["axis"])
        if name == "cumprod":
            return torch.cumprod(x, dim=vals["axis"])
        if name == "l2norm":
            return F.normalize(x, p=2.0, dim=vals["axis"], eps=vals["eps"])
        if name == "layer_norm":
            return F.layer_norm(x, (x.shape[-1],), vals["weight"], vals["bias"], vals["eps"])
        if name == "rms_norm":
            y = x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + vals["eps"])
            return y * vals["weight"] if vals["weight"] is not None else y
        if name == "transpose":
            return torch.transpose(x, vals["a"], vals["b"]).contiguous()
        raise ValueError(f"unhandled function {name}")


# ============================================================================================
# Size expressions of the candidate format: symbols, integers, + - * / %, cdiv(a, b), ().

EXPR_TOK = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z_0-9]*)|([-+*/%(),]))")


def eval_size_expr(s, sizes):
    toks, pos = [], 0
    s = s.strip()
    while pos < len(s):
        m = EXPR_TOK.match(s, pos)
        if not m or m.end() == pos:
            raise ValueError(f"bad size expression {s!r}")
        pos = m.end()
        if m.group(1):
            toks.append(("n", int(m.group(1))))
        elif m.group(2):
            toks.append(("id", m.group(2)))
        else:
            toks.append(("s", m.group(3)))
    i = [0]

    def peek():
        return toks[i[0]] if i[0] < len(toks) else (None, None)

    def eat(v):
        if peek() == ("s", v):
            i[0] += 1
            return True
        return False

    def tdiv(a, b):  # C-style truncating division, as in 64-bit integer arithmetic
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b > 0) else -q

    def expr():
        v = term()
        while True:
            if eat("+"):
                v += term()
            elif eat("-"):
                v -= term()
            else:
                return v

    def term():
        v = unary()
        while True:
            if eat("*"):
                v *= unary()
            elif eat("/"):
                v = tdiv(v, unary())
            elif eat("%"):
                d = unary()
                v = v - tdiv(v, d) * d
            else:
                return v

    def unary():
        if eat("-"):
            return -unary()
        k, v = peek()
        if k == "n":
            i[0] += 1
            return v
        if k == "id" and v == "cdiv":
            i[0] += 1
            if not eat("("):
                raise ValueError("cdiv needs (")
            a = expr()
            if not eat(","):
                raise ValueError("cdiv needs 2 arguments")
            b = expr()
            if not eat(")"):
                raise ValueError("cdiv needs )")
            return -((-a) // b)
        if k == "id":
            i[0] += 1
            if v not in sizes:
                raise ValueError(f"{v!r} is not a size symbol")
            return sizes[v]
        if eat("("):
            v = expr()
            if not eat(")"):
                raise ValueError("missing )")
            return v
        raise ValueError(f"unexpected {peek()} in {s!r}")

    v = expr()
    if i[0] != len(toks):
        raise ValueError(f"trailing tokens in {s!r}")
    return v


def split_top(s):
    out, cur, depth = [], "", 0
    for c in s:
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        if c == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += c
    if cur.strip():
        out.append(cur.strip())
    return out


def field(line, key):
    m = re.search(r"(?:^|\s)" + key + r"=", line)
    if not m:
        return None
    rest = line[m.end():]
    if rest.startswith("("):
        depth = 0
        for j, c in enumerate(rest):
            depth += c == "("
            depth -= c == ")"
            if depth == 0:
                return rest[1:j]
        raise ValueError(f"unbalanced {key}=(...)")
    return rest.split()[0] if rest.split() else ""


def parse_candidate(src):
    scratch, launches = [], []
    for raw in src.split("\n"):
        line = raw.strip()
        m = re.match(r"//\s*kevin:\s*(.*)$", line)
        if not m:
            continue
        rest = m.group(1).strip()
        if rest.startswith("scratch"):
            mm = re.match(r"scratch\s+(\w+)\s+(\w+)\s*\[(.*)\]\s*$", rest)
            if not mm:
                raise ValueError(f"bad scratch line: {raw}")
            scratch.append({"name": mm.group(1), "dtype": mm.group(2), "numel": mm.group(3)})
        elif rest.startswith("launch"):
            body = rest[len("launch"):].strip()
            kernel = body.split()[0]
            launches.append({
                "kernel": kernel,
                "grid": split_top(field(body, "grid")),
                "block": split_top(field(body, "block")),
                "smem": field(body, "smem") or "0",
                "args": split_top(field(body, "args")),
            })
        else:
            raise ValueError(f"unknown kevin: directive: {raw}")
    return scratch, launches


def strip_comments(src):
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def kernel_param_types(src, name):
    """['ptr' | 'i32' | 'u32' | 'i64' | 'f32' | 'f64'] for the parameters of __global__ NAME(...)."""
    code = strip_comments(src)
    for m in re.finditer(r"\b" + re.escape(name) + r"\s*\(", code):
        start_decl = max(code.rfind(";", 0, m.start()), code.rfind("}", 0, m.start()), code.rfind("{", 0, m.start()))
        if "__global__" not in code[start_decl + 1:m.start()]:
            continue
        depth, j = 1, m.end()
        while depth:
            depth += code[j] == "("
            depth -= code[j] == ")"
            j += 1
        inner = code[m.end():j - 1].strip()
        if inner in ("", "void"):
            return []
        types = []
        for p in split_top(inner):
            p = re.sub(r"\b(const|__restrict__|__restrict|volatile)\b", " ", p)
            if "*" in p:
                types.append("ptr")
            elif re.search(r"\b(long\s+long|long|size_t|int64_t|ptrdiff_t)\b", p):
                types.append("u64" if "unsigned" in p or "size_t" in p else "i64")
            elif "unsigned" in p or "uint32_t" in p:
                types.append("u32")
            elif re.search(r"\bdouble\b", p):
                types.append("f64")
            elif re.search(r"\bfloat\b", p):
                types.append("f32")
            elif re.search(r"\b(int|int32_t)\b", p):
                types.append("i32")
            else:
                raise ValueError(f"unsupported parameter type in {p!r}")
        return types
    raise ValueError(f"no __global__ function {name}")


# ============================================================================================
# One task at one preset.

DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "i64": "int64", "i32": "int32"}


def default_tol(dtypes):
    if any(d in ("f16", "bf16") for d in dtypes):
        return 1e-2, 1e-2
    return 1e-4, 1e-4


def gen_input(rng, np, dist, shape):
    n = int(np.prod(shape)) if shape else 1
    kind = dist.get("dist", "normal")
    if kind == "normal":
        x = rng.standard_normal(n, dtype=np.float32) * np.float32(dist.get("std", 1.0)) + np.float32(dist.get("mean", 0.0))
    elif kind == "uniform":
        x = rng.uniform(dist["lo"], dist["hi"], n).astype(np.float32)
    elif kind == "positive":
        x = np.float32(dist.get("min", 0.1)) + np.abs(rng.standard_normal(n, dtype=np.float32)) * np.float32(dist.get("std", 1.0))
    else:
        raise ValueError(f"unknown dist {kind}")
    return x.reshape(shape)


class TaskRun:
    def __init__(self, task, cp, torch, np):
        self.task, self.cp, self.torch, self.np = task, cp, torch, np
        self.prog = parse_program(task["program"])
        with open(os.path.join(SOL_DIR, task["name"] + ".cu")) as f:
            self.src = f.read()
        self.scratch, self.launches = parse_candidate(self.src)
        names = []
        for l in self.launches:
            if l["kernel"] not in names:
                names.append(l["kernel"])
        self.module = cp.RawModule(code=self.src, options=("--std=c++17", "--device-as-default-execution-space"),
                                   name_expressions=names)
        self.kernels = {n: self.module.get_function(n) for n in names}
        self.ptypes = {n: kernel_param_types(self.src, n) for n in names}
        dts = [d["dtype"] for d in self.prog["inputs"] + self.prog["outputs"]]
        tol = task.get("tolerance", {})
        atol, rtol = default_tol(dts)
        self.atol, self.rtol = tol.get("atol", atol), tol.get("rtol", rtol)

    def torch_dtype(self, d):
        return getattr(self.torch, DTYPES[d])

    def shape(self, decl, sizes):
        return [d if isinstance(d, int) else sizes[d] for d in decl["dims"]]

    def make_inputs(self, sizes, seed):
        """Returns {name: torch tensor on the GPU in the input's dtype} (values rounded to it)."""
        torch, np = self.torch, self.np
        out = {}
        for k, d in enumerate(self.prog["inputs"]):
            rng = np.random.default_rng([seed, k])
            x = gen_input(rng, np, self.task.get("inputs", {}).get(d["name"], {}), self.shape(d, sizes))
            out[d["name"]] = torch.from_numpy(np.ascontiguousarray(x)).cuda().to(self.torch_dtype(d["dtype"]))
        return out

    def reference(self, inputs):
        env = {k: v.double() for k, v in inputs.items()}
        return Interp(self.prog, self.torch, exact=True).run(env)

    def to_cupy(self, t):
        """A cupy view of a torch CUDA tensor (bf16 viewed as uint16 bits)."""
        torch, cp = self.torch, self.cp
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        return cp.from_dlpack(t) if hasattr(cp, "from_dlpack") else cp.fromDlpack(torch.utils.dlpack.to_dlpack(t))

    def alloc_outputs(self, sizes):
        torch = self.torch
        outs = {}
        for d in self.prog["outputs"]:
            shape = self.shape(d, sizes)
            if d["dtype"] in ("i64", "i32"):
                t = torch.full(shape, -(2**31) + 7, dtype=self.torch_dtype(d["dtype"]), device="cuda")
            else:
                t = torch.full(shape, float("nan"), dtype=self.torch_dtype(d["dtype"]), device="cuda")
            outs[d["name"]] = t
        scratch = {}
        for s in self.scratch:
            n = eval_size_expr(s["numel"], sizes)
            dt = self.torch_dtype(s["dtype"])
            t = torch.empty(n, dtype=dt, device="cuda")
            if dt.is_floating_point:
                t.fill_(float("nan"))
            else:
                t.fill_(-1)
            scratch[s["name"]] = t
        return outs, scratch

    def plan(self, sizes, buffers):
        """[(kernel, grid, block, smem, args)] with cupy-ready arguments."""
        np = self.np
        cast = {"i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64, "f32": np.float32, "f64": np.float64}
        plan = []
        for l in self.launches:
            grid = tuple(eval_size_expr(g, sizes) for g in l["grid"]) + (1,) * (3 - len(l["grid"]))
            block = tuple(eval_size_expr(b, sizes) for b in l["block"]) + (1,) * (3 - len(l["block"]))
            smem = eval_size_expr(l["smem"], sizes)
            types = self.ptypes[l["kernel"]]
            if len(types) != len(l["args"]):
                raise ValueError(f"{l['kernel']}: {len(l['args'])} args for {len(types)} parameters")
            args = []
            for a, ty in zip(l["args"], types):
                if a in buffers:
                    if ty != "ptr":
                        raise ValueError(f"tensor {a} passed to a scalar parameter")
                    args.append(buffers[a])
                else:
                    if ty == "ptr":
                        raise ValueError(f"scalar {a} passed to a pointer parameter")
                    if re.fullmatch(r"[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?[fF]?", a) and not re.fullmatch(r"\d+", a):
                        v = float(a.rstrip("fF"))
                    else:
                        v = eval_size_expr(a, sizes)
                    args.append(cast[ty](v))
            kern = self.kernels[l["kernel"]]
            if smem > 48 * 1024:
                kern.max_dynamic_shared_size_bytes = smem
            plan.append((kern, grid, block, smem, tuple(args)))
        return plan

    def launch(self, plan):
        for kern, grid, block, smem, args in plan:
            kern(grid, block, args, shared_mem=smem)

    def compare(self, outs, ref):
        torch = self.torch
        for d in self.prog["outputs"]:
            name = d["name"]
            got, want = outs[name], ref[name]
            if tuple(got.shape) != tuple(want.shape):
                want = want.reshape(got.shape)
            if d["dtype"] in ("i64", "i32"):
                bad = got != want.to(got.dtype)
            else:
                g = got.double()
                ok = (g - want).abs() <= self.atol + self.rtol * want.abs()
                ok |= (g == want)  # equal infinities
                bad = ~ok
            nbad = int(bad.sum().item())
            if nbad:
                idx = int(torch.nonzero(bad.reshape(-1))[0].item())
                gi = got.reshape(-1)[idx].item()
                wi = want.reshape(-1)[idx].item()
                pos = list(np_unravel(idx, got.shape))
                return f"{name}{pos}: got {gi!r}, want {wi!r} ({nbad} of {got.numel()} elements wrong)"
        return None

    def max_err(self, outs, ref):
        errs = {}
        for d in self.prog["outputs"]:
            if d["dtype"] in ("i64", "i32"):
                continue
            g, w = outs[d["name"]].double(), ref[d["name"]].reshape(outs[d["name"]].shape)
            errs[d["name"]] = float(((g - w).abs() / (self.atol + self.rtol * w.abs())).max().item())
        return errs

    def check(self, preset, trials, seed):
        torch = self.torch
        sizes = dict(self.task["sizes"][preset])
        for trial in range(trials):
            inputs = self.make_inputs(sizes, seed + 1000 * trial)
            ref = self.reference(inputs)
            copies = {k: v.clone() for k, v in inputs.items()}
            outs, scratch = self.alloc_outputs(sizes)
            buffers = {k: self.to_cupy(v) for k, v in {**inputs, **outs, **scratch}.items()}
            plan = self.plan(sizes, buffers)
            for run in range(2):
                self.launch(plan)
                self.cp.cuda.get_current_stream().synchronize()
                torch.cuda.synchronize()
                msg = self.compare(outs, ref)
                if msg:
                    return False, f"trial {trial}, run {run + 1}: {msg}", None
                for k in inputs:
                    if not torch.equal(inputs[k].reshape(-1).view(torch.uint8), copies[k].reshape(-1).view(torch.uint8)):
                        return False, f"trial {trial}, run {run + 1}: input {k} was modified", None
            errs = self.max_err(outs, ref)
            del inputs, ref, copies, outs, scratch, buffers, plan
        return True, None, errs

    def time(self, reps, seed):
        torch, cp = self.torch, self.cp
        sizes = dict(self.task["sizes"]["gpu"])
        inputs = self.make_inputs(sizes, seed)
        outs, scratch = self.alloc_outputs(sizes)
        buffers = {k: self.to_cupy(v) for k, v in {**inputs, **outs, **scratch}.items()}
        plan = self.plan(sizes, buffers)
        flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")

        def measure(fn):
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            times = []
            for _ in range(reps):
                flush.zero_()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e))
            times.sort()
            return times[len(times) // 2]

        # cupy launches go to cupy's current stream; make it torch's current stream so events bracket them.
        import warnings

        with warnings.catch_warnings():  # ExternalStream is deprecated (not removed) in cupy 14
            warnings.simplefilter("ignore", DeprecationWarning)
            stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        with stream:
            t_kernel = measure(lambda: self.launch(plan))
        eager = Interp(self.prog, torch, exact=False)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        with torch.no_grad():
            t_eager = measure(lambda: eager.run(inputs))
        return t_kernel, t_eager


def np_unravel(idx, shape):
    out = []
    for d in reversed(list(shape)):
        out.append(idx % d)
        idx //= d
    return list(reversed(out))


def run_task(task, presets, trials, reps, seed):
    """Returns a list of result dicts (one per preset)."""
    import numpy as np
    import cupy as cp
    import torch

    results = []
    try:
        tr = TaskRun(task, cp, torch, np)
    except Exception as e:  # compile / parse error: every preset fails
        msg = f"setup: {type(e).__name__}: {e}"
        return [{"task": task["name"], "level": task["level"], "preset": p, "status": "FAIL", "error": msg} for p in presets]
    for p in presets:
        r = {"task": task["name"], "level": task["level"], "preset": p}
        try:
            ok, msg, errs = tr.check(p, trials, seed)
            r["status"] = "PASS" if ok else "FAIL"
            if msg:
                r["error"] = msg
            if errs:
                r["max_err_over_tol"] = errs
            if ok and p == "gpu" and reps > 0:
                tk, te = tr.time(reps, seed + 7)
                r["kernel_ms"], r["eager_ms"] = tk, te
                r["speedup"] = te / tk if tk > 0 else None
        except Exception as e:
            r["status"] = "FAIL"
            r["error"] = f"{type(e).__name__}: {e}"
            r["traceback"] = traceback.format_exc(limit=4)
        results.append(r)
        try:
            torch.cuda.empty_cache()
        except Exception:
            pass
    return results


def fmt(r):
    s = f"{r['status']:4}  {r['task']:28} {r['preset']:5}"
    if "kernel_ms" in r:
        s += f"  kernel {r['kernel_ms']:.4f} ms  eager {r['eager_ms']:.4f} ms  speedup {r['speedup']:.2f}x"
    if "max_err_over_tol" in r and r["status"] == "PASS":
        s += "  max err/tol " + ",".join(f"{k}={v:.3f}" for k, v in r["max_err_over_tol"].items())
    if r.get("error"):
        s += f"  {r['error']}"
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tasks", nargs="*", help="task names (default: every task with a solution file)")
    ap.add_argument("--level", type=int, help="only tasks of this level")
    ap.add_argument("--preset", choices=["small", "gpu", "both"], default="both")
    ap.add_argument("--trials", type=int, default=2, help="fresh input sets per preset (harness: 5)")
    ap.add_argument("--reps", type=int, default=20, help="timed repetitions at the GPU preset (0: no timing)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", help="write a JSON summary here")
    ap.add_argument("--no-isolate", action="store_true", help="run every task in this process")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per task (isolated mode)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    presets = ["small", "gpu"] if args.preset == "both" else [args.preset]

    tasks = {}
    for fn in sorted(os.listdir(TASKS_DIR)):
        if fn.endswith(".toml"):
            t = load_toml(os.path.join(TASKS_DIR, fn))
            tasks[t["name"]] = t

    if args.child:  # isolated worker: one task, results as JSON on the last stdout line
        res = run_task(tasks[args.child], presets, args.trials, args.reps, args.seed)
        print("@@RESULT@@" + json.dumps(res))
        return 0

    names = args.tasks or [n for n in tasks if os.path.exists(os.path.join(SOL_DIR, n + ".cu"))]
    if args.level is not None:
        names = [n for n in names if n in tasks and tasks[n]["level"] == args.level]
    all_results = []
    for name in names:
        if name not in tasks:
            res = [{"task": name, "preset": p, "status": "FAIL", "error": "no such task"} for p in presets]
        elif not os.path.exists(os.path.join(SOL_DIR, name + ".cu")):
            res = [{"task": name, "level": tasks[name]["level"], "preset": p, "status": "FAIL", "error": "no solution file"} for p in presets]
        elif args.no_isolate:
            res = run_task(tasks[name], presets, args.trials, args.reps, args.seed)
        else:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--preset", args.preset,
                   "--trials", str(args.trials), "--reps", str(args.reps), "--seed", str(args.seed)]
            t0 = time.time()
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                line = [l for l in p.stdout.splitlines() if l.startswith("@@RESULT@@")]
                if line:
                    res = json.loads(line[-1][len("@@RESULT@@"):])
                else:
                    tail = (p.stderr or p.stdout)[-1500:]
                    res = [{"task": name, "level": tasks[name]["level"], "preset": pr, "status": "FAIL",
                            "error": f"child exited with {p.returncode}: {tail}"} for pr in presets]
            except subprocess.TimeoutExpired:
                res = [{"task": name, "level": tasks[name]["level"], "preset": pr, "status": "FAIL",
                        "error": f"timeout after {time.time() - t0:.0f} s"} for pr in presets]
        for r in res:
            print(fmt(r), flush=True)
            if r.get("traceback") and r["status"] == "FAIL":
                print("      " + r["traceback"].replace("\n", "\n      "), flush=True)
        all_results.extend(res)

    npass = sum(r["status"] == "PASS" for r in all_results)
    print(f"\n{npass}/{len(all_results)} task-presets pass")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": all_results, "passed": npass, "total": len(all_results)}, f, indent=1)
    return 0 if npass == len(all_results) else 1


if __name__ == "__main__":
    sys.exit(main())
