//! The harness kernels run on the CPU device model ([`crate::cpu`]), so their rules are tested
//! without a GPU: the key stream equals [`super::mask_stream`], the diff finds the first changed
//! element, the compare kernel applies the protocol's rule, the generator draws its distribution.
//! Skipped (with a message) when no C++ compiler is on PATH.

use std::ffi::c_void;

use crate::candidate::{ResolvedArg, ResolvedLaunch, ResolvedPlan, Scalar};
use crate::cpu::{self, Module};

use super::{mask_stream, HARNESS_SOURCE};

struct Model {
    module: Module,
    dir: std::path::PathBuf,
}

impl Drop for Model {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn launch(kernel: &str, args: Vec<ResolvedArg>) -> ResolvedLaunch {
    ResolvedLaunch {
        line: 1,
        kernel: kernel.into(),
        grid: [4, 1, 1],
        block: [64, 1, 1],
        smem_bytes: 0,
        args,
    }
}

fn t(i: usize) -> ResolvedArg {
    ResolvedArg::Tensor(i)
}

fn u64a(v: u64) -> ResolvedArg {
    ResolvedArg::Scalar(Scalar::U64(v))
}

const KERNELS: &[&str] = &[
    "kevin_mask4",
    "kevin_mask8",
    "kevin_regen_diff",
    "kevin_compare",
    "kevin_generate",
    "kevin_widen",
    "kevin_generate_wide",
];

fn model() -> Option<Model> {
    if let Err(e) = cpu::find_compiler() {
        eprintln!("SKIP harness kernels on the device model: {e}");
        return None;
    }
    let plan = ResolvedPlan {
        scratch: Vec::new(),
        launches: KERNELS.iter().map(|k| launch(k, Vec::new())).collect(),
    };
    let dir = std::env::temp_dir().join(format!("kevin-harness-model-{}", std::process::id()));
    let so = cpu::compile(HARNESS_SOURCE, &plan, &dir).expect("harness.cu compiles on the model");
    let module = Module::load(&so).expect("load");
    Some(Model { module, dir })
}

fn run(m: &Model, l: &ResolvedLaunch, bufs: &mut [&mut [u64]]) {
    let ptrs: Vec<*mut c_void> = bufs.iter_mut().map(|b| b.as_mut_ptr().cast()).collect();
    // SAFETY: every buffer is as large as the launches below use (n elements).
    unsafe { m.module.launch(l, &ptrs, &[], 2) }.expect("launch");
}

#[test]
fn harness_kernels_follow_the_protocol_rules() {
    let Some(m) = model() else { return };
    let n = 1000u64;
    let key = 0x1234_5678_9abc_def0;
    // f32 data as u32 words, packed two per u64 element of the host vectors.
    let words = |v: &[u64]| -> Vec<u32> {
        v.iter()
            .flat_map(|w| [*w as u32, (*w >> 32) as u32])
            .collect()
    };
    let pack = |w: &[u32]| -> Vec<u64> {
        w.chunks(2)
            .map(|c| u64::from(c[0]) | (u64::from(c[1]) << 32))
            .collect()
    };
    let original: Vec<u32> = (0..n as u32)
        .map(|i| (i as f32 * 0.5 - 7.0).to_bits())
        .collect();

    // Masking equals the host's key stream.
    let mut masked = pack(&original);
    run(
        &m,
        &launch("kevin_mask4", vec![t(0), u64a(n), u64a(key)]),
        &mut [&mut masked],
    );
    for (i, (&w, &o)) in words(&masked).iter().zip(&original).enumerate() {
        assert_eq!(w, o ^ mask_stream(key, i as u64) as u32, "element {i}");
    }

    // Compare: an unwritten element (fill), one out of tolerance, the rest within.
    let fill = crate::verify::buffer::F32_FILL;
    let mut got: Vec<u32> = original
        .iter()
        .map(|&w| (f32::from_bits(w) * (1.0 + 5e-5)).to_bits())
        .collect();
    got[5] = fill;
    got[10] = (f32::from_bits(original[10]) + 0.5).to_bits();
    let mut got = pack(&got);
    let compare = |want_dtype: i32| {
        let mut args = vec![t(0), t(1), u64a(n)];
        args.push(ResolvedArg::Scalar(Scalar::I32(0)));
        args.push(ResolvedArg::Scalar(Scalar::I32(want_dtype)));
        args.extend([u64a(key), u64a(u64::from(fill))]);
        args.push(ResolvedArg::Scalar(Scalar::F64(1e-4)));
        args.push(ResolvedArg::Scalar(Scalar::F64(1e-4)));
        args.push(t(2));
        launch("kevin_compare", args)
    };
    let check_stats = |stats: &[u64; 4]| {
        assert_eq!(stats[0], 2, "two failures");
        assert_eq!(stats[1], 5, "the first is the unwritten element");
        let ratio = f32::from_bits(stats[2] as u32);
        assert!(ratio > 0.3 && ratio <= 1.0, "max ratio {ratio}");
    };
    let mut stats = [0u64, u64::MAX, 0, 0];
    run(&m, &compare(0), &mut [&mut got, &mut masked, &mut stats]);
    check_stats(&stats);

    // The same against an fp64 reference: widened on the device, masked 8 bytes at a time.
    let mut wide = vec![0u64; n as usize];
    let mut widen = vec![t(0), t(1), u64a(n)];
    widen.push(ResolvedArg::Scalar(Scalar::I32(0)));
    run(
        &m,
        &launch("kevin_widen", widen),
        &mut [&mut pack(&original), &mut wide],
    );
    for (i, (&w, &o)) in wide.iter().zip(&original).enumerate() {
        assert_eq!(
            f64::from_bits(w),
            f64::from(f32::from_bits(o)),
            "widened {i}"
        );
    }
    run(
        &m,
        &launch("kevin_mask8", vec![t(0), u64a(n), u64a(key)]),
        &mut [&mut wide],
    );
    assert_eq!(
        wide[3],
        f64::from(f32::from_bits(original[3])).to_bits() ^ mask_stream(key, 3)
    );
    let mut stats = [0u64, u64::MAX, 0, 0];
    run(&m, &compare(4), &mut [&mut got, &mut wide, &mut stats]);
    check_stats(&stats);

    // The generator: normal(2, 3) in f32.
    let mut out = vec![0u64; n as usize / 2];
    let draw_kind = |kernel: &str, target: usize, kind: i32, [a, b, c]: [f32; 3]| {
        let mut args = vec![
            t(target),
            u64a(n),
            u64a(99),
            ResolvedArg::Scalar(Scalar::I32(kind)),
        ];
        for v in [a, b, c] {
            args.push(ResolvedArg::Scalar(Scalar::F32(v)));
        }
        args.push(ResolvedArg::Scalar(Scalar::I32(0)));
        launch(kernel, args)
    };
    let draw = |kernel: &str, target: usize| draw_kind(kernel, target, 0, [2.0, 3.0, 0.0]);
    run(&m, &draw("kevin_generate", 0), &mut [&mut out]);
    let v: Vec<f64> = words(&out)
        .iter()
        .map(|&w| f64::from(f32::from_bits(w)))
        .collect();
    assert!(v.iter().all(|x| x.is_finite()), "every draw is finite");
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
    assert!(
        (mean - 2.0).abs() < 0.3 && (sd - 3.0).abs() < 0.3,
        "mean {mean}, sd {sd}"
    );

    // The input check regenerates the draw: nothing changed, then the first changed element.
    let regen = |data: &mut Vec<u64>| {
        let mut first = [u64::MAX];
        let mut l = draw("kevin_regen_diff", 0);
        l.args.push(t(1));
        run(&m, &l, &mut [data, &mut first]);
        first[0]
    };
    assert_eq!(
        regen(&mut out.clone()),
        u64::MAX,
        "an untouched input passes"
    );
    let mut changed = words(&out);
    changed[700] ^= 1;
    changed[37] ^= 1 << 20;
    assert_eq!(regen(&mut pack(&changed)), 37);

    // A grid of two values (signs, kind 3): only -1 and 1, both drawn, about as often.
    let values = |kind: i32, abc: [f32; 3]| {
        let mut out = vec![0u64; n as usize / 2];
        run(
            &m,
            &draw_kind("kevin_generate", 0, kind, abc),
            &mut [&mut out],
        );
        let mut first = [u64::MAX];
        let mut l = draw_kind("kevin_regen_diff", 0, kind, abc);
        l.args.push(t(1));
        run(&m, &l, &mut [&mut out.clone(), &mut first]);
        assert_eq!(
            first[0],
            u64::MAX,
            "kind {kind}: the regenerated draw is the same"
        );
        words(&out)
            .iter()
            .map(|&w| f64::from(f32::from_bits(w)))
            .collect::<Vec<f64>>()
    };
    let signs = values(3, [-1.0, 2.0, 2.0]);
    let ones = signs.iter().filter(|&&v| v == 1.0).count();
    assert!(signs.iter().all(|&v| v == 1.0 || v == -1.0), "{signs:?}");
    assert!(
        ones > signs.len() / 3 && ones < signs.len() * 2 / 3,
        "{ones} of {}",
        signs.len()
    );
    // Uniform [0, 1) times one factor in [0, 1) (kind 4): the tensor's largest value is about
    // the factor, the same for every element, and the spread uniform below it.
    let scaled = values(4, [0.0, 1.0, 0.0]);
    let top = scaled.iter().cloned().fold(0.0, f64::max);
    assert!(top > 0.0 && top < 1.0 && scaled.iter().all(|&v| (0.0..top + 1e-9).contains(&v)));
    let mean = scaled.iter().sum::<f64>() / scaled.len() as f64;
    assert!(
        (mean / top - 0.5).abs() < 0.1,
        "mean {mean} against top {top}"
    );
    // Square matrices of 8 x 8 (the draw's n holds several): upper (5), lower (6) and
    // symmetric (7).
    let cols = 8usize;
    let at = |v: &[f64], k: usize, r: usize, c: usize| v[k * cols * cols + r * cols + c];
    let upper = values(5, [0.0, 1.0, cols as f32]);
    let lower = values(6, [0.0, 1.0, cols as f32]);
    let sym = values(7, [0.0, 1.0, cols as f32]);
    for k in 0..upper.len() / (cols * cols) {
        for r in 0..cols {
            for c in 0..cols {
                assert_eq!(at(&upper, k, r, c) == 0.0, c < r, "upper {k} {r} {c}");
                assert_eq!(at(&lower, k, r, c) == 0.0, c > r, "lower {k} {r} {c}");
                assert_eq!(
                    at(&sym, k, r, c),
                    at(&sym, k, c, r),
                    "symmetric {k} {r} {c}"
                );
            }
        }
        assert_ne!(at(&sym, k, 0, 1), at(&sym, k, 0, 2));
    }

    // i64 (dtype 3): the draw rounded to an integer, 8 bytes an element, and the input check
    // regenerates it (n / 2 elements fill the n / 2 words).
    let mut ints = vec![0u64; n as usize / 2];
    let mut l = draw_kind("kevin_generate", 0, 1, [-3.0, 3.0, 0.0]);
    l.args.push(ResolvedArg::Scalar(Scalar::I32(3)));
    l.args.remove(l.args.len() - 2);
    l.args[1] = u64a(n / 2);
    run(&m, &l, &mut [&mut ints]);
    let v: Vec<i64> = ints.iter().map(|&w| w as i64).collect();
    assert!(v.iter().all(|x| (-3..=3).contains(x)), "{v:?}");
    assert!(
        (-3..=3).all(|k| v.contains(&k)),
        "every integer in range is drawn"
    );
    let mut first = [u64::MAX];
    let mut l2 = l.clone();
    l2.kernel = "kevin_regen_diff".into();
    l2.args.push(t(1));
    run(&m, &l2, &mut [&mut ints.clone(), &mut first]);
    assert_eq!(first[0], u64::MAX, "the regenerated i64 draw is the same");
    // The fp64 reference plan keeps i64 buffers i64: the wide draw of an i64 input is the same
    // words, not doubles (a copy of it in the reference plan read double bits as integers).
    let mut wide = vec![0u64; n as usize / 2];
    let mut lw = l.clone();
    lw.kernel = "kevin_generate_wide".into();
    lw.args.insert(2, u64a(0));
    run(&m, &lw, &mut [&mut wide]);
    assert!(wide == ints, "the reference's i64 input is the candidate's");
    ints[5] ^= 1 << 40;
    run(&m, &l2, &mut [&mut ints, &mut first]);
    assert_eq!(first[0], 5, "a changed high byte of an i64 input is found");
}
