//! The CPU executor's sandbox, layer by layer, against modules an attacker would write: each
//! test runs a real compiled module in a real executor process (this test binary doubles as the
//! `cpu-exec` worker) and checks what the module could and could not do.
//!
//! The hostile kernels reach the operating system the way the module gate cannot see: they copy
//! a `syscall; ret` stub into an executable page (`mmap` is on the import allowlist, the fiber
//! stacks need it) and call it. So each layer below the gate is tested on its own: with the
//! seccomp filter on, any such call kills the executor; with the filter off (a test-only switch),
//! the layers beneath must still hold: no file system (chroot into an empty directory), nobody's
//! uid when started as root, no signals to the worker, no network, no clock.

mod common;

use std::path::{Path, PathBuf};

use kevin::candidate::Limits;
use kevin::cpu::executor::SandboxedExecutor;
use kevin::cpu::CpuCompileError;
use kevin::ops::Dtype;
use kevin::tasks::{Preset, TaskSuite};
use kevin::verify::correctness::Executor;
use kevin::verify::ExecFailure;

fn main() {
    common::main(&[
        (
            "the_gate_refuses_libc_imports_and_load_time_code",
            the_gate_refuses_libc_imports_and_load_time_code,
        ),
        (
            "a_system_call_kills_the_executor_and_not_the_worker",
            a_system_call_kills_the_executor_and_not_the_worker,
        ),
        (
            "beneath_the_filter_files_users_signals_and_network_are_out_of_reach",
            beneath_the_filter_files_users_signals_and_network_are_out_of_reach,
        ),
        ("rdtsc_faults_in_the_executor", rdtsc_faults_in_the_executor),
        (
            "faults_in_many_threads_at_once_are_reported",
            faults_in_many_threads_at_once_are_reported,
        ),
        (
            "a_forged_reply_cannot_pass_garbage",
            a_forged_reply_cannot_pass_garbage,
        ),
        (
            "a_thread_left_running_cannot_finish_the_output_later",
            a_thread_left_running_cannot_finish_the_output_later,
        ),
        (
            "scratch_overflow_is_tampering",
            scratch_overflow_is_tampering,
        ),
    ]);
}

fn suite() -> TaskSuite {
    TaskSuite::load(Path::new(env!("CARGO_MANIFEST_DIR")).join("tasks")).expect("tasks/ loads")
}

/// Compiles `source` for the `relu` task (small preset) without the static source rules, so the
/// module gate and the sandbox are what is tested: the launch plan is validated against a benign
/// twin (the same `// kevin:` lines and kernel signature, an empty body).
fn build(
    source: &str,
    dir: &Path,
) -> Result<(PathBuf, kevin::candidate::ResolvedPlan), CpuCompileError> {
    let suite = suite();
    let task = suite.get("relu").expect("relu task");
    let plan = kevin::candidate::plan::parse_plan(source).expect("plan parses");
    let mut twin: String = source
        .lines()
        .filter(|l| l.starts_with("// kevin:"))
        .map(|l| format!("{l}\n"))
        .collect();
    twin.push_str(if source.contains("float* S") {
        "__global__ void relu(const float* X, float* Y, float* S, long long n) {}\n"
    } else {
        "__global__ void relu(const float* X, float* Y, long long n) {}\n"
    });
    let cand = kevin::candidate::Candidate {
        source: twin,
        summary: String::new(),
        plan,
    };
    let plan = kevin::candidate::validate(
        &cand,
        &task.candidate_signature(Preset::Small),
        &Limits::default(),
    )
    .expect("plan fits relu");
    let so = kevin::cpu::compile(source, &plan, dir)?;
    Ok((so, plan))
}

