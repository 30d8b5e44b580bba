//! NVRTC through cudarc: finding the library without panicking, finding the CUDA headers, and
//! compiling one candidate to PTX or CUBIN.
//!
//! cudarc loads libnvrtc lazily and panics when it is missing, so [`locate_nvrtc`] probes first
//! with the same library names cudarc will try, and turns absence into
//! [`CompileError::Unavailable`] with the install instructions. `KEVIN_NVRTC_LIB=/path/libnvrtc.so.12`
//! loads a library that is not on the loader's path: once loaded, cudarc's own `dlopen` by soname
//! finds it.
//!
//! Kernel names: the launch plan names kernels by their source name, with or without
//! `extern "C"`. Each name is registered as an NVRTC name expression (`&name`) and
//! [`CompileOutput::lowered_names`] maps it to the symbol in the module (the mangled name for C++
//! linkage, the same name for `extern "C"`), which is what the loader looks up. A name the source
//! does not define is a compile error the policy sees. Overloaded or templated kernels are not
//! supported (their `&name` is ambiguous).

use std::collections::BTreeMap;
use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use cudarc::nvrtc::sys;

use super::{CompileError, CompileOutput, CompileRequest, ModuleImage, OutputKind};

/// Environment variable naming an explicit libnvrtc to load.
pub const NVRTC_LIB_ENV: &str = "KEVIN_NVRTC_LIB";
/// Environment variable naming a directory holding `cuda_fp16.h` and friends.
pub const CUDA_INCLUDE_ENV: &str = "KEVIN_CUDA_INCLUDE";

/// How to get NVRTC, appended to every "not found" error.
pub const INSTALL_HINT: &str = "install NVRTC with `python3 -m pip install nvidia-cuda-nvrtc-cu12 \
nvidia-cuda-runtime-cu12` and put its library folder on the loader path: `export \
LD_LIBRARY_PATH=$(python3 -c 'import nvidia.cuda_nvrtc as m; print(m.__path__[0])')/lib:$LD_LIBRARY_PATH` \
(or set KEVIN_NVRTC_LIB to the full path of libnvrtc.so.12)";

/// The NVRTC library in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvrtcLibrary {
    /// The name or path it was loaded by.
    pub loaded_from: String,
    /// NVRTC's (major, minor) version.
    pub version: (i32, i32),
}

/// Finds and loads NVRTC once per process (see the module docs). Never panics.
pub fn locate_nvrtc() -> Result<NvrtcLibrary, CompileError> {
    static FOUND: OnceLock<Result<NvrtcLibrary, CompileError>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let loaded_from = match std::env::var(NVRTC_LIB_ENV) {
                Ok(path) if !path.is_empty() => probe_library(&[path])?,
                _ => {
                    let mut candidates = cudarc::get_lib_name_candidates("nvrtc");
                    // Last resort: the pip wheel's folder, so a fresh machine needs no
                    // LD_LIBRARY_PATH after `pip install nvidia-cuda-nvrtc-cu12`.
                    if let Some(dir) = pip_nvrtc_lib_dir() {
                        candidates.push(dir.join("libnvrtc.so.12").display().to_string());
                    }
                    probe_library(&candidates)?
                }
            };
            let (mut major, mut minor) = (0, 0);
            // SAFETY: the library is loaded (probed above); the out-pointers are valid.
            let status = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
            nvrtc_ok("nvrtcVersion", status)?;
            Ok(NvrtcLibrary {
                loaded_from,
                version: (major, minor),
            })
        })
        .clone()
}

