//! Lowering tests (steps, buffers, dtypes, GEMM flags, broadcast strides, scalar folding) and
//! the NVRTC compile of [`SOURCE`].

use std::collections::BTreeSet;
use std::path::Path;

use super::*;
use crate::compile::{self, CompileRequest, OutputKind};
use crate::ops::{Program, Sizes};
use crate::tasks::TaskSuite;

fn plan(src: &str, sizes: &[(&str, usize)]) -> EagerPlan {
    plan_in(src, sizes, Precision::Native)
}

fn plan_in(src: &str, sizes: &[(&str, usize)], precision: Precision) -> EagerPlan {
    let program = Program::parse(src).unwrap_or_else(|e| panic!("{e}"));
    let sizes: Sizes = sizes.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    lower::lower_program("test", &program, &sizes, precision).unwrap_or_else(|e| panic!("{e}"))
}

/// Each step as its kernel name, "gemm", "conv" or "batch_norm".
fn kinds(p: &EagerPlan) -> Vec<String> {
    p.steps
        .iter()
        .map(|s| match s {
            Step::Kernel { kernel, .. } => kernel.clone(),
            Step::Gemm(_) => "gemm".into(),
            Step::Conv(_) => "conv".into(),
            Step::BatchNorm(_) => "batch_norm".into(),
        })
        .collect()
}

fn gemm(p: &EagerPlan, i: usize) -> &Gemm {
    match &p.steps[i] {
        Step::Gemm(g) => g,
        s => panic!("step {i} is not a GEMM: {s:?}"),
    }
}

fn args(p: &EagerPlan, i: usize) -> &[StepArg] {
    match &p.steps[i] {
        Step::Kernel { args, .. } => args,
        s => panic!("step {i} is not a kernel: {s:?}"),
    }
}

fn buf(p: &EagerPlan, name: &str) -> usize {
    p.buffers
        .iter()
        .position(|b| b.name == name)
        .unwrap_or_else(|| panic!("no buffer `{name}` in {:?}", p.buffers))
}

const LINEAR: &str =
    "input A: f32[M, K]\ninput W: f32[K, N]\ninput b: f32[N]\noutput Y: f32[M, N]\n";

#[test]
fn gemm_bias_relu_is_three_launches_into_fresh_buffers() {
    let p = plan(
        &format!("{LINEAR}Y = relu(A @ W + b)"),
        &[("M", 33), ("N", 65), ("K", 17)],
    );
    assert_eq!(
        kinds(&p),
        ["gemm", "binary_add_bcast_f32", "unary_relu_f32"]
    );
    let names: Vec<&str> = p.buffers.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["A", "W", "b", "Y", "Y.1", "Y.2"]);
    assert!(p.buffers[4..]
        .iter()
        .all(|b| b.dtype == Dtype::F32 && b.elems == 33 * 65));
    let g = gemm(&p, 0);
    assert_eq!((g.a, g.b, g.c), (0, 1, 4));
    assert_eq!((g.m, g.n, g.k, g.batch), (33, 65, 17, 1));
    assert!(!g.trans_a && !g.trans_b);
    // The bias add reads the GEMM's output by rows and the bias with a zero row stride.
    let a = args(&p, 1);
    assert_eq!(
        &a[..5],
        [
            StepArg::Buffer(4),
            StepArg::Buffer(2),
            StepArg::Buffer(5),
            StepArg::I64(33 * 65),
            StepArg::I32(2)
        ]
    );
    assert_eq!(&a[5..7], [StepArg::I64(33), StepArg::I64(65)]);
    assert_eq!(a[17..19], [StepArg::I64(65), StepArg::I64(1)]);
    assert_eq!(a[23..25], [StepArg::I64(0), StepArg::I64(1)]);
    assert_eq!(args(&p, 2)[..2], [StepArg::Buffer(5), StepArg::Buffer(3)]);
}

#[test]
fn a_transposed_weight_is_a_gemm_flag_not_a_copy() {
    let src = "input X: f32[M, K]\ninput W: f32[N, K]\ninput b: f32[N]\noutput Y: f32[M, N]\n\
               Y = tanh(X @ transpose(W) + b)";
    let p = plan(src, &[("M", 33), ("N", 65), ("K", 17)]);
    assert_eq!(
        kinds(&p),
        ["gemm", "binary_add_bcast_f32", "unary_tanh_f32"]
    );
    let g = gemm(&p, 0);
    assert!(g.trans_b && !g.trans_a);
    assert_eq!((g.a, g.b, g.m, g.n, g.k), (0, 1, 33, 65, 17));
    // A transposed left operand of a 2-D product is a flag too.
    let p = plan(
        "input A: f32[K, M]\ninput B: f32[K, N]\noutput C: f32[M, N]\nC = transpose(A, 0, 1) @ B",
        &[("M", 5), ("N", 6), ("K", 7)],
    );
    assert_eq!(kinds(&p), ["gemm"]);
    assert!(gemm(&p, 0).trans_a);
    assert_eq!(gemm(&p, 0).c, 2);
}

