//! Compiling candidate CUDA (device code only) with NVRTC, in worker child processes.
//!
//! The daemon builds a [`CompileRequest`] and sends it through a [`CompilePool`] (a
//! [`WorkerPool`] of `kevin worker --role compile` children, default deadline 10 s); the child runs
//! [`worker_main`], which checks the source (`source_check`: only CUDA device headers may be
//! included), compiles it with [`nvrtc::compile_in_process`] and answers a [`CompileResponse`].
//! A compile error is data ([`CompileError::Source`] with a trimmed log naming file and line); a
//! candidate that hangs or crashes NVRTC becomes a [`WorkerFailure`] for its request, and the
//! child is replaced.
//!
//! Rules on what was compiled: the PTX of every compile (also fetched when the output is a
//! CUBIN; NVRTC keeps it) is searched for the timer and clock registers
//! (`source_check::ptx_timer_register`), so an inline-asm string assembled by macros, which the
//! source rules cannot read, is still caught: [`CompileError::Rule`]. `__has_include` is refused
//! before NVRTC runs (it would answer from this machine's file system).
//!
//! Output: PTX for a virtual architecture (`compute_90`) or, when a GPU is present, a CUBIN for
//! the exact one (`sm_90`), which spares the driver's JIT at load time. No fast math by default.
//! Which architecture "auto" means, and whether there is a GPU at all, is
//! [`crate::machine`]'s to say.
//!
//! Dependency direction: this folder imports only the worker pool ([`crate::worker`]); the
//! environments ([`crate::env`]) and the role table ([`crate::roles`]) import it, never the
//! other way round.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::worker::{
    serve, PoolConfig, ServeError, WorkerCommand, WorkerFailure, WorkerPool,
    DEFAULT_MAX_FRAME_BYTES,
};

pub mod feedback;
pub mod nvrtc;
mod source_check;

pub use nvrtc::{find_cuda_include_dirs, locate_nvrtc, NvrtcLibrary, INSTALL_HINT};

/// The file name NVRTC reports in its log (`candidate.cu(12): error: ...`).
pub const SOURCE_FILE_NAME: &str = "candidate.cu";

/// Default architecture: the H200.
pub const DEFAULT_ARCH: &str = "sm_90";

/// Largest accepted source, in bytes (the candidate format bounds it far lower).
pub const MAX_SOURCE_BYTES: usize = 256 * 1024;

/// Default deadline of one compile.
pub const DEFAULT_COMPILE_TIMEOUT: Duration = Duration::from_secs(10);

/// What NVRTC should produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputKind {
    /// PTX text for `compute_XX` (portable; the driver JIT-compiles it at load time).
    #[default]
    Ptx,
    /// Machine code for exactly `sm_XX` (what a GPU worker loads).
    Cubin,
}

/// One compile job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompileRequest {
    /// The candidate's CUDA source: device code only.
    pub source: String,
    /// Target architecture, `sm_XX` or `sm_XXa` (for example "sm_90").
    pub arch: String,
    /// PTX or CUBIN.
    pub output: OutputKind,
    /// Source names of the kernels the launch plan uses (see [`CompileOutput::lowered_names`]).
    pub kernel_names: Vec<String>,
    /// Extra NVRTC options, from kevin's configuration (never from the candidate).
    pub extra_options: Vec<String>,
}

impl CompileRequest {
    /// A PTX request for [`DEFAULT_ARCH`] with no extra options.
    pub fn ptx(source: impl Into<String>, kernel_names: &[&str]) -> Self {
        CompileRequest {
            source: source.into(),
            arch: DEFAULT_ARCH.to_string(),
            output: OutputKind::Ptx,
            kernel_names: kernel_names.iter().map(|s| s.to_string()).collect(),
            extra_options: Vec::new(),
        }
    }

    /// Checks everything that does not need NVRTC: sizes, the architecture, kernel names, and
    /// the candidate's `#include`s.
    pub fn validate(&self) -> Result<(), CompileError> {
        let invalid = |reason: String| Err(CompileError::InvalidRequest { reason });
        if self.source.len() > MAX_SOURCE_BYTES {
            return invalid(format!(
                "source is {} bytes, more than the limit of {MAX_SOURCE_BYTES}",
                self.source.len()
            ));
        }
        let digits = self
            .arch
            .strip_prefix("sm_")
            .map(|a| a.trim_end_matches('a'));
        if !digits
            .is_some_and(|d| (2..=3).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()))
        {
            return invalid(format!(
                "architecture {:?} is not of the form sm_90",
                self.arch
            ));
        }
        for name in &self.kernel_names {
            source_check::check_kernel_name(name).or_else(invalid)?;
        }
        // A forbidden include is the candidate's fault: report it like a compile error.
        source_check::check_includes(&self.source, SOURCE_FILE_NAME)
            .map_err(|log| CompileError::Source { log })?;
        source_check::check_has_include(&self.source, SOURCE_FILE_NAME)
            .map_err(|reason| CompileError::Rule { reason })
    }
}

