//! The fused extend path (issue 18): [`Qwen2`]'s cached forward pass on burn's CUDA backend as
//! one backend extension, for generation.
//!
//! burn's path launches about 46 kernels per layer, each with tens of microseconds of host work
//! (fusion, shape handling, submission), and so a decode step of the Qwen2-0.5B shape took 63 ms
//! for 1 GB of weights (`benches/results/policy-profile-h200-2026-12-01.md`). Here one `extend`
//! call runs on a stream of its own, without burn in the loop:
//! - per layer five kernels of [`SOURCE`] (`fused.cu`: RMSNorm with the residual add, bias +
//!   RoPE + the cache write, attention over the slot's cache, SwiGLU) and seven cuBLAS products
//!   on the weights' device memory (burn's tensors, read in place);
//! - the keys and values in a cache of its own (`[layers][k|v][slots, kv, max_len, d]`), so a
//!   finished slot is emptied by resetting its length, and no token is ever padded: rows of any
//!   lengths (prefill and decode mixed) are one flat list of tokens;
//! - the final norm and the head on each row's last token only; the logits come back as a burn
//!   tensor (f32, `[rows, vocab]`), rounded to bf16 first in a bf16 model as the reference does.
//!
//! Host fences: the cubecl client is synchronised once before the pass (the logits' fresh
//! memory may still be in use by a cubecl kernel) and the own stream once after it.
//!
//! The plain-burn reference is the rest of [`Qwen2`]'s `extend` (the model's layers), used on
//! every other backend, when [`SWITCH`] turns this off, or when this path cannot start
//! (no NVRTC, no cuBLAS, an architecture it does not cover: more than [`MAX_GROUP`] query heads
//! per key/value head, a head dimension other than 32, 64 or 128). `qwen2_gpu.rs` compares the
//! two.

use std::any::{Any, TypeId};

use burn::backend::ir::{
    CustomOpIr, HandleContainer, OperationIr, OperationOutput, TensorId, TensorIr,
};
use burn::backend::Cuda;
use burn::cubecl::cuda::CudaRuntime;
use burn::module::Param;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Shape, Tensor, TensorPrimitive};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, FloatElement};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{FusionBackend, FusionRuntime, FusionTensor};
use cudarc::driver::result as cu;
use cudarc::driver::sys as drv;
use half::bf16;
use kevin::baseline::Gemm;
use kevin::gpu::blas::{Blas, GemmCall};
use kevin::gpu::device::ArgPack;
use kevin::ops::Dtype;

use super::config::Qwen2Config;
use super::Qwen2;
use crate::cublas::operand;
use crate::DeviceDraw;

/// CUDA source of the fused path's kernels (after [`crate::kernels::PRELUDE`]).
pub const SOURCE: crate::kernels::Source = crate::kernels::Source {
    name: "fused",
    text: include_str!("fused.cu"),
    kernels: kernel_names,
};

/// Kernels of [`SOURCE`], each in an f32 and a bf16 version (suffix `_f32`, `_bf16`).
const TYPED: &[&str] = &[
    "kevin_embed",
    "kevin_add_rmsnorm",
    "kevin_qkv_rope",
    "kevin_attn1",
    "kevin_attn2",
    "kevin_attn4",
    "kevin_attn_merge",
    "kevin_silu_mul",
];

/// Every kernel symbol of [`SOURCE`].
pub fn kernel_names() -> Vec<String> {
    let mut names: Vec<String> = TYPED
        .iter()
        .flat_map(|k| [format!("{k}_f32"), format!("{k}_bf16")])
        .collect();
    names.push("kevin_round_bf16".into());
    names.push("kevin_sample".into());
    names
}

/// Most query heads per key/value head the attention kernel holds (`MAXG` in `fused.cu`).
pub const MAX_GROUP: usize = 8;

/// Warps per attention block.
const ATTN_WARPS: u32 = 4;

/// Passes of at most this many tokens may split each token's keys into parts (decode steps; a
/// prefill of more tokens fills the GPU with one block per token and key/value head).
const SPLIT_TOKENS: usize = 512;
/// Most parts a token's keys are split into.
const MAX_SPLIT: usize = 16;
/// Fewest keys a part is worth.
const MIN_PART_KEYS: usize = 128;
/// Attention blocks a pass aims for (the H200 has 132 SMs).
const TARGET_BLOCKS: usize = 1024;

/// Parts the attention of each of `tokens` tokens over up to `max_keys` keys (of `kv` key/value
/// heads) is split into: enough blocks to fill the GPU when few tokens run, parts of at least
/// [`MIN_PART_KEYS`] keys, at most [`MAX_SPLIT`]; 1 above [`SPLIT_TOKENS`] tokens.
fn attn_parts(tokens: usize, kv: usize, max_keys: usize) -> usize {
    if tokens == 0 || tokens > SPLIT_TOKENS {
        return 1;
    }
    TARGET_BLOCKS
        .div_ceil(tokens * kv.max(1))
        .min(max_keys / MIN_PART_KEYS)
        .clamp(1, MAX_SPLIT)
}