#[test]
fn attention_is_bmm_scale_softmax_bmm() {
    let src = "input Q: f32[B, S, D]\ninput K: f32[B, S, D]\ninput V: f32[B, S, D]\n\
               const scale = 0.125\noutput O: f32[B, S, D]\n\
               P = softmax(Q @ transpose(K) * scale, axis=-1)\nO = P @ V";
    let p = plan(src, &[("B", 2), ("S", 33), ("D", 8)]);
    assert_eq!(
        kinds(&p),
        ["gemm", "binary_mul_scalar_f32", "softmax_rows_f32", "gemm"]
    );
    let g = gemm(&p, 0);
    assert!(g.trans_b);
    assert_eq!((g.m, g.n, g.k, g.batch), (33, 33, 8, 2));
    assert_eq!(
        (g.stride_a, g.stride_b, g.stride_c),
        (33 * 8, 8 * 33, 33 * 33)
    );
    // The named intermediate P has its own buffer; the second GEMM reads it and writes O.
    let pb = buf(&p, "P");
    assert_eq!(p.buffers[pb].elems, 2 * 33 * 33);
    assert_eq!(args(&p, 1)[1], StepArg::F32(0.125));
    let g2 = gemm(&p, 3);
    assert_eq!((g2.a, g2.b, g2.c, g2.batch), (pb, 2, 3, 2));
}

#[test]
fn matmul_forms_fold_like_torch_matmul() {
    // [B,M,K] @ [K,N]: one GEMM of B*M rows.
    let p = plan(
        "input X: f32[B, M, K]\ninput W: f32[K, N]\noutput Y: f32[B, M, N]\nY = X @ W",
        &[("B", 3), ("M", 5), ("K", 4), ("N", 6)],
    );
    let g = gemm(&p, 0);
    assert_eq!((g.m, g.n, g.k, g.batch), (15, 6, 4, 1));
    // A transposed X cannot be folded: it is copied first, as reshape copies.
    let p = plan(
        "input X: f32[B, K, M]\ninput W: f32[K, N]\noutput Y: f32[B, M, N]\nY = transpose(X) @ W",
        &[("B", 3), ("M", 5), ("K", 4), ("N", 6)],
    );
    assert_eq!(kinds(&p), ["copy_strided_b32", "gemm"]);
    assert!(!gemm(&p, 1).trans_a);
    // [M,K] @ [K]: n = 1.
    let p = plan(
        "input A: f32[M, K]\ninput x: f32[K]\noutput y: f32[M]\ny = A @ x",
        &[("M", 70), ("K", 33)],
    );
    let g = gemm(&p, 0);
    assert_eq!((g.m, g.n, g.k, g.batch, g.c), (70, 1, 33, 1, 2));
}

#[test]
fn scalars_fold_and_become_kernel_arguments() {
    let src = "input X: f32[M, N]\nconst s = 1.5\noutput Y: f32[M, N]\noutput Z: f32[M, N]\n\
               Y = X * (2 * s - 1)\nZ = 1 - X";
    let p = plan(src, &[("M", 3), ("N", 4)]);
    assert_eq!(
        kinds(&p),
        ["binary_mul_scalar_f32", "binary_sub_scalar_f32"]
    );
    assert_eq!(args(&p, 0)[1], StepArg::F32(2.0));
    assert_eq!(args(&p, 0)[4], StepArg::I32(0));
    assert_eq!(args(&p, 1)[4], StepArg::I32(1), "scalar first");
    // Unary minus of a tensor is a kernel; of a scalar, arithmetic.
    let p = plan(
        "input X: f32[N]\nconst s = 2.0\noutput Y: f32[N]\nY = -X * -s",
        &[("N", 4)],
    );
    assert_eq!(kinds(&p), ["unary_neg_f32", "binary_mul_scalar_f32"]);
    assert_eq!(args(&p, 1)[1], StepArg::F32(-2.0));
}

#[test]
fn intermediates_take_the_checkers_dtype() {
    let src = "input A: bf16[M, K]\ninput W: bf16[K, N]\ninput b: bf16[N]\noutput Y: bf16[M, N]\n\
               Y = gelu(A @ W + b)";
    let p = plan(src, &[("M", 3), ("N", 4), ("K", 5)]);
    assert_eq!(
        kinds(&p),
        ["gemm", "binary_add_bcast_bf16", "unary_gelu_bf16"]
    );
    assert_eq!(gemm(&p, 0).dtype, Dtype::Bf16);
    assert!(p.buffers.iter().all(|b| b.dtype == Dtype::Bf16));
    // argmax gives i64; a mixed-dtype sum widens the f16 operand first.
    let src = "input A: f16[M, N]\ninput B: f32[M, N]\noutput I: i64[M]\noutput S: f32[M, N]\n\
               I = argmax(A, axis=-1)\nS = A + B";
    let p = plan(src, &[("M", 3), ("N", 4)]);
    assert_eq!(
        kinds(&p),
        ["reduce_argmax_rows_f16", "cast_f16_f32", "binary_add_f32"]
    );
    assert_eq!(p.buffers[buf(&p, "I")].dtype, Dtype::I64);
    assert_eq!(p.buffers[buf(&p, "S.1")].dtype, Dtype::F32);
}

#[test]
fn reductions_pick_rows_or_columns() {
    let src = "input X: f32[B, M, N]\noutput R: f32[B, M, 1]\noutput C: f32[B, N]\n\
               R = sum(X, axis=-1, keepdim=true)\nC = max(X, axis=1)";
    let p = plan(src, &[("B", 3), ("M", 17), ("N", 40)]);
    assert_eq!(kinds(&p), ["reduce_sum_rows_f32", "reduce_max_cols_v4_f32"]);
    assert_eq!(&args(&p, 0)[2..], [StepArg::I64(51), StepArg::I64(40)]);
    assert_eq!(
        &args(&p, 1)[2..],
        [StepArg::I64(3), StepArg::I64(17), StepArg::I64(40)]
    );
    // Short rows: a warp per row, four rows per block; long rows: a block (<= 512) per row.
    let Step::Kernel { grid, block, .. } = &p.steps[0] else {
        unreachable!()
    };
    assert_eq!((*grid, *block), ([13, 1, 1], [32, 4, 1]));
    let p = plan(
        "input X: f32[M, N]\noutput Y: f32[M, N]\nY = softmax(X, axis=-1)",
        &[("M", 8), ("N", 16384)],
    );
    let Step::Kernel { grid, block, .. } = &p.steps[0] else {
        unreachable!()
    };
    assert_eq!((*grid, *block), ([8, 1, 1], [512, 1, 1]));
}

