//! The GPU-wide timing lease: a candidate is timed only while nothing else of kevin's runs on its
//! GPU (issue 17, item 7). It works across processes, because the parties live in different ones:
//! the evaluation's `kevin worker --role cuda` children and their parent environment, the
//! generator and learner of the daemon, and separate commands (`kevin eval`, `kevin bench
//! hacks`, `kevin bench policy`) on the same GPU.
//!
//! # Protocol
//! Two lock files per GPU, locked with `flock(2)` (advisory, per open file description, released
//! by the kernel when the holder's file is closed or its process dies, so a killed worker or a
//! crashed daemon never leaves the GPU leased):
//! - `<key>.lock`, the lease itself: a timing run holds it exclusively ([`Hold::Timing`]); a
//!   step of other GPU work (one generator decode step, one learner micro-batch, one
//!   correctness check) holds it shared ([`Hold::Step`]), so steps run together but never
//!   while a candidate is timed.
//! - `<key>.turnstile`, for writer preference: `flock` lets new shared holders in while an
//!   exclusive request waits, so a busy generator would starve timing. A timing run takes the
//!   turnstile exclusively *before* the lease and keeps it until it ends; a step passes the
//!   turnstile (shared, held only while it takes the lease) and then holds the lease. Once a
//!   timing run waits, no new step starts; the steps in progress finish, and the run starts.
//!   A step never waits longer than the timing runs queued before it; a timing run never waits
//!   longer than the steps in progress when it asked.
//!
//! A holder must release between steps (the hold is a guard, [`Held`]) and must not hold twice:
//! two holds through one [`GpuLease`] would share its open file descriptions, so it refuses a
//! second one ([`LeaseError::AlreadyHeld`]); each thread that takes part (the generator, the
//! learner, an environment's GPU) opens its own. GPU work is asynchronous: a holder must have
//! waited for its step's work on the device before it drops the guard.
//!
//! # Where the files live
//! `$KEVIN_GPU_LOCK_DIR`, else `/tmp/kevin-gpu-locks`: one folder for every user of the machine
//! (the GPU is shared by all of them; a per-user runtime folder would let a root daemon and a
//! user's bench time over each other). It is created mode 1777 (sticky, like /tmp); the files are
//! opened read-only (`flock` needs no write access) without following symbolic links, and
//! created mode 0666. The key names the GPU as the driver does, by PCI bus id ([`gpu_key`]), so
//! processes with different `CUDA_VISIBLE_DEVICES` still meet on the same files.
//!
//! # What it does not do
//! It is cooperative: a process that does not take the lease (another user's training job, a
//! program that is not kevin) still disturbs timings. Candidates never hold it themselves: the
//! trusted parent takes it around their requests.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Environment variable naming the folder of the lock files (default [`DEFAULT_LOCK_DIR`]).
pub const LOCK_DIR_ENV: &str = "KEVIN_GPU_LOCK_DIR";
/// The folder of the lock files when [`LOCK_DIR_ENV`] is not set.
pub const DEFAULT_LOCK_DIR: &str = "/tmp/kevin-gpu-locks";

/// How a holder uses the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// A timing run: nothing else of kevin's on the GPU (exclusive, with writer preference).
    Timing,
    /// One step of other GPU work (shared with other steps, never with a timing run).
    Step,
}

/// A lease that could not be opened or taken.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// A lock file or its folder could not be opened or created.
    #[error("GPU timing lease {path}: {source}")]
    Open {
        /// The file or folder.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `flock` failed (not a wait: an error of the system call).
    #[error("GPU timing lease {path}: flock: {source}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// This handle already holds the lease: release the first hold before taking another.
    #[error("GPU timing lease {0}: already held through this handle (one hold at a time)")]
    AlreadyHeld(PathBuf),
    /// The GPU could not be named.
    #[error("GPU timing lease for GPU {ordinal}: {reason}")]
    Key {
        /// The GPU ordinal (after `CUDA_VISIBLE_DEVICES`).
        ordinal: usize,
        /// Why.
        reason: String,
    },
}

struct Inner {
    main: File,
    turnstile: File,
    path: PathBuf,
    held: AtomicBool,
    /// Who holds through this handle, for [`wait_totals`].
    party: &'static str,
}

