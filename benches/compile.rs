//! Compile latency and compile-pool throughput over the reference solutions in
//! tasks/solutions/*.cu (or `--dir DIR`, e.g. benches/data with its hand-picked kernels).
//!
//! `cargo bench -p kevin --bench compile [-- --reps N --rounds R --opts A,B --dir DIR --out FILE]`
//!
//! Per kernel: one warm-up compile, then `reps` timed compiles in this process (PTX for
//! compute_90, and CUBIN for sm_90); median and p90. Then the pool: every kernel `rounds` times
//! through a CompilePool of 1 and of 2 workers (this binary, `worker --role compile`), from as
//! many client threads as workers; compiles per second. Writes a Markdown report.
//! Each file names its kernels on its first line: `// kernels: a, b`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use kevin::compile::{
    compile, find_cuda_include_dirs, locate_nvrtc, spawn_compile_pool, CompileRequest, OutputKind,
};
use kevin::worker::WorkerCommand;

struct Kernel {
    file: String,
    request: CompileRequest,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        std::process::exit(kevin::roles::child_main_from_args(&args[1..]));
    }
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let reps: usize = flag("--reps").and_then(|v| v.parse().ok()).unwrap_or(10);
    let rounds: usize = flag("--rounds").and_then(|v| v.parse().ok()).unwrap_or(3);
    // Extra NVRTC options to compare (for example `--opts --pch`), comma-separated.
    let extra: Vec<String> = flag("--opts")
        .map(|v| v.split(',').map(String::from).collect())
        .unwrap_or_default();

    let nvrtc = match locate_nvrtc() {
        Ok(lib) => lib,
        Err(e) => {
            eprintln!("compile bench: {e}");
            std::process::exit(1);
        }
    };
    let include_dirs = find_cuda_include_dirs();
    // Default: every reference solution of the task suite (what the policy's candidates look
    // like); `--dir benches/data` for the hand-picked set.
    let data = flag("--dir")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tasks/solutions"));
    let mut kernels = load_kernels(&data);
    if kernels.is_empty() {
        eprintln!("compile bench: no kernels in {}", data.display());
        std::process::exit(1);
    }
    for k in &mut kernels {
        k.request.extra_options = extra.clone();
    }

    let mut report = String::new();
    let date = kevin::clock::utc_date();
    report += &format!("# Compile benchmark, {date}\n\n");
    report +=
        &format!(
        "- command: `LD_LIBRARY_PATH=<site-packages>/nvidia/cuda_nvrtc/lib cargo bench -p kevin \
         --bench compile -- --reps {reps} --rounds {rounds}{}{}`\n",
        if extra.is_empty() { String::new() } else { format!(" --opts {}", extra.join(",")) },
        flag("--dir").map(|d| format!(" --dir {d}")).unwrap_or_default()
    );
    report += &format!(
        "- kernels: {} files from {}\n",
        kernels.len(),
        data.display()
    );
    report += &format!(
        "- machine: {} CPU cores available (shared with other jobs), no GPU\n",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    report += &format!(
        "- NVRTC {}.{} ({}), include dirs {:?}\n",
        nvrtc.version.0, nvrtc.version.1, nvrtc.loaded_from, include_dirs
    );
    report += "- options: --gpu-architecture=compute_90 (PTX) or sm_90 (CUBIN), --std=c++17, \
               --device-as-default-execution-space, -minimal (NVRTC >= 12.4), no fast math\n";
    report += &format!("- extra options: {extra:?}\n\n");

    report += "## Latency per kernel, in process (ms; one warm-up, then ";
    report += &format!("{reps} runs)\n\n");
    report += "| kernel | PTX median | PTX p90 | PTX CPU median | CUBIN median | CUBIN p90 | CUBIN CPU median |\n\
               |---|---:|---:|---:|---:|---:|---:|\n";
    let (mut ptx_medians, mut ptx_cpu_medians, mut cubin_medians) =
        (Vec::new(), Vec::new(), Vec::new());
    for k in &kernels {
        let ptx = time_compiles(&k.request, &include_dirs, reps);
        let cubin_req = CompileRequest {
            output: OutputKind::Cubin,
            ..k.request.clone()
        };
        let cubin = time_compiles(&cubin_req, &include_dirs, reps);
        let line = format!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
            k.file,
            percentile(&ptx.wall, 0.5),
            percentile(&ptx.wall, 0.9),
            percentile(&ptx.cpu, 0.5),
            percentile(&cubin.wall, 0.5),
            percentile(&cubin.wall, 0.9),
            percentile(&cubin.cpu, 0.5),
        );
        print!("{line}");
        report += &line;
        ptx_medians.push(percentile(&ptx.wall, 0.5));
        ptx_cpu_medians.push(percentile(&ptx.cpu, 0.5));
        cubin_medians.push(percentile(&cubin.wall, 0.5));
    }
    report += &format!(
        "\nMedian over kernels of the median: PTX {:.1} ms wall ({:.1} ms CPU), CUBIN {:.1} ms wall \
         (target <= 50 ms).\n\n",
        percentile(&ptx_medians, 0.5),
        percentile(&ptx_cpu_medians, 0.5),
        percentile(&cubin_medians, 0.5)
    );

    report += &format!(
        "## Pool throughput ({} kernels x {rounds} rounds, PTX, client threads = workers)\n\n",
        kernels.len()
    );
    report += "| workers | compiles | wall (s) | compiles/s | spawn of the pool (ms) |\n|---:|---:|---:|---:|---:|\n";
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("compile-bench"));
    for workers in [1, 2] {
        let spawn_start = Instant::now();
        let pool = match spawn_compile_pool(WorkerCommand::kevin_role(&exe, "compile"), workers) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("compile bench: pool failed to start: {e}");
                std::process::exit(1);
            }
        };
        let spawn_ms = spawn_start.elapsed().as_secs_f64() * 1e3;
        // Warm each worker (NVRTC loads lazily on the first compile).
        for _ in 0..workers {
            let _ = pool.request(&kernels[0].request);
        }
        let jobs: Vec<&CompileRequest> = (0..rounds)
            .flat_map(|_| kernels.iter().map(|k| &k.request))
            .collect();
        let start = Instant::now();
        let failures = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for t in 0..workers {
                let (pool, jobs, failures) = (&pool, &jobs, &failures);
                s.spawn(move || {
                    for job in jobs.iter().skip(t).step_by(workers) {
                        if !matches!(pool.request(job), Ok(Ok(_))) {
                            failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let wall = start.elapsed();
        let line = format!(
            "| {workers} | {} | {:.2} | {:.1} | {spawn_ms:.0} |\n",
            jobs.len(),
            wall.as_secs_f64(),
            jobs.len() as f64 / wall.as_secs_f64()
        );
        print!("{line}");
        report += &line;
        let failed = failures.into_inner();
        if failed > 0 {
            report += &format!("\n{failed} compiles failed in the pool run above.\n");
        }
    }

    let out = flag("--out").map(PathBuf::from).unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("benches/results/compile-{date}.md"))
    });
    match std::fs::write(&out, &report) {
        Ok(()) => println!("wrote {}", out.display()),
        Err(e) => eprintln!("could not write {}: {e}", out.display()),
    }
}

