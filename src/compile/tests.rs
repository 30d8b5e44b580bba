//! In-process tests of the compile step. Tests that need NVRTC skip with a message when it is
//! missing, unless `KEVIN_REQUIRE_NVRTC=1` (set in CI), which turns the skip into a failure.

use super::*;

/// True when NVRTC is usable; otherwise prints why and returns false (or fails, in CI).
pub(crate) fn nvrtc_or_skip(test: &str) -> bool {
    match locate_nvrtc() {
        Ok(_) => true,
        Err(e) if std::env::var("KEVIN_REQUIRE_NVRTC").as_deref() == Ok("1") => {
            panic!("{test}: KEVIN_REQUIRE_NVRTC=1 but NVRTC is unavailable: {e}")
        }
        Err(e) => {
            eprintln!("skipping {test}: {e}");
            false
        }
    }
}

const SAXPY: &str = r#"
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

// C++ linkage: found through its lowered (mangled) name.
__global__ void scale(float* y, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= s;
}
"#;

fn compile_here(req: &CompileRequest) -> CompileResponse {
    compile(req, &find_cuda_include_dirs())
}

#[test]
fn compiles_ptx_with_lowered_names() {
    if !nvrtc_or_skip("compiles_ptx_with_lowered_names") {
        return;
    }
    let out = compile_here(&CompileRequest::ptx(SAXPY, &["saxpy", "scale"])).unwrap();
    let ModuleImage::Ptx(ptx) = &out.image else {
        panic!("expected PTX, got {:?}", out.image)
    };
    assert!(ptx.contains(".entry saxpy"), "{ptx}");
    assert!(ptx.contains(".target sm_90"), "{ptx}");
    assert_eq!(out.lowered_names["saxpy"], "saxpy");
    let scale = &out.lowered_names["scale"];
    assert!(
        scale.starts_with("_Z") && ptx.contains(&format!(".entry {scale}")),
        "{scale}"
    );
    assert!(out.compile_ms > 0.0);
}

#[test]
fn compiles_cubin() {
    if !nvrtc_or_skip("compiles_cubin") {
        return;
    }
    let req = CompileRequest {
        output: OutputKind::Cubin,
        ..CompileRequest::ptx(SAXPY, &["saxpy"])
    };
    let out = compile_here(&req).unwrap();
    let ModuleImage::Cubin(bytes) = &out.image else {
        panic!("expected a CUBIN")
    };
    assert_eq!(&bytes[..4], b"\x7fELF");
    // The image survives the wire (hex-encoded). compile_ms is compared approximately: serde_json
    // does not promise an exact f64 round trip without its float_roundtrip feature (this test
    // failed once on 31.820139 vs 31.820138999999998).
    let json = serde_json::to_string(&out).unwrap();
    let back = serde_json::from_str::<CompileOutput>(&json).unwrap();
    assert!((back.compile_ms - out.compile_ms).abs() < 1e-9);
    assert_eq!(
        CompileOutput {
            compile_ms: out.compile_ms,
            ..back
        },
        out
    );
}

