//! From a checked program to an [`EagerPlan`]: a walk over each statement's expression tree in
//! Python's evaluation order (operands left to right, then the operator), one step per op node.
//! The type checker gives every node's dtype and shape; this walk only decides buffers, folds
//! scalar arithmetic, and spots the transposes a GEMM absorbs.

use std::collections::BTreeMap;

use crate::ops::{infer_expr, normalize_axis, BinOp, Dtype, Expr, Op, Program, ReduceKind};
use crate::ops::{Sizes, UnaryFn};

use super::launch::{self, split, BCAST_MAX_DIMS};
use super::{BaselineError, BufferDecl, EagerPlan, Gemm, Step};

/// A tensor value: a contiguous row-major buffer.
#[derive(Clone, Debug)]
struct Tensor {
    buf: usize,
    dtype: Dtype,
    shape: Vec<usize>,
}

impl Tensor {
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// What a node evaluates to: a Python float (no kernel) or a tensor.
enum Value {
    Scalar(f64),
    Tensor(Tensor),
}

/// Where a node's result goes.
#[derive(Clone, Copy)]
enum Dest {
    /// The statement writes a task output: this buffer.
    Output(usize),
    /// The statement names an intermediate: a fresh buffer with the statement's name.
    Named,
}

struct Lowerer<'a> {
    task: &'a str,
    program: &'a Program,
    sizes: &'a Sizes,
    buffers: Vec<BufferDecl>,
    steps: Vec<Step>,
    env: BTreeMap<String, Tensor>,
    /// The statement being lowered: line, target, unnamed intermediates made so far.
    line: usize,
    target: String,
    made: usize,
}

/// Lowers `program` at `sizes`; `task` names the task in errors.
pub(super) fn lower_program(
    task: &str,
    program: &Program,
    sizes: &Sizes,
) -> Result<EagerPlan, BaselineError> {
    let mut l = Lowerer {
        task,
        program,
        sizes,
        buffers: Vec::new(),
        steps: Vec::new(),
        env: BTreeMap::new(),
        line: 0,
        target: String::new(),
        made: 0,
    };
    let n_inputs = program.inputs.len();
    for (i, d) in program.inputs.iter().chain(&program.outputs).enumerate() {
        let shape =
            d.ty.concrete_shape(sizes)
                .map_err(|symbol| BaselineError::MissingSize {
                    task: task.to_string(),
                    symbol,
                })?;
        let t = Tensor {
            buf: l.buffers.len(),
            dtype: d.ty.dtype,
            shape,
        };
        l.buffers.push(BufferDecl {
            name: d.name.clone(),
            dtype: t.dtype,
            elems: t.numel(),
        });
        if i < n_inputs {
            l.env.insert(d.name.clone(), t);
        }
    }
    for s in &program.stmts {
        l.line = s.line;
        l.target = s.target.clone();
        l.made = 0;
        let out = program.outputs.iter().position(|d| d.name == s.target);
        let t = l.statement(&s.expr, out.map(|i| n_inputs + i))?;
        l.env.insert(s.target.clone(), t);
    }
    Ok(EagerPlan {
        buffers: l.buffers,
        steps: l.steps,
    })
}