/// Whether this path is taken where it serves: the fused generation pass (burn's layers when
/// off); process-wide, on by default.
pub static SWITCH: crate::kernels::Switch = crate::kernels::Switch::on();

/// Whether `B` is a backend this path serves: burn's CUDA backend in f32 or bf16.
pub(super) fn serves<B: Backend>() -> bool {
    let b = TypeId::of::<B>();
    b == TypeId::of::<Cuda<f32>>() || b == TypeId::of::<Cuda<bf16>>()
}

/// Why `cfg` is outside what the kernels cover, if it is.
pub fn unsupported(cfg: &Qwen2Config) -> Option<String> {
    let (h, kv, d) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim(),
    );
    if kv == 0 || h % kv != 0 || h / kv > MAX_GROUP {
        return Some(format!(
            "{h} query heads over {kv} key/value heads (at most {MAX_GROUP} per group)"
        ));
    }
    if !(d <= 32 && d % 2 == 0 || d == 64 || d == 128) {
        return Some(format!("head dimension {d} (even up to 32, 64 or 128)"));
    }
    None
}

impl std::fmt::Debug for Fused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fused")
    }
}

impl Fused {
    /// The state for a cache of `slots` x `max_len` tokens of `cfg` in `dtype` (F32 or BF16) on
    /// GPU `device`: compiles the kernels (once per process), allocates the key/value memory.
    pub(super) fn new(
        cfg: &Qwen2Config,
        slots: usize,
        max_len: usize,
        dtype: DType,
        device: usize,
    ) -> Result<Fused, String> {
        if let Some(why) = unsupported(cfg) {
            return Err(why);
        }
        let (dtype, suffix) = match dtype {
            DType::F32 => (Dtype::F32, "f32"),
            DType::BF16 => (Dtype::Bf16, "bf16"),
            other => return Err(format!("dtype {other:?} (f32 or bf16)")),
        };
        let elem = dtype.size_bytes();
        if !Blas::available() {
            return Err("libcublas.so is not on the loader path".into());
        }
        // Owned from here: the stream (and the module) are released if anything below fails,
        // after the cuBLAS handle bound to the stream (declared later, dropped first).
        let (ctx, stream) = crate::cublas::primary_stream(device)?;
        let mut own = Own {
            ctx,
            stream,
            module: std::ptr::null_mut(),
        };
        own.module = SOURCE.load(device)?;
        let module = own.module;
        let blas = Blas::new(stream).map_err(|e| e.to_string())?;
        let f = |name: &str| crate::kernels::function(module, name);
        let typed = |k: &str| f(&format!("{k}_{suffix}"));
        let fns = Fns {
            embed: typed("kevin_embed")?,
            add_rmsnorm: typed("kevin_add_rmsnorm")?,
            qkv_rope: typed("kevin_qkv_rope")?,
            attn: match cfg.head_dim() {
                ..=32 => typed("kevin_attn1")?,
                64 => typed("kevin_attn2")?,
                _ => typed("kevin_attn4")?,
            },
            attn_merge: typed("kevin_attn_merge")?,
            silu_mul: typed("kevin_silu_mul")?,
            round_bf16: f("kevin_round_bf16")?,
            sample: f("kevin_sample")?,
        };
        let (kv, d) = (cfg.num_key_value_heads, cfg.head_dim());
        let layer_bytes = slots * kv * max_len * d * elem;
        let cache = DevMem::new(2 * cfg.num_hidden_layers * layer_bytes)?;
        let inv_freq = super::layers::inv_freq(cfg);
        let freq = DevMem::new(inv_freq.len() * 4)?;
        // SAFETY: `freq` holds `half` f32; the copy completes before `inv_freq` is dropped
        // (synchronised below).
        unsafe {
            cu::memcpy_htod_async(freq.ptr, &inv_freq, stream).map_err(|e| format!("{e:?}"))?;
            cu::stream::synchronize(stream).map_err(|e| format!("{e:?}"))?;
        }
        Ok(Fused {
            blas,
            fns,
            dtype,
            elem,
            cfg: cfg.clone(),
            max_len,
            layer_bytes,
            cache,
            freq,
            scratch: None,
            weights: None,
            own,
        })
    }
}

struct Fns {
    embed: drv::CUfunction,
    add_rmsnorm: drv::CUfunction,
    qkv_rope: drv::CUfunction,
    attn: drv::CUfunction,
    attn_merge: drv::CUfunction,
    silu_mul: drv::CUfunction,
    round_bf16: drv::CUfunction,
    sample: drv::CUfunction,
}