fn load_kernels(dir: &Path) -> Vec<Kernel> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    paths.retain(|p| p.extension().is_some_and(|e| e == "cu"));
    paths.sort();
    paths
        .into_iter()
        .filter_map(|path| {
            let source = std::fs::read_to_string(&path).ok()?;
            // Kernel names: a `// kernels: a, b` first line (benches/data), else the launch plan
            // (reference solutions).
            let mut names: Vec<String> = match source.lines().next()?.strip_prefix("// kernels:") {
                Some(list) => list.split(',').map(|n| n.trim().to_string()).collect(),
                None => kevin::candidate::plan::parse_plan(&source)
                    .ok()?
                    .launches
                    .into_iter()
                    .map(|l| l.kernel)
                    .collect(),
            };
            names.sort();
            names.dedup();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            Some(Kernel {
                file: path.file_name()?.to_string_lossy().into_owned(),
                request: CompileRequest::ptx(source.clone(), &names),
            })
        })
        .collect()
}

/// Wall and CPU milliseconds of `reps` compiles after one warm-up; exits on a failed compile.
/// CPU time is this thread's (NVRTC compiles on the calling thread): on a shared machine it is the
/// steadier figure, wall time the one a caller waits.
fn time_compiles(req: &CompileRequest, include_dirs: &[PathBuf], reps: usize) -> Timings {
    let mut t = Timings::default();
    for i in 0..=reps {
        let (start, cpu_start) = (Instant::now(), thread_cpu_ms());
        if let Err(e) = compile(req, include_dirs) {
            eprintln!("compile bench: {:?} failed: {e}", req.kernel_names);
            std::process::exit(1);
        }
        if i > 0 {
            t.wall.push(start.elapsed().as_secs_f64() * 1e3);
            t.cpu.push(thread_cpu_ms() - cpu_start);
        }
    }
    t
}

#[derive(Default)]
struct Timings {
    wall: Vec<f64>,
    cpu: Vec<f64>,
}

fn thread_cpu_ms() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; CLOCK_THREAD_CPUTIME_ID is always available on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

fn percentile(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}