impl Lowerer<'_> {
    fn err(&self, message: impl Into<String>) -> BaselineError {
        BaselineError::Statement {
            task: self.task.to_string(),
            line: self.line,
            target: self.target.clone(),
            message: message.into(),
        }
    }

    /// Lowers a statement's root into output buffer `out` (if any) and returns its value. A root
    /// that computes nothing (a name, an identity transpose) is copied into an output, and bound
    /// without a kernel to an intermediate name, as Python binds a name.
    fn statement(&mut self, e: &Expr, out: Option<usize>) -> Result<Tensor, BaselineError> {
        let dest = out.map_or(Dest::Named, Dest::Output);
        let t = match self.expr(e, Some(dest))? {
            Value::Tensor(t) => t,
            Value::Scalar(_) => return Err(self.err("the right-hand side is a scalar")),
        };
        match out {
            Some(b) if t.buf != b => {
                let bytes = t.numel() * t.dtype.size_bytes();
                self.steps.push(launch::copy(t.buf, b, bytes));
                Ok(Tensor { buf: b, ..t })
            }
            _ => Ok(t),
        }
    }

    /// The buffer a node writes: the statement's destination for its root, else a fresh one.
    fn alloc(&mut self, dest: Option<Dest>, dtype: Dtype, shape: &[usize]) -> Tensor {
        let buf = match dest {
            Some(Dest::Output(b)) => b,
            _ => {
                let name = match dest {
                    Some(_) => self.target.clone(),
                    None => {
                        self.made += 1;
                        format!("{}.{}", self.target, self.made)
                    }
                };
                self.buffers.push(BufferDecl {
                    name,
                    dtype,
                    elems: shape.iter().product(),
                });
                self.buffers.len() - 1
            }
        };
        Tensor {
            buf,
            dtype,
            shape: shape.to_vec(),
        }
    }

    /// The checker's dtype and concrete shape of a tensor-valued node.
    fn tensor_type(&self, e: &Expr) -> Result<(Dtype, Vec<usize>), BaselineError> {
        let t = infer_expr(self.program, e).map_err(|m| self.err(m))?;
        let dtype = t
            .dtype
            .ok_or_else(|| self.err("expected a tensor, found a scalar"))?;
        let shape = t
            .shape
            .iter()
            .map(|d| {
                d.resolve(self.sizes)
                    .ok_or_else(|| self.err(format!("size `{d}` has no value")))
            })
            .collect::<Result<_, _>>()?;
        Ok((dtype, shape))
    }

    fn rank(&self, e: &Expr) -> Result<usize, BaselineError> {
        let t = infer_expr(self.program, e).map_err(|m| self.err(m))?;
        Ok(t.shape.len())
    }

    fn tensor(&mut self, e: &Expr) -> Result<Tensor, BaselineError> {
        match self.expr(e, None)? {
            Value::Tensor(t) => Ok(t),
            Value::Scalar(_) => Err(self.err("expected a tensor operand, found a scalar")),
        }
    }

    fn expr(&mut self, e: &Expr, dest: Option<Dest>) -> Result<Value, BaselineError> {
        match e {
            Expr::Num(v) => Ok(Value::Scalar(*v)),
            Expr::Var(n) => {
                if let Some(c) = self.program.const_value(n) {
                    return Ok(Value::Scalar(c));
                }
                let t = self.env.get(n).cloned();
                t.map(Value::Tensor)
                    .ok_or_else(|| self.err(format!("unknown name `{n}`")))
            }
            Expr::Neg(a) => Ok(match self.expr(a, None)? {
                Value::Scalar(v) => Value::Scalar(-v),
                Value::Tensor(t) => Value::Tensor(self.unary("neg", &t, [0.0, 0.0], dest)),
            }),
            Expr::Binary(BinOp::MatMul, a, b) => self.matmul(e, a, b, dest).map(Value::Tensor),
            Expr::Binary(op, a, b) => self.binary(e, *op, a, b, dest),
            Expr::Call { op, args } => self.call(e, op, args, dest).map(Value::Tensor),
        }
    }

    fn unary(&mut self, f: &str, x: &Tensor, p: [f64; 2], dest: Option<Dest>) -> Tensor {
        let y = self.alloc(dest, x.dtype, &x.shape);
        let p = [p[0] as f32, p[1] as f32];
        let step = launch::unary(f, x.dtype, x.buf, y.buf, x.numel(), p);
        self.steps.push(step);
        y
    }

    /// `x` converted to `to` (a kernel only when the dtypes differ).
    fn cast(&mut self, x: Tensor, to: Dtype) -> Tensor {
        if x.dtype == to {
            return x;
        }
        let y = self.alloc(None, to, &x.shape);
        let step = launch::cast(x.dtype, to, x.buf, y.buf, x.numel());
        self.steps.push(step);
        y
    }

    fn binary(
        &mut self,
        e: &Expr,
        op: BinOp,
        a: &Expr,
        b: &Expr,
        dest: Option<Dest>,
    ) -> Result<Value, BaselineError> {
        let (va, vb) = (self.expr(a, None)?, self.expr(b, None)?);
        let name = binop_name(op);
        let (x, s, scalar_first) = match (va, vb) {
            (Value::Scalar(x), Value::Scalar(y)) => return Ok(Value::Scalar(fold(op, x, y))),
            (Value::Tensor(t), Value::Scalar(s)) => (t, s, false),
            (Value::Scalar(s), Value::Tensor(t)) => (t, s, true),
            (Value::Tensor(ta), Value::Tensor(tb)) => {
                let (dtype, shape) = self.tensor_type(e)?;
                let (ta, tb) = (self.cast(ta, dtype), self.cast(tb, dtype));
                let y = self.alloc(dest, dtype, &shape);
                let step = if ta.shape == shape && tb.shape == shape {
                    launch::binary(name, dtype, ta.buf, tb.buf, y.buf, y.numel())
                } else {
                    let dims = broadcast_dims(&shape, &ta.shape, &tb.shape);
                    if dims.len() > BCAST_MAX_DIMS {
                        return Err(self.err(format!(
                            "broadcasting {:?} with {:?} needs {} dimensions, more than {BCAST_MAX_DIMS}",
                            ta.shape,
                            tb.shape,
                            dims.len()
                        )));
                    }
                    launch::bcast(name, dtype, ta.buf, tb.buf, y.buf, &dims)
                };
                self.steps.push(step);
                return Ok(Value::Tensor(y));
            }
        };
        let y = self.alloc(dest, x.dtype, &x.shape);
        let step = launch::binary_scalar(
            name,
            x.dtype,
            x.buf,
            s as f32,
            y.buf,
            x.numel(),
            scalar_first,
        );
        self.steps.push(step);
        Ok(Value::Tensor(y))
    }

    /// `e` without a transpose of its last two axes, and whether there was one: the GEMM reads
    /// the untransposed buffer with its transpose flag, as cuBLAS does with PyTorch's view.
    fn peel_transpose<'e>(&self, e: &'e Expr) -> Result<(&'e Expr, bool), BaselineError> {
        if let Expr::Call {
            op: Op::Transpose { a, b },
            args,
        } = e
        {
            if let [x] = args.as_slice() {
                let r = self.rank(x)?;
                let axes = (normalize_axis(*a, r), normalize_axis(*b, r));
                let last_two = (r.checked_sub(2), r.checked_sub(1));
                if r >= 2 && (axes == last_two || (axes.1, axes.0) == last_two) {
                    return Ok((x, true));
                }
            }
        }
        Ok((e, false))
    }

    fn matmul(
        &mut self,
        e: &Expr,
        a: &Expr,
        b: &Expr,
        dest: Option<Dest>,
    ) -> Result<Tensor, BaselineError> {
        let ranks = (self.rank(a)?, self.rank(b)?);
        // PyTorch folds [B,M,K]@[K,N] into one mm of B*M rows, which needs A contiguous: a
        // transposed A there is copied first (here: lowered as a transpose kernel).
        let (a, trans_a) = match ranks {
            (2, 2) | (3, 3) | (2, 1) => self.peel_transpose(a)?,
            _ => (a, false),
        };
        let (b, trans_b) = match ranks {
            (2, 2) | (3, 3) | (3, 2) => self.peel_transpose(b)?,
            _ => (b, false),
        };
        let (ta, tb) = (self.tensor(a)?, self.tensor(b)?);
        let (dtype, shape) = self.tensor_type(e)?;
        let (ta, tb) = (self.cast(ta, dtype), self.cast(tb, dtype));
        // Logical (as multiplied) shapes.
        let logical = |t: &Tensor, trans: bool| {
            let mut s = t.shape.clone();
            let r = s.len();
            if trans {
                s.swap(r - 2, r - 1);
            }
            s
        };
        let (la, lb) = (logical(&ta, trans_a), logical(&tb, trans_b));
        let (batch, m, k, n) = match (la.as_slice(), lb.as_slice()) {
            ([m, k], [_, n]) => (1, *m, *k, *n),
            ([bt, m, k], [_, _, n]) => (*bt, *m, *k, *n),
            ([bt, m, k], [_, n]) => (1, bt * m, *k, *n),
            ([m, k], [_]) => (1, *m, *k, 1),
            _ => return Err(self.err(format!("cannot multiply {la:?} by {lb:?}"))),
        };
        let int = |v: usize, what: &str| {
            i32::try_from(v)
                .map(|v| v as u32)
                .map_err(|_| self.err(format!("GEMM {what} = {v} exceeds a 32-bit int")))
        };
        let gemm = Gemm {
            dtype,
            a: ta.buf,
            b: tb.buf,
            c: 0,
            m: int(m, "m")?,
            n: int(n, "n")?,
            k: int(k, "k")?,
            batch: int(batch, "batch")?,
            trans_a,
            trans_b,
            stride_a: (m * k) as i64,
            stride_b: (k * n) as i64,
            stride_c: (m * n) as i64,
        };
        let y = self.alloc(dest, dtype, &shape);
        self.steps.push(Step::Gemm(Gemm { c: y.buf, ..gemm }));
        Ok(y)
    }

    fn axis(&self, x: &Tensor, axis: i64) -> Result<usize, BaselineError> {
        normalize_axis(axis, x.shape.len()).ok_or_else(|| {
            self.err(format!(
                "axis {axis} is out of range for shape {:?}",
                x.shape
            ))
        })
    }

    fn call(
        &mut self,
        e: &Expr,
        op: &Op,
        args: &[Expr],
        dest: Option<Dest>,
    ) -> Result<Tensor, BaselineError> {
        let Some(first) = args.first() else {
            return Err(self.err("a call without operands"));
        };
        let x = self.tensor(first)?;
        let lanes = |l: &mut Self, name: &str, axis: i64, eps: f64| {
            let dims = split(&x.shape, l.axis(&x, axis)?);
            let y = l.alloc(dest, x.dtype, &x.shape);
            let step = launch::lanes(name, x.dtype, x.buf, y.buf, dims, eps as f32);
            l.steps.push(step);
            Ok(y)
        };
        let scan = |l: &mut Self, name: &str, axis: i64| {
            let dims = split(&x.shape, l.axis(&x, axis)?);
            let y = l.alloc(dest, x.dtype, &x.shape);
            l.steps
                .push(launch::scan(name, x.dtype, x.buf, y.buf, dims));
            Ok(y)
        };
        match *op {
            Op::Unary(u) => Ok(self.unary(unary_name(u), &x, [0.0, 0.0], dest)),
            Op::LeakyRelu { slope } => Ok(self.unary("leaky_relu", &x, [slope, 0.0], dest)),
            Op::Elu { alpha } => Ok(self.unary("elu", &x, [alpha, 0.0], dest)),
            Op::Clamp { lo, hi, .. } => Ok(self.unary("clamp", &x, [lo, hi], dest)),
            Op::Reduce { kind, axis, .. } => {
                let dims = split(&x.shape, self.axis(&x, axis)?);
                let (dtype, shape) = self.tensor_type(e)?;
                let y = self.alloc(dest, dtype, &shape);
                let step = launch::reduce(reduce_name(kind), x.dtype, x.buf, y.buf, dims);
                self.steps.push(step);
                Ok(y)
            }
            Op::Softmax { axis } => lanes(self, "softmax", axis, 0.0),
            Op::LogSoftmax { axis } => lanes(self, "log_softmax", axis, 0.0),
            Op::L2Norm { axis, eps } => lanes(self, "l2norm", axis, eps),
            Op::Cumsum { axis } => scan(self, "cumsum", axis),
            Op::Cumprod { axis } => scan(self, "cumprod", axis),
            Op::LayerNorm { eps, weight, bias } => {
                self.norm(e, x, &args[1..], false, eps, (weight, bias), dest)
            }
            Op::RmsNorm { eps, weight } => {
                self.norm(e, x, &args[1..], true, eps, (weight, false), dest)
            }
            Op::Transpose { a, b } => {
                let (a, b) = (self.axis(&x, a)?, self.axis(&x, b)?);
                if a == b {
                    return Ok(x);
                }
                let (lo, hi) = (a.min(b), a.max(b));
                let s = &x.shape;
                let pa_qbr = [
                    s[..lo].iter().product(),
                    s[lo],
                    s[lo + 1..hi].iter().product(),
                    s[hi],
                    s[hi + 1..].iter().product(),
                ];
                let mut shape = x.shape.clone();
                shape.swap(lo, hi);
                let y = self.alloc(dest, x.dtype, &shape);
                let step = launch::transpose(x.dtype.size_bytes(), x.buf, y.buf, pa_qbr);
                self.steps.push(step);
                Ok(y)
            }
        }
    }

    /// layer_norm / rms_norm: operands converted to the result dtype (only when they differ).
    #[allow(clippy::too_many_arguments)]
    fn norm(
        &mut self,
        e: &Expr,
        x: Tensor,
        rest: &[Expr],
        rms: bool,
        eps: f64,
        (weight, bias): (bool, bool),
        dest: Option<Dest>,
    ) -> Result<Tensor, BaselineError> {
        let mut rest = rest.iter();
        let mut operand = |l: &mut Self, present: bool| -> Result<Option<Tensor>, BaselineError> {
            match (present, rest.next()) {
                (false, _) => Ok(None),
                (true, Some(e)) => l.tensor(e).map(Some),
                (true, None) => Err(l.err("a norm's weight or bias operand is missing")),
            }
        };
        let w = operand(self, weight)?;
        let b = operand(self, bias)?;
        let (dtype, shape) = self.tensor_type(e)?;
        let x = self.cast(x, dtype);
        let w = w.map(|w| self.cast(w, dtype));
        let b = b.map(|b| self.cast(b, dtype));
        let n = *x
            .shape
            .last()
            .ok_or_else(|| self.err("cannot normalise a scalar"))?;
        let y = self.alloc(dest, dtype, &shape);
        let (wb, bb) = (w.map(|t| t.buf), b.map(|t| t.buf));
        let rows = x.numel() / n;
        let step = launch::norm(rms, dtype, x.buf, wb, bb, y.buf, rows, n, eps as f32);
        self.steps.push(step);
        Ok(y)
    }
}

