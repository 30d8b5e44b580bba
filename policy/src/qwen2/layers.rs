//! The layers of the decoder, each with `new` (from a [`WeightSource`]), `visit` (to a
//! [`WeightVisitor`]) and a short `forward`: RMSNorm, RoPE, grouped-query attention, the SwiGLU
//! MLP and the pre-norm decoder layer, plus the matmul that can split f32 into bf16 parts.

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::activation::{silu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, DType, FloatDType, Tensor, TensorData};

use super::cache::{ExtendPlan, LayerKv};
use super::config::Qwen2Config;
use super::weights::{linear_from, visit_linear, WeightKind, WeightSource, WeightVisitor};

/// `a @ b` (batch dimensions broadcast). A large product on the CUDA backend goes to cuBLAS
/// ([`crate::cublas`]: fp32 compute, so f32 stays f32). Otherwise, with `split` and f32
/// operands, each operand is split into a bf16 head and its f32 remainder and the four partial
/// products are summed: tensor-core kernels that stage f32 through TF32 (burn's CUDA matmuls do,
/// with no switch to turn it off) then hold every product to about f32 accuracy, at four times
/// the matmul work (the 3xTF32 technique of CUTLASS, with the small*small term kept). Casting to
/// bf16 needs a backend that has bf16 (CUDA does; NdArray does not, and computes f32 matmuls
/// exactly anyway).
pub(super) fn mm<B: Backend, const D: usize>(
    a: Tensor<B, D>,
    b: Tensor<B, D>,
    split: bool,
) -> Tensor<B, D> {
    let (a, b) = match crate::cublas::matmul(a, b) {
        Ok(out) => return out,
        Err(operands) => operands,
    };
    if !split || a.dtype() != DType::F32 {
        return a.matmul(b);
    }
    let head = |x: Tensor<B, D>| x.cast(FloatDType::BF16).cast(FloatDType::F32);
    let (ah, bh) = (head(a.clone()), head(b.clone()));
    let (al, bl) = (a - ah.clone(), b - bh.clone());
    // Smallest terms first.
    al.clone().matmul(bl.clone()) + al.matmul(bh.clone()) + ah.clone().matmul(bl) + ah.matmul(bh)
}

/// `f` applied to `x [.., k]` seen as rows, `[rows, k] -> [rows, n]`, the result given back its
/// leading dimensions: `[.., n]`. A product with a weight is then one matrix product each way,
/// and the weight's gradient one product over every row, not a product per batch entry summed
/// afterwards (burn's gradient of a broadcast operand: a `[b, k, n]` tensor and a reduction, for
/// every linear layer of a learner step).
pub(super) fn on_rows<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    f: impl FnOnce(Tensor<B, 2>) -> Tensor<B, 2>,
) -> Tensor<B, D> {
    let mut dims = x.dims();
    let rows = dims[..D - 1].iter().product();
    let y = f(x.reshape([rows, dims[D - 1]]));
    dims[D - 1] = y.dims()[1];
    y.reshape(dims)
}

/// `layer(x)`, on rows ([`on_rows`]); through [`mm`] when `split` or when cuBLAS takes the
/// product.
pub(super) fn lin<B: Backend, const D: usize>(
    layer: &Linear<B>,
    x: Tensor<B, D>,
    split: bool,
) -> Tensor<B, D> {
    on_rows(x, |x| {
        let w = layer.weight.val();
        if !split && !crate::cublas::wants_dims::<B>(x.dtype(), &x.dims(), w.dtype(), &w.dims()) {
            return layer.forward(x);
        }
        let y = mm(x, w, split);
        match &layer.bias {
            Some(bias) => match crate::norm::add_bias(y, bias.val()) {
                Ok(out) => out,
                Err((y, b)) => y + b.unsqueeze(),
            },
            None => y,
        }
    })
}

/// RMSNorm as transformers computes it: in f32, scaled after casting back ([`crate::norm`]'s
/// kernels on CUDA).
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    pub(super) weight: Param<Tensor<B, 1>>,
    eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    pub(super) fn new<S: WeightSource<B>>(
        src: &mut S,
        name: &str,
        dim: usize,
        eps: f64,
    ) -> Result<Self, S::Error> {
        let weight = src.get(&format!("{name}.weight"), [dim], WeightKind::Norm)?;
        Ok(Self {
            weight: Param::from_tensor(weight),
            eps,
        })
    }

    pub(super) fn visit(&self, name: &str, f: &mut WeightVisitor<'_>) {
        f(
            &format!("{name}.weight"),
            self.weight.val().into_data(),
            WeightKind::Norm,
        );
    }

    /// `[.., hidden] -> [.., hidden]`
    pub(super) fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let x = match crate::norm::rms_norm(x, self.weight.val(), self.eps) {
            Ok(y) => return y,
            Err((x, _)) => x,
        };
        let dtype = x.dtype();
        let x = to_f32(x);
        let inv_rms = (x.clone().square().mean_dim(D - 1) + self.eps)
            .sqrt()
            .recip();
        (x * inv_rms).cast(dtype) * self.weight.val().unsqueeze()
    }
}

