//! The f64 numerics behind the reference interpreter: scalar functions (erf, GELU, stable
//! sigmoid and softplus, ...), broadcasting, reductions and scans along an axis, norms, matrix
//! products and transposes on row-major [`Tensor`]s. Plain loops, written for clarity and
//! trustworthiness, not speed.

use super::ast::{BinOp, ReduceKind, UnaryFn};
use super::interp::Tensor;
use super::round::round_f32;

/// How the kernels add up a long sum (a matrix product's, a sum or mean reduction's, a
/// cumulative sum's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sums {
    /// In f64, in index order: the reference.
    Exact,
    /// In index order in an f32 accumulator, rounded after every add (a product is added exactly,
    /// then rounded: a fused multiply-add): what a plain kernel computes.
    F32InOrder,
}

impl Sums {
    /// `acc + v` as this accumulator holds it.
    fn add(self, acc: f64, v: f64) -> f64 {
        match self {
            Sums::Exact => acc + v,
            Sums::F32InOrder => round_f32(acc + v),
        }
    }

    fn total(self, lane: &[f64]) -> f64 {
        lane.iter().fold(0.0, |acc, &v| self.add(acc, v))
    }
}

/// erf(x) to about 1e-15: the everywhere-positive series
/// erf(x) = 2/sqrt(pi) * exp(-x^2) * sum_n (2x^2)^n x / (1*3*...*(2n+1)), and +-1 beyond |x| = 6.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    if a >= 6.0 {
        return x.signum();
    }
    let (mut term, mut sum) = (a, a);
    let mut n = 0.0;
    while term > sum * 1e-17 {
        n += 1.0;
        term *= 2.0 * a * a / (2.0 * n + 1.0);
        sum += term;
    }
    let v = 2.0 / std::f64::consts::PI.sqrt() * (-a * a).exp() * sum;
    v.min(1.0).copysign(x)
}

fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

fn relu6(x: f64) -> f64 {
    x.clamp(0.0, 6.0)
}

/// Applies a parameterless elementwise function.
pub fn unary(f: UnaryFn, x: f64) -> f64 {
    use UnaryFn::*;
    match f {
        Relu => x.max(0.0),
        Gelu => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
        GeluTanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
        Silu => x * sigmoid(x),
        Sigmoid => sigmoid(x),
        Tanh => x.tanh(),
        Exp => x.exp(),
        Log => x.ln(),
        Abs => x.abs(),
        Neg => -x,
        Sqrt => x.sqrt(),
        Rsqrt => 1.0 / x.sqrt(),
        Square => x * x,
        Softplus => softplus(x),
        Mish => x * softplus(x).tanh(),
        Hardsigmoid => relu6(x + 3.0) / 6.0,
        Hardswish => x * relu6(x + 3.0) / 6.0,
    }
}

/// Applies an elementwise binary operator (not `@`).
pub fn binary(op: BinOp, a: f64, b: f64) -> f64 {
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

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Visits every index of `shape` in row-major order, with the offsets given by two stride sets.
fn for_each_index(shape: &[usize], sa: &[usize], sb: &[usize], mut f: impl FnMut(usize, usize)) {
    let total: usize = shape.iter().product();
    let mut idx = vec![0usize; shape.len()];
    let (mut oa, mut ob) = (0usize, 0usize);
    for _ in 0..total {
        f(oa, ob);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            oa += sa[d];
            ob += sb[d];
            if idx[d] < shape[d] {
                break;
            }
            oa -= sa[d] * shape[d];
            ob -= sb[d] * shape[d];
            idx[d] = 0;
        }
    }
}