/// Python's arithmetic on two floats (what PyTorch never sees).
fn fold(op: BinOp, a: f64, b: f64) -> f64 {
    match op {
        BinOp::Add => a + b,
        BinOp::Sub => a - b,
        BinOp::Mul => a * b,
        BinOp::Div => a / b,
        BinOp::Max => a.max(b),
        BinOp::Min => a.min(b),
        BinOp::Pow => a.powf(b),
        BinOp::MatMul => f64::NAN,
    }
}

/// (extent, stride of a, stride of b) per output dimension, outermost first, with extent-1
/// dimensions dropped and neighbours merged where both operands allow (as TensorIterator
/// coalesces), so `[M, N] + [N]` is two dimensions and `[M, N] + [M, N]` one.
fn broadcast_dims(out: &[usize], a: &[usize], b: &[usize]) -> Vec<(usize, i64, i64)> {
    let strides = |s: &[usize]| -> Vec<i64> {
        let pad = out.len() - s.len();
        let mut st = vec![0i64; out.len()];
        let mut acc = 1i64;
        for i in (0..s.len()).rev() {
            st[pad + i] = if s[i] == 1 { 0 } else { acc };
            acc *= s[i] as i64;
        }
        st
    };
    let (sa, sb) = (strides(a), strides(b));
    let mut dims: Vec<(usize, i64, i64)> = Vec::new();
    for (i, &n) in out.iter().enumerate() {
        if n == 1 {
            continue;
        }
        if let Some(last) = dims.last_mut() {
            let n64 = n as i64;
            if last.1 == sa[i] * n64 && last.2 == sb[i] * n64 {
                *last = (last.0 * n, sa[i], sb[i]);
                continue;
            }
        }
        dims.push((n, sa[i], sb[i]));
    }
    if dims.is_empty() {
        dims.push((1, 0, 0));
    }
    dims
}

