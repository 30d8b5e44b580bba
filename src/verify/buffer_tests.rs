use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use super::*;

/// Environment variable that turns [`fault_child`] from a no-op into the faulting access.
const FAULT_ENV: &str = "KEVIN_TEST_GUARD_FAULT";

/// Does nothing in a normal test run. When [`run_child`] re-runs the test binary with
/// `FAULT_ENV` set, it performs the access named there, which should kill the process.
#[test]
fn fault_child() {
    let Ok(what) = std::env::var(FAULT_ENV) else {
        return;
    };
    let page = page_size();
    match what.as_str() {
        // One f32 past the end of 10 elements, End placement.
        "overflow" => {
            // 1024 bytes: a multiple of the device alignment, so the data ends at the guard.
            let mut b = GuardedBuffer::new(1024).unwrap();
            let p = b.as_mut_ptr().cast::<f32>();
            // SAFETY: deliberately out of bounds: this must fault.
            unsafe { std::ptr::write_volatile(p.add(256), 1.0) };
        }
        // The last element, in bounds: must not fault (the control).
        "last" => {
            let mut b = GuardedBuffer::new(40).unwrap();
            let p = b.as_mut_ptr().cast::<f32>();
            // SAFETY: in bounds.
            unsafe { std::ptr::write_volatile(p.add(9), 1.0) };
        }
        // One byte before the start, Start placement.
        "underflow_start" => {
            let mut b = GuardedBuffer::with_placement(40, Placement::Start).unwrap();
            // SAFETY: deliberately out of bounds: this must fault.
            unsafe { std::ptr::write_volatile(b.as_mut_ptr().wrapping_sub(1), 1u8) };
        }
        // One byte before the start of a page-multiple End buffer (no slack).
        "underflow_page" => {
            let mut b = GuardedBuffer::new(page).unwrap();
            // SAFETY: deliberately out of bounds: this must fault.
            unsafe { std::ptr::write_volatile(b.as_mut_ptr().wrapping_sub(1), 1u8) };
        }
        // One element past the end of a TensorBuf's typed view.
        "tensor_overflow" => {
            let mut t = TensorBuf::new("Y", Dtype::I64, 32).unwrap();
            let p = t.as_i64_mut().unwrap().as_mut_ptr();
            // SAFETY: deliberately out of bounds: this must fault.
            unsafe { std::ptr::write_volatile(p.add(32), 1) };
        }
        other => panic!("unknown fault {other}"),
    }
}

/// Re-runs this test binary on `fault_child` with `what`; returns the child's exit status.
fn run_child(what: &str) -> std::process::ExitStatus {
    let exe = std::env::current_exe().unwrap();
    Command::new(exe)
        .args([
            "--exact",
            "verify::buffer::tests::fault_child",
            "--test-threads=1",
            "--quiet",
        ])
        .env(FAULT_ENV, what)
        .output()
        .unwrap()
        .status
}

fn died_of_segv(status: std::process::ExitStatus) -> bool {
    let sig = status.signal();
    // Linux reports a guard-page access as SIGSEGV; some BSDs and macOS as SIGBUS.
    sig == Some(libc::SIGSEGV) || (cfg!(not(target_os = "linux")) && sig == Some(libc::SIGBUS))
}

#[test]
fn out_of_bounds_accesses_fault_in_a_child() {
    for what in [
        "overflow",
        "underflow_start",
        "underflow_page",
        "tensor_overflow",
    ] {
        let status = run_child(what);
        assert!(
            died_of_segv(status),
            "{what}: child ended with {status:?}, not SIGSEGV"
        );
    }
    let status = run_child("last");
    assert!(
        status.success(),
        "in-bounds write: child ended with {status:?}"
    );
}

#[test]
fn a_write_into_the_slack_is_seen_by_the_canary() {
    // 40 bytes start 256-byte aligned, so 216 bytes of slack sit before the guard page.
    let mut b = GuardedBuffer::new(40).unwrap();
    assert!(b.slack_intact());
    let p = b.as_mut_ptr().cast::<f32>();
    // SAFETY: out of the data but inside the slack, which is mapped read-write.
    unsafe { std::ptr::write_volatile(p.add(10), 1.0) };
    assert!(
        !b.slack_intact(),
        "one element past the end is caught by the canary"
    );
}

