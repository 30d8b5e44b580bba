//! Kernel names and launch configurations: the one place that knows the parameter lists and the
//! `extern "C"` names of `kernels.cu`. Every kernel loops (grid-stride, over rows or over column
//! blocks), so a grid only decides speed; the sizes here are chosen for an H200 (132 SMs) and
//! kept simple: 256-thread vectorised elementwise blocks, 128-thread strided blocks (broadcasts,
//! transposes) with magic-number division as PyTorch's TensorIterator, a warp per row up to 1024
//! elements and a block per row beyond, (32, ty) blocks for columns. An F64 plan launches the
//! `_f64` instantiation of every float kernel with the same grids (see [`Elem`]).

use crate::ops::Dtype;

use super::{BatchNorm, Conv, Gemm, Precision, Step, StepArg, Window};

/// What a kernel's buffers hold: the task dtype in a native plan, f64 for every float buffer of
/// an F64 plan (i64 stays i64). It names the kernel's dtype suffix, sizes its vector accesses
/// and types its scalar parameters (float, or double for f64).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Elem {
    /// Stored in the task's dtype.
    Task(Dtype),
    /// Stored as f64.
    F64,
}

impl Elem {
    /// How a buffer of task dtype `d` is stored in a plan of `precision`.
    pub(super) fn new(d: Dtype, precision: Precision) -> Elem {
        match (precision, d) {
            (Precision::F64, Dtype::F32 | Dtype::F16 | Dtype::Bf16) => Elem::F64,
            _ => Elem::Task(d),
        }
    }

    /// The kernel-name suffix.
    pub(super) fn name(self) -> &'static str {
        match self {
            Elem::Task(d) => d.name(),
            Elem::F64 => "f64",
        }
    }

    /// Bytes per element.
    pub(super) fn size_bytes(self) -> usize {
        match self {
            Elem::Task(d) => d.size_bytes(),
            Elem::F64 => 8,
        }
    }

    /// A scalar parameter in the kernel's opmath type.
    fn scalar(self, v: f64) -> StepArg {
        match self {
            Elem::F64 => StepArg::F64(v),
            Elem::Task(_) => StepArg::F32(v as f32),
        }
    }
}

/// Elementwise functions, by kernel name (`unary_<name>_<dt>`, parameters `(x, y, n, p0, p1)`):
/// the op language's, then three steps of PyTorch composites (`clamp_min`, `reciprocal`,
/// `inf_to_zero`).
pub(super) const UNARY: [&str; 23] = [
    "relu",
    "gelu",
    "gelu_tanh",
    "silu",
    "sigmoid",
    "tanh",
    "exp",
    "log",
    "abs",
    "neg",
    "sqrt",
    "rsqrt",
    "square",
    "softplus",
    "mish",
    "hardsigmoid",
    "hardswish",
    "leaky_relu",
    "elu",
    "clamp",
    "clamp_min",
    "reciprocal",
    "inf_to_zero",
];
/// Binary operators: `binary_<op>_<dt>`, `binary_<op>_scalar_<dt>`, `binary_<op>_bcast_<dt>`.
pub(super) const BINARY: [&str; 7] = ["add", "sub", "mul", "div", "maximum", "minimum", "pow"];
/// Reductions: `reduce_<kind>_rows_<dt>`, `reduce_<kind>_cols[_v2|_v4]_<dt>`; `norm` is the 2-norm of
/// PyTorch's `F.normalize`.
pub(super) const REDUCE: [&str; 8] = [
    "sum", "mean", "max", "min", "prod", "argmax", "argmin", "norm",
];
/// Statistics-then-map along an axis: `<name>_rows_<dt>`, `<name>_cols_<dt>`.
pub(super) const LANES: [&str; 2] = ["softmax", "log_softmax"];
/// Scans: `<name>_rows_<dt>`, `<name>_cols_<dt>`.
pub(super) const SCANS: [&str; 2] = ["cumsum", "cumprod"];

const FLOATS: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::Bf16];
/// The storage types of float kernels: the task dtypes, then f64.
const STORED: [&str; 4] = ["f32", "f16", "bf16", "f64"];

