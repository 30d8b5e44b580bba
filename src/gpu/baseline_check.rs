//! The GPU tests' check of the eager baseline (and its fp64 reference plan) against the fp64
//! interpreter on one input set ([`check_baseline`]).

use crate::ops::Dtype;
use crate::tasks::{Preset, Role, Task, TensorSpec, Tolerance};
use crate::verify::buffer::dtype_size;
use crate::verify::correctness::judge;

use super::buffers::TaskBuffers;
use super::device::{DevBuf, GpuError};
use super::harness::{decode, decode_reference, reference_width, Harness};
use super::mask_stream;
use crate::verify::request::BaselineCheck;

/// Downloads a device tensor of `spec`'s elements as f64 values: in its dtype, or (`key`) as
/// the stored references masked with that key.
fn download_values(
    h: &Harness,
    ptr: u64,
    spec: &TensorSpec,
    key: Option<u64>,
) -> Result<Vec<f64>, GpuError> {
    let width = match key {
        Some(_) => reference_width(spec.dtype),
        None => dtype_size(spec.dtype),
    };
    let mut bytes = vec![0u8; spec.numel() * width];
    let n = bytes.len();
    h.gpu.download_at(&mut bytes, ptr, n)?;
    Ok(bytes
        .chunks_exact(width)
        .enumerate()
        .map(|(i, c)| {
            let mut raw = [0u8; 8];
            raw[..width].copy_from_slice(c);
            let raw = u64::from_ne_bytes(raw);
            match key {
                Some(k) => {
                    let m = mask_stream(k, i as u64);
                    let m = if width == 4 { m & 0xFFFF_FFFF } else { m };
                    decode_reference(spec.dtype, raw ^ m)
                }
                None => decode(spec.dtype, raw),
            }
        })
        .collect())
}

/// Largest error / tolerance bound and the first element out of tolerance, of `got` against the
/// interpreter's `want`.
fn judge_all(
    spec: &TensorSpec,
    got: &[f64],
    want: &[f64],
    tol: Tolerance,
    ratio: &mut f64,
    first: &mut Option<String>,
) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if judge(spec.dtype, g, false, w, tol).is_some() {
            first.get_or_insert_with(|| format!("{}[{i}]: expected {w}, got {g}", spec.name));
        } else if spec.dtype != Dtype::I64 && w.is_finite() {
            *ratio = ratio.max((g - w).abs() / (tol.atol + tol.rtol * w.abs()));
        }
    }
}

/// Runs the baseline of `task`, and its fp64 reference plan, on one input set drawn on the
/// device from `seed`, and compares both with the fp64 interpreter on the same (downloaded)
/// inputs; then times `time_reps` runs of the baseline (L2 flushed before each, as the timing
/// protocol runs it). `time_only` skips the comparisons.
pub fn check_baseline(
    h: &mut Harness,
    task: &Task,
    preset: Preset,
    seed: u64,
    time_reps: u32,
    time_only: bool,
) -> Result<BaselineCheck, String> {
    let e = |e: GpuError| e.to_string();
    let bufs = TaskBuffers::new(h, task, preset).map_err(|e| e.to_string())?;
    let ins = bufs
        .alloc_tensors(h, Role::Input)
        .map_err(|e| e.to_string())?;
    let outs = bufs
        .alloc_tensors(h, Role::Output)
        .map_err(|e| e.to_string())?;
    let inputs: Vec<u64> = ins.iter().map(DevBuf::ptr).collect();
    let outputs: Vec<u64> = outs.iter().map(DevBuf::ptr).collect();
    bufs.generate(h, &inputs, seed).map_err(e)?;
    let ptrs = bufs.baseline_ptrs(&inputs, &outputs);
    h.run_baseline(&bufs.plan, &ptrs).map_err(e)?;
    h.gpu.sync().map_err(e)?;
    let cudnn_steps = bufs
        .plan
        .steps
        .iter()
        .filter(|s| {
            matches!(
                s,
                crate::baseline::Step::Conv(_) | crate::baseline::Step::BatchNorm(_)
            )
        })
        .count();
    let median_ms = match time_reps {
        0 => None,
        reps => {
            let events = h.gpu.timer().map_err(e)?;
            let mut ms = Vec::with_capacity(reps as usize);
            for _ in 0..reps {
                h.flush_l2().map_err(e)?;
                events.start().map_err(e)?;
                h.run_baseline(&bufs.plan, &ptrs).map_err(e)?;
                events.stop().map_err(e)?;
                ms.push(events.elapsed_ms().map_err(e)?);
            }
            ms.sort_by(f64::total_cmp);
            Some(ms[ms.len() / 2])
        }
    };
    let mut check = BaselineCheck {
        steps: bufs.plan.steps.len(),
        cublas: h.blas_in_use(),
        cudnn_steps,
        median_ms,
        max_error_ratio: 0.0,
        first_failure: None,
        reference_max_error_ratio: 0.0,
        reference_first_failure: None,
    };
    if time_only {
        return Ok(check);
    }
    let host_inputs = bufs.specs[..bufs.n_inputs]
        .iter()
        .zip(&inputs)
        .map(|(s, &p)| download_values(h, p, s, None))
        .collect::<Result<Vec<_>, _>>()
        .map_err(e)?;
    let want = task
        .reference(preset, &host_inputs)
        .map_err(|e| format!("reference: {e}"))?;
    let tol = task.tolerance;
    let out_specs = &bufs.specs[bufs.n_inputs..];
    for ((spec, &p), want) in out_specs.iter().zip(&outputs).zip(&want) {
        let got = download_values(h, p, spec, None).map_err(e)?;
        judge_all(
            spec,
            &got,
            want,
            tol,
            &mut check.max_error_ratio,
            &mut check.first_failure,
        );
    }
    // The correctness protocol's reference, as it computes and stores it (inputs drawn
    // straight into f64, float outputs narrowed to f32, masked), unmasked here.
    let key = 0x5EED_0F_CAFE;
    let refs = bufs.alloc_refs(h).map_err(|e| e.to_string())?;
    bufs.reference(h, seed, &refs, key).map_err(e)?;
    for ((spec, buf), want) in out_specs.iter().zip(&refs).zip(&want) {
        let got = download_values(h, buf.ptr(), spec, Some(key)).map_err(e)?;
        judge_all(
            spec,
            &got,
            want,
            tol,
            &mut check.reference_max_error_ratio,
            &mut check.reference_first_failure,
        );
    }
    Ok(check)
}