#[test]
fn names_and_copies_bind_as_python_does() {
    // An intermediate name is an alias (no kernel); an output needs its own copy.
    let src = "input X: f32[M, N]\noutput Y: f32[M, N]\noutput Z: f32[M, N]\n\
               T = X\nY = relu(T)\nZ = transpose(X, 0, 0)";
    let p = plan(src, &[("M", 3), ("N", 4)]);
    assert_eq!(kinds(&p), ["unary_relu_f32", "copy_bytes"]);
    assert_eq!(args(&p, 0)[0], StepArg::Buffer(0));
    assert_eq!(args(&p, 1)[2], StepArg::I64(48));
    // Transposes elsewhere than under a matmul are strided copies, as `.contiguous()` makes them:
    // the output's dimensions with the input's strides.
    let src = "input X: f16[A, B, C]\noutput Y: f16[A, C, B]\noutput Z: f16[C, B, A]\n\
               Y = transpose(X)\nZ = transpose(X, 0, 2)";
    let p = plan(src, &[("A", 2), ("B", 3), ("C", 5)]);
    assert_eq!(kinds(&p), ["copy_strided_b16", "copy_strided_b16"]);
    let a = args(&p, 0);
    assert_eq!(a[2..4], [StepArg::I64(30), StepArg::I32(3)]);
    assert_eq!(a[4..7], [2, 5, 3].map(StepArg::I64));
    assert_eq!(a[16..19], [15, 1, 5].map(StepArg::I64));
    assert_eq!(args(&p, 1)[16..19], [1, 5, 15].map(StepArg::I64));
}

#[test]
fn norms_pass_absent_operands_as_flags() {
    let src = "input X: f32[M, N]\ninput g: f32[N]\noutput Y: f32[M, N]\noutput Z: f32[M, N]\n\
               Y = layer_norm(X, g, eps=1e-5)\nZ = rms_norm(X)";
    let p = plan(src, &[("M", 3), ("N", 4)]);
    assert_eq!(kinds(&p), ["layer_norm_f32", "rms_norm_f32"]);
    let a = args(&p, 0);
    assert_eq!(a[..4], [0, 1, 0, 2].map(StepArg::Buffer));
    assert_eq!(a[7..], [StepArg::I32(1), StepArg::I32(0)]);
    let a = args(&p, 1);
    assert_eq!(a[..3], [0, 0, 3].map(StepArg::Buffer));
    assert_eq!(a[6], StepArg::I32(0));
}

/// Max pooling writes its argmax positions too, into an i64 buffer of its own, as PyTorch's CUDA
/// max pooling does (max_pool*d runs max_pool*d_with_indices there); average pooling has none.
#[test]
fn max_pooling_writes_indices_as_pytorch_does() {
    let src = "input X: f32[N, C, H, W]\noutput M: f32[N, C, H - 1, W - 1]\n\
               output A: f32[N, C, H - 1, W - 1]\n\
               M = max_pool2d(X, 2, stride=1)\nA = avg_pool2d(X, 2, stride=1)";
    let p = plan(src, &[("N", 2), ("C", 3), ("H", 8), ("W", 9)]);
    assert_eq!(kinds(&p), ["max_pool_f32", "avg_pool_f32"]);
    let idx = p.buffers.len() - 1;
    assert_eq!(p.buffers[idx].dtype, Dtype::I64, "{:?}", p.buffers);
    assert_eq!(p.buffers[idx].elems, 2 * 3 * 7 * 8);
    assert_eq!(args(&p, 0)[..3], [0, 1, idx].map(StepArg::Buffer));
    assert_eq!(args(&p, 0)[3], StepArg::I64(6), "planes after the buffers");
    assert_eq!(args(&p, 1)[..2], [0, 2].map(StepArg::Buffer));
    assert_eq!(args(&p, 1)[2], StepArg::I64(6), "no index buffer");
}

