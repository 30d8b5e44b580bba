//! The loader's gate: a compiled CPU module is read as an ELF file, and refused before anything
//! loads it, unless everything it imports is on an allowlist and nothing of it runs at load time.
//!
//! - **Imports**: every undefined dynamic symbol (strong or weak: a weak `open` binds to libc's
//!   as well as a strong one) must be a function of the device model's runtime (the C++ thread,
//!   allocation and memory routines the header uses) or of the C math library. `open`, `write`,
//!   `kill`, `posix_spawn`, `environ` and every other libc name are refused with the name.
//! - **Nothing runs at load time**: no `DT_INIT`/`DT_FINI`, no init/fini/preinit arrays (static
//!   constructors, `__attribute__((constructor))`, destructors), no `STT_GNU_IFUNC` symbol and no
//!   `R_X86_64_IRELATIVE` relocation (an ifunc resolver runs inside `dlopen`), no run path. The
//!   module is linked with `-nostartfiles`, so a clean module has none of these.
//! - **Libraries**: `DT_NEEDED` only names the C and C++ runtimes.
//!
//! This is one layer, not the wall: a kernel can still find libc's functions through the
//! allowed `dl_iterate_phdr`, or make a system call directly. The executor's sandbox
//! ([`super::sandbox`]) is what stops those; this layer gives a clear, early error for the
//! ordinary case and keeps load-time code out of the process that sets the sandbox up.

use std::path::Path;

/// Why a module was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModuleCheckError {
    /// The file is not an ELF shared object this checker understands (a harness problem: the
    /// compiler produced it).
    #[error("the compiled module is not a readable ELF64 shared object: {0}")]
    Malformed(String),
    /// The candidate's code does something device code cannot (the candidate's fault).
    #[error("{0}")]
    Refused(String),
}

/// Runtime functions the device model's header and the C++ runtime it uses import.
const RUNTIME: &[&str] = &[
    // std::thread (one OS thread per block worker)
    "_ZNSt6thread15_M_start_threadESt10unique_ptrINS_6_StateESt14default_deleteIS1_EEPFvvE",
    "_ZNSt6thread4joinEv",
    "_ZNSt6thread6_StateD2Ev",
    "_ZSt9terminatev",
    // std::vector and operator new/delete
    "_ZSt20__throw_length_errorPKc",
    "_ZSt17__throw_bad_allocv",
    "_ZSt28__throw_bad_array_new_lengthv",
    "_ZSt24__throw_out_of_range_fmtPKcz",
    "_Znwm",
    "_Znam",
    "_ZdlPv",
    "_ZdlPvm",
    "_ZdaPv",
    "_ZdaPvm",
    "_ZnwmSt11align_val_t",
    "_ZdlPvSt11align_val_t",
    "_ZdlPvmSt11align_val_t",
    "__cxa_guard_acquire",
    "__cxa_guard_release",
    "__cxa_guard_abort",
    "__cxa_pure_virtual",
    "__gxx_personality_v0",
    "_Unwind_Resume",
    "__stack_chk_fail",
    // thread-local storage (`__shared__` is thread_local) and the shared-memory poisoning
    "__tls_get_addr",
    "dl_iterate_phdr",
    // allocation and memory (fiber stacks, the dynamic shared buffer, device memcpy/memset)
    "malloc",
    "calloc",
    "realloc",
    "free",
    "aligned_alloc",
    "posix_memalign",
    "mmap",
    "munmap",
    "mprotect",
    "memcpy",
    "memmove",
    "memset",
    "memcmp",
    "__memcpy_chk",
    "__memmove_chk",
    "__memset_chk",
    // the launch's error message
    "snprintf",
    "__snprintf_chk",
];

/// C math functions; each is allowed as `name`, `namef` and `namel`, and as glibc's
/// `__name_finite` variants.
const MATH: &[&str] = &[
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atan2",
    "atanh",
    "cbrt",
    "ceil",
    "copysign",
    "cos",
    "cosh",
    "erf",
    "erfc",
    "exp",
    "exp10",
    "exp2",
    "expm1",
    "fabs",
    "fdim",
    "floor",
    "fma",
    "fmax",
    "fmin",
    "fmod",
    "frexp",
    "hypot",
    "ilogb",
    "ldexp",
    "lgamma",
    "lgamma_r",
    "llrint",
    "llround",
    "log",
    "log10",
    "log1p",
    "log2",
    "logb",
    "lrint",
    "lround",
    "modf",
    "nan",
    "nearbyint",
    "nextafter",
    "nexttoward",
    "pow",
    "remainder",
    "remquo",
    "rint",
    "round",
    "roundeven",
    "scalbln",
    "scalbn",
    "sin",
    "sincos",
    "sinh",
    "sqrt",
    "tan",
    "tanh",
    "tgamma",
    "trunc",
    "j0",
    "j1",
    "jn",
    "y0",
    "y1",
    "yn",
    "__isnan",
    "__isinf",
    "__finite",
    "__signbit",
    "__fpclassify",
];