/// Device memory of the engine's own (freed on drop).
struct DevMem {
    ptr: u64,
}

impl DevMem {
    fn new(bytes: usize) -> Result<DevMem, String> {
        // SAFETY: plain allocation in the current context.
        let ptr = unsafe { cu::malloc_sync(bytes.max(1)) }
            .map_err(|e| format!("allocating {bytes} bytes on the GPU: {e:?}"))?;
        Ok(DevMem { ptr })
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        // SAFETY: allocated once by `new`; the engine synchronises its stream after every pass,
        // so no kernel of its own still uses it.
        unsafe {
            let _ = cu::free_sync(self.ptr);
        }
    }
}

/// A weight as the kernels and cuBLAS read it.
#[derive(Debug, Clone, Copy, Default)]
struct Mat {
    ptr: u64,
    /// A 2-d weight stored column-major (its transpose is row-major).
    trans: bool,
    /// Elements between consecutive stored rows.
    ld: i64,
}

/// The weights' device addresses for one set of burn tensors (kept alive here).
struct WeightSet {
    key: Vec<Option<TensorId>>,
    mats: Vec<Option<Mat>>,
    keep: Vec<(CubeTensor<CudaRuntime>, Box<dyn Any + Send>)>,
}

/// Scratch for passes of up to `tokens` tokens and `rows` rows.
struct Scratch {
    mem: DevMem,
    tokens: usize,
    rows: usize,
}

/// The fused path's state for one cache: its stream, cuBLAS handle, kernels, key/value memory,
/// scratch, and the device addresses of the weights it last ran with.
pub struct Fused {
    blas: Blas,
    fns: Fns,
    dtype: Dtype,
    elem: usize,
    cfg: Qwen2Config,
    max_len: usize,
    layer_bytes: usize,
    cache: DevMem,
    freq: DevMem,
    scratch: Option<Scratch>,
    weights: Option<WeightSet>,
    /// Last: dropped after the cuBLAS handle bound to its stream and after the memory.
    own: Own,
}

// SAFETY: the raw CUDA handles are used through `&mut Fused` only (one thread at a time), with
// the primary context made current by that thread.
unsafe impl Send for Fused {}

impl Drop for Fused {
    fn drop(&mut self) {
        // Before the fields: the context is current for the frees and nothing runs any more.
        // SAFETY: the stream was created by this engine; passes end synchronised.
        unsafe {
            let _ = cu::ctx::set_current(self.own.ctx);
            let _ = cu::stream::synchronize(self.own.stream);
        }
    }
}

/// The engine's stream and module in the primary context, released on drop.
struct Own {
    ctx: drv::CUcontext,
    stream: drv::CUstream,
    module: drv::CUmodule,
}

impl Drop for Own {
    fn drop(&mut self) {
        // SAFETY: created once for this engine, released once; its work is synchronised.
        unsafe {
            let _ = cu::ctx::set_current(self.ctx);
            if !self.module.is_null() {
                let _ = cu::module::unload(self.module);
            }
            let _ = cu::stream::destroy(self.stream);
        }
    }
}

/// Weights per layer, in this order: input norm, q, q bias, k, k bias, v, v bias, o, post norm,
/// gate, up, down.
const PER_LAYER: usize = 12;

/// The model's float primitives in the engine's order ([`PER_LAYER`] per layer, then the
/// embedding, the final norm and the untied head); `None` for an absent bias or a tied head.
fn primitives<F: FloatElement>(model: &Qwen2<Cuda<F>>) -> Vec<Option<FusionTensor<Fr<F>>>> {
    fn p<F: FloatElement, const D: usize>(
        t: &Param<Tensor<Cuda<F>, D>>,
    ) -> Option<FusionTensor<Fr<F>>> {
        Some(t.val().into_primitive().tensor())
    }
    let mut out = Vec::with_capacity(model.layers.len() * PER_LAYER + 3);
    for layer in &model.layers {
        let a = &layer.self_attn;
        out.push(p(&layer.input_layernorm.weight));
        for lin in [&a.q_proj, &a.k_proj, &a.v_proj] {
            out.push(p(&lin.weight));
            out.push(lin.bias.as_ref().and_then(p));
        }
        out.push(p(&a.o_proj.weight));
        out.push(p(&layer.post_attention_layernorm.weight));
        out.push(p(&layer.mlp.gate_proj.weight));
        out.push(p(&layer.mlp.up_proj.weight));
        out.push(p(&layer.mlp.down_proj.weight));
    }
    out.push(p(&model.embed_tokens.weight));
    out.push(p(&model.norm.weight));
    out.push(model.lm_head.as_ref().and_then(|h| p(&h.weight)));
    out
}