fn binop_name(op: BinOp) -> &'static str {
    match op {
        BinOp::Add => "add",
        BinOp::Sub => "sub",
        BinOp::Mul => "mul",
        BinOp::Div => "div",
        BinOp::Max => "maximum",
        BinOp::Min => "minimum",
        BinOp::Pow => "pow",
        BinOp::MatMul => "matmul",
    }
}

fn unary_name(u: UnaryFn) -> &'static str {
    use UnaryFn::*;
    match u {
        Relu => "relu",
        Gelu => "gelu",
        GeluTanh => "gelu_tanh",
        Silu => "silu",
        Sigmoid => "sigmoid",
        Tanh => "tanh",
        Exp => "exp",
        Log => "log",
        Abs => "abs",
        Neg => "neg",
        Sqrt => "sqrt",
        Rsqrt => "rsqrt",
        Square => "square",
        Softplus => "softplus",
        Mish => "mish",
        Hardsigmoid => "hardsigmoid",
        Hardswish => "hardswish",
    }
}

fn reduce_name(k: ReduceKind) -> &'static str {
    match k {
        ReduceKind::Sum => "sum",
        ReduceKind::Mean => "mean",
        ReduceKind::Max => "max",
        ReduceKind::Min => "min",
        ReduceKind::Prod => "prod",
        ReduceKind::Logsumexp => "logsumexp",
        ReduceKind::Argmax => "argmax",
        ReduceKind::Argmin => "argmin",
    }
}