/// Loads the first of `candidates` (names for the loader's search, or paths) that opens and keeps
/// it loaded for the life of the process; returns which one. The error lists what was tried and
/// how to install NVRTC.
pub fn probe_library(candidates: &[String]) -> Result<String, CompileError> {
    let mut tried: Vec<&str> = Vec::new();
    let mut first_error = None;
    for candidate in candidates {
        if tried.contains(&candidate.as_str()) {
            continue;
        }
        tried.push(candidate);
        // SAFETY: loading libnvrtc runs only its (trusted, NVIDIA-shipped) initialisers.
        match unsafe { libloading::Library::new(candidate) } {
            Ok(lib) => {
                // Keep it loaded: cudarc's own dlopen by soname then finds this copy.
                std::mem::forget(lib);
                return Ok(candidate.clone());
            }
            Err(e) => {
                first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    Err(CompileError::Unavailable {
        reason: format!(
            "NVRTC (libnvrtc) not found; tried {} ({}). To fix: {INSTALL_HINT}",
            tried.join(", "),
            first_error.unwrap_or_else(|| "no candidates".into())
        ),
    })
}

/// The `lib` folder of the `nvidia-cuda-nvrtc-cu12` wheel, as `python3` on the PATH sees it
/// (asked once per process; None when python3 or the wheel is missing).
pub fn pip_nvrtc_lib_dir() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        pip_lib_dir("nvidia.cuda_nvrtc").filter(|dir| dir.join("libnvrtc.so.12").exists())
    })
    .clone()
}

/// The `lib` folder of an NVIDIA pip wheel's package (`nvidia.cuda_nvrtc`, `nvidia.cuda_cupti`,
/// ...), as `python3` on the PATH sees it; None when python3, the package or the folder is
/// missing. Asks python each call: callers keep the answer.
pub fn pip_lib_dir(package: &str) -> Option<PathBuf> {
    // The `nvidia.*` packages are namespace packages: their location is __path__[0], not __file__.
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            &format!("import {package} as m; print(m.__path__[0])"),
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim()).join("lib");
    (out.status.success() && dir.is_dir()).then_some(dir)
}

/// Directories with the CUDA device headers (`cuda_fp16.h`, `cuda_bf16.h`, ...), in search order:
/// `KEVIN_CUDA_INCLUDE`; the `cuda_runtime` pip package next to the libnvrtc on
/// `LD_LIBRARY_PATH` or `KEVIN_NVRTC_LIB` (site-packages/nvidia/cuda_runtime/include);
/// `$CUDA_HOME/include`; `/usr/local/cuda/include`. Only directories that hold `cuda_fp16.h`
/// count. Empty when none is found: kernels that include no header still compile.
pub fn find_cuda_include_dirs() -> Vec<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os(CUDA_INCLUDE_ENV) {
        candidates.push(PathBuf::from(dir));
    }
    let mut lib_dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(lib) = std::env::var_os(NVRTC_LIB_ENV) {
        if let Some(dir) = Path::new(&lib).parent() {
            lib_dirs.insert(0, dir.to_path_buf());
        }
    }
    lib_dirs.extend(pip_nvrtc_lib_dir());
    for dir in lib_dirs {
        if dir.join("libnvrtc.so.12").exists() || dir.join("libnvrtc.so").exists() {
            // pip layout: nvidia/cuda_nvrtc/lib -> nvidia/cuda_runtime/include;
            // toolkit layout: cuda/lib64 -> cuda/include.
            candidates.push(dir.join("../../cuda_runtime/include"));
            candidates.push(dir.join("../include"));
        }
    }
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        candidates.push(PathBuf::from(home).join("include"));
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));

    let mut found: Vec<PathBuf> = Vec::new();
    for dir in candidates {
        if dir.join("cuda_fp16.h").is_file() {
            let dir = dir.canonicalize().unwrap_or(dir);
            if !found.contains(&dir) {
                found.push(dir);
            }
        }
    }
    found
}