/// A batch norm goes to cuDNN exactly where PyTorch sends it there (f32, weight and bias, rank 3
/// or more, eps of at least 1e-5); the kernel form is `chan_norm` in batch mode (groups 0).
#[test]
fn batch_norms_take_cudnn_where_pytorch_does() {
    let src = "input X: f32[N, C, L]\ninput H: f16[N, C, L]\ninput P: f32[N, C]\n\
               input g: f32[C]\ninput b: f32[C]\ninput gh: f16[C]\ninput bh: f16[C]\n\
               output A: f32[N, C, L]\noutput B: f32[N, C, L]\noutput D: f16[N, C, L]\n\
               output E: f32[N, C]\noutput G: f32[N, C, L]\n\
               A = batch_norm(X, g, b)\nB = batch_norm(X, g)\nD = batch_norm(H, gh, bh)\n\
               E = batch_norm(P, g, b)\nG = batch_norm(X, g, b, eps=1e-6)";
    let sizes = [("N", 4), ("C", 3), ("L", 50)];
    let p = plan(src, &sizes);
    assert_eq!(
        kinds(&p),
        [
            "batch_norm",
            "chan_norm_f32",
            "chan_norm_f16",
            "chan_norm_f32",
            "chan_norm_f32"
        ],
        "only the f32 rank-3 norm with weight, bias and eps >= 1e-5 is cuDNN's"
    );
    let Step::BatchNorm(bn) = &p.steps[0] else {
        panic!("not a batch norm step")
    };
    assert_eq!((bn.x, bn.w, bn.b), (0, 3, 4));
    assert_eq!((bn.n, bn.c, bn.s, bn.eps), (4, 3, 50, 1e-5));
    // Its kernel form is the same chan_norm launch the others get, in both precisions.
    let k = p.with_kernel_steps(false, true);
    assert_eq!(kinds(&k)[0], "chan_norm_f32");
    assert_eq!(args(&k, 0)[7], StepArg::I64(0), "groups 0: batch mode");
    let f64 = plan_in(src, &sizes, Precision::F64);
    assert!(
        matches!(f64.steps[0], Step::BatchNorm(_)),
        "the F64 plan mirrors it"
    );
    assert_eq!(
        kinds(&f64.with_kernel_steps(true, true))[0],
        "chan_norm_f64"
    );
    assert!(
        !BatchNorm::cudnn_takes(Dtype::F32, 4, (1 << 16, 1 << 8, 1 << 8), 1e-5),
        "2^32 elements"
    );
    assert!(
        !BatchNorm::cudnn_takes(Dtype::F32, 3, (880_802, 1, 1), 1e-5),
        "too many samples"
    );
}

/// Reductions over a strided axis give a thread 4 (or 2) adjacent outputs where the columns
/// divide by it, in blocks of at most 512 / V threads, whose rows split the axis only when
/// each keeps 16 elements, as PyTorch's reduce kernel; index reductions keep kevin's split.
#[test]
fn column_reductions_vectorise_their_outputs_as_pytorch_does() {
    let src = "input X: f32[B, M, N]\ninput Y: f32[B, M, K]\ninput Z: f32[B, M, L]\n\
               output S: f32[B, N]\noutput E: f32[B, K]\noutput O: f32[B, L]\n\
               output A: i64[B, N]\n\
               S = sum(X, axis=1)\nE = mean(Y, axis=1)\nO = max(Z, axis=1)\n\
               A = argmax(X, axis=1)";
    let p = plan(
        src,
        &[("B", 8), ("M", 64), ("N", 1024), ("K", 1022), ("L", 1023)],
    );
    let blocks: Vec<(String, [u32; 3])> = p
        .steps
        .iter()
        .map(|s| match s {
            Step::Kernel { kernel, block, .. } => (kernel.clone(), *block),
            s => panic!("not a kernel: {s:?}"),
        })
        .collect();
    assert_eq!(
        blocks,
        [
            // V = 4: 128 threads, 4 rows of 16 elements each.
            ("reduce_sum_cols_v4_f32".to_string(), [32, 4, 1]),
            // V = 2: 8 rows would keep 8 elements each: 256 columns, the axis whole.
            ("reduce_mean_cols_v2_f32".to_string(), [256, 1, 1]),
            // V = 1: 512 columns, the axis whole.
            ("reduce_max_cols_f32".to_string(), [512, 1, 1]),
            // 256 blocks would not fill the H200: 32 rows split the axis.
            ("reduce_argmax_cols_f32".to_string(), [32, 32, 1]),
        ]
    );
    let sum_block = |src: &str, sizes: &[(&str, usize)]| match &plan(src, sizes).steps[0] {
        Step::Kernel { block, .. } => *block,
        s => panic!("not a kernel: {s:?}"),
    };
    let over_m = "input X: f32[B, M, N]\noutput S: f32[B, N]\nS = sum(X, axis=1)";
    // A short axis: 16 groups of 4 columns by the 2 rows the axis allows, as 32 threads
    // that each reduce their columns whole.
    assert_eq!(
        sum_block(over_m, &[("B", 2), ("M", 3), ("N", 64)]),
        [32, 1, 1]
    );
    // A long axis split over rows, one column a thread: kevin's column launch.
    assert_eq!(
        sum_block(over_m, &[("B", 128), ("M", 4096), ("N", 4095)]),
        [32, 16, 1]
    );
    // A long axis over few columns: their 2 groups of 4 by 32 rows (at most what the kernel's
    // shared tile combines).
    assert_eq!(
        sum_block(
            "input Z: f32[L, 8]\noutput S: f32[8]\nS = sum(Z, axis=0)",
            &[("L", 300)]
        ),
        [2, 32, 1]
    );
}

#[test]
fn row_scans_split_their_threads_between_rows_and_columns_as_pytorch_does() {
    use super::launch::scan_log_threads_x;
    // As many rows as elements a row: 16 threads a row, 32 rows a block (kb1_89's cumsum).
    assert_eq!(scan_log_threads_x(32768, 32768), 4);
    // Many short rows stay at 16 threads a row; one long row takes the whole block.
    assert_eq!(scan_log_threads_x(4096, 8), 4);
    assert_eq!(scan_log_threads_x(95760, 8), 4);
    assert_eq!(scan_log_threads_x(1, 1000), 9);
    assert_eq!(scan_log_threads_x(64, 4096), 7);
    let p = plan(
        "input X: f32[R, N]\noutput Y: f32[R, N]\nY = cumsum(X, axis=1)",
        &[("R", 64), ("N", 4096)],
    );
    let Step::Kernel { grid, block, .. } = &p.steps[0] else {
        panic!("not a kernel")
    };
    assert_eq!((*grid, *block), ([16, 1, 1], [128, 4, 1]));
}