#[test]
fn end_placement_ends_at_the_guard_page() {
    let page = page_size();
    for bytes in [0, 1, 40, page - 4, page, page + 8, 3 * page + 2] {
        let b = GuardedBuffer::new(bytes).unwrap();
        assert_eq!(b.len(), bytes);
        assert_eq!(
            b.as_ptr() as usize % DEVICE_ALIGN,
            0,
            "{bytes} bytes: device-aligned start"
        );
        let end = b.as_ptr() as usize + bytes;
        assert!(
            end.next_multiple_of(page) - end < DEVICE_ALIGN || bytes == 0,
            "{bytes} bytes: end near the guard"
        );
        if bytes % DEVICE_ALIGN == 0 {
            assert_eq!(end % page, 0, "{bytes} bytes: ends at the guard page");
        }
        assert!(b.as_bytes().iter().all(|&x| x == 0));
        let s = GuardedBuffer::with_placement(bytes, Placement::Start).unwrap();
        assert_eq!(s.as_ptr() as usize % page, 0, "{bytes} bytes, start");
        assert_eq!(s.placement(), Placement::Start);
    }
}

#[test]
fn typed_views_check_length() {
    let mut b = GuardedBuffer::new(12).unwrap();
    assert_eq!(b.as_slice::<f32>().unwrap().len(), 3);
    assert_eq!(b.as_mut_slice::<u16>().unwrap().len(), 6);
    assert_eq!(
        b.as_slice::<i64>().unwrap_err(),
        BufferError::Layout {
            bytes: 12,
            elem_size: 8
        }
    );
    assert!(GuardedBuffer::new(0)
        .unwrap()
        .as_slice::<i64>()
        .unwrap()
        .is_empty());
}

#[test]
fn fill_write_read_per_dtype() {
    let values = [1.5, -2.25, 0.1, 3.0];
    for dtype in [Dtype::F32, Dtype::F16, Dtype::Bf16, Dtype::I64] {
        let mut t = TensorBuf::new("T", dtype, 4).unwrap();
        assert_eq!(t.as_bytes().len(), 4 * dtype_size(dtype));
        t.fill_nan();
        assert!((0..4).all(|i| t.is_fill(i)), "{dtype:?}");
        assert!(t.values().all(|(_, fill)| fill));
        if dtype != Dtype::I64 {
            assert!(t.read_f64().iter().all(|v| v.is_nan()), "{dtype:?}");
        }
        t.write_f64(&values).unwrap();
        assert!(!(0..4).any(|i| t.is_fill(i)));
        let back = t.read_f64();
        let expected: Vec<f64> = match dtype {
            Dtype::I64 => vec![2.0, -2.0, 0.0, 3.0],
            d => values
                .iter()
                .map(|&v| crate::ops::round::round_to(d, v))
                .collect(),
        };
        assert_eq!(back, expected, "{dtype:?}");
        assert_eq!(t.get_f64(3), Some(3.0));
        assert_eq!(t.get_f64(4), None);
        assert!(!t.is_fill(4));
    }
}

#[test]
fn fill_patterns_are_nan_and_distinct_from_canonical_nan() {
    assert!(f32::from_bits(F32_FILL).is_nan());
    assert_ne!(F32_FILL, f32::NAN.to_bits());
    assert!(crate::ops::round::f16_from_bits(F16_FILL).is_nan());
    assert_ne!(F16_FILL, crate::ops::round::f16_bits(f64::NAN));
    assert!(crate::ops::round::bf16_from_bits(BF16_FILL).is_nan());
    assert_ne!(BF16_FILL, crate::ops::round::bf16_bits(f64::NAN));
}

#[test]
fn typed_errors_not_panics() {
    let mut t = TensorBuf::new("A", Dtype::F16, 3).unwrap();
    assert!(matches!(t.as_f32(), Err(BufferError::Dtype { .. })));
    assert!(matches!(t.as_i64_mut(), Err(BufferError::Dtype { .. })));
    assert_eq!(
        t.write_f64(&[1.0]),
        Err(BufferError::Length {
            name: "A".into(),
            expected: 3,
            got: 1
        })
    );
    assert!(matches!(
        TensorBuf::new("B", Dtype::I64, usize::MAX / 4),
        Err(BufferError::TooLarge { .. })
    ));
    assert!(matches!(
        GuardedBuffer::new(usize::MAX - 10),
        Err(BufferError::TooLarge { .. })
    ));
}
