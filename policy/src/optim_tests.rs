//! kevin's AdamW against burn's (PyTorch's arithmetic) over several steps, the clip inside the
//! step, and an earlier kevin's optimizer state (burn's record) read and continued.

use burn::backend::{Autodiff, NdArray};
use burn::optim::AdamWConfig;
use burn::tensor::TensorData;

use super::*;
use crate::learner_testing::BigramTestLm;

type Ad = Autodiff<NdArray>;
type Lm = BigramTestLm<Ad>;

const SETTINGS: AdamWSettings = TEST_SETTINGS;

fn burn_adamw() -> OptimizerAdaptor<burn::optim::AdamW, Lm, Ad> {
    AdamWConfig::new()
        .with_beta_1(SETTINGS.beta_1 as f32)
        .with_beta_2(SETTINGS.beta_2 as f32)
        .with_epsilon(SETTINGS.epsilon as f32)
        .with_weight_decay(SETTINGS.weight_decay as f32)
        .init()
}

/// A double with its weights drawn (not lazily initialised, so its clones share them).
fn lm() -> Lm {
    BigramTestLm::<Ad>::new(7, 5, 16, &Default::default()).reloaded()
}

/// Gradients of a loss whose gradient depends on the weights (so two optimizers' trajectories
/// agree only if their steps do), with targets that change with `step`:
/// sum((e - t1)^2) + 3 sum((h - t2)^2) + sum(b^3).
fn grads(model: &Lm, step: usize) -> GradientsParams {
    let (e, h, b) = model.weights();
    let target = |dims: [usize; 2], k: f64| {
        let values: Vec<f32> = (0..dims[0] * dims[1])
            .map(|i| ((i as f64 * 0.37 + step as f64).sin() * k) as f32)
            .collect();
        Tensor::<Ad, 2>::from_data(TensorData::new(values, dims), &Default::default())
    };
    let loss = (e.clone() - target(e.dims(), 1.0)).powi_scalar(2).sum()
        + (h.clone() - target(h.dims(), 2.0))
            .powi_scalar(2)
            .sum()
            .mul_scalar(3.0)
        + b.powi_scalar(3).sum();
    GradientsParams::from_grads(loss.backward(), model)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
}

#[test]
fn adamw_takes_burns_adamw_steps() {
    let start = lm();
    let (mut ours, mut theirs) = (start.clone(), start.clone());
    let mut adamw = AdamW::<NdArray>::new(SETTINGS);
    let mut reference = burn_adamw();
    for step in 0..6 {
        let lr = 1e-2 * (step + 1) as f64;
        let g = grads(&ours, step);
        let (next, norm) = clipped_step(ours, &mut adamw, g, f64::INFINITY, lr);
        assert!(norm.unwrap().is_finite());
        ours = next;
        let g = grads(&theirs, step);
        theirs = reference.step(lr, theirs, g);
    }
    let moved = max_diff(&start.weight_values(), &ours.weight_values());
    assert!(moved > 1e-2, "the weights barely moved: {moved}");
    let diff = max_diff(&ours.weight_values(), &theirs.weight_values());
    assert!(
        diff < 1e-5,
        "kevin's AdamW is {diff} from burn's after 6 steps"
    );
}

#[test]
fn the_clip_scales_the_gradient_inside_the_step() {
    let start = lm();
    let g = grads(&start, 0);
    let norm = crate::grad_norm::global_grad_norm(&start, &g);
    let max_norm = norm / 4.0;
    let (clipped, got) = clipped_step(start.clone(), &mut AdamW::new(SETTINGS), g, max_norm, 0.1);
    assert_eq!(got, Ok(norm));
    // The same step on gradients scaled by hand, without a clip.
    let mut g = grads(&start, 0);
    let mut scaled = GradientsParams::new();
    for (id, _, shape) in param_table::<Ad, Lm>(&start) {
        if shape.len() == 2 {
            let t = g.remove::<NdArray, 2>(id).unwrap();
            scaled.register::<NdArray, 2>(id, t.mul_scalar(0.25));
        } else {
            let t = g.remove::<NdArray, 1>(id).unwrap();
            scaled.register::<NdArray, 1>(id, t.mul_scalar(0.25));
        }
    }
    let (by_hand, _) = clipped_step(start.clone(), &mut AdamW::new(SETTINGS), scaled, 1e9, 0.1);
    let diff = max_diff(&clipped.weight_values(), &by_hand.weight_values());
    assert!(
        diff < 1e-6,
        "clipped inside the step: {diff} from the scaled gradients' step"
    );
    // A second step shows the moments saw the scaled gradient (AdamW's first step alone is
    // nearly scale-free).
    let mut a = AdamW::new(SETTINGS);
    let mut b = AdamW::new(SETTINGS);
    let (m1, _) = clipped_step(start.clone(), &mut a, grads(&start, 0), max_norm, 0.1);
    let (m2, _) = clipped_step(start.clone(), &mut b, grads(&start, 0), 1e9, 0.1);
    let (m1, _) = clipped_step(m1.clone(), &mut a, grads(&m1, 1), 1e9, 0.1);
    let (m2, _) = clipped_step(m2.clone(), &mut b, grads(&m2, 1), 1e9, 0.1);
    assert!(max_diff(&m1.weight_values(), &m2.weight_values()) > 1e-4);
}

