//! Global gradient-norm clipping, as the recipe means it (clip 0.05 on the norm of *all*
//! gradients together).
//!
//! burn's `GradientClipping::Norm` clips each parameter's gradient on its own, which changes the
//! direction of the update; here the L2 norm is taken over every parameter's gradient at once and
//! every gradient is scaled by the same factor min(1, max_norm / norm), as PyTorch's
//! `clip_grad_norm_` does. The squared norms are summed on the device and read back once: on
//! burn's CUDA backend by [`crate::norm::squared_sum`] (one kernel launch over every gradient of
//! a dtype into one sum), elsewhere with burn's ops.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{FloatDType, Shape, Tensor, TensorMetadata, TensorPrimitive};

/// Every parameter's gradient, in the module's visiting order.
struct Collect<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    found: Vec<FloatTensor<B::InnerBackend>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(grad) = self.grads.get::<B::InnerBackend, D>(param.id) {
            self.found.push(grad.into_primitive().tensor());
        }
    }
}

/// The sum of `t`'s squares in f32, as a `[1]` tensor: row sums first (a tensor of one
/// dimension is one row), then their sum. A full reduction of a large tensor in one step runs on
/// a handful of blocks on burn's CUDA backend (4 for any size: 6 ms for Qwen2-0.5B's embedding
/// on an H200, 23.5 ms a step in all); the rows spread it over the GPU (about 18 ms a step:
/// burn's reduction is slow either way, which is why CUDA takes [`crate::norm::squared_sum`]).
fn squared_sum<B: Backend>(t: FloatTensor<B>) -> Tensor<B, 1> {
    let dims = t.shape().to_vec();
    let cols = dims.last().copied().unwrap_or(1).max(1);
    let rows = dims.iter().product::<usize>() / cols;
    let t = B::float_reshape(t, Shape::from(vec![rows, cols]));
    Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(t))
        .cast(FloatDType::F32)
        .square()
        .sum_dim(1)
        .sum()
}

/// The L2 norm of all of `module`'s gradients in `grads` together (0 when there are none).
pub fn global_grad_norm<B, M>(module: &M, grads: &GradientsParams) -> f64
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
{
    let mut visitor = Collect::<B> {
        grads,
        found: Vec::new(),
    };
    module.visit(&mut visitor);
    if visitor.found.is_empty() {
        return 0.0;
    }
    let total = match crate::norm::squared_sum::<B::InnerBackend>(visitor.found) {
        Ok(total) => total,
        Err(found) => found
            .into_iter()
            .map(squared_sum::<B::InnerBackend>)
            .reduce(|a, b| a + b)
            .expect("at least one gradient"),
    };
    total
        .into_data()
        .iter::<f64>()
        .next()
        .map_or(0.0, f64::sqrt)
}

/// The factor every gradient is scaled by to clip the global norm `norm` to `max_norm`:
/// `max_norm / norm` above it, else 1 (PyTorch's `clip_grad_norm_` without its epsilon).
pub fn clip_factor(norm: f64, max_norm: f64) -> f64 {
    if norm > max_norm {
        max_norm / norm
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, NdArray};
    use burn::module::{Module, ParamId};
    use burn::tensor::Tensor;

    use super::*;
    use crate::learner_testing::BigramTestLm;

    type Ad = Autodiff<NdArray>;

    /// Ids and element counts of a module's float parameters.
    #[derive(Default)]
    struct Ids(Vec<(ParamId, Vec<usize>)>);

    impl ModuleVisitor<Ad> for Ids {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Ad, D>>) {
            self.0.push((param.id, param.dims().to_vec()));
        }
    }

    /// Gradients filled with one value per parameter: 0.5, -1.5, 2.5, ...
    fn constant_grads(lm: &BigramTestLm<Ad>) -> GradientsParams {
        let mut ids = Ids::default();
        lm.visit(&mut ids);
        assert_eq!(ids.0.len(), 3, "embedding, head weight, head bias");
        let mut grads = GradientsParams::new();
        for (k, (id, dims)) in ids.0.into_iter().enumerate() {
            let v = (k as f64 + 0.5) * if k % 2 == 0 { 1.0 } else { -1.0 };
            let device = Default::default();
            match dims.len() {
                1 => grads.register::<NdArray, 1>(id, Tensor::full([dims[0]], v, &device)),
                _ => grads.register::<NdArray, 2>(id, Tensor::full([dims[0], dims[1]], v, &device)),
            }
        }
        grads
    }

    #[test]
    fn global_norm_is_over_every_gradient_and_clips_by_one_factor() {
        // vocab 5, hidden 3: embedding 5x3 = 15 values of 0.5, head 3x5 = 15 of -1.5, bias 5 of 2.5.
        let lm = BigramTestLm::<Ad>::new(5, 3, 8, &Default::default());
        let grads = constant_grads(&lm);
        // sqrt(3.75 + 33.75 + 31.25) = sqrt(68.75) ~ 8.29.
        let by_hand = (15.0 * 0.25 + 15.0 * 2.25 + 5.0 * 6.25f64).sqrt();
        let norm = global_grad_norm(&lm, &grads);
        assert!(
            (norm - by_hand).abs() < 1e-6 * by_hand,
            "norm {norm}, by hand {by_hand}"
        );
        assert_eq!(clip_factor(norm, 0.05), 0.05 / norm);
        assert_eq!(clip_factor(norm, 2.0), 2.0 / norm);
        // At or below the limit nothing changes.
        assert_eq!(clip_factor(norm, norm), 1.0);
        assert_eq!(clip_factor(norm, 100.0), 1.0);
        assert_eq!(global_grad_norm(&lm, &GradientsParams::new()), 0.0);
    }
}