/// Threads per block of the elementwise kernels.
const EW_THREADS: u32 = 256;
/// Most blocks of an elementwise launch; beyond that, threads loop.
const EW_MAX_BLOCKS: u64 = 1 << 16;
/// Threads per block of the depthwise convolution (PyTorch's `CUDA_NUM_THREADS`).
const DEPTHWISE_THREADS: u32 = 128;
/// The depthwise convolution's kernels: a plane's general window, a volume's, square windows of
/// 1, 3 and 5 over a plane (all in 32-bit indices), and any window in 64-bit indices.
const DEPTHWISE_FORMS: [&str; 6] = ["", "_vol", "_k1", "_k3", "_k5", "_wide"];
/// The pooling kernels: planes, volumes (32-bit indices), either in 64-bit indices.
const POOL_FORMS: [&str; 3] = ["", "_vol", "_wide"];
/// A value reduction over columns: 1, 2 or 4 adjacent outputs a thread ([`col_width`]).
const COL_FORMS: [&str; 3] = ["", "_v2", "_v4"];

/// `kernel` without the form its sizes picked (`conv_depthwise_k3_f32` is `conv_depthwise_f32`):
/// the kernel family, the same at every preset.
#[cfg(test)]
pub(super) fn family(kernel: &str) -> String {
    let forms = DEPTHWISE_FORMS.iter().chain(&POOL_FORMS).chain(&COL_FORMS);
    forms
        .filter(|f| !f.is_empty())
        .fold(kernel.to_string(), |k, f| k.replace(&format!("{f}_"), "_"))
}
/// Most blocks of a row or column launch; beyond that, blocks loop.
const MAX_BLOCKS: u64 = (1 << 31) - 1;
/// Rows up to this long get one warp each; longer rows get a block.
const WARP_ROW_MAX: usize = 1024;
/// Rows per block when a warp takes a row.
const WARP_ROWS: u32 = 4;

/// Every kernel of `kernels.cu`, by name.
pub fn kernel_names() -> Vec<String> {
    let mut out = Vec::new();
    for d in STORED {
        out.extend(UNARY.iter().map(|u| format!("unary_{u}_{d}")));
        for b in BINARY {
            out.push(format!("binary_{b}_{d}"));
            out.push(format!("binary_{b}_scalar_{d}"));
            out.push(format!("binary_{b}_bcast_{d}"));
        }
        for r in REDUCE {
            out.push(format!("reduce_{r}_rows_{d}"));
            let widths = if r.starts_with("arg") {
                1
            } else {
                COL_FORMS.len()
            };
            for form in &COL_FORMS[..widths] {
                out.push(format!("reduce_{r}_cols{form}_{d}"));
            }
        }
        for l in LANES.iter().chain(&SCANS) {
            out.push(format!("{l}_rows_{d}"));
            out.push(format!("{l}_cols_{d}"));
        }
        out.push(format!("conv_{d}"));
        out.push(format!("conv_transpose_{d}"));
        for form in DEPTHWISE_FORMS {
            out.push(format!("conv_depthwise{form}_{d}"));
        }
        for form in POOL_FORMS {
            out.push(format!("max_pool{form}_{d}"));
            out.push(format!("avg_pool{form}_{d}"));
        }
        out.push(format!("layer_norm_{d}"));
        out.push(format!("chan_norm_{d}"));
        out.push(format!("rms_norm_{d}"));
        out.push(format!("gemm_{d}"));
        out.push(format!("gather_{d}"));
    }
    for from in FLOATS.map(Dtype::name) {
        for to in FLOATS.map(Dtype::name) {
            if to != from {
                out.push(format!("cast_{from}_{to}"));
            }
        }
    }
    for bits in [16, 32, 64] {
        out.push(format!("copy_strided_b{bits}"));
        out.push(format!("copy_triangle_b{bits}"));
        out.push(format!("copy_flip_b{bits}"));
    }
    out.push("copy_bytes".into());
    out
}

fn blocks(work: u64, per_block: u64, cap: u64) -> u32 {
    work.div_ceil(per_block).clamp(1, cap) as u32
}

fn kernel(name: String, grid: [u32; 3], block: [u32; 3], args: Vec<StepArg>) -> Step {
    Step::Kernel {
        kernel: name,
        grid,
        block,
        smem_bytes: 0,
        args,
    }
}

fn n64(n: usize) -> StepArg {
    StepArg::I64(n as i64)
}

/// An elementwise launch over `n` elements of `e`, 16 bytes per thread and step.
fn elementwise(name: String, e: Elem, n: usize, args: Vec<StepArg>) -> Step {
    let per_thread = (16 / e.size_bytes()) as u64;
    let grid = blocks(
        (n as u64).div_ceil(per_thread),
        EW_THREADS as u64,
        EW_MAX_BLOCKS,
    );
    kernel(name, [grid, 1, 1], [EW_THREADS, 1, 1], args)
}

