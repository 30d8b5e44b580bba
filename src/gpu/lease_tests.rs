//! The lease across threads (each with its own handle, as the generator, the learner and an
//! environment have) and across processes (a forked child that holds the lease, then dies).

use super::*;
use std::sync::mpsc;
use std::thread;

/// A fresh folder for one test's lock files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kevin-lease-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const QUIET: Duration = Duration::from_millis(150);

/// Takes `hold` on a new handle of `lock` in a thread; the thread sends its tag once it holds,
/// keeps it for `keep`, then releases, and returns how long taking waited and when it held.
/// Returns once the thread is about to take, so a loaded machine that starts it late does not
/// shorten the wait a test measures.
fn holder(
    lock: &Path,
    hold: Hold,
    keep: Duration,
    tag: &'static str,
    tx: mpsc::Sender<&'static str>,
) -> thread::JoinHandle<(Duration, Instant)> {
    let lease = GpuLease::open(lock, "test").unwrap();
    let (ready_tx, ready_rx) = mpsc::channel();
    let handle = thread::spawn(move || {
        ready_tx.send(()).unwrap();
        let held = lease.take(hold).unwrap();
        let at = Instant::now();
        tx.send(tag).unwrap();
        thread::sleep(keep);
        (held.waited(), at)
    });
    ready_rx.recv().unwrap();
    handle
}

#[test]
fn a_timing_run_excludes_steps_and_steps_share() {
    let lock = scratch("excl").join("gpu-test.lock");
    let timer = GpuLease::open(&lock, "test").unwrap();
    let held = timer.take(Hold::Timing).unwrap();
    let (tx, rx) = mpsc::channel();
    let step = holder(&lock, Hold::Step, Duration::ZERO, "step", tx.clone());
    assert!(
        rx.recv_timeout(QUIET).is_err(),
        "a step started during a timing run"
    );
    let released = Instant::now();
    drop(held);
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok("step"));
    // It held only after the release, and its wait was counted.
    let (waited, at) = step.join().unwrap();
    assert!(at >= released && waited > Duration::ZERO, "{waited:?}");

    // Two steps at once: both hold, neither waits for the other.
    let a = GpuLease::open(&lock, "test").unwrap();
    let b = GpuLease::open(&lock, "test").unwrap();
    let ha = a.take(Hold::Step).unwrap();
    let hb = b.take(Hold::Step).unwrap();
    assert!(hb.waited() < QUIET);
    // And a timing run waits for both.
    let t = holder(&lock, Hold::Timing, Duration::ZERO, "timing", tx);
    assert!(rx.recv_timeout(QUIET).is_err(), "timed while steps ran");
    drop(ha);
    assert!(
        rx.recv_timeout(QUIET).is_err(),
        "timed while a step still ran"
    );
    drop(hb);
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok("timing"));
    t.join().unwrap();
}

#[test]
fn a_waiting_timing_run_goes_before_later_steps() {
    let lock = scratch("pref").join("gpu-test.lock");
    let (tx, rx) = mpsc::channel();
    let first = GpuLease::open(&lock, "test").unwrap();
    let step = first.take(Hold::Step).unwrap();
    let timing = holder(&lock, Hold::Timing, QUIET, "timing", tx.clone());
    thread::sleep(QUIET); // the timing run now waits, holding the turnstile
    let later = holder(&lock, Hold::Step, Duration::ZERO, "later step", tx);
    assert!(rx.recv_timeout(QUIET).is_err(), "someone ran beside a step");
    let released = Instant::now();
    drop(step);
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok("timing"));
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok("later step"));
    let (timing_waited, timing_at) = timing.join().unwrap();
    assert!(
        timing_at >= released && timing_waited > Duration::ZERO,
        "{timing_waited:?}"
    );
    // The later step waited for the whole timing run it queued behind (held for QUIET).
    let (later_waited, later_at) = later.join().unwrap();
    assert!(later_at >= timing_at + QUIET, "{later_waited:?}");
}