/// Casts to f32 unless already f32 (no cast node at all in the f32 path).
pub(super) fn to_f32<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    if x.dtype() == DType::F32 {
        x
    } else {
        x.cast(DType::F32)
    }
}

/// The rotary-embedding angles of some positions: `cos` and `sin` of `[rows, 1, t, d]`, each
/// half of the last dimension repeating the other (transformers' `cat(freqs, freqs)`).
pub(super) struct Rope<B: Backend> {
    cos: Tensor<B, 4>,
    sin: Tensor<B, 4>,
}

impl<B: Backend> Rope<B> {
    /// `positions` is `rows x t`, row-major. The angles are computed in f32 exactly as
    /// transformers does (`inv_freq` in f32, one f32 product per angle).
    pub(super) fn new(
        cfg: &Qwen2Config,
        positions: &[usize],
        rows: usize,
        device: &B::Device,
    ) -> Self {
        let d = cfg.head_dim();
        let inv_freq = inv_freq(cfg);
        let mut cos = Vec::with_capacity(positions.len() * d);
        let mut sin = Vec::with_capacity(positions.len() * d);
        for &p in positions {
            let angles: Vec<f32> = inv_freq.iter().map(|f| p as f32 * f).collect();
            for _ in 0..2 {
                cos.extend(angles.iter().map(|a| a.cos()));
                sin.extend(angles.iter().map(|a| a.sin()));
            }
        }
        let shape = [rows, 1, positions.len() / rows, d];
        Self {
            cos: Tensor::from_data(
                TensorData::new(cos, shape),
                (device, super::float_dtype::<B>()),
            ),
            sin: Tensor::from_data(
                TensorData::new(sin, shape),
                (device, super::float_dtype::<B>()),
            ),
        }
    }

    /// A projection's rows `x [b, t, heads * d]` as heads, `[b, heads, t, d]`, rotated: one
    /// kernel each way on burn's CUDA backend ([`crate::norm::rope_heads`]), else the reshape, the
    /// transpose and [`Rope::apply`].
    pub(super) fn heads(&self, x: Tensor<B, 3>, heads: usize) -> Tensor<B, 4> {
        match crate::norm::rope_heads(x, heads, &self.cos, &self.sin) {
            Ok(y) => y,
            Err(x) => {
                let [b, t, n] = x.dims();
                self.apply(x.reshape([b, t, heads, n / heads]).swap_dims(1, 2))
            }
        }
    }

    /// `[b, heads, t, d] -> [b, heads, t, d]`: `x * cos + rotate_half(x) * sin`.
    pub(super) fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let half = x.dims()[3] / 2;
        let x1 = x.clone().narrow(3, 0, half);
        let x2 = x.clone().narrow(3, half, half);
        let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
        x * self.cos.clone() + rotated * self.sin.clone()
    }
}

/// RoPE's `head_dim / 2` inverse frequencies, in f32 as transformers computes them.
pub(super) fn inv_freq(cfg: &Qwen2Config) -> Vec<f32> {
    let d = cfg.head_dim();
    let theta = cfg.rope_base() as f32;
    (0..d / 2)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / d as f32))
        .collect()
}

/// Grouped-query self-attention with RoPE; q/k/v with bias, o without.
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    pub(super) q_proj: Linear<B>,
    pub(super) k_proj: Linear<B>,
    pub(super) v_proj: Linear<B>,
    pub(super) o_proj: Linear<B>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    /// Split f32 matmuls (see [`super::Qwen2::set_split_f32_matmul`]).
    pub(super) split: bool,
}