/// `y = f(x)` elementwise, with the function's two scalar parameters.
pub(super) fn unary(f: &str, e: Elem, x: usize, y: usize, n: usize, p: [f64; 2]) -> Step {
    let args = vec![
        StepArg::Buffer(x),
        StepArg::Buffer(y),
        n64(n),
        e.scalar(p[0]),
        e.scalar(p[1]),
    ];
    elementwise(format!("unary_{f}_{}", e.name()), e, n, args)
}

/// `y = a op b` over operands of the output's shape and dtype.
pub(super) fn binary(op: &str, e: Elem, a: usize, b: usize, y: usize, n: usize) -> Step {
    let args = vec![
        StepArg::Buffer(a),
        StepArg::Buffer(b),
        StepArg::Buffer(y),
        n64(n),
    ];
    elementwise(format!("binary_{op}_{}", e.name()), e, n, args)
}

/// `y = a op s` (or `s op a` when `scalar_first`).
pub(super) fn binary_scalar(
    op: &str,
    e: Elem,
    a: usize,
    s: f64,
    y: usize,
    n: usize,
    scalar_first: bool,
) -> Step {
    let args = vec![
        StepArg::Buffer(a),
        e.scalar(s),
        StepArg::Buffer(y),
        n64(n),
        StepArg::I32(scalar_first.into()),
    ];
    elementwise(format!("binary_{op}_scalar_{}", e.name()), e, n, args)
}

/// Most dimensions a strided launch takes after merging (`KB_MAXD` in `kernels.cu`).
pub(super) const STRIDED_MAX_DIMS: usize = 6;

/// Threads per block of the strided kernels, each taking 2 elements per step (PyTorch's
/// `elementwise_kernel<128, 2>`).
const STRIDED_THREADS: u32 = 128;

/// The magic number of an unsigned 32-bit division by `d`, packed as `magic | shift << 32`
/// (Granlund-Montgomery): for n < 2^31, n / d == (umulhi(n, magic) + n) >> shift, with shift
/// the least s such that 2^s >= d. 0 for d >= 2^31 (such launches index in 64 bits).
pub(super) fn div_magic(d: u64) -> i64 {
    if d == 0 || d >= 1 << 31 {
        return 0;
    }
    let shift = (0..32).find(|&s| (1u64 << s) >= d).unwrap_or(31);
    let magic = ((1u64 << 32) * ((1u64 << shift) - d)) / d + 1;
    (magic | (shift << 32)) as i64
}

/// The 25 parameters after the element count of a strided launch: the dimension count, then
/// extents, magics, strides of a and strides of b, each padded to [`STRIDED_MAX_DIMS`].
fn strided_args(dims: &[(usize, i64, i64)]) -> Vec<StepArg> {
    let mut args = vec![StepArg::I32(dims.len() as i32)];
    let pad = |f: &dyn Fn(&(usize, i64, i64)) -> i64, fill: i64| {
        let mut v: Vec<StepArg> = dims.iter().map(|t| StepArg::I64(f(t))).collect();
        v.resize(STRIDED_MAX_DIMS, StepArg::I64(fill));
        v
    };
    args.extend(pad(&|t| t.0 as i64, 1));
    args.extend(pad(&|t| div_magic(t.0 as u64), div_magic(1)));
    args.extend(pad(&|t| t.1, 0));
    args.extend(pad(&|t| t.2, 0));
    args
}

fn strided_grid(n: usize) -> [u32; 3] {
    [
        blocks(n as u64, 2 * STRIDED_THREADS as u64, EW_MAX_BLOCKS),
        1,
        1,
    ]
}

/// `y = a op b` with broadcasting: `dims` are (extent, stride of a, stride of b), outermost
/// first, at most [`STRIDED_MAX_DIMS`]; the output is contiguous.
pub(super) fn bcast(
    op: &str,
    e: Elem,
    a: usize,
    b: usize,
    y: usize,
    dims: &[(usize, i64, i64)],
) -> Step {
    let n: usize = dims.iter().map(|t| t.0).product();
    let mut args = vec![
        StepArg::Buffer(a),
        StepArg::Buffer(b),
        StepArg::Buffer(y),
        n64(n),
    ];
    args.extend(strided_args(dims));
    let name = format!("binary_{op}_bcast_{}", e.name());
    kernel(name, strided_grid(n), [STRIDED_THREADS, 1, 1], args)
}