/// The option list for one request (everything but the source).
pub fn nvrtc_options(req: &CompileRequest, include_dirs: &[PathBuf]) -> Vec<String> {
    // A CUBIN is machine code for exactly one architecture (sm_XX); PTX is for a virtual one
    // (compute_XX) and is JIT-compiled by the driver at load time.
    let arch = match req.output {
        OutputKind::Cubin => req.arch.clone(),
        OutputKind::Ptx => req.arch.replacen("sm_", "compute_", 1),
    };
    let mut opts = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        // Candidates are device code only; no __device__/__host__ annotations needed on helpers.
        "--device-as-default-execution-space".to_string(),
        // No fast math: correctness is checked at 1e-4 and approximate division/sqrt would make
        // a correct algorithm fail. A candidate may still call the intrinsics explicitly.
    ];
    // -minimal (NVRTC >= 12.4) leaves out texture/surface functions, the device runtime API
    // and device-side launches, none of which device-only candidates can use: about 13% less
    // compile time (benches/results), and less surface for untrusted code.
    if locate_nvrtc().is_ok_and(|lib| lib.version >= (12, 4)) {
        opts.push("-minimal".to_string());
    }
    opts.extend(
        include_dirs
            .iter()
            .map(|d| format!("--include-path={}", d.display())),
    );
    opts.extend(req.extra_options.iter().cloned());
    opts
}

/// Compiles `req` in this process. Call this only in a worker child: the source is untrusted
/// and NVRTC may crash or hang on it.
pub fn compile_in_process(
    req: &CompileRequest,
    include_dirs: &[PathBuf],
) -> Result<CompileOutput, CompileError> {
    locate_nvrtc()?;
    let start = Instant::now();
    let source = CString::new(req.source.as_str()).map_err(|_| CompileError::InvalidRequest {
        reason: "source contains a NUL byte".into(),
    })?;
    let file_name = CString::new(super::SOURCE_FILE_NAME).unwrap_or_default();
    let name_exprs: Vec<CString> = req
        .kernel_names
        .iter()
        .map(|n| CString::new(format!("&{n}")).unwrap_or_default())
        .collect();
    let options: Vec<CString> = nvrtc_options(req, include_dirs)
        .into_iter()
        .map(|o| CString::new(o).unwrap_or_default())
        .collect();
    let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();

    let program = Program::create(&source, &file_name)?;
    for expr in &name_exprs {
        // SAFETY: `program` is live; `expr` outlives the call (NVRTC copies it).
        nvrtc_ok("nvrtcAddNameExpression", unsafe {
            sys::nvrtcAddNameExpression(program.0, expr.as_ptr())
        })?;
    }
    // SAFETY: `program` is live; the option strings outlive the call.
    let status = unsafe {
        sys::nvrtcCompileProgram(program.0, option_ptrs.len() as i32, option_ptrs.as_ptr())
    };
    let log = program.log()?;
    match status {
        sys::nvrtcResult::NVRTC_SUCCESS => {}
        // Includes passed the allow-list, so a header that cannot be found is missing from
        // this installation, not the candidate's fault.
        sys::nvrtcResult::NVRTC_ERROR_COMPILATION
            if include_dirs.is_empty() && log.contains("could not open source file") =>
        {
            return Err(CompileError::Unavailable {
                reason: format!(
                    "CUDA headers (cuda_fp16.h, ...) not found: `python3 -m pip install \
                     nvidia-cuda-runtime-cu12` (found next to libnvrtc on LD_LIBRARY_PATH) or set \
                     {CUDA_INCLUDE_ENV}; NVRTC said: {}",
                    super::feedback::trim_log(&log)
                ),
            })
        }
        sys::nvrtcResult::NVRTC_ERROR_COMPILATION => {
            return Err(CompileError::Source {
                log: super::feedback::trim_log(&log),
            })
        }
        other => nvrtc_ok("nvrtcCompileProgram", other)?,
    }

    let mut lowered_names = BTreeMap::new();
    for (name, expr) in req.kernel_names.iter().zip(&name_exprs) {
        let mut lowered: *const c_char = std::ptr::null();
        // SAFETY: `program` is compiled and live; NVRTC owns the returned string until destroy,
        // and it is copied before then.
        unsafe {
            nvrtc_ok(
                "nvrtcGetLoweredName",
                sys::nvrtcGetLoweredName(program.0, expr.as_ptr(), &mut lowered),
            )?;
            if !lowered.is_null() {
                let symbol = CStr::from_ptr(lowered).to_string_lossy().into_owned();
                lowered_names.insert(name.clone(), symbol);
            }
        }
    }
    // The PTX is there after a compile for a real architecture too (NVRTC compiles through
    // it): the rules on what was compiled read it whatever the output.
    let ptx = program.ptx()?;
    if let Some(register) = super::source_check::ptx_timer_register(&ptx) {
        return Err(CompileError::Rule {
            reason: format!(
                "the compiled code reads the GPU clock (`{register}`), which is not allowed \
                 (inline PTX is read after the preprocessor: a macro does not hide a timer register)"
            ),
        });
    }
    let image = match req.output {
        OutputKind::Ptx => ModuleImage::Ptx(ptx),
        OutputKind::Cubin => ModuleImage::Cubin(program.cubin()?),
    };
    Ok(CompileOutput {
        image,
        log,
        lowered_names,
        compile_ms: start.elapsed().as_secs_f64() * 1e3,
    })
}