#[test]
fn compile_error_names_the_line() {
    if !nvrtc_or_skip("compile_error_names_the_line") {
        return;
    }
    let source = "__global__ void k(float* y) {\n    y[0] = undefined_thing;\n}\n";
    match compile_here(&CompileRequest::ptx(source, &["k"])) {
        Err(CompileError::Source { log }) => {
            assert!(log.contains("candidate.cu(2): error"), "{log}");
            assert!(log.contains("undefined_thing"), "{log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn missing_kernel_is_a_compile_error() {
    if !nvrtc_or_skip("missing_kernel_is_a_compile_error") {
        return;
    }
    match compile_here(&CompileRequest::ptx(SAXPY, &["no_such_kernel"])) {
        Err(CompileError::Source { log }) => assert!(log.contains("no_such_kernel"), "{log}"),
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn half_and_bfloat16_headers_are_found() {
    if !nvrtc_or_skip("half_and_bfloat16_headers_are_found") {
        return;
    }
    let source = r#"
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void h(const __half* x, __nv_bfloat16* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16(__half2float(x[i]) * 2.0f);
}
"#;
    let req = CompileRequest::ptx(source, &["h"]);
    // Without headers, the failure is kevin's installation's, and says how to fix it.
    match compile(&req, &[]) {
        Err(CompileError::Unavailable { reason }) => {
            assert!(reason.contains("nvidia-cuda-runtime-cu12"), "{reason}")
        }
        other => panic!("expected Unavailable without include dirs, got {other:?}"),
    }
    if find_cuda_include_dirs().is_empty() {
        let msg = "no CUDA headers found (pip install nvidia-cuda-runtime-cu12)";
        assert!(
            std::env::var("KEVIN_REQUIRE_NVRTC").as_deref() != Ok("1"),
            "{msg}"
        );
        eprintln!("skipping the rest of half_and_bfloat16_headers_are_found: {msg}");
        return;
    }
    let out = compile_here(&req);
    assert!(
        out.is_ok(),
        "{out:?} (include dirs: {:?})",
        find_cuda_include_dirs()
    );
}

#[test]
fn bogus_library_path_gives_the_install_hint() {
    let err = nvrtc::probe_library(&["/nonexistent/libnvrtc.so.12".to_string()]).unwrap_err();
    let CompileError::Unavailable { reason } = err else {
        panic!("expected Unavailable, got {err:?}")
    };
    assert!(reason.contains("/nonexistent/libnvrtc.so.12"), "{reason}");
    assert!(
        reason.contains("pip install nvidia-cuda-nvrtc-cu12"),
        "{reason}"
    );
    assert!(reason.contains("LD_LIBRARY_PATH"), "{reason}");
}

#[test]
fn invalid_requests_are_rejected_before_nvrtc() {
    let check = |req: CompileRequest, part: &str| match compile(&req, &[]) {
        Err(CompileError::InvalidRequest { reason }) => assert!(reason.contains(part), "{reason}"),
        other => panic!("expected InvalidRequest ({part}), got {other:?}"),
    };
    let base = CompileRequest::ptx(SAXPY, &["saxpy"]);
    check(
        CompileRequest {
            arch: "compute_90; rm -rf".into(),
            ..base.clone()
        },
        "architecture",
    );
    check(
        CompileRequest::ptx(SAXPY, &["k<int>"]),
        "not a C++ identifier",
    );
    check(
        CompileRequest::ptx("x".repeat(MAX_SOURCE_BYTES + 1), &[]),
        "limit",
    );
    for arch in ["sm_90", "sm_90a", "sm_100", "sm_80"] {
        let req = CompileRequest {
            arch: arch.into(),
            ..base.clone()
        };
        assert!(req.validate().is_ok(), "{arch}");
    }
}

#[test]
fn forbidden_include_is_the_candidates_compile_error() {
    let req = CompileRequest::ptx("#include \"/proc/self/environ\"\n", &[]);
    match compile(&req, &[]) {
        Err(CompileError::Source { log }) => assert!(log.contains("candidate.cu(1)"), "{log}"),
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn options_follow_the_output_kind() {
    let mut req = CompileRequest::ptx("", &[]);
    let opts = nvrtc::nvrtc_options(&req, &["/inc".into()]);
    assert!(opts.contains(&"--gpu-architecture=compute_90".to_string()));
    assert!(opts.contains(&"--include-path=/inc".to_string()));
    assert!(!opts
        .iter()
        .any(|o| o.contains("fast-math") || o.contains("fast_math")));
    req.output = OutputKind::Cubin;
    let opts = nvrtc::nvrtc_options(&req, &[]);
    assert!(opts.contains(&"--gpu-architecture=sm_90".to_string()));
}

#[test]
fn hex_round_trip_and_errors() {
    let image = ModuleImage::Cubin(vec![0, 1, 0x7f, 0xff]);
    let json = serde_json::to_string(&image).unwrap();
    assert_eq!(json, r#"{"cubin":"00017fff"}"#);
    assert_eq!(serde_json::from_str::<ModuleImage>(&json).unwrap(), image);
    for bad in [r#"{"cubin":"0"}"#, r#"{"cubin":"zz"}"#] {
        assert!(serde_json::from_str::<ModuleImage>(bad).is_err(), "{bad}");
    }
}

#[test]
fn timer_registers_are_found_in_the_compiled_ptx() {
    if !nvrtc_or_skip("timer_registers_are_found_in_the_compiled_ptx") {
        return;
    }
    // No literal of the source holds the register's name: the preprocessor assembles it.
    let source = r#"
#define STR(x) #x
#define REG(a, b) "mov.u64 %0, %%" STR(a) STR(b) ";"
extern "C" __global__ void k(unsigned long long* out) {
    unsigned long long t;
    asm volatile(REG(global, timer) : "=l"(t));
    out[0] = t;
}
"#;
    for output in [OutputKind::Ptx, OutputKind::Cubin] {
        let req = CompileRequest {
            output,
            ..CompileRequest::ptx(source, &["k"])
        };
        match compile_here(&req) {
            Err(CompileError::Rule { reason }) => {
                assert!(reason.contains("`%globaltimer`"), "{reason}")
            }
            other => panic!("{output:?}: expected a rule error, got {other:?}"),
        }
    }
    // The same kernel without the timer compiles.
    let clean = source.replace("asm volatile(REG(global, timer) : \"=l\"(t));", "t = 1;");
    assert!(compile_here(&CompileRequest::ptx(clean, &["k"])).is_ok());
}