/// Libraries a module may need.
const NEEDED: &[&str] = &[
    "libstdc++.so.6",
    "libm.so.6",
    "libc.so.6",
    "libgcc_s.so.1",
    "libpthread.so.0",
    "ld-linux-x86-64.so.2",
    "libc++.so.1",
    "libc++abi.so.1",
];

/// True when a module may import `name`.
pub fn allowed_import(name: &str) -> bool {
    if RUNTIME.contains(&name) {
        return true;
    }
    let base = name
        .strip_prefix("__")
        .and_then(|n| n.strip_suffix("_finite"))
        .unwrap_or(name);
    let base = [base.strip_suffix('f'), base.strip_suffix('l')]
        .into_iter()
        .flatten()
        .find(|b| MATH.contains(b))
        .unwrap_or(base);
    MATH.contains(&base)
}

const DT_NEEDED: u64 = 1;
const DT_INIT: u64 = 12;
const DT_FINI: u64 = 13;
const DT_RPATH: u64 = 15;
const DT_INIT_ARRAY: u64 = 25;
const DT_FINI_ARRAY: u64 = 26;
const DT_RUNPATH: u64 = 29;
const DT_PREINIT_ARRAY: u64 = 32;
const SHT_RELA: u32 = 4;
const SHT_DYNAMIC: u32 = 6;
const SHT_DYNSYM: u32 = 11;
const SHT_INIT_ARRAY: u32 = 14;
const SHT_FINI_ARRAY: u32 = 15;
const SHT_PREINIT_ARRAY: u32 = 16;
const STT_GNU_IFUNC: u8 = 10;
const R_X86_64_IRELATIVE: u32 = 37;

/// Checks the module at `path` (see the module docs).
pub fn check_module(path: &Path) -> Result<(), ModuleCheckError> {
    let bytes = std::fs::read(path)
        .map_err(|e| ModuleCheckError::Malformed(format!("{}: {e}", path.display())))?;
    check_bytes(&bytes)
}

/// [`check_module`] on the file's bytes.
pub fn check_bytes(bytes: &[u8]) -> Result<(), ModuleCheckError> {
    let elf = Elf::parse(bytes)?;
    let mut refused: Vec<String> = Vec::new();
    let mut imports: Vec<String> = Vec::new();
    for sh in &elf.sections {
        match sh.kind {
            SHT_INIT_ARRAY | SHT_PREINIT_ARRAY if sh.size > 0 => refused.push(
                "static constructors (an initialiser that runs code, or __attribute__((constructor)))"
                    .into(),
            ),
            SHT_FINI_ARRAY if sh.size > 0 => refused
                .push("static destructors (or __attribute__((destructor)))".into()),
            SHT_DYNSYM => {
                let strtab = elf.section(sh.link)?;
                for sym in elf.table(sh, 24)? {
                    let name = elf.string(strtab, u32_at(sym, 0)? as u64)?;
                    let info = sym[4];
                    let shndx = u16::from_le_bytes([sym[6], sym[7]]);
                    if info & 0xf == STT_GNU_IFUNC {
                        refused.push(format!("an indirect function (`{name}`), whose resolver runs at load time"));
                    }
                    if shndx == 0 && !name.is_empty() && !allowed_import(&name) {
                        imports.push(name);
                    }
                }
            }
            SHT_DYNAMIC => {
                let strtab = elf.section(sh.link)?;
                for entry in elf.table(sh, 16)? {
                    let tag = u64_at(entry, 0)?;
                    let val = u64_at(entry, 8)?;
                    match tag {
                        DT_INIT | DT_INIT_ARRAY | DT_PREINIT_ARRAY => refused.push(
                            "code that runs when the module loads (an init function or array)"
                                .into(),
                        ),
                        DT_FINI | DT_FINI_ARRAY => refused
                            .push("code that runs when the module unloads (a fini function or array)".into()),
                        DT_RPATH | DT_RUNPATH => refused.push("a library search path".into()),
                        DT_NEEDED => {
                            let lib = elf.string(strtab, val)?;
                            if !NEEDED.contains(&lib.as_str()) {
                                refused.push(format!("a dependency on `{lib}`"));
                            }
                        }
                        _ => {}
                    }
                }
            }
            SHT_RELA => {
                for rela in elf.table(sh, 24)? {
                    if (u64_at(rela, 8)? & 0xffff_ffff) as u32 == R_X86_64_IRELATIVE {
                        refused.push("an IRELATIVE relocation (code run by the loader)".into());
                    }
                }
            }
            _ => {}
        }
    }
    imports.sort();
    imports.dedup();
    if !imports.is_empty() {
        let list = imports
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        refused.insert(
            0,
            format!(
                "calls to {list}, which device code cannot make (a kernel may call the CUDA \
                 device runtime and math functions only)"
            ),
        );
    }
    refused.dedup();
    if refused.is_empty() {
        Ok(())
    } else {
        Err(ModuleCheckError::Refused(format!(
            "the compiled kernel has {}",
            refused.join("; ")
        )))
    }
}

