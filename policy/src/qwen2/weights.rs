//! Weight naming: where a model's weights come from ([`WeightSource`]: a checkpoint or a random
//! initialisation) and where they go ([`WeightVisitor`]), under Hugging Face's names and shapes.

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor, TensorData};

/// How a weight is laid out and initialised. The checkpoint code transposes `Linear` weights:
/// torch stores them `[out, in]`, burn's `Linear` `[in, out]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WeightKind {
    /// A linear layer's weight, `[out, in]` in the checkpoint, `[in, out]` in burn.
    Linear,
    /// The token embedding `[vocab, hidden]`, the same in both.
    Embedding,
    /// A bias vector (zeros at random initialisation).
    Bias,
    /// An RMSNorm scale (ones at random initialisation).
    Norm,
}

/// Where the weights of a model being built come from: a checkpoint or a random initialisation.
/// Names and shapes are Hugging Face's (torch layout), so one naming scheme (this module's) serves
/// loading, saving and initialisation.
pub(crate) trait WeightSource<B: Backend> {
    /// The error of a missing or malformed tensor.
    type Error;
    /// The tensor `name` of torch shape `shape`, in burn's layout for `kind`.
    fn get<const D: usize>(
        &mut self,
        name: &str,
        shape: [usize; D],
        kind: WeightKind,
    ) -> Result<Tensor<B, D>, Self::Error>;
}

/// Random weights as transformers initialises Qwen2: normal(0, `initializer_range`) for
/// matrices, zeros for biases, ones for norms.
pub(super) struct RandomInit<'a, B: Backend> {
    pub(super) device: &'a B::Device,
    pub(super) std: f64,
}

impl<B: Backend> WeightSource<B> for RandomInit<'_, B> {
    type Error = std::convert::Infallible;

    fn get<const D: usize>(
        &mut self,
        _name: &str,
        mut shape: [usize; D],
        kind: WeightKind,
    ) -> Result<Tensor<B, D>, Self::Error> {
        if kind == WeightKind::Linear {
            shape.reverse();
        }
        Ok(match kind {
            WeightKind::Linear | WeightKind::Embedding => Tensor::random(
                shape,
                Distribution::Normal(0.0, self.std),
                (self.device, super::float_dtype::<B>()),
            ),
            WeightKind::Bias => Tensor::zeros(shape, (self.device, super::float_dtype::<B>())),
            WeightKind::Norm => Tensor::ones(shape, (self.device, super::float_dtype::<B>())),
        })
    }
}

/// Receives every weight of a model, under its Hugging Face name, in burn's layout.
pub(crate) type WeightVisitor<'a> = dyn FnMut(&str, TensorData, WeightKind) + 'a;

pub(super) fn linear_from<B: Backend, S: WeightSource<B>>(
    src: &mut S,
    name: &str,
    d_in: usize,
    d_out: usize,
    bias: bool,
) -> Result<Linear<B>, S::Error> {
    let weight = src.get(&format!("{name}.weight"), [d_out, d_in], WeightKind::Linear)?;
    let bias = if bias {
        Some(Param::from_tensor(src.get(
            &format!("{name}.bias"),
            [d_out],
            WeightKind::Bias,
        )?))
    } else {
        None
    };
    Ok(Linear {
        weight: Param::from_tensor(weight),
        bias,
    })
}

pub(super) fn visit_linear<B: Backend>(layer: &Linear<B>, name: &str, f: &mut WeightVisitor<'_>) {
    f(
        &format!("{name}.weight"),
        layer.weight.val().into_data(),
        WeightKind::Linear,
    );
    if let Some(bias) = &layer.bias {
        f(
            &format!("{name}.bias"),
            bias.val().into_data(),
            WeightKind::Bias,
        );
    }
}