/// `y` (contiguous) = `x` read through strides: `dims` are (extent, stride in x, unused), as for
/// [`bcast`]. A transpose made contiguous.
pub(super) fn strided_copy(
    elem_bytes: usize,
    x: usize,
    y: usize,
    dims: &[(usize, i64, i64)],
) -> Step {
    let n: usize = dims.iter().map(|t| t.0).product();
    let mut args = vec![StepArg::Buffer(x), StepArg::Buffer(y), n64(n)];
    args.extend(strided_args(dims));
    let name = format!("copy_strided_b{}", elem_bytes * 8);
    kernel(name, strided_grid(n), [STRIDED_THREADS, 1, 1], args)
}

/// The grid of PyTorch's index kernels (flip, gather) over `n` elements: 128 threads of 4
/// elements a block (`each_4x128` in kernels.cu).
fn index_grid(n: usize) -> [u32; 3] {
    [
        blocks(n as u64, 4 * STRIDED_THREADS as u64, i32::MAX as u64),
        1,
        1,
    ]
}

/// `flip` of `x` into `y` along an axis of `extent` with `inner` elements after it, as
/// PyTorch's flip kernel launches: 128 threads, 4 elements each.
pub(super) fn flip(
    elem_bytes: usize,
    x: usize,
    y: usize,
    n: usize,
    inner: usize,
    extent: usize,
) -> Step {
    let args = vec![
        StepArg::Buffer(x),
        StepArg::Buffer(y),
        n64(n),
        n64(inner),
        n64(extent),
        StepArg::I64(div_magic(inner as u64)),
        StepArg::I64(div_magic(extent as u64)),
    ];
    let name = format!("copy_flip_b{}", elem_bytes * 8);
    kernel(name, index_grid(n), [STRIDED_THREADS, 1, 1], args)
}

/// `gather` of `x` by the i64 `idx` into `y` (`n` elements, the index's): along an axis `ka`
/// long in the index and `kx` in `x`, with `inner` elements after it; as PyTorch's gather
/// kernel launches, 128 threads of 4 elements.
pub(super) fn gather(
    e: Elem,
    [x, idx, y]: [usize; 3],
    n: usize,
    [ka, kx, inner]: [usize; 3],
) -> Step {
    let args = vec![
        StepArg::Buffer(x),
        StepArg::Buffer(idx),
        StepArg::Buffer(y),
        n64(n),
        n64(ka),
        n64(kx),
        n64(inner),
    ];
    kernel(
        format!("gather_{}", e.name()),
        index_grid(n),
        [STRIDED_THREADS, 1, 1],
        args,
    )
}

/// `triu` (`upper`) or `tril` of the `rows x cols` matrices of `x` into `y`: zero bits where the
/// element is dropped (the zero of every float type).
pub(super) fn triangle(
    elem_bytes: usize,
    x: usize,
    y: usize,
    n: usize,
    [rows, cols]: [usize; 2],
    diagonal: i64,
    upper: bool,
) -> Step {
    let args = vec![
        StepArg::Buffer(x),
        StepArg::Buffer(y),
        n64(n),
        n64(rows),
        n64(cols),
        StepArg::I64(diagonal),
        StepArg::I32(upper.into()),
    ];
    let name = format!("copy_triangle_b{}", elem_bytes * 8);
    kernel(name, strided_grid(n), [STRIDED_THREADS, 1, 1], args)
}

/// Grid and block of a row kernel: a warp per row (several rows per block) for short rows, a
/// block of up to 512 threads per row for long ones (1024-thread blocks measured 1.7x slower
/// than PyTorch on softmax rows of 16384 on the H200: one block per SM, idle at each barrier).
fn row_launch(rows: usize, n: usize) -> ([u32; 3], [u32; 3]) {
    if n <= WARP_ROW_MAX {
        let grid = blocks(rows as u64, WARP_ROWS as u64, MAX_BLOCKS);
        return ([grid, 1, 1], [32, WARP_ROWS, 1]);
    }
    let threads = n.div_ceil(16).next_power_of_two().clamp(64, 512) as u32;
    ([blocks(rows as u64, 1, MAX_BLOCKS), 1, 1], [threads, 1, 1])
}

/// Grid and block of a column kernel: (32, ty) threads per 32 columns of one outer index, the
/// ty threads of a column splitting the axis: 16, or 32 when there are too few blocks to fill an
/// H200 (132 SMs x 4 blocks of 512 threads) otherwise.
fn col_launch(outer: usize, n: usize, inner: usize) -> ([u32; 3], [u32; 3]) {
    let work = outer as u64 * inner.div_ceil(32) as u64;
    let rows = if work < 4 * 132 { 32 } else { 16 };
    let ty = n.next_power_of_two().min(rows) as u32;
    ([blocks(work, 1, MAX_BLOCKS), 1, 1], [32, ty, 1])
}