/// Elementwise `op` with NumPy broadcasting.
pub fn broadcast(op: BinOp, a: &Tensor, b: &Tensor) -> Result<Tensor, String> {
    let n = a.shape.len().max(b.shape.len());
    let pad = |t: &Tensor| {
        let mut s = vec![1; n - t.shape.len()];
        s.extend(&t.shape);
        s
    };
    let (pa, pb) = (pad(a), pad(b));
    let mut shape = Vec::with_capacity(n);
    for (&x, &y) in pa.iter().zip(&pb) {
        if x != y && x != 1 && y != 1 {
            return Err(format!(
                "cannot broadcast shapes {:?} and {:?}",
                a.shape, b.shape
            ));
        }
        shape.push(if x == 1 { y } else { x });
    }
    let bstrides = |p: &[usize]| -> Vec<usize> {
        let s = strides(p);
        p.iter()
            .zip(s)
            .map(|(&d, st)| if d == 1 { 0 } else { st })
            .collect()
    };
    let (sa, sb) = (bstrides(&pa), bstrides(&pb));
    let mut data = Vec::with_capacity(shape.iter().product());
    for_each_index(&shape, &sa, &sb, |i, j| {
        data.push(binary(op, a.data[i], b.data[j]))
    });
    Ok(Tensor { shape, data })
}

