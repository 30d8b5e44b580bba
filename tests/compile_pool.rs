//! The compile pool end to end: real `worker --role compile` children (this binary), NVRTC in
//! the child, a hanging compile killed at its deadline, and a worker without NVRTC answering with
//! the install hint instead of dying.

mod common;

use std::time::{Duration, Instant};

use kevin::compile::{
    spawn_compile_pool, CompileError, CompileRequest, ModuleImage, DEFAULT_COMPILE_TIMEOUT,
};
use kevin::worker::WorkerFailure;

fn main() {
    common::main(&[
        ("compiles_in_a_worker", compiles_in_a_worker),
        (
            "hanging_compile_is_killed_and_the_next_succeeds",
            hanging_compile_is_killed_and_the_next_succeeds,
        ),
        (
            "worker_without_nvrtc_reports_the_hint",
            worker_without_nvrtc_reports_the_hint,
        ),
    ]);
}

const KERNEL: &str = r#"
extern "C" __global__ void relu(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.0f);
}
"#;

/// Exponentially many template instantiations: NVRTC runs (and allocates) until it is killed.
const TEMPLATE_BOMB: &str = r#"
template <int N, int M> struct Bomb {
    static constexpr long long v = Bomb<N - 1, 2 * M>::v + Bomb<N - 1, 2 * M + 1>::v;
};
template <int M> struct Bomb<0, M> { static constexpr long long v = M; };
extern "C" __global__ void k(long long* out) { *out = Bomb<40, 1>::v; }
"#;

fn nvrtc_present() -> bool {
    kevin::compile::locate_nvrtc().is_ok()
}

fn skip_unless_nvrtc(test: &str) -> bool {
    if nvrtc_present() {
        return false;
    }
    assert!(
        std::env::var("KEVIN_REQUIRE_NVRTC").as_deref() != Ok("1"),
        "{test}: KEVIN_REQUIRE_NVRTC=1 but NVRTC is missing: {}",
        kevin::compile::INSTALL_HINT
    );
    eprintln!(
        "skipping {test}: NVRTC not found ({})",
        kevin::compile::INSTALL_HINT
    );
    true
}

fn compiles_in_a_worker() {
    if skip_unless_nvrtc("compiles_in_a_worker") {
        return;
    }
    let pool = spawn_compile_pool(common::self_as_worker("compile"), 2).unwrap();
    assert_eq!(pool.config().request_timeout, DEFAULT_COMPILE_TIMEOUT);
    let out = pool
        .request(&CompileRequest::ptx(KERNEL, &["relu"]))
        .expect("worker answered")
        .expect("kernel compiled");
    let ModuleImage::Ptx(ptx) = out.image else {
        panic!("expected PTX")
    };
    assert!(ptx.contains(".entry relu"));
    let err = pool
        .request(&CompileRequest::ptx("__global__ void k() { oops }", &["k"]))
        .expect("worker answered");
    assert!(matches!(err, Err(CompileError::Source { .. })), "{err:?}");
}

fn hanging_compile_is_killed_and_the_next_succeeds() {
    if skip_unless_nvrtc("hanging_compile_is_killed_and_the_next_succeeds") {
        return;
    }
    let pool = spawn_compile_pool(common::self_as_worker("compile"), 1).unwrap();
    let limit = Duration::from_millis(1500);
    let start = Instant::now();
    let result = pool.request_with_timeout(&CompileRequest::ptx(TEMPLATE_BOMB, &["k"]), limit);
    match result {
        Err(WorkerFailure::Timeout { .. }) => {}
        // NVRTC may also give up on its own (an instantiation limit): fine, as long as it
        // answered in time.
        Ok(Err(CompileError::Source { .. })) => eprintln!("note: NVRTC rejected the bomb itself"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let next = pool
        .request(&CompileRequest::ptx(KERNEL, &["relu"]))
        .unwrap();
    assert!(next.is_ok(), "{next:?}");
}

fn worker_without_nvrtc_reports_the_hint() {
    let mut command = common::self_as_worker("compile");
    command.env.push((
        "KEVIN_NVRTC_LIB".into(),
        "/nonexistent/libnvrtc.so.12".into(),
    ));
    let pool = spawn_compile_pool(command, 1).unwrap();
    match pool.request(&CompileRequest::ptx(KERNEL, &["relu"])) {
        Ok(Err(CompileError::Unavailable { reason })) => {
            assert!(
                reason.contains("pip install nvidia-cuda-nvrtc-cu12"),
                "{reason}"
            )
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}
