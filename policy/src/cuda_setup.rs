//! Where burn's CUDA backend keeps the kernels it compiles, set once per process before the
//! first CUDA tensor.
//!
//! burn (through cubecl) compiles every kernel from CUDA C++ with NVRTC on first use, one at a
//! time: minutes for a model, measured on the H200 (see benches/results/). Without a cache every
//! process pays that again. kevin therefore always gives cubecl a persistent PTX cache:
//!
//! - `KEVIN_CUBECL_CACHE=DIR` when set, else `$XDG_CACHE_HOME/kevin/cubecl`, else
//!   `~/.cache/kevin/cubecl`, else `.kevin-cache/cubecl` under the working directory;
//! - a `cubecl.toml` (or `burn.toml` with a `[cubecl]` section) in the working directory or a
//!   parent is read first, as cubecl itself would; a cache it names wins;
//! - `KEVIN_CUBECL_LOG=FILE` appends the name of every kernel compiled (cubecl's "basic" level),
//!   which is how first-use compilation was measured; cubecl's own `CUBECL_DEBUG_LOG` still works.
//!
//! The PTX the driver turns into machine code has a cache of its own, `CUDA_CACHE_PATH`
//! (default `~/.nv/ComputeCache`); keep it next to this one on machines that start fresh.

use std::path::PathBuf;
use std::sync::OnceLock;

use burn::backend::cuda::CudaDevice;
use burn::cubecl::config::{
    cache::CacheConfig, compilation::CompilationLogLevel, CubeClRuntimeConfig, RuntimeConfig,
};

/// Environment variable naming the kernel cache directory.
pub const CACHE_ENV: &str = "KEVIN_CUBECL_CACHE";
/// Environment variable naming a file that lists every kernel compiled.
pub const LOG_ENV: &str = "KEVIN_CUBECL_LOG";

static CACHE_DIR: OnceLock<PathBuf> = OnceLock::new();

/// The default cache directory from the environment (see the module docs).
pub fn default_cache_dir(env: impl Fn(&str) -> Option<String>) -> PathBuf {
    let set = |key: &str| env(key).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = set(CACHE_ENV) {
        return dir;
    }
    if let Some(xdg) = set("XDG_CACHE_HOME") {
        return xdg.join("kevin").join("cubecl");
    }
    if let Some(home) = set("HOME") {
        return home.join(".cache").join("kevin").join("cubecl");
    }
    PathBuf::from(".kevin-cache").join("cubecl")
}

/// Configures cubecl (once per process; later calls return the first answer) and returns the
/// kernel cache directory in use. Must run before the first CUDA tensor is made: every CUDA
/// entry point of this crate goes through [`cuda_device`], which calls it.
pub fn configure() -> &'static PathBuf {
    CACHE_DIR.get_or_init(|| {
        let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
        let dir = match &config.compilation.cache {
            Some(cache) => cache.root(),
            None => {
                let dir = default_cache_dir(|k| std::env::var(k).ok());
                config.compilation.cache = Some(CacheConfig::File(dir.clone()));
                dir
            }
        };
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), "cannot create the kernel cache directory: {e}");
        }
        if let Some(file) = std::env::var_os(LOG_ENV).filter(|v| !v.is_empty()) {
            config.compilation.logger.file = Some(PathBuf::from(file));
            config.compilation.logger.level = CompilationLogLevel::Basic;
        }
        // Only fails if cubecl read its config already (a CUDA tensor made before this call):
        // that process keeps cubecl's defaults, which is slower, not wrong.
        if std::panic::catch_unwind(|| CubeClRuntimeConfig::set(config)).is_err() {
            tracing::warn!("cubecl was configured before kevin could set its kernel cache");
        }
        tracing::info!(
            cache = %dir.display(),
            "burn CUDA: kernels compile on first use (can take minutes) and are cached"
        );
        dir
    })
}

/// An error naming `what` when no GPU is visible: burn's CUDA backend would otherwise panic on
/// a thread of its own when it cannot load the driver.
pub fn require_gpu(what: &str) -> Result<(), String> {
    if !kevin::machine::has_gpu() {
        return Err(format!(
            "{what} asks for CUDA, but no GPU is visible (nvidia-smi lists none, or \
             CUDA_VISIBLE_DEVICES hides them); use the cpu device on this machine"
        ));
    }
    Ok(())
}

/// GPU `index` of burn's CUDA backend, with cubecl configured first.
pub fn cuda_device(index: usize) -> CudaDevice {
    configure();
    CudaDevice { index }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_dir_follows_the_environment_in_order() {
        fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| v.to_string())
            }
        }
        static ALL: [(&str, &str); 3] =
            [(CACHE_ENV, "/k"), ("XDG_CACHE_HOME", "/x"), ("HOME", "/h")];
        assert_eq!(default_cache_dir(env(&ALL)), PathBuf::from("/k"));
        assert_eq!(
            default_cache_dir(env(&ALL[1..])),
            PathBuf::from("/x/kevin/cubecl")
        );
        assert_eq!(
            default_cache_dir(env(&[(CACHE_ENV, ""), ("HOME", "/h")])),
            PathBuf::from("/h/.cache/kevin/cubecl")
        );
        assert_eq!(
            default_cache_dir(env(&[])),
            PathBuf::from(".kevin-cache/cubecl")
        );
    }
}