#[test]
fn timing_runs_exclude_each_other_and_a_stream_of_steps_cannot_starve_them() {
    let lock = scratch("starve").join("gpu-test.lock");
    let stop = Arc::new(AtomicBool::new(false));
    // Four threads that take steps back to back, each step 5 ms: shared holds always overlap.
    let steppers: Vec<_> = (0..4)
        .map(|_| {
            let lease = GpuLease::open(&lock, "test").unwrap();
            let stop = stop.clone();
            thread::spawn(move || {
                let mut steps = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let _held = lease.take(Hold::Step).unwrap();
                    thread::sleep(Duration::from_millis(5));
                    steps += 1;
                }
                steps
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(50));
    let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let timers: Vec<_> = (0..2)
        .map(|_| {
            let lease = GpuLease::open(&lock, "test").unwrap();
            let inside = inside.clone();
            thread::spawn(move || {
                let mut worst = Duration::ZERO;
                for _ in 0..5 {
                    let held = lease.take(Hold::Timing).unwrap();
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two timing runs");
                    thread::sleep(Duration::from_millis(10));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    worst = worst.max(held.waited());
                }
                worst
            })
        })
        .collect();
    for t in timers {
        // At worst: the steps in progress (5 ms) and the other timer's run (10 ms), with slack
        // for a loaded test machine; a starved timer would wait for as long as steps are taken.
        let worst = t.join().unwrap();
        assert!(
            worst < Duration::from_secs(2),
            "a timing run waited {worst:?}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for s in steppers {
        assert!(s.join().unwrap() > 0);
    }
}

#[test]
fn one_handle_holds_once() {
    let lock = scratch("once").join("gpu-test.lock");
    let lease = GpuLease::open(&lock, "test").unwrap();
    let held = lease.take(Hold::Step).unwrap();
    assert!(matches!(
        lease.take(Hold::Timing),
        Err(LeaseError::AlreadyHeld(_))
    ));
    assert!(matches!(
        lease.take(Hold::Step),
        Err(LeaseError::AlreadyHeld(_))
    ));
    drop(held);
    let held = lease.take(Hold::Timing).unwrap();
    assert_eq!(held.hold(), Hold::Timing);
}

/// A child process (forked; it only makes async-signal-safe calls) holds the lease for timing;
/// a step here waits for it, and gets the lease once the child is killed: the kernel releases a
/// dead holder's locks.
#[test]
fn a_holder_in_another_process_excludes_and_its_death_releases() {
    use std::ffi::CString;
    let lock = scratch("fork").join("gpu-test.lock");
    // Create both files here, so the child only opens them.
    drop(GpuLease::open(&lock, "test").unwrap());
    let main = CString::new(lock.as_os_str().to_str().unwrap()).unwrap();
    let turn = CString::new(
        lock.with_extension("turnstile")
            .to_str()
            .unwrap()
            .to_string(),
    )
    .unwrap();
    let mut pipe = [0i32; 2];
    // SAFETY: a pipe into a local array.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    // SAFETY: the child makes only async-signal-safe calls (open, flock, write, pause, _exit).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        unsafe {
            let t = libc::open(turn.as_ptr(), libc::O_RDONLY);
            let m = libc::open(main.as_ptr(), libc::O_RDONLY);
            if t < 0 || m < 0 || libc::flock(t, libc::LOCK_EX) != 0 {
                libc::_exit(2);
            }
            if libc::flock(m, libc::LOCK_EX) != 0 {
                libc::_exit(3);
            }
            libc::write(pipe[1], b"x".as_ptr().cast(), 1);
            loop {
                libc::pause();
            }
        }
    }
    // SAFETY: closing our copy of the write end, then reading one byte into a local.
    unsafe { libc::close(pipe[1]) };
    let mut byte = 0u8;
    let n = unsafe { libc::read(pipe[0], (&mut byte as *mut u8).cast(), 1) };
    assert_eq!(n, 1, "the child did not take the lease");
    let (tx, rx) = mpsc::channel();
    let step = holder(&lock, Hold::Step, Duration::ZERO, "step", tx);
    assert!(
        rx.recv_timeout(QUIET).is_err(),
        "a step ran while another process timed"
    );
    // SAFETY: killing and reaping our own child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
        libc::close(pipe[0]);
    }
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok("step"));
    step.join().unwrap();
}

#[test]
fn lock_files_are_not_followed_through_links() {
    let dir = scratch("link");
    let target = dir.join("elsewhere");
    std::fs::write(&target, b"").unwrap();
    std::os::unix::fs::symlink(&target, dir.join("gpu-test.lock")).unwrap();
    let err = GpuLease::open(&dir.join("gpu-test.lock"), "test").unwrap_err();
    assert!(err.to_string().contains("gpu-test.lock"), "{err}");
}

#[test]
fn the_lock_folder_is_shared_and_named_by_the_environment() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("dir").join("locks");
    std::env::set_var(LOCK_DIR_ENV, &dir);
    let got = lock_dir();
    std::env::remove_var(LOCK_DIR_ENV);
    assert_eq!(got.unwrap(), dir);
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o1777);
    // A file where the folder should be is named in the error.
    let file = scratch("dir2").join("notadir");
    std::fs::write(&file, b"").unwrap();
    std::env::set_var(LOCK_DIR_ENV, &file);
    let err = lock_dir().unwrap_err();
    std::env::remove_var(LOCK_DIR_ENV);
    assert!(err.to_string().contains("notadir"), "{err}");
}

#[test]
fn bus_ids_become_file_names() {
    assert_eq!(key_of_bus_id("0000:19:00.0\n"), "gpu-0000-19-00.0");
    assert_eq!(key_of_bus_id("00000000:9A:00.0"), "gpu-00000000-9a-00.0");
    assert_eq!(key_of_bus_id("../x"), "gpu-..-x");
}

#[test]
fn waits_are_counted_per_party() {
    let lock = scratch("waits").join("gpu-test.lock");
    let lease = GpuLease::open(&lock, "waits-test-party").unwrap();
    drop(lease.take(Hold::Step).unwrap());
    drop(lease.take(Hold::Step).unwrap());
    drop(lease.take(Hold::Timing).unwrap());
    let totals = wait_totals();
    assert_eq!(totals["waits-test-party.timing"].holds, 1);
    let after = totals["waits-test-party.step"];
    assert_eq!(after.holds, 2);
    assert!(after.waited_ms >= after.max_ms && after.max_ms >= 0.0);
}