/// A compiled module, ready for a GPU worker to load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompileOutput {
    /// The module.
    pub image: ModuleImage,
    /// NVRTC's log (warnings), possibly empty.
    pub log: String,
    /// Source kernel name -> symbol in the module (mangled unless `extern "C"`).
    pub lowered_names: BTreeMap<String, String>,
    /// Wall time of the NVRTC calls in the worker, in milliseconds.
    pub compile_ms: f64,
}

/// The compiled code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModuleImage {
    /// PTX text.
    Ptx(String),
    /// CUBIN (ELF) bytes, hex-encoded on the wire (JSON has no bytes; hex is 2x, a number array
    /// about 3.5x).
    Cubin(#[serde(with = "hex_bytes")] Vec<u8>),
}

impl ModuleImage {
    /// The bytes the driver loads (`cuModuleLoadData` takes a CUBIN or PTX text alike).
    pub fn into_bytes(self) -> Vec<u8> {
        match self {
            ModuleImage::Cubin(b) => b,
            ModuleImage::Ptx(p) => p.into_bytes(),
        }
    }
}

/// Why a compile produced no module.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum CompileError {
    /// The candidate does not compile (its fault): the trimmed log, naming file and line.
    #[error("compilation failed:\n{log}")]
    Source {
        /// NVRTC's log, trimmed to the first errors.
        log: String,
    },
    /// The source compiled, but what was compiled breaks a rule of the format (the PTX reads a
    /// timer register), or the source uses what the compiler must not be asked (`__has_include`):
    /// a format error of the candidate, like the static rules' (`crate::candidate::rules`).
    #[error("{reason}")]
    Rule {
        /// What is not allowed, for the policy.
        reason: String,
    },
    /// The request itself is malformed (kevin's fault, or a launch plan naming a bad kernel).
    #[error("invalid compile request: {reason}")]
    InvalidRequest {
        /// What is wrong.
        reason: String,
    },
    /// NVRTC is not installed or not on the loader path; the message says how to fix it.
    #[error("{reason}")]
    Unavailable {
        /// What was tried and the install instructions.
        reason: String,
    },
    /// An NVRTC call failed for another reason than the source (bad option, internal error).
    #[error("NVRTC call {call} failed: {code}")]
    Nvrtc {
        /// The NVRTC function.
        call: String,
        /// NVRTC's error string.
        code: String,
    },
}

/// The compile worker's answer.
pub type CompileResponse = Result<CompileOutput, CompileError>;

/// A pool of compile workers.
pub type CompilePool = WorkerPool<CompileRequest, CompileResponse>;

/// Starts a [`CompilePool`] of `workers` children running `command` (normally
/// `WorkerCommand::kevin_role(<kevin binary>, "compile")`), with the default 10 s deadline.
pub fn spawn_compile_pool(
    command: WorkerCommand,
    workers: usize,
) -> Result<CompilePool, WorkerFailure> {
    let config = PoolConfig {
        workers,
        request_timeout: DEFAULT_COMPILE_TIMEOUT,
        ..PoolConfig::default()
    };
    WorkerPool::new(command, config)
}

/// Compiles in this process: validation, then NVRTC. Untrusted source belongs in a worker child
/// ([`worker_main`]); this is what that child runs, and what benchmarks call directly.
pub fn compile(req: &CompileRequest, include_dirs: &[std::path::PathBuf]) -> CompileResponse {
    req.validate()?;
    nvrtc::compile_in_process(req, include_dirs)
}

/// The child side of the compile pool (`kevin worker --role compile`): serves [`CompileRequest`]s
/// on stdin/stdout until the parent closes the channel.
pub fn worker_main() -> Result<(), ServeError> {
    // Resolved once per worker: the header folders do not change while it runs. NVRTC itself is
    // located on the first request, so a missing library is reported per request (with the
    // install hint) instead of as a worker that cannot start.
    let include_dirs = find_cuda_include_dirs();
    serve("compile", DEFAULT_MAX_FRAME_BYTES, |req: CompileRequest| {
        compile(&req, &include_dirs)
    })
}

/// Hex encoding for byte vectors in JSON.
mod hex_bytes {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = String::with_capacity(bytes.len() * 2);
        for b in bytes {
            out.push(DIGITS[usize::from(b >> 4)] as char);
            out.push(DIGITS[usize::from(b & 15)] as char);
        }
        s.serialize_str(&out)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = <&str>::deserialize(d)?;
        if text.len() % 2 != 0 {
            return Err(D::Error::custom("odd-length hex string"));
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            _ => Err(D::Error::custom("invalid hex digit")),
        };
        text.as_bytes()
            .chunks(2)
            .map(|pair| Ok(nibble(pair[0])? << 4 | nibble(pair[1])?))
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests;