fn tmp(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("kevin-sandbox-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The `syscall(nr, a, b, c)` stub every hostile kernel below uses, and a kernel body around it.
const STUB: &str = r#"
typedef long (*sys_fn)(long, long, long, long);
__device__ sys_fn make_sys() {
    static const unsigned char code[] = {0x48,0x89,0xf8, 0x48,0x89,0xf7, 0x48,0x89,0xd6, 0x48,0x89,0xca, 0x0f,0x05, 0xc3};
    void* page = mmap(0, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memcpy(page, code, sizeof code);
    return (sys_fn)page;
}
"#;

fn hostile(body: &str) -> String {
    format!(
        "// kevin: launch relu grid=(1) block=(1) args=(X, Y, M*N)\n{STUB}\n\
         __global__ void relu(const float* X, float* Y, long long n) {{\n    sys_fn sys = make_sys();\n{body}\n}}\n"
    )
}

/// The layers an executor reports on this machine (a probe module's), e.g. to skip what the
/// kernel does not offer (no seccomp, no unprivileged user namespaces) instead of failing.
fn layers() -> Vec<String> {
    let dir = tmp("probe");
    let src = "// kevin: launch relu grid=(1) block=(1) args=(X, Y, M*N)\n\
               __global__ void relu(const float* X, float* Y, long long n) { }\n";
    let (so, plan) = build(src, &dir).expect("compiles");
    let exec = SandboxedExecutor::start(&so, plan, 1, true).expect("starts");
    let layers = exec.layers().to_vec();
    let _ = std::fs::remove_dir_all(&dir);
    println!("executor layers on this machine: {layers:#?}");
    layers
}

fn layer_on(layers: &[String], prefix: &str) -> bool {
    layers
        .iter()
        .any(|l| l.starts_with(prefix) && !l.contains(": off") && !l.contains("chroot off"))
}

/// Runs `source` once on the relu task's tensors (Y NaN-filled); Y's values, or the failure.
fn run(name: &str, source: &str, seccomp: bool) -> Result<Vec<f64>, ExecFailure> {
    let dir = tmp(name);
    let (so, plan) = build(source, &dir).expect("compiles");
    let mut exec = SandboxedExecutor::start(&so, plan, 1, seccomp)?;
    let n = 33 * 65;
    let x = exec.alloc("X", Dtype::F32, n).expect("alloc X");
    let mut y = exec.alloc("Y", Dtype::F32, n).expect("alloc Y");
    y.fill_nan();
    let mut tensors = vec![x, y];
    let out = exec.run(&mut tensors).map(|()| tensors[1].read_f64());
    let _ = std::fs::remove_dir_all(&dir);
    out
}

fn the_gate_refuses_libc_imports_and_load_time_code() {
    let cases = [
        (
            "open",
            "extern \"C\" int open(const char*, int, ...);\n",
            "Y[0] = open(\"/etc/hostname\", 0);",
            "`open`",
        ),
        (
            "environ",
            "extern \"C\" char** environ;\n",
            "Y[0] = environ[0][0];",
            "`environ`",
        ),
        (
            "ctor",
            "static volatile int hit;\n__attribute__((constructor)) void early() { hit = 1; }\n",
            "Y[0] = X[0];",
            "static constructors",
        ),
        (
            "dtor",
            "static volatile int hit;\n__attribute__((destructor)) void late() { hit = 1; }\n",
            "Y[0] = X[0];",
            "destructors",
        ),
        (
            "kill",
            "extern \"C\" int kill(int, int);\n",
            "Y[0] = kill(1, 0);",
            "`kill`",
        ),
    ];
    for (name, decl, body, want) in cases {
        let source = format!(
            "// kevin: launch relu grid=(1) block=(1) args=(X, Y, M*N)\n{decl}\
             __global__ void relu(const float* X, float* Y, long long n) {{ {body} }}\n"
        );
        let dir = tmp(name);
        match build(&source, &dir) {
            Err(CpuCompileError::Source { log }) => {
                assert!(log.contains(want), "{name}: {log}");
            }
            other => panic!("{name}: expected the gate to refuse, got {other:?}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn a_system_call_kills_the_executor_and_not_the_worker() {
    if !layer_on(&layers(), "seccomp") {
        println!("skipped: this kernel offers no seccomp filter (the executor says so)");
        return;
    }
    // getpid is allowed; getuid (102) and openat (257) are not.
    let got = run(
        "getpid",
        &hostile("    Y[0] = (float)(sys(39, 0, 0, 0) > 0);"),
        true,
    )
    .expect("an allowed system call runs");
    assert_eq!(got[0], 1.0);
    for (name, nr) in [
        ("getuid", 102),
        ("openat", 257),
        ("socket", 41),
        ("fork", 57),
    ] {
        let src = hostile(&format!("    Y[0] = (float)sys({nr}, 0, 0, 0);"));
        match run(name, &src, true) {
            Err(ExecFailure::Crash(reason)) => {
                // The handler names the call the filter trapped.
                assert!(
                    reason.contains(&format!("system call {nr} ")),
                    "{name}: {reason}"
                )
            }
            other => panic!("{name}: expected a crash by SIGSYS, got {other:?}"),
        }
    }
}

fn beneath_the_filter_files_users_signals_and_network_are_out_of_reach() {
    // Y[0] = openat(AT_FDCWD, "/etc/hostname", O_RDONLY): no descriptor can be made (and there is
    //        no such file under the empty root).
    // Y[1] = getuid(): nobody when the test runs as root.
    // Y[2] = kill(worker pid, 0): not permitted (as nobody) or no such process (as anyone).
    // Y[3] = socket(AF_INET, SOCK_STREAM) then connect to 127.0.0.1:22: the new network namespace
    //        has no configured loopback, so it cannot reach the host's.
    // Y[4] = openat(AT_FDCWD, "/tmp/kevin-x", O_CREAT|O_WRONLY): no file can be made.
    // Y[5] = stat("/etc/hostname"): no such file (the chroot, without needing
    //        a descriptor).
    // Y[6] = mkdir("/x"): the empty root is not writable.
    let ppid = std::process::id();
    let body = format!(
        r#"    const char path[] = "/etc/hostname";
    Y[0] = (float)sys(257, -100, (long)path, 0);
    Y[1] = (float)sys(102, 0, 0, 0);
    Y[2] = (float)sys(62, {ppid}, 0, 0);
    long s = sys(41, 2, 1, 0);
    unsigned char addr[16] = {{2, 0, 0, 22, 127, 0, 0, 1}};
    Y[3] = s < 0 ? (float)s : (float)sys(42, s, (long)addr, 16);
    const char made[] = "/tmp/kevin-x";
    Y[4] = (float)sys(257, -100, (long)made, 0101);
    static unsigned char st[256];
    Y[5] = (float)sys(4, (long)path, (long)st, 0);
    const char dir[] = "/x";
    Y[6] = (float)sys(83, (long)dir, 0755, 0);"#
    );
    let got = run("layers", &hostile(&body), false).expect("runs without the filter");
    let got = &got[..7];
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let layers = layers();
    assert!(got[0] < 0.0, "open of a host file: {got:?}");
    if layer_on(&layers, "file system") {
        assert_eq!(
            got[5],
            -(libc::ENOENT as f64),
            "stat of a host file: {got:?}"
        );
    }
    if root {
        assert_eq!(got[1], 65534.0, "uid: {got:?}");
        assert_eq!(got[2], -(libc::EPERM as f64), "kill: {got:?}");
    }
    if layer_on(&layers, "namespaces") {
        assert!(
            got[3] < 0.0,
            "connect to the host's loopback must fail: {got:?}"
        );
    }
    assert!(got[4] < 0.0, "creating a file must fail: {got:?}");
    if layer_on(&layers, "file system") {
        assert!(got[6] < 0.0, "creating a directory must fail: {got:?}");
    }
}

fn rdtsc_faults_in_the_executor() {
    let src = "// kevin: launch relu grid=(1) block=(1) args=(X, Y, M*N)\n\
               __global__ void relu(const float* X, float* Y, long long n) { Y[0] = (float)__builtin_ia32_rdtsc(); }\n";
    match run("rdtsc", src, true) {
        Err(ExecFailure::Crash(reason)) => assert!(reason.contains("SIGSEGV"), "{reason}"),
        other => panic!("rdtsc must fault, got {other:?}"),
    }
}

/// Every thread of every block faults at once (a misaligned float4 access, as
/// `relu.misaligned` does), on several executor threads: the crash must still carry the fault
/// handler's line (the signal, the address and what it means), not the bare signal. A second
/// thread's fault used to end the process while the first one's line was being written.
fn faults_in_many_threads_at_once_are_reported() {
    let src = "// kevin: launch relu grid=(cdiv(M*N,1024)) block=(256) args=(X, Y, M*N)\n\
               __global__ void relu(const float* X, float* Y, long long n) {\n\
                   long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n\
                   if (i < (n - 1) / 4) reinterpret_cast<float4*>(Y + 1)[i] = reinterpret_cast<const float4*>(X + 1)[i];\n\
               }\n";
    let dir = tmp("manyfaults");
    let (so, plan) = build(src, &dir).expect("compiles");
    for attempt in 0..12 {
        let mut exec = SandboxedExecutor::start(&so, plan.clone(), 8, true).expect("starts");
        let n = 33 * 65;
        let x = exec.alloc("X", Dtype::F32, n).expect("alloc X");
        let y = exec.alloc("Y", Dtype::F32, n).expect("alloc Y");
        match exec.run(&mut vec![x, y]) {
            Err(ExecFailure::Crash(reason)) => assert!(
                reason.contains("at address 0x") && reason.contains("misaligned"),
                "attempt {attempt}: the fault's line is missing: {reason}"
            ),
            other => panic!("attempt {attempt}: a misaligned float4 must crash, got {other:?}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn a_forged_reply_cannot_pass_garbage() {
    // The kernel writes a well-formed `Done` frame onto the executor's reply pipe (fd 1) with a
    // raw write, then returns without computing: the worker takes the forged reply as the end of
    // the run, and the output is the fill, which the protocol judges wrong. Here the executor's
    // own reply follows and is read as the next run's, which is what `run` reports for run two.
    // Encode a Done { failure: None } frame exactly as the protocol does.
    let frame = kevin::worker::protocol::encode_frame(
        &kevin::cpu::sandbox::Reply::Done { failure: None },
        kevin::cpu::sandbox::MAX_FRAME,
    )
    .expect("encodes");
    let bytes: Vec<String> = frame.iter().map(|b| b.to_string()).collect();
    let body = format!(
        "    static const unsigned char f[] = {{{}}};\n    sys(1, 1, (long)f, {});",
        bytes.join(","),
        frame.len()
    );
    let dir = tmp("forge");
    let (so, plan) = build(&hostile(&body), &dir).expect("compiles");
    let mut exec = SandboxedExecutor::start(&so, plan, 1, true).expect("starts");
    let n = 33 * 65;
    let x = exec.alloc("X", Dtype::F32, n).expect("alloc");
    let mut y = exec.alloc("Y", Dtype::F32, n).expect("alloc");
    y.fill_nan();
    let mut tensors = vec![x, y];
    // Run one: ends at the forged frame or the real one; Y is unwritten either way.
    let first = exec.run(&mut tensors);
    assert!(first.is_ok(), "{first:?}");
    assert!(
        tensors[1].read_f64().iter().all(|v| v.is_nan()),
        "Y must still be the fill"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn a_thread_left_running_cannot_finish_the_output_later() {
    // The kernel starts a thread that writes the answer 50 ms later and returns at once. The
    // worker freezes the executor when the run's reply arrives, so the output it reads, however
    // long after, is what the kernel had written by then: the fill.
    let src = "// kevin: launch relu grid=(1) block=(1) args=(X, Y, M*N)\n\
        static void late(float* Y, const float* X, long long n) { usleep_(50000); for (long long i = 0; i < n; ++i) Y[i] = X[i] > 0 ? X[i] : 0; }\n\
        __global__ void relu(const float* X, float* Y, long long n) { new std::thread(late, Y, X, n); }\n";
    // usleep is not on the allowlist; spin on a volatile counter instead.
    let src = src.replace(
        "usleep_(50000);",
        "for (volatile long k = 0; k < 50000000; k = k + 1) {}",
    );
    let dir = tmp("late");
    let (so, plan) = build(&src, &dir).expect("compiles");
    let mut exec = SandboxedExecutor::start(&so, plan, 1, true).expect("starts");
    let n = 33 * 65;
    let mut x = exec.alloc("X", Dtype::F32, n).expect("alloc");
    x.write_f64(&vec![1.0; n]).expect("write");
    let mut y = exec.alloc("Y", Dtype::F32, n).expect("alloc");
    y.fill_nan();
    let mut tensors = vec![x, y];
    exec.run(&mut tensors).expect("runs");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        tensors[1].read_f64().iter().all(|v| v.is_nan()),
        "a frozen executor wrote the output after its run ended"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn scratch_overflow_is_tampering() {
    let src = "// kevin: scratch S f32[M*N]\n\
        // kevin: launch relu grid=(1) block=(1) args=(X, Y, S, M*N)\n\
        __global__ void relu(const float* X, float* Y, float* S, long long n) { for (long long i = 0; i < n; ++i) Y[i] = X[i] > 0 ? X[i] : 0; S[n] = 1.0f; }\n";
    let dir = tmp("scratch");
    let (so, plan) = build(src, &dir).expect("compiles");
    let mut exec = SandboxedExecutor::start(&so, plan, 1, true).expect("starts");
    let n = 33 * 65;
    let x = exec.alloc("X", Dtype::F32, n).expect("alloc");
    let y = exec.alloc("Y", Dtype::F32, n).expect("alloc");
    let mut tensors = vec![x, y];
    assert_eq!(exec.tampering(), None);
    exec.run(&mut tensors).expect("runs");
    let t = exec.tampering().expect("the overflow of S is seen");
    assert!(t.contains("scratch buffer S"), "{t}");
    let _ = std::fs::remove_dir_all(&dir);
}