/// Adjacent outputs a thread of a column reduction over `inner` columns, as PyTorch's reduce kernel
/// vectorises them: 4 where the columns divide by 4, else 2, else 1; each width is a kernel of its
/// own (`reduce_<kind>_cols_v4`, `_v2`, and the plain one).
fn col_width(inner: usize) -> usize {
    if inner % 4 == 0 {
        4
    } else if inner % 2 == 0 {
        2
    } else {
        1
    }
}

/// Grid and block of a column reduction, as PyTorch's reduce kernel sets them: a thread takes V =
/// 4 (else 2, else 1) adjacent outputs where the columns divide by it, a block at most 512 / V
/// threads, bw x bh of them (bw up to a warp across columns, bh the rest, both powers of two
/// within the columns and the axis). The bh rows split the axis when that leaves each thread 16
/// elements or the axis is 256 long; otherwise every thread reduces its columns whole and the
/// block is bw * bh columns wide. `v` is [`col_width`]'s; index outputs (`v` 0), and an axis
/// split one column a thread: [`col_launch`].
fn reduce_col_launch(v: usize, outer: usize, n: usize, inner: usize) -> ([u32; 3], [u32; 3]) {
    if v == 0 {
        return col_launch(outer, n, inner);
    }
    let floor_pow2 = |x: usize| 1usize << x.max(1).ilog2();
    let max_threads = 512 / v;
    let groups = inner / v;
    let (d0, d1) = (
        floor_pow2(groups).min(max_threads),
        floor_pow2(n).min(max_threads),
    );
    let bw = d0.min(32);
    let bh = d1.min(max_threads / bw);
    let bw = d0.min(max_threads / bh);
    if n >= bh * 16 || n >= 256 {
        if v == 1 {
            return col_launch(outer, n, inner);
        }
        // The kernel combines at most 32 rows (col_reduce's shared tile).
        let bh = bh.min(32);
        let work = outer as u64 * groups.div_ceil(bw) as u64;
        return (
            [blocks(work, 1, MAX_BLOCKS), 1, 1],
            [bw as u32, bh as u32, 1],
        );
    }
    let wide = bw * bh;
    let work = outer as u64 * groups.div_ceil(wide) as u64;
    ([blocks(work, 1, MAX_BLOCKS), 1, 1], [wide as u32, 1, 1])
}