/// Softmax over a strided axis: a thread reduces and maps its column whole, up to 1024 columns
/// a block, unless the columns are few (<= 64) and the axis long (>= 64), as PyTorch's
/// SpatialSoftMax sets its blocks.
#[test]
fn softmax_over_strided_axes_takes_pytorchs_blocks() {
    let block = |inner: usize, n: usize| {
        let src = "input X: f32[B, C, S]\noutput Y: f32[B, C, S]\nY = softmax(X, axis=1)";
        let p = plan(src, &[("B", 4), ("C", n), ("S", inner)]);
        match &p.steps[0] {
            Step::Kernel { kernel, block, .. } => {
                assert_eq!(kernel, "softmax_cols_f32");
                *block
            }
            s => panic!("not a kernel: {s:?}"),
        }
    };
    assert_eq!(block(12600, 16), [1024, 1, 1]);
    assert_eq!(block(100, 64), [100, 1, 1]);
    assert_eq!(block(48, 16), [48, 1, 1]);
    // (8 blocks would not fill the H200: 32 rows split the axis.)
    assert_eq!(block(48, 300), [32, 32, 1]);
}

/// The windowed kernels' forms are picked on the host, as PyTorch picks its templates: 64-bit
/// indices only past 2^31 elements, volumes apart from planes.
#[test]
fn window_kernel_forms_follow_sizes_and_axes() {
    let dw = "input X: f32[N, 256, H, W]\ninput K: f32[256, 1, 3, 3]\n\
              output Y: f32[N, 256, H - 2, W - 2]\nY = conv2d(X, K, groups=256)";
    let sizes = |n| [("N", n), ("H", 512), ("W", 512)];
    assert_eq!(kinds(&plan(dw, &sizes(8))), ["conv_depthwise_k3_f32"]);
    assert_eq!(kinds(&plan(dw, &sizes(64))), ["conv_depthwise_wide_f32"]);
    let pool = "input X: f32[N, C, D, H, W]\noutput M: f32[N, C, D - 1, H - 1, W - 1]\n\
                output A: f32[N, C, D - 1, H - 1, W - 1]\n\
                M = max_pool3d(X, 2, stride=1)\nA = avg_pool3d(X, 2, stride=1)";
    let sizes = |n| [("N", n), ("C", 64), ("D", 64), ("H", 64), ("W", 64)];
    assert_eq!(
        kinds(&plan(pool, &sizes(2))),
        ["max_pool_vol_f32", "avg_pool_vol_f32"]
    );
    assert_eq!(
        kinds(&plan(pool, &sizes(128))),
        ["max_pool_wide_f32", "avg_pool_wide_f32"]
    );
}

#[test]
fn depthwise_convolutions_take_pytorchs_own_kernel_where_it_does() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixtures = TaskSuite::load(root.join("tests/data/baseline")).expect("fixtures");
    let task = fixtures.get("depthwise").expect("the depthwise fixture");
    let p = lower(task, Preset::Gpu).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        kinds(&p),
        [
            "conv_depthwise_k3_f32",
            "conv_depthwise_k1_f32",
            "conv_depthwise_f32",
            "conv_depthwise_bf16",
            "conv_depthwise_vol_bf16",
            "conv",
            "conv_depthwise_k3_f16",
            "conv_depthwise_k5_f32",
            "conv_depthwise_f32"
        ],
        "f16 on a plane of 32 channels, no dilation, equal strides: cuDNN"
    );
    // Not depthwise: one group, groups below the channels, or transposed.
    let src = "input X: f32[N, 4, L]\ninput A: f32[4, 4, 3]\ninput B: f32[4, 2, 3]\n\
               input T: f32[4, 1, 3]\noutput P: f32[N, 4, L - 2]\noutput Q: f32[N, 4, L - 2]\n\
               output R: f32[N, 4, L + 2]\nP = conv1d(X, A)\nQ = conv1d(X, B, groups=2)\n\
               R = conv_transpose1d(X, T, groups=4)";
    let p = plan(src, &[("N", 2), ("L", 40)]);
    assert_eq!(kinds(&p), ["conv", "conv", "conv"]);
    // The F64 plan runs the same kernel in f64.
    let f64 = lower_f64(task, Preset::Small).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(kinds(&f64)[0], "conv_depthwise_k3_f64");
}

/// The magic numbers of the strided kernels divide exactly (the kernel's 32-bit arithmetic,
/// replayed in 64 bits), against plain division.
#[test]
fn magic_division_is_exact() {
    let mut divisors: Vec<u64> = (1..=300).collect();
    divisors.extend([
        1000,
        4095,
        4096,
        4097,
        8191,
        65_537,
        1 << 20,
        999_983,
        (1 << 31) - 1,
    ]);
    for d in divisors {
        let packed = launch::div_magic(d) as u64;
        let (magic, shift) = (packed & 0xffff_ffff, packed >> 32);
        let mut ns: Vec<u64> = vec![0, 1, d - 1, d, d + 1, 2 * d, (1 << 31) - 1, (1 << 31) - 2];
        ns.extend((0..200u64).map(|k| (k * 2_654_435_761) % (1 << 31)));
        for n in ns.into_iter().filter(|&n| n < 1 << 31) {
            let t = (n * magic) >> 32;
            assert!(t + n < 1 << 32, "overflow for {n} / {d}");
            assert_eq!((t + n) >> shift, n / d, "{n} / {d}");
        }
    }
    assert_eq!(launch::div_magic(1 << 31), 0);
}