/// Splits `shape` around `axis` into (outer, extent, inner).
fn split(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

/// Applies `f` to every lane along `axis`, writing a lane of the same length.
pub fn map_lanes(x: &Tensor, axis: usize, f: impl Fn(&[f64], &mut [f64])) -> Tensor {
    let (outer, n, inner) = split(&x.shape, axis);
    let mut out = vec![0.0; x.data.len()];
    let (mut lane, mut res) = (vec![0.0; n], vec![0.0; n]);
    for o in 0..outer {
        for i in 0..inner {
            for (k, l) in lane.iter_mut().enumerate() {
                *l = x.data[(o * n + k) * inner + i];
            }
            f(&lane, &mut res);
            for (k, r) in res.iter().enumerate() {
                out[(o * n + k) * inner + i] = *r;
            }
        }
    }
    Tensor {
        shape: x.shape.clone(),
        data: out,
    }
}

fn logsumexp(lane: &[f64]) -> f64 {
    let m = lane.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY || m.is_nan() {
        return m;
    }
    m + lane.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
}

fn first_index(lane: &[f64], better: impl Fn(f64, f64) -> bool) -> f64 {
    let mut best = 0;
    for (k, &v) in lane.iter().enumerate() {
        if better(v, lane[best]) {
            best = k;
        }
    }
    best as f64
}

/// Reduces along `axis` (a sum or mean added as `sums` says).
pub fn reduce(x: &Tensor, kind: ReduceKind, axis: usize, keepdim: bool, sums: Sums) -> Tensor {
    let (outer, n, inner) = split(&x.shape, axis);
    let mut data = Vec::with_capacity(outer * inner);
    let mut lane = vec![0.0; n];
    for o in 0..outer {
        for i in 0..inner {
            for (k, l) in lane.iter_mut().enumerate() {
                *l = x.data[(o * n + k) * inner + i];
            }
            data.push(match kind {
                ReduceKind::Sum => sums.total(&lane),
                ReduceKind::Mean => sums.total(&lane) / n as f64,
                ReduceKind::Max => lane.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                ReduceKind::Min => lane.iter().copied().fold(f64::INFINITY, f64::min),
                ReduceKind::Prod => lane.iter().product(),
                ReduceKind::Argmax => first_index(&lane, |v, b| v > b),
                ReduceKind::Argmin => first_index(&lane, |v, b| v < b),
                ReduceKind::Logsumexp => logsumexp(&lane),
            });
        }
    }
    let mut shape = x.shape.clone();
    if keepdim {
        shape[axis] = 1;
    } else {
        shape.remove(axis);
    }
    Tensor { shape, data }
}

/// Softmax of one lane, shifted by its maximum for stability.
pub fn softmax_lane(lane: &[f64], out: &mut [f64]) {
    let m = lane.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut s = 0.0;
    for (o, &v) in out.iter_mut().zip(lane) {
        *o = (v - m).exp();
        s += *o;
    }
    out.iter_mut().for_each(|o| *o /= s);
}

/// Log-softmax of one lane.
pub fn log_softmax_lane(lane: &[f64], out: &mut [f64]) {
    let l = logsumexp(lane);
    for (o, &v) in out.iter_mut().zip(lane) {
        *o = v - l;
    }
}

/// Running sum (`prod == false`, added as `sums` says) or product of one lane.
pub fn scan_lane(lane: &[f64], out: &mut [f64], prod: bool, sums: Sums) {
    let mut acc = if prod { 1.0 } else { 0.0 };
    for (o, &v) in out.iter_mut().zip(lane) {
        acc = if prod { acc * v } else { sums.add(acc, v) };
        *o = acc;
    }
}

/// `lane / max(||lane||_2, eps)`.
pub fn l2norm_lane(lane: &[f64], out: &mut [f64], eps: f64) {
    let norm = lane.iter().map(|v| v * v).sum::<f64>().sqrt().max(eps);
    for (o, &v) in out.iter_mut().zip(lane) {
        *o = v / norm;
    }
}

/// Layer norm (`rms == false`, biased variance) or RMS norm over the last axis, then the optional
/// weight and bias.
pub fn norm_last(
    x: &Tensor,
    eps: f64,
    rms: bool,
    w: Option<&Tensor>,
    b: Option<&Tensor>,
) -> Tensor {
    let axis = x.shape.len() - 1;
    map_lanes(x, axis, |lane, out| {
        let n = lane.len() as f64;
        let mean = if rms {
            0.0
        } else {
            lane.iter().sum::<f64>() / n
        };
        let var = lane.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        let inv = 1.0 / (var + eps).sqrt();
        for (k, (o, &v)) in out.iter_mut().zip(lane).enumerate() {
            *o = (v - mean) * inv * w.map_or(1.0, |w| w.data[k]) + b.map_or(0.0, |b| b.data[k]);
        }
    })
}

/// Matrix product for the shape pairs the checker allows: (2,2), (3,3), (3,2), (2,1), each
/// output's products added in order of the contracted index as `sums` says.
pub fn matmul(a: &Tensor, b: &Tensor, sums: Sums) -> Result<Tensor, String> {
    let bad = || format!("cannot multiply shapes {:?} and {:?}", a.shape, b.shape);
    let shape = super::check::matmul_shape(&a.shape, &b.shape).ok_or_else(bad)?;
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let (m, k) = (a.shape[ra - 2], a.shape[ra - 1]);
    let n = if rb == 1 { 1 } else { b.shape[rb - 1] };
    // The batch dims fold into one: A's leading dims, each with its own B when B has them.
    let batch: usize = a.shape[..ra - 2].iter().product();
    let b_batched = rb == ra && ra > 2;
    let mut data = vec![0.0; batch * m * n];
    for bi in 0..batch {
        let ao = bi * m * k;
        let bo = if b_batched { bi * k * n } else { 0 };
        for i in 0..m {
            let row = &mut data[(bi * m + i) * n..(bi * m + i + 1) * n];
            for p in 0..k {
                let av = a.data[ao + i * k + p];
                let brow = &b.data[bo + p * n..bo + (p + 1) * n];
                for (r, &bv) in row.iter_mut().zip(brow) {
                    *r = sums.add(*r, av * bv);
                }
            }
        }
    }
    Ok(Tensor { shape, data })
}

/// Swaps axes `a` and `b`, producing a contiguous tensor.
pub fn transpose(x: &Tensor, a: usize, b: usize) -> Tensor {
    let mut shape = x.shape.clone();
    shape.swap(a, b);
    let mut src = strides(&x.shape);
    src.swap(a, b);
    let zero = vec![0; shape.len()];
    let mut data = Vec::with_capacity(x.data.len());
    for_each_index(&shape, &src, &zero, |i, _| data.push(x.data[i]));
    Tensor { shape, data }
}

/// Output extents of a window sliding over `spatial` (floor mode), or an error when one is not
/// positive.
fn window_extents(
    spatial: &[usize],
    kernel: &[usize],
    stride: &[usize],
    padding: &[usize],
    dilation: &[usize],
) -> Result<Vec<usize>, String> {
    let mut out = Vec::with_capacity(spatial.len());
    for i in 0..spatial.len() {
        let span = dilation[i] as i64 * (kernel[i] as i64 - 1) + 1;
        let room = spatial[i] as i64 + 2 * padding[i] as i64 - span;
        if room < 0 {
            return Err(format!(
                "a window of {} (dilation {}) does not fit axis {i} of length {} padded by {}",
                kernel[i], dilation[i], spatial[i], padding[i]
            ));
        }
        out.push((room / stride[i] as i64 + 1) as usize);
    }
    Ok(out)
}

/// Row-major index of `pos` in `shape`.
fn flat(pos: &[usize], shape: &[usize]) -> usize {
    pos.iter().zip(shape).fold(0, |acc, (&p, &n)| acc * n + p)
}

/// Every position of `shape` in row-major order, as a reusable odometer.
fn next_pos(pos: &mut [usize], shape: &[usize]) -> bool {
    for i in (0..shape.len()).rev() {
        pos[i] += 1;
        if pos[i] < shape[i] {
            return true;
        }
        pos[i] = 0;
    }
    false
}

/// `[n, f, *outs]` with each value `at(sample, channel, position)`, in row-major order.
fn per_output(
    n: usize,
    f: usize,
    outs: &[usize],
    mut at: impl FnMut(usize, usize, &[usize]) -> f64,
) -> Tensor {
    let mut shape = vec![n, f];
    shape.extend(outs);
    let mut data = Vec::with_capacity(shape.iter().product());
    let mut o = vec![0; outs.len()];
    for b in 0..n {
        for ch in 0..f {
            o.iter_mut().for_each(|v| *v = 0);
            loop {
                data.push(at(b, ch, &o));
                if !next_pos(&mut o, outs) {
                    break;
                }
            }
        }
    }
    Tensor { shape, data }
}

/// Calls `visit` with every offset of a window, in row-major order.
fn each_offset(kernel: &[usize], mut visit: impl FnMut(&[usize])) {
    let mut off = vec![0; kernel.len()];
    loop {
        visit(&off);
        if !next_pos(&mut off, kernel) {
            break;
        }
    }
}

/// The input position a window offset reads for an output position, or `None` in the padding.
fn window_src(
    out: &[usize],
    off: &[usize],
    spatial: &[usize],
    stride: &[usize],
    padding: &[usize],
    dilation: &[usize],
    src: &mut [usize],
) -> bool {
    for i in 0..out.len() {
        let p = (out[i] * stride[i] + off[i] * dilation[i]) as i64 - padding[i] as i64;
        if p < 0 || p >= spatial[i] as i64 {
            return false;
        }
        src[i] = p as usize;
    }
    true
}

/// PyTorch's convolution (cross-correlation) of `x: [N, C, *spatial]` with `w: [F, C/groups,
/// *kernel]` and an optional bias `[F]`, in f64.
pub fn conv(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    stride: &[usize],
    padding: &[usize],
    dilation: &[usize],
    groups: usize,
) -> Result<Tensor, String> {
    let d = stride.len();
    if x.shape.len() != d + 2 || w.shape.len() != d + 2 {
        return Err(format!(
            "conv{d}d of shapes {:?} and {:?}",
            x.shape, w.shape
        ));
    }
    let (n, c, f, cg) = (x.shape[0], x.shape[1], w.shape[0], w.shape[1]);
    if cg * groups != c || f % groups != 0 {
        return Err(format!(
            "conv{d}d: {c} input channels and {f} output channels with groups {groups} need a \
             weight of [F, C/groups, ...], got {:?}",
            w.shape
        ));
    }
    let spatial = &x.shape[2..];
    let kernel = &w.shape[2..];
    let outs = window_extents(spatial, kernel, stride, padding, dilation)?;
    let fg = f / groups;
    let sp: usize = spatial.iter().product();
    let ks: usize = kernel.iter().product();
    let mut src = vec![0; d];
    Ok(per_output(n, f, &outs, |b, oc, o| {
        let g = oc / fg;
        let mut acc = bias.map_or(0.0, |t| t.data[oc]);
        each_offset(kernel, |off| {
            if window_src(o, off, spatial, stride, padding, dilation, &mut src) {
                let (xi, wi) = (flat(&src, spatial), flat(off, kernel));
                for ic in 0..cg {
                    acc +=
                        x.data[(b * c + g * cg + ic) * sp + xi] * w.data[(oc * cg + ic) * ks + wi];
                }
            }
        });
        acc
    }))
}

/// Max or average pooling of `x: [N, C, *spatial]` in f64 (floor mode). Max pooling treats
/// padding as -inf and ignores NaN, as the max reduction does; average pooling divides by the
/// window clipped to the padded input (`count_include_pad`, PyTorch's divisor) or by the
/// positions inside the input.
pub fn pool(
    x: &Tensor,
    max: bool,
    kernel: &[usize],
    stride: &[usize],
    padding: &[usize],
    dilation: &[usize],
    count_include_pad: bool,
) -> Result<Tensor, String> {
    let d = kernel.len();
    if x.shape.len() != d + 2 {
        return Err(format!("pool{d}d of shape {:?}", x.shape));
    }
    let spatial = &x.shape[2..];
    let outs = window_extents(spatial, kernel, stride, padding, dilation)?;
    let sp: usize = spatial.iter().product();
    let channels = x.shape[1];
    let mut src = vec![0; d];
    Ok(per_output(x.shape[0], channels, &outs, |b, ch, o| {
        let plane = b * channels + ch;
        let (mut best, mut sum, mut inside) = (f64::NEG_INFINITY, 0.0, 0usize);
        each_offset(kernel, |off| {
            if window_src(o, off, spatial, stride, padding, dilation, &mut src) {
                let v = x.data[plane * sp + flat(&src, spatial)];
                // As the max reduction: a NaN loses (f64::max).
                best = best.max(v);
                sum += v;
                inside += 1;
            }
        });
        if max {
            return best;
        }
        let count = if count_include_pad {
            // The window clipped to the padded input (PyTorch's divisor).
            (0..d)
                .map(|i| {
                    let start = (o[i] * stride[i]) as i64 - padding[i] as i64;
                    let end = (start + kernel[i] as i64).min(spatial[i] as i64 + padding[i] as i64);
                    (end - start) as usize
                })
                .product()
        } else {
            inside
        };
        sum / count as f64
    }))
}

/// PyTorch's transposed convolution of `x: [N, C, *spatial]` with `w: [C, F/groups, *kernel]`
/// and an optional bias `[F]`, in f64: every output position gathers the input positions
/// `i = (o + padding - k*dilation) / stride` that divide exactly.
#[allow(clippy::too_many_arguments)]
pub fn conv_transpose(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    stride: &[usize],
    padding: &[usize],
    output_padding: &[usize],
    dilation: &[usize],
    groups: usize,
) -> Result<Tensor, String> {
    let d = stride.len();
    if x.shape.len() != d + 2 || w.shape.len() != d + 2 {
        return Err(format!(
            "conv_transpose{d}d of shapes {:?} and {:?}",
            x.shape, w.shape
        ));
    }
    let (n, c, fg) = (x.shape[0], x.shape[1], w.shape[1]);
    if w.shape[0] != c || c % groups != 0 {
        return Err(format!(
            "conv_transpose{d}d: {c} input channels with groups {groups} need a weight of \
             [C, F/groups, ...], got {:?}",
            w.shape
        ));
    }
    let (f, cg) = (fg * groups, c / groups);
    let spatial = &x.shape[2..];
    let kernel = &w.shape[2..];
    let mut outs = Vec::with_capacity(d);
    for i in 0..d {
        let len = (spatial[i] as i64 - 1) * stride[i] as i64 - 2 * padding[i] as i64
            + dilation[i] as i64 * (kernel[i] as i64 - 1)
            + output_padding[i] as i64
            + 1;
        if len <= 0 {
            return Err(format!(
                "conv_transpose{d}d: output length {len} on axis {i}"
            ));
        }
        outs.push(len as usize);
    }
    let sp: usize = spatial.iter().product();
    let ks: usize = kernel.iter().product();
    let mut src = vec![0; d];
    Ok(per_output(n, f, &outs, |b, oc, o| {
        let (g, ocl) = (oc / fg, oc % fg);
        let mut acc = bias.map_or(0.0, |t| t.data[oc]);
        each_offset(kernel, |off| {
            let hit = (0..d).all(|i| {
                let num = o[i] as i64 + padding[i] as i64 - (off[i] * dilation[i]) as i64;
                let s = stride[i] as i64;
                if num < 0 || num % s != 0 || num / s >= spatial[i] as i64 {
                    return false;
                }
                src[i] = (num / s) as usize;
                true
            });
            if hit {
                let (xi, wi) = (flat(&src, spatial), flat(off, kernel));
                for ic in g * cg..(g + 1) * cg {
                    acc += x.data[(b * c + ic) * sp + xi] * w.data[(ic * fg + ocl) * ks + wi];
                }
            }
        });
        acc
    }))
}

/// Normalisation of `x: [N, C, *]` over sets of elements, in f64: `groups > 0` (group norm;
/// instance norm is `groups = C`), set (n, j) holds channels `j*C/groups ..` of sample n;
/// `groups == 0` (batch norm, training mode), set c holds channel c of every sample. Mean and
/// biased variance per set, then `(x - mean) / sqrt(var + eps)`, times `w[c]`, plus `b[c]`.
pub fn channel_norm(
    x: &Tensor,
    groups: usize,
    eps: f64,
    w: Option<&Tensor>,
    b: Option<&Tensor>,
) -> Result<Tensor, String> {
    if x.shape.len() < 2 {
        return Err(format!("a channel norm of shape {:?}", x.shape));
    }
    let (n, c) = (x.shape[0], x.shape[1]);
    let s: usize = x.shape[2..].iter().product();
    if groups > 0 && c % groups != 0 {
        return Err(format!(
            "{c} channels are not divisible into {groups} groups"
        ));
    }
    for t in w.iter().chain(b.iter()) {
        if t.shape != [c] {
            return Err(format!(
                "weight/bias of shape {:?} for {c} channels",
                t.shape
            ));
        }
    }
    // Every set as its list of element indices.
    let sets: Vec<Vec<usize>> = if groups == 0 {
        (0..c)
            .map(|ch| {
                (0..n)
                    .flat_map(|i| (0..s).map(move |p| (i * c + ch) * s + p))
                    .collect()
            })
            .collect()
    } else {
        let per = c / groups;
        (0..n * groups)
            .map(|set| {
                let start = (set / groups * c + set % groups * per) * s;
                (start..start + per * s).collect()
            })
            .collect()
    };
    let mut y = x.clone();
    for set in sets {
        let m = set.len() as f64;
        let mean = set.iter().map(|&i| x.data[i]).sum::<f64>() / m;
        let var = set.iter().map(|&i| (x.data[i] - mean).powi(2)).sum::<f64>() / m;
        let rstd = 1.0 / (var + eps).sqrt();
        for i in set {
            let ch = i / s % c;
            let mut v = (x.data[i] - mean) * rstd;
            if let Some(w) = w {
                v *= w.data[ch];
            }
            if let Some(b) = b {
                v += b.data[ch];
            }
            y.data[i] = v;
        }
    }
    Ok(y)
}
