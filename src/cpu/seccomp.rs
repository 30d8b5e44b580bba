//! The executor's system-call filter: a classic-BPF seccomp program that allows only what running
//! a loaded module needs (memory mapping for fiber stacks and the shared buffers, threads for the
//! block workers, futexes, the two pipes to the trusted worker) and ends the process on
//! anything else (a trap: the SIGSYS handler names the call on stderr, then the process dies of
//! SIGSYS): no `open`, no `socket`, no `execve`, no `kill`, no new process (`clone` only
//! with `CLONE_THREAD`, `clone3` answers `ENOSYS` so the C library falls back to `clone`), no
//! `ptrace`, no clocks.
//!
//! Written by hand (twenty instructions do not need a dependency); x86-64 Linux only, like the
//! CPU device model itself.

/// Why the filter could not be installed.
pub type InstallError = std::io::Error;

/// System calls the executor may make after its module is loaded (x86-64 numbers).
const ALLOWED: &[(u32, &str)] = &[
    (0, "read"),
    (1, "write"),
    (3, "close"),
    (9, "mmap"),
    (10, "mprotect"),
    (11, "munmap"),
    (12, "brk"),
    (13, "rt_sigaction"),
    (14, "rt_sigprocmask"),
    (15, "rt_sigreturn"),
    (24, "sched_yield"),
    (25, "mremap"),
    (28, "madvise"),
    (39, "getpid"),
    (60, "exit"),
    (131, "sigaltstack"),
    (186, "gettid"),
    (202, "futex"),
    (204, "sched_getaffinity"),
    (218, "set_tid_address"),
    (219, "restart_syscall"),
    (231, "exit_group"),
    (273, "set_robust_list"),
    (318, "getrandom"),
    (334, "rseq"),
];

const SYS_CLONE: u32 = 56;
const SYS_CLONE3: u32 = 435;
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

// BPF opcodes (linux/filter.h).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGE_K: u16 = 0x35;
const BPF_JSET_K: u16 = 0x45;
const BPF_RET_K: u16 = 0x06;

const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ALLOW: u32 = 0x7fff_0000;
const RET_TRAP: u32 = 0x0003_0000;
const RET_ERRNO: u32 = 0x0005_0000;

// Offsets in struct seccomp_data.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const OFF_ARG0_LO: u32 = 16;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The filter program.
fn program() -> Vec<libc::sock_filter> {
    let mut p = vec![
        stmt(BPF_LD_W_ABS, OFF_ARCH),
        jump(BPF_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(BPF_RET_K, RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, OFF_NR),
        // x32 system calls have the same numbers with a high bit: refuse them all.
        jump(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1),
        stmt(BPF_RET_K, RET_KILL_PROCESS),
        // clone3 hides its flags behind a pointer: ENOSYS, so glibc retries with clone.
        jump(BPF_JEQ_K, SYS_CLONE3, 0, 1),
        stmt(BPF_RET_K, RET_ERRNO | libc::ENOSYS as u32),
        // clone: threads only (CLONE_THREAD set in the flags, the first argument's low word).
        jump(BPF_JEQ_K, SYS_CLONE, 0, 4),
        stmt(BPF_LD_W_ABS, OFF_ARG0_LO),
        jump(BPF_JSET_K, libc::CLONE_THREAD as u32, 0, 1),
        stmt(BPF_RET_K, RET_ALLOW),
        stmt(BPF_RET_K, RET_TRAP),
    ];
    let n = ALLOWED.len();
    for (i, (nr, _)) in ALLOWED.iter().enumerate() {
        // On a match, jump over the remaining comparisons and the kill to the allow.
        let to_allow = (n - i - 1 + 1) as u8;
        p.push(jump(BPF_JEQ_K, *nr, to_allow, 0));
    }
    // Anything else traps: SIGSYS, whose handler (`worker::report_faults`) writes the call's
    // number to stderr and ends the process by the same signal.
    p.push(stmt(BPF_RET_K, RET_TRAP));
    p.push(stmt(BPF_RET_K, RET_ALLOW));
    p
}

/// The names of the allowed system calls, for the docs and the executor's report.
pub fn allowed_names() -> Vec<&'static str> {
    let mut v: Vec<&str> = ALLOWED.iter().map(|(_, n)| *n).collect();
    v.push("clone (threads only)");
    v
}

/// Installs the filter on the calling thread (and every thread it starts later). Needs
/// `no_new_privs` (set here) unless the caller has CAP_SYS_ADMIN.
pub fn install() -> Result<(), InstallError> {
    let prog = program();
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prctl with integer arguments, then a pointer to a filter that outlives the call
    // (the kernel copies it).
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &fprog as *const libc::sock_fprog,
            0,
            0,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_comparison_lands_on_the_allow_and_the_rest_on_the_trap() {
        let p = program();
        let last = p.len() - 1;
        assert_eq!(p[last].k, RET_ALLOW);
        assert_eq!(p[last - 1].k, RET_TRAP);
        let first_cmp = p.len() - 2 - ALLOWED.len();
        for (i, ins) in p[first_cmp..last - 1].iter().enumerate() {
            assert_eq!(ins.code, BPF_JEQ_K);
            assert_eq!(ins.k, ALLOWED[i].0);
            assert_eq!(
                first_cmp + i + 1 + ins.jt as usize,
                last,
                "{}",
                ALLOWED[i].1
            );
        }
        assert!(ALLOWED
            .iter()
            .all(|(nr, _)| ![2, 57, 58, 59, 62, 41, 101, 257, 228].contains(nr)));
    }
}