#[test]
fn a_missing_size_is_named() {
    let program = Program::parse("input X: f32[M]\noutput Y: f32[M]\nY = relu(X)").unwrap();
    let err = lower::lower_program("t", &program, &Sizes::new(), Precision::Native).unwrap_err();
    assert_eq!(
        err.to_string(),
        "task `t`: size `M` has no value at this preset"
    );
}

#[test]
fn kernel_gemm_replaces_gemm_steps_and_plans_round_trip() {
    let p = plan(
        &format!("{LINEAR}Y = relu(A @ W + b)"),
        &[("M", 33), ("N", 65), ("K", 17)],
    );
    let k = p.with_kernel_steps(true, true);
    assert_eq!(k.buffers, p.buffers);
    let Step::Kernel {
        kernel,
        grid,
        block,
        args,
        ..
    } = &k.steps[0]
    else {
        panic!("not a kernel")
    };
    assert_eq!(kernel, "gemm_f32");
    assert_eq!((*grid, *block), ([5, 3, 1], [16, 16, 1]));
    assert_eq!(args[..3], [0, 1, 4].map(StepArg::Buffer));
    assert_eq!(k.steps[1..], p.steps[1..]);
    let json = serde_json::to_string(&p).unwrap();
    assert!(json.contains("\"dtype\":\"f32\""), "{json}");
    assert_eq!(serde_json::from_str::<EagerPlan>(&json).unwrap(), p);
}

fn suite() -> TaskSuite {
    TaskSuite::load(Path::new(env!("CARGO_MANIFEST_DIR")).join("tasks")).expect("tasks")
}

/// Launches per task at the GPU preset (the small preset lowers to the same steps, the forms of a
/// kernel that sizes pick aside): one per op
/// node, with the exceptions the module docs name. Printed with `--nocapture` for comparison
/// with PyTorch eager's kernel counts.
#[test]
fn every_task_lowers_at_both_presets_with_known_kernels() {
    let known: BTreeSet<String> = kernel_names().into_iter().collect();
    let mut table = Vec::new();
    for task in suite().tasks() {
        let gpu = lower(task, Preset::Gpu).unwrap_or_else(|e| panic!("{e}"));
        let small = lower(task, Preset::Small).unwrap_or_else(|e| panic!("{e}"));
        // The same kernels, up to the form that the sizes pick (a column reduction's width,
        // a depthwise window's or pooling's 64-bit form).
        let family = |p: &EagerPlan| -> Vec<String> {
            kinds(p).iter().map(|k| super::launch::family(k)).collect()
        };
        assert_eq!(family(&gpu), family(&small), "{}", task.name);
        let sig = task.signature(Preset::Gpu);
        for (b, t) in gpu.buffers.iter().zip(&sig.tensors) {
            assert_eq!((&b.name, b.dtype, b.elems), (&t.name, t.dtype, t.numel()));
        }
        // cuBLAS's products and cuDNN's convolutions are steps of their own, not kernels.
        for k in kinds(&gpu).iter().filter(|k| *k != "gemm" && *k != "conv") {
            assert!(known.contains(k), "{}: unknown kernel {k}", task.name);
        }
        table.push(format!("{:28} {}", task.name, kinds(&gpu).join(" ")));
    }
    println!("{}", table.join("\n"));
    let launches = |name: &str| {
        let s = suite();
        lower(s.get(name).unwrap(), Preset::Gpu).unwrap().launches()
    };
    assert_eq!(launches("relu"), 1);
    assert_eq!(launches("cross_entropy_soft"), 4);
    assert_eq!(launches("gemm_min_max_clamp"), 5);
    assert_eq!(launches("softmax_argmax"), 3);
    assert_eq!(launches("rms_norm"), 1);
    assert_eq!(launches("logsumexp_rows"), 7);
    assert_eq!(launches("cosine_similarity_rows"), 8);
}

#[test]
fn composites_are_lowered_as_pytorch_runs_them() {
    let p = plan(
        "input X: f32[M, N]\noutput Y: f32[M]\nY = logsumexp(X, axis=-1)",
        &[("M", 3), ("N", 40)],
    );
    assert_eq!(
        kinds(&p),
        [
            "reduce_max_rows_f32",
            "unary_inf_to_zero_f32",
            "binary_sub_bcast_f32",
            "unary_exp_f32",
            "reduce_sum_rows_f32",
            "unary_log_f32",
            "binary_add_f32"
        ]
    );
    // The final add writes Y from the log and the zeroed maxima.
    assert_eq!(
        args(&p, 6)[..3],
        [buf(&p, "Y.6"), buf(&p, "Y.2"), 1].map(StepArg::Buffer)
    );
    let p = plan(
        "input X: f32[M, N]\noutput Y: f32[M, N]\nY = l2norm(X, axis=0, eps=1e-6)",
        &[("M", 3), ("N", 40)],
    );
    assert_eq!(
        kinds(&p),
        [
            "reduce_norm_cols_v4_f32",
            "unary_clamp_min_f32",
            "binary_div_bcast_f32"
        ]
    );
    assert_eq!(args(&p, 1)[3], StepArg::F32(1e-6));
    let p = plan("input X: f32[N]\noutput Y: f32[N]\nY = 2 / X", &[("N", 4)]);
    assert_eq!(kinds(&p), ["unary_reciprocal_f32", "binary_mul_scalar_f32"]);
}

