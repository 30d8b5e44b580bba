//! Deadlines on a worker's own time: what the scheduler made a process tree wait, runnable, for a
//! CPU (Linux `/proc`) is not counted against it.
//!
//! A deadline on untrusted work (a compile, a verification, a timing run) is meant as the work's
//! own time. On a machine with more runnable threads than cores (CI's two cores running a test
//! binary's tests side by side, a worker node with more jobs than cores) a candidate's compiler or
//! run also waits for a CPU, and that wait is the machine's, not the candidate's: a correct kernel
//! whose compile took 3 s of CPU must not become a `Timeout` because it took 12 s of wall time.
//! [`WorkDeadline`] is such a deadline: wall time less the waits for a CPU, up to a backstop; where
//! `/proc` lacks the figures (not Linux, or a kernel without schedstats) it is wall time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How far below a worker [`WorkDeadline`] looks (processes of processes).
const MAX_DEPTH: usize = 6;
/// The most processes of one tree it reads (a fork bomb is stopped by its sandbox, not here).
const MAX_PROCESSES: usize = 256;

/// Deadlines stretched by a starved worker end at the latest after this many times their limit:
/// then the machine, not the candidate, is reported (an outcome of the harness).
pub const STARVED_BACKSTOP: u32 = 5;

/// The run-queue delay of every thread of `pid` and its live descendants
/// (`/proc/PID/task/TID/schedstat`, second field, in ns), by thread id; `None` when the kernel
/// keeps no such figures. One walk: each thread's directory gives its delay and its children.
fn run_delays(pid: u32) -> Option<HashMap<u32, u64>> {
    let mut out = HashMap::new();
    let mut any = false;
    let mut seen = vec![pid];
    let mut level = vec![pid];
    for _ in 0..=MAX_DEPTH {
        let mut next = Vec::new();
        for p in level {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
                continue;
            };
            for task in tasks.flatten() {
                let dir = task.path();
                let tid = task.file_name().to_str().and_then(|t| t.parse().ok());
                if let (Some(tid), Ok(text)) = (tid, std::fs::read_to_string(dir.join("schedstat")))
                {
                    let mut fields = text.split_whitespace().map(|f| f.parse::<u64>());
                    if let (Some(Ok(_on_cpu)), Some(Ok(delay))) = (fields.next(), fields.next()) {
                        out.insert(tid, delay);
                        any = true;
                    }
                }
                if let Ok(children) = std::fs::read_to_string(dir.join("children")) {
                    next.extend(
                        children
                            .split_whitespace()
                            .filter_map(|c| c.parse::<u32>().ok()),
                    );
                }
            }
        }
        next.retain(|c| !seen.contains(c));
        next.truncate(MAX_PROCESSES.saturating_sub(seen.len()));
        if next.is_empty() {
            break;
        }
        seen.extend(&next);
        level = next;
    }
    any.then_some(out)
}

/// The time a worker's tree has waited for a CPU since it was started: the most any one of its
/// threads waited (a thread that came later counts from zero). A waiting thread holds the work
/// up; threads that wait at the same time do not add up, so the largest is the share of the wait
/// that is surely the machine's. It never falls: a process that ended (`cc1plus` before `as`)
/// keeps the wait it was seen with.
#[derive(Debug, Clone)]
struct StarvedClock {
    pid: u32,
    base: HashMap<u32, u64>,
    most: Duration,
}

impl StarvedClock {
    fn start(pid: u32) -> Option<StarvedClock> {
        Some(StarvedClock {
            pid,
            base: run_delays(pid)?,
            most: Duration::ZERO,
        })
    }

    fn starved(&mut self) -> Duration {
        let now = run_delays(self.pid).unwrap_or_default();
        let most = now
            .iter()
            .map(|(tid, d)| d.saturating_sub(self.base.get(tid).copied().unwrap_or(0)))
            .max()
            .unwrap_or(0);
        self.most = self.most.max(Duration::from_nanos(most));
        self.most
    }
}

/// How a [`WorkDeadline`] ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// The work had its limit of time, not counting its waits for a CPU: the candidate's.
    Timeout,
    /// The backstop passed while the work had had less than its limit: the rest of the time it
    /// waited for a CPU. The machine's.
    Starved {
        /// From the start to giving up.
        elapsed: Duration,
        /// How long it waited, runnable, for a CPU.
        starved: Duration,
    },
}

/// A deadline of `limit` on a worker tree's own time: wall time less what the tree waited for a
/// CPU, ending at the latest at [`STARVED_BACKSTOP`] times `limit`. Where the kernel keeps no
/// run-queue delays it is plain wall time.
#[derive(Debug)]
pub struct WorkDeadline {
    start: Instant,
    limit: Duration,
    clock: Option<StarvedClock>,
    starved: Duration,
}