impl<B: Backend> Attention<B> {
    pub(super) fn new<S: WeightSource<B>>(
        src: &mut S,
        name: &str,
        cfg: &Qwen2Config,
    ) -> Result<Self, S::Error> {
        let (h, kv, d) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim(),
        );
        let hidden = cfg.hidden_size;
        let bias = cfg.qkv_bias();
        Ok(Self {
            q_proj: linear_from(src, &format!("{name}.q_proj"), hidden, h * d, bias)?,
            k_proj: linear_from(src, &format!("{name}.k_proj"), hidden, kv * d, bias)?,
            v_proj: linear_from(src, &format!("{name}.v_proj"), hidden, kv * d, bias)?,
            o_proj: linear_from(src, &format!("{name}.o_proj"), h * d, hidden, false)?,
            num_heads: h,
            num_kv_heads: kv,
            head_dim: d,
            split: false,
        })
    }

    pub(super) fn visit(&self, name: &str, f: &mut WeightVisitor<'_>) {
        visit_linear(&self.q_proj, &format!("{name}.q_proj"), f);
        visit_linear(&self.k_proj, &format!("{name}.k_proj"), f);
        visit_linear(&self.v_proj, &format!("{name}.v_proj"), f);
        visit_linear(&self.o_proj, &format!("{name}.o_proj"), f);
    }

    /// `[b, t, hidden] -> q [b, h, t, d], k [b, kv, t, d], v [b, kv, t, d]`, RoPE applied.
    pub(super) fn qkv(
        &self,
        x: Tensor<B, 3>,
        rope: &Rope<B>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
        let [b, t, _] = x.dims();
        let (h, kv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let q = rope.heads(lin(&self.q_proj, x.clone(), self.split), h);
        let k = rope.heads(lin(&self.k_proj, x.clone(), self.split), kv);
        let v = lin(&self.v_proj, x, self.split)
            .reshape([b, t, kv, d])
            .swap_dims(1, 2);
        (q, k, v)
    }

    /// `q [b, h, t, d]`, `k, v [b, kv, s, d]`, `masked [b|1, 1, t, s]` (true: may not attend)
    /// `-> [b, t, h * d]` after `o_proj`. Query heads are grouped onto their key/value head by a
    /// reshape (transformers' `repeat_kv` without the copy): head `i` reads kv head `i / g`.
    pub(super) fn attend(
        &self,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        masked: Tensor<B, 4, Bool>,
    ) -> Tensor<B, 3> {
        let [b, h, t, d] = q.dims();
        let (kv, s) = (self.num_kv_heads, k.dims()[2]);
        let g = h / kv;
        let scale = (d as f64).powf(-0.5);
        // [b, kv, g * t, d] @ [b, kv, d, s] -> [b, kv, g * t, s] -> [b, h, t, s]
        let scores = mm(q.reshape([b, kv, g * t, d]), k.swap_dims(2, 3), self.split) * scale;
        let scores = scores.reshape([b, h, t, s]);
        let dtype = scores.dtype();
        let scores = to_f32(scores).mask_fill(masked.expand([b, h, t, s]), f32::NEG_INFINITY);
        let probs = softmax(scores, 3).cast(dtype);
        // [b, kv, g * t, s] @ [b, kv, s, d] -> [b, h, t, d]
        let out = mm(probs.reshape([b, kv, g * t, s]), v, self.split).reshape([b, h, t, d]);
        self.project(out)
    }

    /// `out [b, h, t, d] -> [b, t, h * d]` after `o_proj`.
    fn project(&self, out: Tensor<B, 4>) -> Tensor<B, 3> {
        let [b, h, t, d] = out.dims();
        lin(
            &self.o_proj,
            out.swap_dims(1, 2).reshape([b, t, h * d]),
            self.split,
        )
    }

    /// Full causal attention over `x [b, t, hidden]` without a cache (`masked`: the causal
    /// mask). On burn's CUDA backend the attention itself is [`crate::flash`]'s, without the
    /// score matrix, where it serves.
    pub(super) fn forward(
        &self,
        x: Tensor<B, 3>,
        rope: &Rope<B>,
        masked: Tensor<B, 4, Bool>,
    ) -> Tensor<B, 3> {
        let (q, k, v) = self.qkv(x, rope);
        match crate::flash::causal_attention(q, k, v) {
            Ok(out) => self.project(out),
            Err((q, k, v)) => self.attend(q, k, v, masked),
        }
    }

    /// Attention of new tokens `x [rows, t, hidden]` over their slots' cached keys and their own:
    /// writes the new keys and values into `kv` first, then attends over the first `plan.keys`
    /// positions of each row's slot.
    pub(super) fn forward_cached(
        &self,
        x: Tensor<B, 3>,
        plan: &ExtendPlan<B>,
        kv: LayerKv<B>,
    ) -> (Tensor<B, 3>, LayerKv<B>) {
        let (q, k, v) = self.qkv(x, &plan.rope);
        let kv = LayerKv {
            k: plan.write(kv.k, k),
            v: plan.write(kv.v, v),
        };
        // [slots * kv * max_len, d] -> [rows, kv, keys, d]
        let rows = q.dims()[0];
        let shape = [rows, self.num_kv_heads, plan.keys, self.head_dim];
        let keys = |cache: &Tensor<B, 2>| cache.clone().select(0, plan.read.clone()).reshape(shape);
        let out = self.attend(q, keys(&kv.k), keys(&kv.v), plan.masked.clone());
        (out, kv)
    }
}