/// The F64 plan of a program is its native plan step for step: same buffers, same GEMMs, the
/// `_f64` instantiation of every float kernel with the same parameters (scalars as `double`,
/// bytes of copies for 8-byte elements), transposes as 64-bit strided copies, and a cast a copy.
fn assert_f64_mirrors_native(native: &EagerPlan, f64: &EagerPlan, what: &str) {
    assert_eq!(native.precision, Precision::Native, "{what}");
    assert_eq!(f64.precision, Precision::F64, "{what}");
    assert_eq!(f64.buffers, native.buffers, "{what}");
    assert_eq!(f64.steps.len(), native.steps.len(), "{what}");
    let elem = |b: usize| match native.buffers[b].dtype {
        Dtype::I64 => 8,
        d => d.size_bytes(),
    };
    for (i, (n, f)) in native.steps.iter().zip(&f64.steps).enumerate() {
        let at = format!("{what}, step {i}");
        let (
            Step::Kernel {
                kernel: kn,
                args: an,
                ..
            },
            Step::Kernel {
                kernel: kf,
                args: af,
                ..
            },
        ) = (n, f)
        else {
            assert_eq!(n, f, "{at}: library steps keep their description");
            assert!(
                matches!(n, Step::Gemm(_) | Step::Conv(_) | Step::BatchNorm(_)),
                "{at}"
            );
            continue;
        };
        assert_eq!(an.len(), af.len(), "{at}");
        let src = match an[0] {
            StepArg::Buffer(b) => b,
            _ => panic!("{at}: first parameter is not a buffer"),
        };
        if kn.starts_with("cast_") {
            // Both dtypes are stored as f64: the conversion is a copy of the bytes.
            assert_eq!(kf, "copy_bytes", "{at}");
            assert_eq!(an[..2], af[..2], "{at}");
            let StepArg::I64(n) = an[2] else {
                panic!("{at}")
            };
            assert_eq!(af[2], StepArg::I64(8 * n), "{at}");
            continue;
        }
        if kn == "copy_bytes" {
            let k = if native.buffers[src].dtype == Dtype::I64 {
                1
            } else {
                8 / elem(src)
            };
            let (StepArg::I64(bn), StepArg::I64(bf)) = (an[2], af[2]) else {
                panic!("{at}")
            };
            assert_eq!(bf, bn * k as i64, "{at}");
        } else if let Some(stem) = ["copy_strided_", "copy_triangle_", "copy_flip_"]
            .into_iter()
            .find(|s| kn.starts_with(s))
        {
            // Kernels by element size: the f64 plan's elements are 8 bytes.
            let want = match native.buffers[src].dtype {
                Dtype::I64 => kn.clone(),
                _ => format!("{stem}b64"),
            };
            assert_eq!(kf, &want, "{at}");
        } else {
            let (stem, _) = kn.rsplit_once('_').expect("a dtype suffix");
            assert_eq!(kf, &format!("{stem}_f64"), "{at}");
        }
        for (a, b) in an.iter().zip(af) {
            match (a, b) {
                (StepArg::F32(x), StepArg::F64(y)) => assert_eq!(*x, *y as f32, "{at}"),
                (StepArg::I64(_), StepArg::I64(_)) if kn == "copy_bytes" => {}
                _ => assert_eq!(a, b, "{at}"),
            }
        }
    }
}

/// The tasks whose plans the plan tests cover: `tasks/`, `tests/data/baseline/`, and the folder
/// in `KEVIN_BASELINE_DUMP_TASKS` when set (a KernelBench import, say).
fn plan_tasks() -> Vec<crate::tasks::Task> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixtures = TaskSuite::load(root.join("tests/data/baseline")).expect("fixtures");
    let mut tasks = suite().tasks().to_vec();
    tasks.extend_from_slice(fixtures.tasks());
    if let Ok(d) = std::env::var("KEVIN_BASELINE_DUMP_TASKS") {
        tasks.extend_from_slice(
            TaskSuite::load(&d)
                .unwrap_or_else(|e| panic!("{d}: {e}"))
                .tasks(),
        );
    }
    tasks
}

#[test]
fn f64_plans_mirror_native_plans_for_every_task() {
    let known: BTreeSet<String> = kernel_names().into_iter().collect();
    for task in &plan_tasks() {
        for preset in [Preset::Small, Preset::Gpu] {
            let native = lower(task, preset).unwrap_or_else(|e| panic!("{e}"));
            let f64 = lower_f64(task, preset).unwrap_or_else(|e| panic!("{e}"));
            assert_f64_mirrors_native(&native, &f64, &task.name);
            let kernels = f64.with_kernel_steps(true, true);
            assert_eq!(kernels.precision, Precision::F64);
            for k in kinds(&kernels) {
                assert!(known.contains(&k), "{}: unknown kernel {k}", task.name);
                let float_kernel = !k.starts_with("copy_") && !k.starts_with("cast_");
                assert!(!float_kernel || k.ends_with("_f64"), "{}: {k}", task.name);
            }
        }
    }
}