struct Section {
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
}

struct Elf<'a> {
    bytes: &'a [u8],
    sections: Vec<Section>,
}

fn malformed(what: &str) -> ModuleCheckError {
    ModuleCheckError::Malformed(what.to_string())
}

fn slice(bytes: &[u8], at: u64, len: u64) -> Result<&[u8], ModuleCheckError> {
    let end = at
        .checked_add(len)
        .ok_or_else(|| malformed("offset overflow"))?;
    bytes
        .get(at as usize..end as usize)
        .ok_or_else(|| malformed("a table lies outside the file"))
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, ModuleCheckError> {
    Ok(u16::from_le_bytes(
        slice(b, at as u64, 2)?.try_into().expect("two bytes"),
    ))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, ModuleCheckError> {
    Ok(u32::from_le_bytes(
        slice(b, at as u64, 4)?.try_into().expect("four bytes"),
    ))
}

fn u64_at(b: &[u8], at: usize) -> Result<u64, ModuleCheckError> {
    Ok(u64::from_le_bytes(
        slice(b, at as u64, 8)?.try_into().expect("eight bytes"),
    ))
}

impl<'a> Elf<'a> {
    fn parse(bytes: &'a [u8]) -> Result<Elf<'a>, ModuleCheckError> {
        if bytes.get(..4) != Some(b"\x7fELF") {
            return Err(malformed("no ELF magic"));
        }
        if bytes.get(4) != Some(&2) || bytes.get(5) != Some(&1) {
            return Err(malformed("not a little-endian ELF64 file"));
        }
        let shoff = u64_at(bytes, 0x28)?;
        let shentsize = u16_at(bytes, 0x3a)? as u64;
        let shnum = u16_at(bytes, 0x3c)? as u64;
        if shentsize < 64 || shnum == 0 {
            return Err(malformed("no section headers"));
        }
        let mut sections = Vec::with_capacity(shnum as usize);
        for i in 0..shnum {
            let sh = slice(bytes, shoff + i * shentsize, 64)?;
            sections.push(Section {
                kind: u32_at(sh, 4)?,
                offset: u64_at(sh, 0x18)?,
                size: u64_at(sh, 0x20)?,
                link: u32_at(sh, 0x28)?,
            });
        }
        Ok(Elf { bytes, sections })
    }

    fn section(&self, index: u32) -> Result<&Section, ModuleCheckError> {
        self.sections
            .get(index as usize)
            .ok_or_else(|| malformed("a section links to a missing section"))
    }

    fn table(&self, sh: &Section, entsize: u64) -> Result<Vec<&'a [u8]>, ModuleCheckError> {
        let data = slice(self.bytes, sh.offset, sh.size)?;
        Ok(data.chunks_exact(entsize as usize).collect())
    }

    fn string(&self, strtab: &Section, at: u64) -> Result<String, ModuleCheckError> {
        let data = slice(self.bytes, strtab.offset, strtab.size)?;
        let tail = data
            .get(at as usize..)
            .ok_or_else(|| malformed("a name lies outside its string table"))?;
        let end = tail
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| malformed("an unterminated name"))?;
        Ok(String::from_utf8_lossy(&tail[..end]).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn math_and_runtime_names_are_allowed_and_libc_is_not() {
        for ok in [
            "expf",
            "exp",
            "expl",
            "tanhf",
            "__expf_finite",
            "sincosf",
            "memset",
            "_Znwm",
            "__tls_get_addr",
            "erff",
            "nearbyintf",
            "fmaxf",
            "roundevenf",
        ] {
            assert!(allowed_import(ok), "{ok}");
        }
        for bad in [
            "open",
            "read",
            "write",
            "kill",
            "posix_spawn",
            "environ",
            "system",
            "fopen",
            "getenv",
            "syscall",
            "dlopen",
            "dlsym",
            "execve",
            "fork",
            "socket",
            "ptrace",
            "f",
            "l",
            "",
        ] {
            assert!(!allowed_import(bad), "{bad}");
        }
    }

    #[test]
    fn garbage_is_malformed_not_refused() {
        assert!(matches!(
            check_bytes(b"not an elf"),
            Err(ModuleCheckError::Malformed(_))
        ));
        let mut truncated = b"\x7fELF\x02\x01".to_vec();
        truncated.resize(70, 0);
        assert!(matches!(
            check_bytes(&truncated),
            Err(ModuleCheckError::Malformed(_))
        ));
    }
}