/// The waits of one party of this process for the lease (see [`wait_totals`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WaitTotals {
    /// Holds taken.
    pub holds: u64,
    /// Milliseconds spent waiting for them, in all.
    pub waited_ms: f64,
    /// The longest single wait (ms).
    pub max_ms: f64,
}

type WaitMap = std::collections::BTreeMap<(&'static str, &'static str), WaitTotals>;

static WAITS: std::sync::Mutex<WaitMap> = std::sync::Mutex::new(WaitMap::new());

/// This process's waits for GPU leases so far, per party and hold: "generator.step",
/// "learner.step", "evaluation.timing", "evaluation.step", ...: the telemetry's view of what the
/// lease costs each side.
pub fn wait_totals() -> std::collections::BTreeMap<String, WaitTotals> {
    WAITS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|((party, hold), v)| (format!("{party}.{hold}"), *v))
        .collect()
}

fn record_wait(party: &'static str, hold: Hold, waited: Duration) {
    let ms = waited.as_secs_f64() * 1e3;
    let hold = match hold {
        Hold::Timing => "timing",
        Hold::Step => "step",
    };
    let mut waits = WAITS.lock().unwrap_or_else(|e| e.into_inner());
    let w = waits.entry((party, hold)).or_default();
    w.holds += 1;
    w.waited_ms += ms;
    w.max_ms = w.max_ms.max(ms);
}

/// One party's handle on the lease of one GPU (see the module documentation). Not `Clone`: each
/// party opens its own, because `flock` locks belong to an open file description.
pub struct GpuLease {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for GpuLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuLease")
            .field("path", &self.inner.path)
            .finish()
    }
}

/// A hold on the lease; released when dropped.
#[derive(Debug)]
pub struct Held {
    inner: Arc<Inner>,
    hold: Hold,
    waited: Duration,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner").field("path", &self.path).finish()
    }
}

impl Held {
    /// How long taking it waited.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// What it holds.
    pub fn hold(&self) -> Hold {
        self.hold
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Unlocking an open file cannot block; an error (EBADF) cannot happen on our own files,
        // and closing them would release the lock anyway.
        let _ = flock(&self.inner.main, Op::Unlock);
        if self.hold == Hold::Timing {
            let _ = flock(&self.inner.turnstile, Op::Unlock);
        }
        self.inner.held.store(false, Ordering::Release);
    }
}

impl GpuLease {
    /// Opens (creating them when missing) the lock file `lock` and its turnstile
    /// (`lock` with the extension `turnstile`) for `party` (the name its waits are counted
    /// under in [`wait_totals`]). The folder must exist.
    pub fn open(lock: &Path, party: &'static str) -> Result<GpuLease, LeaseError> {
        let turnstile_path = lock.with_extension("turnstile");
        let main = open_lock_file(lock)?;
        let turnstile = open_lock_file(&turnstile_path)?;
        Ok(GpuLease {
            inner: Arc::new(Inner {
                main,
                turnstile,
                path: lock.to_path_buf(),
                held: AtomicBool::new(false),
                party,
            }),
        })
    }