/// Splits `shape` around `axis` into (outer, extent, inner).
pub(super) fn split(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

/// A reduction of `x` along the middle of (outer, n, inner) into `y` (outer x inner).
pub(super) fn reduce(kind: &str, e: Elem, x: usize, y: usize, dims: (usize, usize, usize)) -> Step {
    let (outer, n, inner) = dims;
    let (x, y) = (StepArg::Buffer(x), StepArg::Buffer(y));
    if inner == 1 {
        let (grid, block) = row_launch(outer, n);
        let args = vec![x, y, n64(outer), n64(n)];
        kernel(
            format!("reduce_{kind}_rows_{}", e.name()),
            grid,
            block,
            args,
        )
    } else {
        let v = if kind.starts_with("arg") {
            0
        } else {
            col_width(inner)
        };
        let (grid, block) = reduce_col_launch(v, outer, n, inner);
        let args = vec![x, y, n64(outer), n64(n), n64(inner)];
        // COL_FORMS by width: 1 (and an index reduction's 0), 2, 4.
        let form = COL_FORMS[v.max(1).ilog2() as usize];
        kernel(
            format!("reduce_{kind}_cols{form}_{}", e.name()),
            grid,
            block,
            args,
        )
    }
}

/// Shared memory of a block that PyTorch's softmax may fill with a row (the device's default
/// per-block limit).
const SOFTMAX_SMEM_BYTES: usize = 48 << 10;
/// Shared memory PyTorch's softmax keeps for its block reduction (a float per warp of up to 1024
/// threads).
const SOFTMAX_SMEM_SCRATCH: usize = 32 * 4;

/// softmax / log_softmax of `x` (task dtype `d`, in a plan of `precision`) along the middle of
/// (outer, n, inner).
pub(super) fn lanes(
    name: &str,
    (d, precision): (Dtype, Precision),
    x: usize,
    y: usize,
    dims: (usize, usize, usize),
) -> Step {
    let e = Elem::new(d, precision);
    let (outer, n, inner) = dims;
    let (x, y) = (StepArg::Buffer(x), StepArg::Buffer(y));
    if inner == 1 {
        let (grid, block) = row_launch(outer, n);
        // PyTorch keeps a row in shared memory (48 KiB a block, less its reduction's scratch)
        // and reads it from global memory once; longer rows go through cunn_SoftMaxForward,
        // which reads them three times (maximum, sum, map): so does the baseline. By the task's
        // dtype, so that the fp64 reference plan has the same steps.
        let separate_max = n * d.size_bytes() + SOFTMAX_SMEM_SCRATCH >= SOFTMAX_SMEM_BYTES;
        let args = vec![x, y, n64(outer), n64(n), StepArg::I32(separate_max.into())];
        kernel(format!("{name}_rows_{}", e.name()), grid, block, args)
    } else {
        let (grid, block) = lanes_col_launch(outer, n, inner);
        let args = vec![x, y, n64(outer), n64(n), n64(inner)];
        kernel(format!("{name}_cols_{}", e.name()), grid, block, args)
    }
}

/// Grid and block of softmax / log_softmax over a strided axis, as PyTorch's
/// `SpatialSoftMax_getBlockSize` sets them: up to 1024 columns a block, a thread each reducing
/// and mapping its column whole, unless the columns are at most 64 and the axis at least 64
/// long, where threads along the axis split it too (then kevin's 32 columns a block and its
/// split: [`col_launch`]).
fn lanes_col_launch(outer: usize, n: usize, inner: usize) -> ([u32; 3], [u32; 3]) {
    let wide = inner.min(1024);
    if wide <= 64 && n >= 64 {
        return col_launch(outer, n, inner);
    }
    let work = outer as u64 * inner.div_ceil(wide) as u64;
    ([blocks(work, 1, MAX_BLOCKS), 1, 1], [wide as u32, 1, 1])
}

/// cumsum / cumprod of `x` along the middle of (outer, n, inner).
pub(super) fn scan(name: &str, e: Elem, x: usize, y: usize, dims: (usize, usize, usize)) -> Step {
    let (outer, n, inner) = dims;
    let (x, y) = (StepArg::Buffer(x), StepArg::Buffer(y));
    if inner == 1 {
        let tx = 1u32 << scan_log_threads_x(outer, n);
        let ty = 512 / tx;
        let grid = [blocks(outer as u64, ty as u64, MAX_BLOCKS), 1, 1];
        let args = vec![x, y, n64(outer), n64(n)];
        kernel(format!("{name}_rows_{}", e.name()), grid, [tx, ty, 1], args)
    } else {
        let (grid, block) = col_launch(outer, n, inner);
        let args = vec![x, y, n64(outer), n64(n), n64(inner)];
        kernel(format!("{name}_cols_{}", e.name()), grid, block, args)
    }
}

/// log2 of the threads a row of a row scan gets, of 512 a block, as PyTorch's
/// `get_log_num_threads_x_inner_scan` sets it: 9 plus the difference of the row's and the row
/// count's ceil-log2, halved, within 4..=9 (many short rows: 16 threads a row, 32 rows a block).
pub(super) fn scan_log_threads_x(rows: usize, n: usize) -> u32 {
    let ceil_log2 = |v: usize| i64::from(v.max(1).next_power_of_two().trailing_zeros());
    ((9 + ceil_log2(n) - ceil_log2(rows)) / 2).clamp(4, 9) as u32
}

/// layer_norm (`rms == false`) or rms_norm over rows of `n`; an absent weight or bias is passed
/// as `x` and never read.
#[allow(clippy::too_many_arguments)]
pub(super) fn norm(
    rms: bool,
    e: Elem,
    x: usize,
    w: Option<usize>,
    b: Option<usize>,
    y: usize,
    rows: usize,
    n: usize,
    eps: f64,
) -> Step {
    let (grid, block) = row_launch(rows, n);
    let buf = |o: Option<usize>| StepArg::Buffer(o.unwrap_or(x));
    let flag = |o: Option<usize>| StepArg::I32(o.is_some().into());
    let mut args = vec![StepArg::Buffer(x), buf(w)];
    if !rms {
        args.push(buf(b));
    }
    args.extend([
        StepArg::Buffer(y),
        n64(rows),
        n64(n),
        e.scalar(eps),
        flag(w),
    ]);
    if !rms {
        args.push(flag(b));
    }
    let name = if rms { "rms_norm" } else { "layer_norm" };
    kernel(format!("{name}_{}", e.name()), grid, block, args)
}

/// Whether every index of tensors of these element counts fits a 32-bit int (the kernels' 32-bit
/// forms, as PyTorch's `canUse32BitIndexMath`).
fn fits_i32(counts: &[usize]) -> bool {
    counts.iter().all(|&n| n <= i32::MAX as usize)
}

/// The form of the depthwise kernel that runs `c`, as PyTorch picks its templates on the host:
/// 64-bit indices where x's or y's need them, else a square 1x1, 3x3 or 5x5 window over a plane
/// unrolled, else the general window over a plane or a volume.
fn depthwise_form(c: &Conv) -> &'static str {
    let w = &c.window;
    let input = c.n * c.c * w.spatial.iter().product::<usize>();
    if !fits_i32(&[c.n * c.f * w.outputs(), input]) {
        return "_wide";
    }
    let plane = w.spatial.len() <= 2;
    let k = &w.kernel;
    let square = k.len() == 2 && k[0] == k[1] || k.len() == 1 && k[0] == 1;
    match k.last() {
        Some(1) if plane && square => "_k1",
        Some(3) if plane && square => "_k3",
        Some(5) if plane && square => "_k5",
        _ if plane => "",
        _ => "_vol",
    }
}