type Inner<F> = CubeBackend<CudaRuntime, F, i32, u8>;
type Fr<F> = <Inner<F> as FusionBackend>::FusionRuntime;

/// What one pass computes: flat tokens with their slot and position, and each row's last token.
pub(super) struct Pass {
    pub(super) ids: Vec<i32>,
    pub(super) slot: Vec<i32>,
    pub(super) pos: Vec<i32>,
    pub(super) last: Vec<i32>,
}

impl Pass {
    /// The pass of `tokens[i]` appended to slot `slots[i]`, whose lengths are `lens`.
    pub(super) fn new(lens: &[usize], slots: &[usize], tokens: &[Vec<u32>]) -> Pass {
        let n: usize = tokens.iter().map(Vec::len).sum();
        let mut pass = Pass {
            ids: Vec::with_capacity(n),
            slot: Vec::with_capacity(n),
            pos: Vec::with_capacity(n),
            last: Vec::with_capacity(slots.len()),
        };
        for (&s, toks) in slots.iter().zip(tokens) {
            for (j, &t) in toks.iter().enumerate() {
                pass.ids.push(t as i32);
                pass.slot.push(s as i32);
                pass.pos.push((lens[s] + j) as i32);
            }
            pass.last.push(pass.ids.len() as i32 - 1);
        }
        pass
    }
}

/// What one pass hands back: the logits as a burn tensor, or the tokens drawn on the device.
enum Output<T> {
    Logits(T),
    Drawn(Vec<(u32, f32)>),
}

/// Runs `pass` of `model` through `fused` (`B` must be a backend it [`serves`]), drawing on the
/// device when `draws` is given.
fn pass<B: Backend>(
    model: &Qwen2<B>,
    fused: &mut Fused,
    pass: &Pass,
    draws: Option<&[DeviceDraw]>,
) -> Result<Output<Tensor<B, 2>>, String> {
    let any: &dyn Any = model;
    fn back<B: Backend, X: Backend>(out: Output<Tensor<X, 2>>) -> Output<Tensor<B, 2>> {
        match out {
            Output::Logits(t) => Output::Logits(crate::cublas::same(t)),
            Output::Drawn(d) => Output::Drawn(d),
        }
    }
    if let Some(m) = any.downcast_ref::<Qwen2<Cuda<f32>>>() {
        return fused.run(m, pass, draws).map(back::<B, Cuda<f32>>);
    }
    if let Some(m) = any.downcast_ref::<Qwen2<Cuda<bf16>>>() {
        return fused.run(m, pass, draws).map(back::<B, Cuda<bf16>>);
    }
    Err(format!(
        "the fused path does not serve {}",
        std::any::type_name::<B>()
    ))
}

/// `model`'s logits for `pass` through `fused` (`B` must be a backend it [`serves`]).
pub(super) fn extend<B: Backend>(
    model: &Qwen2<B>,
    fused: &mut Fused,
    p: &Pass,
) -> Result<Tensor<B, 2>, String> {
    match pass(model, fused, p, None)? {
        Output::Logits(t) => Ok(t),
        Output::Drawn(_) => Err("the fused pass drew tokens where logits were asked".into()),
    }
}

/// `model`'s pass with one token per row drawn on the device (see [`crate::DeviceDraw`]).
pub(super) fn draw<B: Backend>(
    model: &Qwen2<B>,
    fused: &mut Fused,
    p: &Pass,
    draws: &[DeviceDraw],
) -> Result<Vec<(u32, f32)>, String> {
    match pass(model, fused, p, Some(draws))? {
        Output::Drawn(d) => Ok(d),
        Output::Logits(_) => Err("the fused pass returned logits where tokens were asked".into()),
    }
}

/// A float tensor made from an inner-backend tensor that is already computed.
fn wrap<F: FloatElement>(
    client: &burn_fusion::Client<Fr<F>>,
    t: CubeTensor<CudaRuntime>,
) -> Tensor<Cuda<F>, 2> {
    #[derive(Debug)]
    struct Op<F: FloatElement> {
        desc: CustomOpIr,
        t: CubeTensor<CudaRuntime>,
        _f: std::marker::PhantomData<F>,
    }
    impl<F: FloatElement> Operation<Fr<F>> for Op<F> {
        fn execute(&self, handles: &mut HandleContainer<<Fr<F> as FusionRuntime>::FusionHandle>) {
            let out = &self.desc.outputs[0];
            handles.register_float_tensor::<Inner<F>>(&out.id, self.t.clone());
        }
    }
    let shape = Shape::from(t.meta.shape().to_vec());
    let out = TensorIr::uninit(client.create_empty_handle(), shape, t.dtype);
    let desc = CustomOpIr::new("kevin_fused_logits", &[], &[out]);
    let prim = client
        .register(
            OperationStreams::default(),
            OperationIr::Custom(desc.clone()),
            Op::<F> {
                desc,
                t,
                _f: std::marker::PhantomData,
            },
        )
        .output();
    Tensor::from_primitive(TensorPrimitive::Float(prim))
}