    /// The lease of GPU `ordinal` (as this process numbers it, after `CUDA_VISIBLE_DEVICES`):
    /// the GPU named by the driver ([`gpu_key`]), its lock file in [`lock_dir`] (created when
    /// missing), for `party` (see [`GpuLease::open`]).
    pub fn for_gpu(ordinal: usize, party: &'static str) -> Result<GpuLease, LeaseError> {
        let key = gpu_key(ordinal).map_err(|reason| LeaseError::Key { ordinal, reason })?;
        let dir = lock_dir()?;
        GpuLease::open(&dir.join(format!("{key}.lock")), party)
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Takes the lease for `hold`, waiting as long as it takes (see the module documentation for
    /// how long that can be).
    pub fn take(&self, hold: Hold) -> Result<Held, LeaseError> {
        if self.inner.held.swap(true, Ordering::AcqRel) {
            return Err(LeaseError::AlreadyHeld(self.inner.path.clone()));
        }
        let started = Instant::now();
        let taken = self.take_locks(hold);
        if let Err(e) = taken {
            self.inner.held.store(false, Ordering::Release);
            return Err(e);
        }
        let waited = started.elapsed();
        record_wait(self.inner.party, hold, waited);
        Ok(Held {
            inner: self.inner.clone(),
            hold,
            waited,
        })
    }

    fn take_locks(&self, hold: Hold) -> Result<(), LeaseError> {
        let i = &self.inner;
        let err = |source| LeaseError::Lock {
            path: i.path.clone(),
            source,
        };
        match hold {
            Hold::Timing => {
                flock(&i.turnstile, Op::Exclusive).map_err(err)?;
                if let Err(e) = flock(&i.main, Op::Exclusive) {
                    let _ = flock(&i.turnstile, Op::Unlock);
                    return Err(err(e));
                }
            }
            Hold::Step => {
                flock(&i.turnstile, Op::Shared).map_err(err)?;
                let main = flock(&i.main, Op::Shared);
                let _ = flock(&i.turnstile, Op::Unlock);
                main.map_err(err)?;
            }
        }
        Ok(())
    }
}

/// The folder of the lock files: [`LOCK_DIR_ENV`], else [`DEFAULT_LOCK_DIR`] (created mode 1777
/// when missing, so every user of the machine can take part). A path that exists and is not a
/// folder (or is a symbolic link) is an error.
pub fn lock_dir() -> Result<PathBuf, LeaseError> {
    let dir = std::env::var_os(LOCK_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_LOCK_DIR), PathBuf::from);
    let open_err = |source| LeaseError::Open {
        path: dir.clone(),
        source,
    };
    match std::fs::create_dir(&dir) {
        Ok(()) => {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777))
                    .map_err(open_err)?;
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(open_err(e)),
    }
    let meta = std::fs::symlink_metadata(&dir).map_err(open_err)?;
    if !meta.is_dir() {
        return Err(open_err(std::io::Error::other(
            "exists and is not a folder (or is a symbolic link)",
        )));
    }
    Ok(dir)
}

/// The file-name key of GPU `ordinal`: `gpu-` and its PCI bus id as the driver reports it
/// (`gpu-0000-19-00.0`), the same in every process whatever its `CUDA_VISIBLE_DEVICES`.
pub fn gpu_key(ordinal: usize) -> Result<String, String> {
    let bus = super::device::pci_bus_id(ordinal).map_err(|e| e.to_string())?;
    Ok(key_of_bus_id(&bus))
}

/// `0000:19:00.0` -> `gpu-0000-19-00.0` (only ASCII letters, digits, `.` and `-` stay).
fn key_of_bus_id(bus: &str) -> String {
    let clean: String = bus
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!("gpu-{clean}")
}

#[cfg(unix)]
fn open_lock_file(path: &Path) -> Result<File, LeaseError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
    };
    let file = match open() {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Created by whoever comes first, readable by every user (the umask may narrow the
            // mode given at creation, hence the chmod; only the creator can make it).
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW)
                .mode(0o666)
                .open(path)
            {
                Ok(f) => {
                    let _ = f.set_permissions(std::fs::Permissions::from_mode(0o666));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(LeaseError::Open {
                        path: path.to_path_buf(),
                        source: e,
                    })
                }
            }
            open().map_err(|source| LeaseError::Open {
                path: path.to_path_buf(),
                source,
            })?
        }
        Err(source) => {
            return Err(LeaseError::Open {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    Ok(file)
}

#[cfg(not(unix))]
fn open_lock_file(path: &Path) -> Result<File, LeaseError> {
    Err(LeaseError::Open {
        path: path.to_path_buf(),
        source: std::io::Error::other("GPU timing leases need a unix system (flock)"),
    })
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Exclusive,
    Shared,
    Unlock,
}

/// `flock(2)`, retried when a signal interrupts the wait.
#[cfg(unix)]
fn flock(file: &File, op: Op) -> std::io::Result<()> {
    use std::os::unix::io::AsRawFd;
    let op = match op {
        Op::Exclusive => libc::LOCK_EX,
        Op::Shared => libc::LOCK_SH,
        Op::Unlock => libc::LOCK_UN,
    };
    loop {
        // SAFETY: flock on a file descriptor this `File` owns.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(not(unix))]
fn flock(_file: &File, _op: Op) -> std::io::Result<()> {
    Err(std::io::Error::other("flock needs a unix system"))
}

#[cfg(all(test, unix))]
#[path = "lease_tests.rs"]
mod tests;