#[test]
fn a_non_finite_norm_leaves_the_model_and_state_untouched() {
    let start = lm();
    let mut g = grads(&start, 0);
    let (id, _, _) = param_table::<Ad, Lm>(&start)[2].clone();
    let b = g.remove::<NdArray, 1>(id).unwrap();
    g.register::<NdArray, 1>(id, b.add_scalar(f32::NAN));
    let mut adamw = AdamW::new(SETTINGS);
    let (after, norm) = clipped_step(start.clone(), &mut adamw, g, 1.0, 0.1);
    assert!(norm.unwrap_err().is_nan());
    assert_eq!(after.weight_values(), start.weight_values());
    assert!(adamw.slots.iter().all(Option::is_none));
}

#[test]
fn an_earlier_kevins_state_is_read_and_continued() {
    let dir = std::env::temp_dir().join(format!("kevin-optim-legacy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Two steps of burn's AdamW, saved as kevin wrote it before: the record keyed by position,
    // version, steps, paths, shapes, in `learner_optimizer.mpk`.
    let mut model = lm();
    let mut burn = burn_adamw();
    for step in 0..2 {
        let g = grads(&model, step);
        model = burn.step(0.05, model, g);
    }
    let table = param_table::<Ad, Lm>(&model);
    let mut record = burn.to_record();
    let mut by_position =
        <OptimizerAdaptor<burn::optim::AdamW, Lm, Ad> as Optimizer<Lm, Ad>>::Record::default();
    for (i, (id, _, _)) in table.iter().enumerate() {
        by_position.insert(ParamId::from(i as u64), record.remove(id).unwrap());
    }
    let paths: Vec<String> = table.iter().map(|(_, p, _)| p.clone()).collect();
    let shapes: Vec<Vec<usize>> = table.iter().map(|(_, _, s)| s.clone()).collect();
    Recorder::<Ad>::record(
        &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
        (by_position, 5u64, 2u64, paths, shapes),
        dir.join("learner_optimizer"),
    )
    .unwrap();
    assert!(dir.join(LEGACY_OPTIMIZER_FILE).is_file());

    let mut ours = OptimizedModel::<Ad, Lm>::new(model.clone(), SETTINGS);
    assert_eq!(ours.load(&dir, &Default::default()).unwrap(), 5);
    assert_eq!(ours.steps(), 2);
    let g = grads(&model, 2);
    ours.step(g, 1e9, 0.05).unwrap();
    let g = grads(&model, 2);
    let theirs = burn.step(0.05, model.clone(), g);
    let diff = max_diff(&ours.model().weight_values(), &theirs.weight_values());
    assert!(diff < 1e-5, "continued {diff} from burn's third step");
    // Without the state the third step differs: the comparison above can fail.
    let mut fresh = OptimizedModel::<Ad, Lm>::new(model.clone(), SETTINGS);
    fresh.step(grads(&model, 2), 1e9, 0.05).unwrap();
    assert!(max_diff(&fresh.model().weight_values(), &theirs.weight_values()) > 1e-4);

    // Saved again, the new format takes precedence and round-trips.
    ours.save(&dir, 6).unwrap();
    let mut again = OptimizedModel::<Ad, Lm>::new(ours.model().clone(), SETTINGS);
    assert_eq!(again.load(&dir, &Default::default()).unwrap(), 6);
    assert_eq!(again.steps(), 3);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_file_that_is_not_kevins_state_is_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("kevin-optim-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut ours = OptimizedModel::<Ad, Lm>::new(lm(), SETTINGS);
    std::fs::write(dir.join(OPTIMIZER_FILE), b"not safetensors").unwrap();
    let (path, why) = ours.load(&dir, &Default::default()).unwrap_err();
    assert_eq!(path, dir.join(OPTIMIZER_FILE));
    assert!(!why.is_empty());
    // A safetensors file without kevin's metadata.
    safetensors::serialize_to_file(
        std::iter::empty::<(&str, &Encoded)>(),
        None,
        &dir.join(OPTIMIZER_FILE),
    )
    .unwrap();
    let (_, why) = ours.load(&dir, &Default::default()).unwrap_err();
    assert!(why.contains("not a kevin optimizer state"), "{why}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_full_precision_model_takes_each_master_at_its_parameters_position() {
    // A bf16 model's parameters are rounded from the optimizer's f32 masters; on the CPU the
    // slots are set by hand: a master for the head's weight (position 1) only.
    let model = lm();
    let (e, h, b) = model.weights();
    let n = h.shape().num_elements();
    let master: Tensor<NdArray, 1> = h.clone().inner().reshape([n]).add_scalar(0.5);
    let zeros = || Tensor::<NdArray, 1>::zeros([n], &Default::default());
    let mut optimized = OptimizedModel::<Ad, Lm>::new(model, SETTINGS);
    optimized.adamw.slots = vec![
        None,
        Some(Slot {
            time: 1,
            m: zeros(),
            v: zeros(),
            master: Some(master),
        }),
        None,
    ];
    let values = |t: Tensor<Ad, 2>| t.into_data().to_vec::<f32>().unwrap();
    let (e2, h2, b2) = optimized.full_precision().weights();
    assert_eq!(
        values(e2),
        values(e),
        "a parameter without a master is kept"
    );
    assert_eq!(
        b2.into_data().to_vec::<f32>().unwrap(),
        b.into_data().to_vec::<f32>().unwrap()
    );
    let want: Vec<f32> = values(h.clone()).iter().map(|v| v + 0.5).collect();
    assert_eq!(values(h2), want, "the head's weight is its master");
    // The model being trained keeps its own (rounded) parameters.
    assert_eq!(values(optimized.model().weights().1), values(h));
}