#[cfg(test)]
mod merge_tests {
    use super::broadcast_dims;

    #[test]
    fn broadcast_dims_merge_what_both_operands_allow() {
        // Same shape: one dimension.
        assert_eq!(broadcast_dims(&[4, 5], &[4, 5], &[4, 5]), [(20, 1, 1)]);
        // Row bias: rows broadcast in b.
        assert_eq!(
            broadcast_dims(&[4, 5], &[4, 5], &[5]),
            [(4, 5, 0), (5, 1, 1)]
        );
        // Column (keepdim) operand: [4, 1] against [4, 5].
        assert_eq!(
            broadcast_dims(&[4, 5], &[4, 1], &[4, 5]),
            [(4, 1, 5), (5, 0, 1)]
        );
        // Leading batch broadcast merges with the rows: [2, 3, 5] + [5].
        assert_eq!(
            broadcast_dims(&[2, 3, 5], &[2, 3, 5], &[5]),
            [(6, 5, 0), (5, 1, 1)]
        );
        // Extent-1 output dimensions vanish; all-ones is one element.
        assert_eq!(broadcast_dims(&[1, 5], &[1, 5], &[1]), [(5, 1, 0)]);
        assert_eq!(broadcast_dims(&[1, 1], &[1], &[1, 1]), [(1, 0, 0)]);
    }
}