/// The window as the kernels take it: 1-D and 2-D padded to 3-D with leading unit axes (extent
/// 1, window 1, stride 1, no padding, dilation 1).
impl Window {
    fn args(&self) -> Vec<StepArg> {
        let pad3 = |v: &[usize], fill: usize| {
            let mut out = vec![fill; 3 - v.len()];
            out.extend(v);
            out
        };
        let mut args = Vec::with_capacity(18);
        for (v, fill) in [
            (&self.spatial, 1),
            (&self.kernel, 1),
            (&self.out, 1),
            (&self.stride, 1),
            (&self.padding, 0),
            (&self.dilation, 1),
        ] {
            args.extend(pad3(v, fill).into_iter().map(n64));
        }
        args
    }

    fn outputs(&self) -> usize {
        self.out.iter().product()
    }
}

/// The direct convolution kernel (or the transposed one, as a gather) that computes `c` in a
/// plan of `precision`: one thread per output element of `y: [n, f, *out]`.
pub(super) fn conv_kernel(c: &Conv, precision: Precision) -> Step {
    let win = &c.window;
    let total = (c.n * c.f * win.outputs()) as u64;
    let depthwise = c.torch_native_depthwise();
    // PyTorch's depthwise kernels: a thread per output, blocks of 128, no grid-stride cap.
    let (threads, max_blocks) = if depthwise {
        (DEPTHWISE_THREADS, MAX_BLOCKS)
    } else {
        (EW_THREADS, EW_MAX_BLOCKS)
    };
    let grid = blocks(total, threads as u64, max_blocks);
    let mut args = vec![
        StepArg::Buffer(c.x),
        StepArg::Buffer(c.w),
        StepArg::Buffer(c.bias.unwrap_or(c.w)),
        StepArg::Buffer(c.y),
        n64(c.n),
        n64(c.c),
        n64(c.f),
        n64(c.groups),
    ];
    args.extend(win.args());
    args.push(StepArg::I32(c.bias.is_some().into()));
    let name = if c.transposed {
        "conv_transpose".to_string()
    } else if depthwise {
        format!("conv_depthwise{}", depthwise_form(c))
    } else {
        "conv".to_string()
    };
    let e = Elem::new(c.dtype, precision);
    kernel(
        format!("{name}_{}", e.name()),
        [grid, 1, 1],
        [threads, 1, 1],
        args,
    )
}

/// Max pooling (with `indices`: the i64 buffer its argmax positions go to, as PyTorch's CUDA max
/// pooling writes them) or average pooling (`indices` None) over `planes` planes (N x C): one
/// thread per output element, launched as PyTorch launches its pooling kernels.
pub(super) fn pool(
    e: Elem,
    (x, y, indices): (usize, usize, Option<usize>),
    planes: usize,
    win: &Window,
    count_include_pad: bool,
) -> Step {
    let max = indices.is_some();
    let total = (planes * win.outputs()) as u64;
    let (grid, block) = if win.spatial.len() <= 2 {
        // max_pool_forward_nchw's blocks of 256, avg_pool2d_out_cuda_frame's of 1024: a thread
        // an output, every block launched.
        let threads = if max { 256 } else { 1024 };
        (
            [blocks(total, threads as u64, MAX_BLOCKS), 1, 1],
            [threads, 1, 1],
        )
    } else {
        // max_pool3d / avg_pool3d: (32, 8) over the output's width and height, the frames
        // (planes x depths) along z; y and z at most 65535 (the kernel loops over the rest).
        let (d, h, w) = (win.out[0], win.out[1], win.out[2]);
        let z = (planes * d).clamp(1, 65535) as u32;
        let y = h.div_ceil(8).clamp(1, 65535) as u32;
        ([w.div_ceil(32).max(1) as u32, y, z], [32, 8, 1])
    };
    let mut args = vec![StepArg::Buffer(x), StepArg::Buffer(y)];
    args.extend(indices.map(StepArg::Buffer));
    args.push(n64(planes));
    args.extend(win.args());
    args.push(StepArg::I32(count_include_pad.into()));
    let name = if max { "max_pool" } else { "avg_pool" };
    let padded: usize = (win.spatial.iter().zip(&win.padding))
        .map(|(s, p)| s + 2 * p)
        .product();
    let input = planes * win.spatial.iter().product::<usize>();
    let form = if !fits_i32(&[total as usize, input, planes * padded]) {
        "_wide"
    } else if win.spatial.len() <= 2 {
        ""
    } else {
        "_vol"
    };
    kernel(format!("{name}{form}_{}", e.name()), grid, block, args)
}