impl WorkDeadline {
    /// Starts the deadline of the work of process `pid` (and its descendants) now.
    pub fn start(pid: u32, limit: Duration) -> WorkDeadline {
        WorkDeadline {
            start: Instant::now(),
            limit,
            clock: StarvedClock::start(pid),
            starved: Duration::ZERO,
        }
    }

    /// The first instant to look: the limit in wall time.
    pub fn first(&self) -> Instant {
        self.start + self.limit
    }

    /// Once the instant last given has passed with the work unfinished: the next instant to look,
    /// moved on by the CPU waits seen so far, or `None` when the limit (or the backstop) is spent,
    /// and then [`Self::expiry`] says which.
    pub fn extend(&mut self) -> Option<Instant> {
        let clock = self.clock.as_mut()?;
        self.starved = clock.starved();
        let due = (self.start + self.limit + self.starved).min(self.backstop());
        (due > Instant::now() + Duration::from_millis(10)).then_some(due)
    }

    /// Why the deadline ran out, once [`Self::extend`] said so.
    pub fn expiry(&self) -> Expiry {
        let elapsed = self.start.elapsed();
        if elapsed >= self.limit * STARVED_BACKSTOP && elapsed < self.limit + self.starved {
            Expiry::Starved {
                elapsed,
                starved: self.starved,
            }
        } else {
            Expiry::Timeout
        }
    }

    fn backstop(&self) -> Instant {
        self.start + self.limit * STARVED_BACKSTOP
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::Instant;

    /// The first CPU this process may run on.
    fn first_cpu() -> usize {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let rc =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        assert_eq!(
            rc,
            0,
            "sched_getaffinity: {}",
            std::io::Error::last_os_error()
        );
        (0..libc::CPU_SETSIZE as usize)
            .find(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .expect("no CPU in this process's affinity mask")
    }

    /// A shell spinning until killed, on CPU `cpu` alone.
    fn spin_on(cpu: usize) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new("sh");
        c.arg("-c").arg("while :; do :; done");
        // SAFETY: between fork and exec the closure only calls async-signal-safe
        // sched_setaffinity on a set built on its own stack.
        unsafe {
            c.pre_exec(move || {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        c.spawn().unwrap()
    }

    /// Waits out `deadline` as the pool does (the work never answers); returns its expiry and
    /// the time that took.
    fn run_out(mut deadline: WorkDeadline) -> (Expiry, Duration) {
        let t0 = Instant::now();
        let mut due = deadline.first();
        loop {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            match deadline.extend() {
                Some(next) => due = next,
                None => return (deadline.expiry(), t0.elapsed()),
            }
        }
    }

    #[test]
    fn on_a_starved_machine_a_sleeper_times_out_and_a_spinner_is_the_machines() {
        let limit = Duration::from_millis(300);
        let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
        if StarvedClock::start(sleeper.id()).is_none() {
            eprintln!("no run-queue delays in /proc here: deadlines are wall time; skipped");
            sleeper.kill().unwrap();
            sleeper.wait().unwrap();
            return;
        }
        // Twelve spinners and the spinner under test, all on one CPU: it gets at most a
        // thirteenth of it, so by the backstop (5 x 300 ms) it has had about 115 ms of its 300
        // and waited 1.38 s of 1.5, however many cores the machine has and however the
        // scheduler spreads work over them. (Spread over the cores, twelve a core still let the
        // spinner get its 300 ms in 1.49 s in two CI runs of 2026-12-07.)
        let cpu = first_cpu();
        let mut load: Vec<_> = (0..12).map(|_| spin_on(cpu)).collect();
        let mut spinner = spin_on(cpu);
        let spinning = WorkDeadline::start(spinner.id(), limit);
        let sleeping = WorkDeadline::start(sleeper.id(), limit);
        let waiting = std::thread::spawn(move || run_out(sleeping));
        let (spinner_expiry, spinner_took) = run_out(spinning);
        let (sleeper_expiry, sleeper_took) = waiting.join().unwrap();
        for c in load.iter_mut().chain([&mut spinner, &mut sleeper]) {
            c.kill().unwrap();
            c.wait().unwrap();
        }
        // The sleeper waited for nothing: its limit is wall time.
        assert_eq!(sleeper_expiry, Expiry::Timeout);
        assert!(sleeper_took < limit * 2, "{sleeper_took:?}");
        // The spinner waited for a CPU most of the time: that moved its deadline on to the
        // backstop, where the machine is blamed.
        let Expiry::Starved { elapsed, starved } = spinner_expiry else {
            panic!("{spinner_expiry:?} after {spinner_took:?}");
        };
        assert!(elapsed >= limit * STARVED_BACKSTOP, "{elapsed:?}");
        assert!(starved > elapsed - limit, "{starved:?} of {elapsed:?}");
    }
}