/// SwiGLU: `down(silu(gate(x)) * up(x))`.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    pub(super) gate_proj: Linear<B>,
    pub(super) up_proj: Linear<B>,
    pub(super) down_proj: Linear<B>,
    /// Split f32 matmuls (see [`super::Qwen2::set_split_f32_matmul`]).
    pub(super) split: bool,
}

impl<B: Backend> Mlp<B> {
    pub(super) fn new<S: WeightSource<B>>(
        src: &mut S,
        name: &str,
        cfg: &Qwen2Config,
    ) -> Result<Self, S::Error> {
        let (hidden, inter) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Self {
            gate_proj: linear_from(src, &format!("{name}.gate_proj"), hidden, inter, false)?,
            up_proj: linear_from(src, &format!("{name}.up_proj"), hidden, inter, false)?,
            down_proj: linear_from(src, &format!("{name}.down_proj"), inter, hidden, false)?,
            split: false,
        })
    }

    pub(super) fn visit(&self, name: &str, f: &mut WeightVisitor<'_>) {
        visit_linear(&self.gate_proj, &format!("{name}.gate_proj"), f);
        visit_linear(&self.up_proj, &format!("{name}.up_proj"), f);
        visit_linear(&self.down_proj, &format!("{name}.down_proj"), f);
    }

    /// `[b, t, hidden] -> [b, t, hidden]`
    pub(super) fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let gate = lin(&self.gate_proj, x.clone(), self.split);
        let up = lin(&self.up_proj, x, self.split);
        let act = crate::norm::swiglu(gate, up).unwrap_or_else(|(gate, up)| silu(gate) * up);
        lin(&self.down_proj, act, self.split)
    }
}

/// Pre-norm decoder layer: `x + attn(norm(x))`, then `h + mlp(norm(h))`.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    pub(super) self_attn: Attention<B>,
    pub(super) mlp: Mlp<B>,
    pub(super) input_layernorm: RmsNorm<B>,
    pub(super) post_attention_layernorm: RmsNorm<B>,
}

impl<B: Backend> DecoderLayer<B> {
    pub(super) fn new<S: WeightSource<B>>(
        src: &mut S,
        name: &str,
        cfg: &Qwen2Config,
    ) -> Result<Self, S::Error> {
        let (hidden, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        Ok(Self {
            self_attn: Attention::new(src, &format!("{name}.self_attn"), cfg)?,
            mlp: Mlp::new(src, &format!("{name}.mlp"), cfg)?,
            input_layernorm: RmsNorm::new(src, &format!("{name}.input_layernorm"), hidden, eps)?,
            post_attention_layernorm: RmsNorm::new(
                src,
                &format!("{name}.post_attention_layernorm"),
                hidden,
                eps,
            )?,
        })
    }

    pub(super) fn visit(&self, name: &str, f: &mut WeightVisitor<'_>) {
        self.self_attn.visit(&format!("{name}.self_attn"), f);
        self.mlp.visit(&format!("{name}.mlp"), f);
        self.input_layernorm
            .visit(&format!("{name}.input_layernorm"), f);
        self.post_attention_layernorm
            .visit(&format!("{name}.post_attention_layernorm"), f);
    }

    /// `[b, t, hidden] -> [b, t, hidden]`, `attn` being the attention path (cached or not).
    pub(super) fn forward(
        &self,
        x: Tensor<B, 3>,
        attn: impl FnOnce(&Attention<B>, Tensor<B, 3>) -> Tensor<B, 3>,
    ) -> Tensor<B, 3> {
        let h = x.clone() + attn(&self.self_attn, self.input_layernorm.forward(x));
        h.clone() + self.mlp.forward(self.post_attention_layernorm.forward(h))
    }
}
