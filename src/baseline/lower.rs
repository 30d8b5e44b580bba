//! From a checked program to an [`EagerPlan`]: a walk over each statement's expression tree in
//! Python's evaluation order (operands left to right, then the operator), one step per op node.
//! The type checker gives every node's dtype and shape; this walk only decides buffers, folds
//! scalar arithmetic, and spots the transposes a GEMM absorbs. The precision only changes what
//! the steps are made of (kernel instantiations, scalar types, bytes copied, casts as copies),
//! never the buffers or the order of the steps.

use std::collections::BTreeMap;

use crate::ops::Sizes;
use crate::ops::{infer_expr, normalize_axis, BinOp, Dtype, Expr, Op, Program, ReduceKind};

use super::launch::{self, split, Elem, STRIDED_MAX_DIMS};
use super::strides::{broadcast_dims, contiguous_strides, merge_dims};
use super::{BaselineError, BatchNorm, BufferDecl, Conv, EagerPlan, Gemm, Precision, Step, Window};

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
    precision: Precision,
    buffers: Vec<BufferDecl>,
    steps: Vec<Step>,
    env: BTreeMap<String, Tensor>,
    /// The statement being lowered: line, target, unnamed intermediates made so far.
    line: usize,
    target: String,
    made: usize,
}

/// Lowers `program` at `sizes` in `precision`; `task` names the task in errors.
pub(super) fn lower_program(
    task: &str,
    program: &Program,
    sizes: &Sizes,
    precision: Precision,
) -> Result<EagerPlan, BaselineError> {
    let mut l = Lowerer {
        task,
        program,
        sizes,
        precision,
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
        precision,
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

    /// How a tensor of dtype `d` is stored in this plan.
    fn elem(&self, d: Dtype) -> Elem {
        Elem::new(d, self.precision)
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
                let bytes = t.numel() * self.elem(t.dtype).size_bytes();
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
        let step = launch::unary(f, self.elem(x.dtype), x.buf, y.buf, x.numel(), p);
        self.steps.push(step);
        y
    }

    /// `x` converted to `to` (a kernel only when the dtypes differ; in an F64 plan, where both
    /// are stored as f64 and nothing is rounded, a copy).
    fn cast(&mut self, x: Tensor, to: Dtype) -> Tensor {
        if x.dtype == to {
            return x;
        }
        let y = self.alloc(None, to, &x.shape);
        let step = match self.precision {
            Precision::Native => launch::cast(x.dtype, to, x.buf, y.buf, x.numel()),
            Precision::F64 => {
                let bytes = x.numel() * self.elem(x.dtype).size_bytes();
                launch::copy(x.buf, y.buf, bytes)
            }
        };
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
        let mut name = op.name();
        let (x, s, scalar_first) = match (va, vb) {
            (Value::Scalar(x), Value::Scalar(y)) => {
                return Ok(Value::Scalar(crate::ops::kernels::binary(op, x, y)))
            }
            (Value::Tensor(t), Value::Scalar(s)) => (t, s, false),
            (Value::Scalar(s), Value::Tensor(t)) if op == BinOp::Div => {
                // PyTorch's __rtruediv__: a reciprocal, then a multiply.
                let r = self.unary("reciprocal", &t, [0.0, 0.0], None);
                name = "mul";
                (r, s, false)
            }
            (Value::Scalar(s), Value::Tensor(t)) => (t, s, true),
            (Value::Tensor(ta), Value::Tensor(tb)) => {
                let (dtype, shape) = self.tensor_type(e)?;
                let (ta, tb) = (self.cast(ta, dtype), self.cast(tb, dtype));
                let y = self.alloc(dest, dtype, &shape);
                let step = if ta.shape == shape && tb.shape == shape {
                    let e = self.elem(dtype);
                    launch::binary(name, e, ta.buf, tb.buf, y.buf, y.numel())
                } else {
                    let dims = broadcast_dims(&shape, &ta.shape, &tb.shape);
                    if dims.len() > STRIDED_MAX_DIMS {
                        return Err(self.err(format!(
                            "broadcasting {:?} with {:?} needs {} dimensions, more than {STRIDED_MAX_DIMS}",
                            ta.shape,
                            tb.shape,
                            dims.len()
                        )));
                    }
                    launch::bcast(name, self.elem(dtype), ta.buf, tb.buf, y.buf, &dims)
                };
                self.steps.push(step);
                return Ok(Value::Tensor(y));
            }
        };
        let y = self.alloc(dest, x.dtype, &x.shape);
        let step = launch::binary_scalar(
            name,
            self.elem(x.dtype),
            x.buf,
            s,
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
        let folded = ranks.0 > 2 && ranks.1 == 2;
        let (a, trans_a) = if folded {
            (a, false)
        } else {
            self.peel_transpose(a)?
        };
        let (b, trans_b) = if ranks.1 >= 2 {
            self.peel_transpose(b)?
        } else {
            (b, false)
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
        if crate::ops::matmul_shape(&la, &lb).is_none() {
            return Err(self.err(format!("cannot multiply {la:?} by {lb:?}")));
        }
        // The batch dims fold into one strided batch; one B for every batch folds into the rows.
        let (r, bt) = (la.len(), la[..la.len() - 2].iter().product::<usize>());
        let (m, k) = (la[r - 2], la[r - 1]);
        let n = if lb.len() == 1 { 1 } else { lb[lb.len() - 1] };
        let (batch, m) = if folded { (1, bt * m) } else { (bt, m) };
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
        let lanes = |l: &mut Self, name: &str, axis: i64| {
            let dims = split(&x.shape, l.axis(&x, axis)?);
            let y = l.alloc(dest, x.dtype, &x.shape);
            l.steps.push(launch::lanes(
                name,
                (x.dtype, l.precision),
                x.buf,
                y.buf,
                dims,
            ));
            Ok(y)
        };
        let scan = |l: &mut Self, name: &str, axis: i64| {
            let dims = split(&x.shape, l.axis(&x, axis)?);
            let y = l.alloc(dest, x.dtype, &x.shape);
            l.steps
                .push(launch::scan(name, l.elem(x.dtype), x.buf, y.buf, dims));
            Ok(y)
        };
        match *op {
            Op::Unary(u) => Ok(self.unary(u.name(), &x, [0.0, 0.0], dest)),
            Op::LeakyRelu { slope } => Ok(self.unary("leaky_relu", &x, [slope, 0.0], dest)),
            Op::Elu { alpha } => Ok(self.unary("elu", &x, [alpha, 0.0], dest)),
            Op::Clamp { lo, hi, .. } => Ok(self.unary("clamp", &x, [lo, hi], dest)),
            Op::Reduce { kind, axis, .. } => {
                let Some(kernel) = reduce_kernel(kind) else {
                    return self.logsumexp(e, x, axis, dest);
                };
                let dims = split(&x.shape, self.axis(&x, axis)?);
                let (dtype, shape) = self.tensor_type(e)?;
                let y = self.alloc(dest, dtype, &shape);
                let step = launch::reduce(kernel, self.elem(x.dtype), x.buf, y.buf, dims);
                self.steps.push(step);
                Ok(y)
            }
            Op::Softmax { axis } => lanes(self, "softmax", axis),
            Op::LogSoftmax { axis } => lanes(self, "log_softmax", axis),
            Op::L2Norm { axis, eps } => self.l2norm(x, axis, eps, dest),
            Op::Cumsum { axis } => scan(self, "cumsum", axis),
            Op::Cumprod { axis } => scan(self, "cumprod", axis),
            Op::LayerNorm { eps, weight, bias } => {
                self.norm(e, x, &args[1..], false, eps, (weight, bias), dest)
            }
            Op::RmsNorm { eps, weight } => {
                self.norm(e, x, &args[1..], true, eps, (weight, false), dest)
            }
            Op::Conv {
                transposed,
                ref stride,
                ref padding,
                ref dilation,
                groups,
                bias,
                ..
            } => {
                let (dtype, shape) = self.tensor_type(e)?;
                let w = self.tensor(&args[1])?;
                let b = if bias {
                    Some(self.tensor(&args[2])?)
                } else {
                    None
                };
                let x = self.cast(x, dtype);
                let w = self.cast(w, dtype);
                let b = b.map(|b| self.cast(b, dtype));
                let y = self.alloc(dest, dtype, &shape);
                let conv = Conv {
                    dtype,
                    transposed,
                    x: x.buf,
                    w: w.buf,
                    bias: b.map(|b| b.buf),
                    y: y.buf,
                    n: x.shape[0],
                    c: x.shape[1],
                    f: shape[1],
                    groups,
                    window: Window {
                        spatial: x.shape[2..].to_vec(),
                        kernel: w.shape[2..].to_vec(),
                        out: shape[2..].to_vec(),
                        stride: stride.clone(),
                        padding: padding.clone(),
                        dilation: dilation.clone(),
                    },
                };
                // A depthwise convolution PyTorch runs with its own kernel is kevin's kernel
                // of that form, not cuDNN.
                self.steps.push(if conv.torch_native_depthwise() {
                    launch::conv_kernel(&conv, self.precision)
                } else {
                    Step::Conv(conv)
                });
                Ok(y)
            }
            Op::ChannelNorm {
                sets,
                eps,
                weight,
                bias,
            } => {
                let (dtype, shape) = self.tensor_type(e)?;
                let (x, w, b) = self.norm_operands(x, &args[1..], (weight, bias), dtype)?;
                let (n, c) = (x.shape[0], x.shape[1]);
                let s = x.shape[2..].iter().product();
                let groups = sets.groups(c);
                let y = self.alloc(dest, dtype, &shape);
                let library =
                    groups == 0 && BatchNorm::cudnn_takes(dtype, x.shape.len(), (n, c, s), eps);
                let (w, b) = (w.map(|t| t.buf), b.map(|t| t.buf));
                let step = match (w, b) {
                    (Some(w), Some(b)) if library => Step::BatchNorm(BatchNorm {
                        x: x.buf,
                        w,
                        b,
                        y: y.buf,
                        n,
                        c,
                        s,
                        eps,
                    }),
                    _ => {
                        let bufs = (x.buf, w, b, y.buf);
                        launch::chan_norm(self.elem(dtype), bufs, (n, c, s), groups, eps)
                    }
                };
                self.steps.push(step);
                Ok(y)
            }
            Op::Pool {
                max,
                ref kernel,
                ref stride,
                ref padding,
                ref dilation,
                count_include_pad,
                ..
            } => {
                let (dtype, shape) = self.tensor_type(e)?;
                let win = Window {
                    spatial: x.shape[2..].to_vec(),
                    kernel: kernel.clone(),
                    out: shape[2..].to_vec(),
                    stride: stride.clone(),
                    padding: padding.clone(),
                    dilation: dilation.clone(),
                };
                let y = self.alloc(dest, dtype, &shape);
                // PyTorch's CUDA max pooling always writes the argmax indices too (i64, one per
                // output) and drops them: so does the baseline, into a buffer of its own.
                let indices = max.then(|| self.alloc(None, Dtype::I64, &shape).buf);
                let planes = x.shape[0] * x.shape[1];
                let e = self.elem(dtype);
                let bufs = (x.buf, y.buf, indices);
                let step = launch::pool(e, bufs, planes, &win, count_include_pad);
                self.steps.push(step);
                Ok(y)
            }
            Op::Triangle { upper, diagonal } => {
                let r = x.shape.len();
                let y = self.alloc(dest, x.dtype, &x.shape);
                let bytes = self.elem(x.dtype).size_bytes();
                let rc = [x.shape[r - 2], x.shape[r - 1]];
                self.steps.push(launch::triangle(
                    bytes,
                    x.buf,
                    y.buf,
                    x.numel(),
                    rc,
                    diagonal,
                    upper,
                ));
                Ok(y)
            }
            Op::Gather { axis } => {
                let at = self.axis(&x, axis)?;
                let idx = self.tensor(&args[1])?;
                let y = self.alloc(dest, x.dtype, &idx.shape);
                let inner = idx.shape[at + 1..].iter().product();
                let dims = [idx.shape[at], x.shape[at], inner];
                let bufs = [x.buf, idx.buf, y.buf];
                let step = launch::gather(self.elem(x.dtype), bufs, idx.numel(), dims);
                self.steps.push(step);
                Ok(y)
            }
            Op::Flip { axis } => {
                let at = normalize_axis(axis, x.shape.len())
                    .ok_or_else(|| self.err(format!("flip axis {axis} out of range")))?;
                let y = self.alloc(dest, x.dtype, &x.shape);
                let bytes = self.elem(x.dtype).size_bytes();
                let inner = x.shape[at + 1..].iter().product();
                let step = launch::flip(bytes, x.buf, y.buf, x.numel(), inner, x.shape[at]);
                self.steps.push(step);
                Ok(y)
            }
            Op::Unsqueeze { .. } | Op::Squeeze { .. } | Op::Reshape { .. } => {
                // A view, as in PyTorch: the same buffer under the new shape; copied only where
                // the result must land in a buffer of its own (an output, a named statement).
                let (_, shape) = self.tensor_type(e)?;
                if dest.is_none() {
                    return Ok(Tensor { shape, ..x });
                }
                let y = self.alloc(dest, x.dtype, &shape);
                let bytes = x.numel() * self.elem(x.dtype).size_bytes();
                self.steps.push(launch::copy(x.buf, y.buf, bytes));
                Ok(y)
            }
            Op::Transpose { a, b } => {
                let (a, b) = (self.axis(&x, a)?, self.axis(&x, b)?);
                if a == b {
                    return Ok(x);
                }
                // The output read through swapped strides of x, as `.contiguous()` copies a view.
                let mut shape = x.shape.clone();
                shape.swap(a, b);
                let mut strides = contiguous_strides(&x.shape);
                strides.swap(a, b);
                let dims = merge_dims(&shape, &strides, &vec![0; shape.len()]);
                let y = self.alloc(dest, x.dtype, &shape);
                let bytes = self.elem(x.dtype).size_bytes();
                let step = launch::strided_copy(bytes, x.buf, y.buf, &dims);
                self.steps.push(step);
                Ok(y)
            }
        }
    }

    /// `x` with `axis` reduced by `kind` into a keepdim-shaped fresh buffer.
    fn reduce_keepdim(&mut self, kind: &str, x: &Tensor, ax: usize) -> Tensor {
        let mut shape = x.shape.clone();
        shape[ax] = 1;
        let y = self.alloc(None, x.dtype, &shape);
        let e = self.elem(x.dtype);
        let step = launch::reduce(kind, e, x.buf, y.buf, split(&x.shape, ax));
        self.steps.push(step);
        y
    }

    /// `a op b` with `b` broadcast to `a`'s shape.
    fn bcast_into(&mut self, op: &str, a: &Tensor, b: &Tensor, dest: Option<Dest>) -> Tensor {
        let y = self.alloc(dest, a.dtype, &a.shape);
        let dims = broadcast_dims(&a.shape, &a.shape, &b.shape);
        let step = launch::bcast(op, self.elem(a.dtype), a.buf, b.buf, y.buf, &dims);
        self.steps.push(step);
        y
    }

    /// torch.logsumexp as PyTorch runs it: m = amax(x, keepdim), m with infinities zeroed,
    /// sum(exp(x - m)), its log, plus m. Seven launches; PyTorch's nine zero the infinities
    /// in three (abs, == inf, masked_fill_), tiny kernels over the reduced shape.
    fn logsumexp(
        &mut self,
        e: &Expr,
        x: Tensor,
        axis: i64,
        dest: Option<Dest>,
    ) -> Result<Tensor, BaselineError> {
        let ax = self.axis(&x, axis)?;
        let (_, shape) = self.tensor_type(e)?;
        let m = self.reduce_keepdim("max", &x, ax);
        let m = self.unary("inf_to_zero", &m, [0.0, 0.0], None);
        let centered = self.bcast_into("sub", &x, &m, None);
        let exps = self.unary("exp", &centered, [0.0, 0.0], None);
        let sum = self.alloc(None, x.dtype, &shape);
        let e = self.elem(x.dtype);
        let step = launch::reduce("sum", e, exps.buf, sum.buf, split(&x.shape, ax));
        self.steps.push(step);
        let log = self.unary("log", &sum, [0.0, 0.0], None);
        // m has the result's elements in the result's order (keepdim or not).
        let y = self.alloc(dest, x.dtype, &shape);
        let step = launch::binary("add", e, log.buf, m.buf, y.buf, y.numel());
        self.steps.push(step);
        Ok(y)
    }

    /// F.normalize as PyTorch runs it: the 2-norm along `axis` (keepdim), clamp_min(eps), and
    /// a broadcast division.
    fn l2norm(
        &mut self,
        x: Tensor,
        axis: i64,
        eps: f64,
        dest: Option<Dest>,
    ) -> Result<Tensor, BaselineError> {
        let ax = self.axis(&x, axis)?;
        let norm = self.reduce_keepdim("norm", &x, ax);
        let denom = self.unary("clamp_min", &norm, [eps, 0.0], None);
        Ok(self.bcast_into("div", &x, &denom, dest))
    }

    /// A norm's input and its optional weight and bias (the operands after `x`, in order),
    /// converted to the result dtype (only where they differ).
    fn norm_operands(
        &mut self,
        x: Tensor,
        rest: &[Expr],
        (weight, bias): (bool, bool),
        dtype: Dtype,
    ) -> Result<(Tensor, Option<Tensor>, Option<Tensor>), BaselineError> {
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
        // Conversions after every operand is evaluated, input first (the launch order).
        let x = self.cast(x, dtype);
        let w = w.map(|w| self.cast(w, dtype));
        let b = b.map(|b| self.cast(b, dtype));
        Ok((x, w, b))
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
        let (dtype, shape) = self.tensor_type(e)?;
        let (x, w, b) = self.norm_operands(x, rest, (weight, bias), dtype)?;
        let n = *x
            .shape
            .last()
            .ok_or_else(|| self.err("cannot normalise a scalar"))?;
        let y = self.alloc(dest, dtype, &shape);
        let (wb, bb) = (w.map(|t| t.buf), b.map(|t| t.buf));
        let rows = x.numel() / n;
        let e = self.elem(dtype);
        let step = launch::norm(rms, e, x.buf, wb, bb, y.buf, rows, n, eps);
        self.steps.push(step);
        Ok(y)
    }
}

/// The reduction kernel of a kind; `None` for logsumexp, which PyTorch runs as a composite
/// (`Lowerer::logsumexp`).
fn reduce_kernel(k: ReduceKind) -> Option<&'static str> {
    (k != ReduceKind::Logsumexp).then(|| k.name())
}