/// Group, instance (`groups = c`) or batch (`groups = 0`) norm of `x: [n, c, s]`: a warp or a
/// block per set of elements, as the row norms.
#[allow(clippy::too_many_arguments)]
pub(super) fn chan_norm(
    e: Elem,
    (x, w, b, y): (usize, Option<usize>, Option<usize>, usize),
    (n, c, s): (usize, usize, usize),
    groups: usize,
    eps: f64,
) -> Step {
    let (sets, per) = if groups == 0 {
        (c, n * s)
    } else {
        (n * groups, c / groups * s)
    };
    let (grid, block) = row_launch(sets, per);
    let buf = |o: Option<usize>| StepArg::Buffer(o.unwrap_or(x));
    let flag = |o: Option<usize>| StepArg::I32(o.is_some().into());
    let args = vec![
        StepArg::Buffer(x),
        buf(w),
        buf(b),
        StepArg::Buffer(y),
        n64(n),
        n64(c),
        n64(s),
        n64(groups),
        e.scalar(eps),
        flag(w),
        flag(b),
    ];
    kernel(format!("chan_norm_{}", e.name()), grid, block, args)
}

/// The `chan_norm` launch that computes a [`BatchNorm`] step (an f32 one) in a plan of `precision`.
pub(super) fn batch_norm_kernel(b: &BatchNorm, precision: Precision) -> Step {
    let e = Elem::new(Dtype::F32, precision);
    chan_norm(
        e,
        (b.x, Some(b.w), Some(b.b), b.y),
        (b.n, b.c, b.s),
        0,
        b.eps,
    )
}

/// Copies `nbytes` bytes from `x` to `y`.
pub(super) fn copy(x: usize, y: usize, nbytes: usize) -> Step {
    let grid = blocks(
        (nbytes as u64).div_ceil(16),
        EW_THREADS as u64,
        EW_MAX_BLOCKS,
    );
    let args = vec![StepArg::Buffer(x), StepArg::Buffer(y), n64(nbytes)];
    kernel("copy_bytes".into(), [grid, 1, 1], [EW_THREADS, 1, 1], args)
}

/// Converts `n` elements of `x` (dtype `from`) into `y` (dtype `to`), in a native plan.
pub(super) fn cast(from: Dtype, to: Dtype, x: usize, y: usize, n: usize) -> Step {
    let grid = blocks(n as u64, EW_THREADS as u64, EW_MAX_BLOCKS);
    let args = vec![StepArg::Buffer(x), StepArg::Buffer(y), n64(n)];
    let name = format!("cast_{}_{}", from.name(), to.name());
    kernel(name, [grid, 1, 1], [EW_THREADS, 1, 1], args)
}

/// The tiled `gemm_<dtype>` launch that computes `g` in a plan of `precision`.
pub(super) fn gemm_kernel(g: &Gemm, precision: Precision) -> Step {
    let grid = [
        blocks(g.n as u64, 16, 65_535),
        blocks(g.m as u64, 16, 65_535),
        g.batch.clamp(1, 65_535),
    ];
    let args = vec![
        StepArg::Buffer(g.a),
        StepArg::Buffer(g.b),
        StepArg::Buffer(g.c),
        StepArg::I64(g.m.into()),
        StepArg::I64(g.n.into()),
        StepArg::I64(g.k.into()),
        StepArg::I64(g.batch.into()),
        StepArg::I32(g.trans_a.into()),
        StepArg::I32(g.trans_b.into()),
        StepArg::I64(g.stride_a),
        StepArg::I64(g.stride_b),
        StepArg::I64(g.stride_c),
    ];
    let e = Elem::new(g.dtype, precision);
    kernel(format!("gemm_{}", e.name()), grid, [16, 16, 1], args)
}