/// 256-byte aligned offsets of consecutive buffers of `sizes` bytes; the total last.
fn layout(sizes: &[usize]) -> (Vec<usize>, usize) {
    let mut at = 0;
    let offsets = sizes
        .iter()
        .map(|&s| {
            let o = at;
            at += s.div_ceil(256) * 256;
            o
        })
        .collect();
    (offsets, at)
}

impl Fused {
    fn err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> String + '_ {
        move |e| format!("fused pass, {what}: {e:?}")
    }

    /// The weight addresses of `model`, resolved again only when its tensors changed.
    fn weights<F: FloatElement>(&mut self, model: &Qwen2<Cuda<F>>) -> Result<(), String> {
        let prims = primitives(model);
        let key: Vec<Option<TensorId>> = prims.iter().map(|p| p.as_ref().map(|t| t.id)).collect();
        if self.weights.as_ref().is_some_and(|w| w.key == key) {
            return Ok(());
        }
        self.weights = None;
        let mut mats = Vec::with_capacity(prims.len());
        let mut keep = Vec::with_capacity(prims.len());
        for prim in prims {
            let Some(prim) = prim else {
                mats.push(None);
                continue;
            };
            let t: CubeTensor<CudaRuntime> =
                prim.client.resolve_tensor_float::<Inner<F>>(prim.clone());
            // A vector must be packed; a matrix any layout cuBLAS reads (as the matmul extension
            // reads its operands), else it is packed once here.
            let layout = |t: &CubeTensor<CudaRuntime>| match t.meta.shape().len() {
                1 => (t.meta.strides()[0] == 1).then_some((false, 1)),
                _ => operand(t.meta.shape(), t.meta.strides(), &[]).map(|o| (o.trans, o.ld)),
            };
            let (t, (trans, ld)) = match layout(&t) {
                Some(l) => (t, l),
                None => {
                    let packed = burn_cubecl::kernel::into_contiguous(t);
                    let l = layout(&packed).ok_or("a weight that packs to no usable layout")?;
                    (packed, l)
                }
            };
            let res = t
                .client
                .get_resource(t.handle.clone())
                .map_err(|e| format!("fused pass, a weight's device address: {e:?}"))?;
            let ptr = res.resource().ptr;
            mats.push(Some(Mat { ptr, trans, ld }));
            keep.push((t, Box::new(res) as Box<dyn Any + Send>));
        }
        // The embedding is gathered by rows: it must be row-major.
        let embed = mats[mats.len() - 3].ok_or("no embedding")?;
        if embed.trans {
            return Err("the embedding is stored transposed".into());
        }
        // Resolving submitted the kernels that compute the weights (a learner step's, a
        // load's); they must have run before this stream reads them.
        if let Some((t, _)) = keep.first() {
            burn::cubecl::future::block_on(t.client.sync())
                .map_err(|e| format!("fused pass, sync: {e:?}"))?;
        }
        self.weights = Some(WeightSet { key, mats, keep });
        Ok(())
    }

    fn launch(
        &self,
        f: drv::CUfunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &mut ArgPack,
    ) -> Result<(), String> {
        crate::kernels::launch(f, grid, block, smem, self.own.stream, args)
            .map_err(|e| format!("fused pass, {e}"))
    }

    /// `x [rows, k] @ w [k, n] -> y [rows, n]` (row-major x, y; `[rows, k, n]` = `dims`);
    /// `out` f32 for the logits.
    fn gemm(&self, x: u64, w: Mat, y: u64, dims: [usize; 3], out: Dtype) -> Result<(), String> {
        let [rows, k, n] = dims;
        let g = Gemm {
            dtype: self.dtype,
            a: 0,
            b: 0,
            c: 0,
            m: rows as u32,
            n: n as u32,
            k: k as u32,
            batch: 1,
            trans_a: false,
            trans_b: w.trans,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
        };
        let call = GemmCall {
            g: &g,
            f64: false,
            a: x,
            b: w.ptr,
            c: y,
        };
        self.blas
            .gemm_out(&call, k as i64, w.ld, out)
            .map_err(|e| format!("fused pass: {e}"))
    }

    fn run<F: FloatElement>(
        &mut self,
        model: &Qwen2<Cuda<F>>,
        pass: &Pass,
        draws: Option<&[DeviceDraw]>,
    ) -> Result<Output<Tensor<Cuda<F>, 2>>, String> {
        // SAFETY: the primary context, retained for the process's lifetime.
        unsafe { cu::ctx::set_current(self.own.ctx) }.map_err(Self::err("cuCtxSetCurrent"))?;
        self.weights(model)?;
        let (n, rows) = (pass.ids.len(), pass.last.len());
        let c = self.cfg.clone();
        let (hidden, inter, vocab) = (c.hidden_size, c.intermediate_size, c.vocab_size);
        let (h, kv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim());
        let e = self.elem;

        // Scratch: metadata, then x, xn, q, k, v, qr, attn, o, gate, up, down, the rows' xn, and
        // for draws the logits, the rows' temperatures and thresholds, tokens and log-probs; last
        // the attention's parts (decode steps split each token's keys, see `attn_parts`).
        let need_tokens = self.scratch.as_ref().map_or(0, |s| s.tokens);
        let need_rows = self.scratch.as_ref().map_or(0, |s| s.rows);
        let sizes = |t: usize, r: usize| {
            vec![
                (3 * t + r) * 4,
                t * hidden * e,
                t * hidden * e,
                t * h * d * e,
                t * kv * d * e,
                t * kv * d * e,
                t * h * d * e,
                t * h * d * e,
                t * hidden * e,
                t * inter * e,
                t * inter * e,
                t * hidden * e,
                r * hidden * e,
                r * vocab * 4,
                r * 2 * 4,
                r * 2 * 4,
                t.min(SPLIT_TOKENS) * h * MAX_SPLIT * (d + 2) * 4,
            ]
        };
        if n > need_tokens || rows > need_rows {
            // Grow by at least half again, so prefill sizes settle quickly.
            let t = n.max(need_tokens + need_tokens / 2);
            let r = rows.max(need_rows);
            self.scratch = None;
            let (_, total) = layout(&sizes(t, r));
            self.scratch = Some(Scratch {
                mem: DevMem::new(total)?,
                tokens: t,
                rows: r,
            });
        }
        let s = self.scratch.as_ref().expect("sized above");
        let (off, _) = layout(&sizes(s.tokens, s.rows));
        let at = |i: usize| s.mem.ptr + off[i] as u64;
        let (x, xn, q, k, v, qr, att, o, gate, up, down, xl) = (
            at(1),
            at(2),
            at(3),
            at(4),
            at(5),
            at(6),
            at(7),
            at(8),
            at(9),
            at(10),
            at(11),
            at(12),
        );
        let meta: Vec<i32> = [&pass.ids, &pass.slot, &pass.pos, &pass.last]
            .into_iter()
            .flatten()
            .copied()
            .collect();
        let (ids, slot, pos, last) = (
            at(0),
            at(0) + 4 * n as u64,
            at(0) + 8 * n as u64,
            at(0) + 12 * n as u64,
        );
        let w = self.weights.as_ref().expect("resolved above");
        let mat = |i: usize| w.mats[i];
        let ptr = |i: usize| w.mats[i].map_or(0, |m| m.ptr);
        let layers = c.num_hidden_layers;
        let (embed_i, norm_i, head_i) = (
            layers * PER_LAYER,
            layers * PER_LAYER + 1,
            layers * PER_LAYER + 2,
        );

        // The logits: drawn from on the device, in the scratch; otherwise in memory from
        // cubecl's pool, then fence 1 so that no cubecl kernel still uses it when this stream
        // writes it.
        let mut burn_out = None;
        let logits = if draws.is_some() {
            at(13)
        } else {
            let first = &w.keep[0].0;
            let client = first.client.clone();
            let out = burn_cubecl::ops::numeric::empty_device_contiguous_dtype(
                client.clone(),
                first.device.clone(),
                Shape::from(vec![rows, vocab]),
                DType::F32,
            );
            let res = client
                .get_resource(out.handle.clone())
                .map_err(|e| format!("fused pass, the logits' device address: {e:?}"))?;
            let ptr = res.resource().ptr;
            burn::cubecl::future::block_on(client.sync())
                .map_err(|e| format!("fused pass, sync: {e:?}"))?;
            burn_out = Some((out, res));
            ptr
        };

        // SAFETY: `meta` fits the scratch's first buffer; it lives until the stream is
        // synchronised at the end of this function.
        unsafe { cu::memcpy_htod_async(ids, &meta, self.own.stream) }.map_err(Self::err("copy"))?;

        let block = |width: usize| (width.next_power_of_two().clamp(32, 1024)) as u32;
        let eps = c.rms_norm_eps as f32;
        let embed = mat(embed_i).ok_or("no embedding")?;
        let mut a = ArgPack::default();
        a.ptr(ids);
        a.ptr(embed.ptr);
        a.ptr(x);
        a.push(&(hidden as i32).to_ne_bytes());
        a.push(&(embed.ld as i32).to_ne_bytes());
        self.launch(self.fns.embed, (n as u32, 1, 1), block(hidden), 0, &mut a)?;

        let norm = |xp: u64, add: u64, wt: u64, outp: u64, rowsp: u64, count: usize| {
            let mut a = ArgPack::default();
            a.ptr(xp);
            a.ptr(add);
            a.ptr(wt);
            a.ptr(outp);
            a.ptr(rowsp);
            a.push(&(hidden as i32).to_ne_bytes());
            a.push(&eps.to_ne_bytes());
            self.launch(
                self.fns.add_rmsnorm,
                (count as u32, 1, 1),
                block(hidden).min(1024),
                0,
                &mut a,
            )
        };
        let scale = (d as f64).powf(-0.5) as f32;
        let attn_smem = ATTN_WARPS * MAX_GROUP as u32 * (d as u32 + 2) * 4;
        let max_keys = pass.pos.iter().map(|&p| p as usize + 1).max().unwrap_or(1);
        let parts = attn_parts(n, kv, max_keys);
        let part = at(16);
        for l in 0..layers {
            let base = l * PER_LAYER;
            let (kc, vc) = (
                self.cache.ptr + (2 * l * self.layer_bytes) as u64,
                self.cache.ptr + ((2 * l + 1) * self.layer_bytes) as u64,
            );
            // x += down (the previous layer's MLP); xn = norm(x)
            norm(x, if l == 0 { 0 } else { down }, ptr(base), xn, 0, n)?;
            let wq = |i: usize| mat(base + i).ok_or("a missing weight");
            self.gemm(xn, wq(1)?, q, [n, hidden, h * d], self.dtype)?;
            self.gemm(xn, wq(3)?, k, [n, hidden, kv * d], self.dtype)?;
            self.gemm(xn, wq(5)?, v, [n, hidden, kv * d], self.dtype)?;
            let mut a = ArgPack::default();
            for p in [
                q,
                k,
                v,
                ptr(base + 2),
                ptr(base + 4),
                ptr(base + 6),
                slot,
                pos,
                self.freq.ptr,
                qr,
                kc,
                vc,
            ] {
                a.ptr(p);
            }
            for i in [h, kv, d, self.max_len] {
                a.push(&(i as i32).to_ne_bytes());
            }
            self.launch(self.fns.qkv_rope, (n as u32, 1, 1), 256, 0, &mut a)?;
            let mut a = ArgPack::default();
            for p in [qr, kc, vc, slot, pos, att, part] {
                a.ptr(p);
            }
            for i in [h, kv, d, self.max_len] {
                a.push(&(i as i32).to_ne_bytes());
            }
            a.push(&scale.to_ne_bytes());
            self.launch(
                self.fns.attn,
                (n as u32, kv as u32, parts as u32),
                32 * ATTN_WARPS,
                attn_smem,
                &mut a,
            )?;
            if parts > 1 {
                let mut a = ArgPack::default();
                a.ptr(part);
                a.ptr(att);
                for i in [h, d, parts] {
                    a.push(&(i as i32).to_ne_bytes());
                }
                let block = (d as u32).next_multiple_of(32);
                self.launch(
                    self.fns.attn_merge,
                    (n as u32, h as u32, 1),
                    block,
                    0,
                    &mut a,
                )?;
            }
            self.gemm(att, wq(7)?, o, [n, h * d, hidden], self.dtype)?;
            norm(x, o, ptr(base + 8), xn, 0, n)?;
            self.gemm(xn, wq(9)?, gate, [n, hidden, inter], self.dtype)?;
            self.gemm(xn, wq(10)?, up, [n, hidden, inter], self.dtype)?;
            let mut a = ArgPack::default();
            a.ptr(gate);
            a.ptr(up);
            a.ptr(gate);
            a.push(&((n * inter) as i64).to_ne_bytes());
            let blocks = (n * inter).div_ceil(256).min(65_535) as u32;
            self.launch(self.fns.silu_mul, (blocks, 1, 1), 256, 0, &mut a)?;
            self.gemm(gate, wq(11)?, down, [n, inter, hidden], self.dtype)?;
        }
        // The rows' last tokens: x += down, then the final norm, then the head.
        norm(x, down, ptr(norm_i), xl, last, rows)?;
        let head = match mat(head_i) {
            Some(m) => m,
            // Tied: logits = xl @ embed^T, the embedding [vocab, hidden] read transposed.
            None => {
                let e = mat(embed_i).ok_or("no embedding")?;
                Mat {
                    ptr: e.ptr,
                    trans: true,
                    ld: e.ld,
                }
            }
        };
        self.gemm(xl, head, logits, [rows, hidden, vocab], Dtype::F32)?;
        if self.dtype == Dtype::Bf16 {
            let mut a = ArgPack::default();
            a.ptr(logits);
            a.push(&((rows * vocab) as i64).to_ne_bytes());
            let blocks = (rows * vocab).div_ceil(256).min(65_535) as u32;
            self.launch(self.fns.round_bf16, (blocks, 1, 1), 256, 0, &mut a)?;
        }
        if let Some(draws) = draws {
            // Temperatures, then thresholds 1 - u (in (0, 1]; a rand f64 is a multiple of
            // 2^-53, so it stays > 0 in f32).
            let params: Vec<f32> = draws
                .iter()
                .map(|d| d.temperature as f32)
                .chain(draws.iter().map(|d| (1.0 - d.uniform) as f32))
                .collect();
            let (par, res) = (at(14), at(15));
            // SAFETY: `params` fits buffer 14 (2 * rows floats) and lives until the stream is
            // synchronised below.
            unsafe { cu::memcpy_htod_async(par, &params, self.own.stream) }
                .map_err(Self::err("copy"))?;
            let mut a = ArgPack::default();
            a.ptr(logits);
            a.push(&(vocab as i32).to_ne_bytes());
            a.ptr(par);
            a.ptr(par + 4 * rows as u64);
            a.ptr(res);
            a.ptr(res + 4 * rows as u64);
            self.launch(self.fns.sample, (rows as u32, 1, 1), 1024, 0, &mut a)?;
            let mut back = vec![0u32; 2 * rows];
            // SAFETY: buffer 15 holds 2 * rows 4-byte values; `back` is not moved until the
            // stream is synchronised.
            unsafe {
                cu::memcpy_dtoh_async(&mut back, res, self.own.stream)
                    .map_err(Self::err("copy"))?;
                cu::stream::synchronize(self.own.stream).map_err(Self::err("sync"))?;
            }
            let drawn = (0..rows)
                .map(|i| (back[i], f32::from_bits(back[rows + i])))
                .collect();
            return Ok(Output::Drawn(drawn));
        }
        // Fence 2: the logits are written before cubecl reads them.
        // SAFETY: this engine's stream.
        unsafe { cu::stream::synchronize(self.own.stream) }.map_err(Self::err("sync"))?;
        let (out, res) = burn_out.expect("allocated above when not drawing");
        drop(res);
        let fusion_client = model
            .embed_tokens
            .weight
            .val()
            .into_primitive()
            .tensor()
            .client
            .clone();
        Ok(Output::Logits(wrap::<F>(&fusion_client, out)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel compiles, and every name of [`kernel_names`] is one of its symbols (each is
    /// a name expression of the compile: a missing one fails it).
    #[test]
    fn fused_kernels_compile_for_sm_90() {
        crate::kernels::assert_compiles(&SOURCE);
    }

    #[test]
    fn passes_flatten_rows_with_their_positions() {
        let pass = Pass::new(&[3, 0, 5], &[2, 1], &[vec![7], vec![1, 2, 3]]);
        assert_eq!(pass.ids, vec![7, 1, 2, 3]);
        assert_eq!(pass.slot, vec![2, 1, 1, 1]);
        assert_eq!(pass.pos, vec![5, 0, 1, 2]);
        assert_eq!(pass.last, vec![0, 3]);
    }

    #[test]
    fn layouts_are_aligned() {
        let (off, total) = layout(&[10, 300, 0, 5]);
        assert_eq!(off, vec![0, 256, 768, 768]);
        assert_eq!(total, 1024);
    }

    #[test]
    fn decode_attention_splits_keys_only_when_few_tokens_run() {
        // A decode step of 64 slots over 3,000 keys: 128 blocks, so 8 parts of 375 keys.
        assert_eq!(attn_parts(64, 2, 3000), 8);
        // One slot: as many parts as the keys allow, at most MAX_SPLIT.
        assert_eq!(attn_parts(1, 2, 3000), MAX_SPLIT);
        assert_eq!(attn_parts(1, 2, 300), 2);
        // Short contexts and prefills are not split.
        assert_eq!(attn_parts(64, 2, 100), 1);
        assert_eq!(attn_parts(2048, 2, 3000), 1);
        assert_eq!(attn_parts(0, 2, 3000), 1);
    }

    #[test]
    fn unsupported_shapes_are_named() {
        let mut cfg = crate::bench::Shape::Qwen2_05b.config();
        assert_eq!(unsupported(&cfg), None, "{cfg:?}");
        cfg.num_attention_heads = cfg.num_key_value_heads * 16;
        assert!(unsupported(&cfg).is_some());
    }
}