#[test]
fn f64_plans_pass_double_scalars_and_copy_casts() {
    let src = "input X: f16[M, N]
input B: f32[M, N]
const s = 0.1
output Y: f32[M, N]
               output Z: f16[M, N]
output I: i64[M]
output T: f16[N, M]
               Y = layer_norm(X + B, eps=1e-5) * s
Z = clamp(X, -0.3, 0.7)
               I = argmax(X, axis=-1)
T = transpose(X)";
    let sizes = [("M", 3), ("N", 40)];
    let p = plan_in(src, &sizes, Precision::F64);
    assert_eq!(
        kinds(&p),
        [
            "copy_bytes",
            "binary_add_f64",
            "layer_norm_f64",
            "binary_mul_scalar_f64",
            "unary_clamp_f64",
            "reduce_argmax_rows_f64",
            "copy_strided_b64"
        ]
    );
    // The f16 operand's "cast" copies 120 f64 values into the f32-typed intermediate.
    assert_eq!(
        args(&p, 0)[..3],
        [
            StepArg::Buffer(0),
            StepArg::Buffer(buf(&p, "Y.1")),
            StepArg::I64(960)
        ]
    );
    assert_eq!(args(&p, 2)[6], StepArg::F64(1e-5));
    assert_eq!(args(&p, 3)[1], StepArg::F64(0.1));
    assert_eq!(args(&p, 4)[3..], [StepArg::F64(-0.3), StepArg::F64(0.7)]);
    // Elementwise launches take 2 doubles per 16-byte access: twice the native f32 grid.
    let Step::Kernel { grid, .. } = &p.steps[1] else {
        unreachable!()
    };
    assert_eq!(grid[0], 1);
    let big = plan_in(
        "input X: f32[N]
output Y: f32[N]
Y = relu(X)",
        &[("N", 1 << 20)],
        Precision::F64,
    );
    let native = plan(
        "input X: f32[N]
output Y: f32[N]
Y = relu(X)",
        &[("N", 1 << 20)],
    );
    let grid = |p: &EagerPlan| match &p.steps[0] {
        Step::Kernel { grid, .. } => grid[0],
        _ => unreachable!(),
    };
    assert_eq!((grid(&native), grid(&big)), (1024, 2048));
    // Bytes per buffer: 8 per element for every float buffer, i64 as is.
    let by_name = |n: &str| &p.buffers[buf(&p, n)];
    assert_eq!(by_name("X").stored_bytes(Precision::Native), 240);
    assert_eq!(by_name("X").stored_bytes(Precision::F64), 960);
    assert_eq!(by_name("B").stored_bytes(Precision::F64), 960);
    assert_eq!(by_name("I").stored_bytes(Precision::Native), 24);
    assert_eq!(by_name("I").stored_bytes(Precision::F64), 24);
}

#[test]
fn f64_gemms_run_as_f64_kernels_and_plans_round_trip() {
    let p = plan_in(
        &format!("{LINEAR}Y = relu(A @ W + b)"),
        &[("M", 33), ("N", 65), ("K", 17)],
        Precision::F64,
    );
    assert_eq!(
        gemm(&p, 0).dtype,
        Dtype::F32,
        "the task's dtype, as information"
    );
    let k = p.with_kernel_steps(true, true);
    assert_eq!(
        kinds(&k),
        ["gemm_f64", "binary_add_bcast_f64", "unary_relu_f64"]
    );
    assert_eq!(k.precision, Precision::F64);
    let json = serde_json::to_string(&p).unwrap();
    assert!(json.contains("\"precision\":\"F64\""), "{json}");
    assert_eq!(serde_json::from_str::<EagerPlan>(&json).unwrap(), p);
}

/// Every plan of `tasks/`, `tests/data/baseline/` (and `$KEVIN_BASELINE_DUMP_TASKS`, a task
/// folder, when set) at both presets, with the task's PyTorch
/// module, tolerance and outputs, as JSON (plus `kernels.cu`) into `$KEVIN_BASELINE_DUMP_DIR`
/// for `scripts/baseline_gpu.py`. Without that variable it only checks that every dump reads
/// back as the same plan.
#[test]
fn dump_plans() {
    let dir = std::env::var("KEVIN_BASELINE_DUMP_DIR").ok();
    if let Some(d) = &dir {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(format!("{d}/kernels.cu"), SOURCE).unwrap();
    }
    for task in &plan_tasks() {
        for preset in Preset::ALL {
            let plan = lower(task, preset).unwrap_or_else(|e| panic!("{e}"));
            let j = plan_record(task, preset).unwrap_or_else(|e| panic!("{e}"));
            let text = j.to_string();
            let back: serde_json::Value = serde_json::from_str(&text).unwrap();
            let back: EagerPlan = serde_json::from_value(back["plan"].clone()).unwrap();
            assert_eq!(back, plan, "{}", task.name);
            if let Some(d) = &dir {
                let name = preset.name();
                std::fs::write(format!("{d}/{}.{name}.json", task.name), text).unwrap();
            }
        }
    }
}

#[test]
fn nvrtc_compiles_every_kernel_for_sm_90() {
    if let Err(e) = compile::locate_nvrtc() {
        if std::env::var("KEVIN_REQUIRE_NVRTC").as_deref() == Ok("1") {
            panic!("KEVIN_REQUIRE_NVRTC=1 but NVRTC is unavailable: {e}");
        }
        eprintln!("skipping nvrtc_compiles_every_kernel_for_sm_90: {e}");
        return;
    }
    let names = kernel_names();
    let req = CompileRequest {
        source: SOURCE.to_string(),
        arch: "sm_90".into(),
        output: OutputKind::Cubin,
        kernel_names: names.clone(),
        extra_options: Vec::new(),
    };
    let out = compile::compile(&req, &compile::find_cuda_include_dirs())
        .unwrap_or_else(|e| panic!("{e}"));
    let compile::ModuleImage::Cubin(bytes) = &out.image else {
        panic!("expected a CUBIN")
    };
    assert_eq!(&bytes[..4], b"\x7fELF");
    for n in &names {
        assert_eq!(out.lowered_names.get(n), Some(n), "kernel {n}");
    }
    assert!(out.log.trim().is_empty(), "NVRTC warnings:\n{}", out.log);
}