/// An NVRTC program, destroyed on drop.
struct Program(sys::nvrtcProgram);

impl Program {
    fn create(source: &CStr, name: &CStr) -> Result<Self, CompileError> {
        let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: valid out-pointer and C strings; no headers are passed in memory.
        let status = unsafe {
            sys::nvrtcCreateProgram(
                &mut prog,
                source.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        nvrtc_ok("nvrtcCreateProgram", status)?;
        Ok(Program(prog))
    }

    fn log(&self) -> Result<String, CompileError> {
        let bytes = self.fetch(
            "nvrtcGetProgramLog",
            // SAFETY (all getters below): `p` is this live program and the buffer has the size
            // NVRTC reported.
            |p, n| unsafe { sys::nvrtcGetProgramLogSize(p, n) },
            |p, buf| unsafe { sys::nvrtcGetProgramLog(p, buf) },
        )?;
        Ok(String::from_utf8_lossy(trim_nul(&bytes)).into_owned())
    }

    fn ptx(&self) -> Result<String, CompileError> {
        let bytes = self.fetch(
            "nvrtcGetPTX",
            |p, n| unsafe { sys::nvrtcGetPTXSize(p, n) },
            |p, buf| unsafe { sys::nvrtcGetPTX(p, buf) },
        )?;
        Ok(String::from_utf8_lossy(trim_nul(&bytes)).into_owned())
    }

    /// Binary: no NUL to strip (an ELF may well end in a zero byte).
    fn cubin(&self) -> Result<Vec<u8>, CompileError> {
        self.fetch(
            "nvrtcGetCUBIN",
            |p, n| unsafe { sys::nvrtcGetCUBINSize(p, n) },
            |p, buf| unsafe { sys::nvrtcGetCUBIN(p, buf) },
        )
    }

    /// The size-then-fill pattern of NVRTC's getters.
    fn fetch(
        &self,
        call: &str,
        size: impl Fn(sys::nvrtcProgram, *mut usize) -> sys::nvrtcResult,
        fill: impl Fn(sys::nvrtcProgram, *mut c_char) -> sys::nvrtcResult,
    ) -> Result<Vec<u8>, CompileError> {
        let mut n = 0usize;
        nvrtc_ok(call, size(self.0, &mut n))?;
        let mut buf = vec![0u8; n];
        nvrtc_ok(call, fill(self.0, buf.as_mut_ptr().cast()))?;
        Ok(buf)
    }
}

/// NVRTC's text results end with a NUL terminator.
fn trim_nul(bytes: &[u8]) -> &[u8] {
    bytes.strip_suffix(&[0]).unwrap_or(bytes)
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram and destroyed only here.
        unsafe {
            let _ = sys::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

fn nvrtc_ok(call: &str, status: sys::nvrtcResult) -> Result<(), CompileError> {
    if status == sys::nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    // SAFETY: NVRTC returns a static string for every result code.
    let text = unsafe {
        let p = sys::nvrtcGetErrorString(status);
        if p.is_null() {
            format!("{status:?}")
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Err(CompileError::Nvrtc {
        call: call.to_string(),
        code: text,
    })
}
