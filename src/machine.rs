//! What this machine has to evaluate and train on, asked once in one place: the GPUs this
//! process may use ([`gpu_count`], [`has_gpu`]), their architecture ([`resolve_arch`]) and the
//! backend a command uses when none is named ([`default_backend`]: cuda where there is a GPU,
//! else cpu). Everything comes from `nvidia-smi` (and `CUDA_VISIBLE_DEVICES`), never from the
//! driver API: loading libcuda where there is no driver makes cudarc panic.
//!
//! Used by the environments, the CLI and the policy crate. It imports nothing of kevin's but
//! [`crate::compile::DEFAULT_ARCH`]; the driver calls themselves are [`crate::gpu::device`].

/// The architecture to compile for: `configured`, or for "auto" the compute capability of the
/// first GPU as nvidia-smi reports it (so a CUBIN/PTX fits the device that will run it), and
/// [`crate::compile::DEFAULT_ARCH`] when there is no GPU or no nvidia-smi. nvidia-smi is asked rather than the
/// driver API because loading libcuda where there is no driver makes cudarc panic.
pub fn resolve_arch(configured: &str) -> String {
    if configured != "auto" {
        return configured.to_string();
    }
    nvidia_smi_query("compute_cap")
        .and_then(|out| parse_compute_cap(&out))
        .unwrap_or_else(|| crate::compile::DEFAULT_ARCH.to_string())
}

/// Number of GPUs this process may use: the ones nvidia-smi lists (0 without a GPU or without
/// nvidia-smi), narrowed by `CUDA_VISIBLE_DEVICES` when it is set (nvidia-smi ignores it, CUDA
/// does not: a GPU index past the visible ones is an invalid device ordinal).
pub fn gpu_count() -> usize {
    let listed = nvidia_smi_query("index").map_or(0, |out| {
        out.lines().filter(|l| !l.trim().is_empty()).count()
    });
    visible_gpus(
        listed,
        std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
    )
}

/// Whether this process may use a GPU ([`gpu_count`] > 0).
pub fn has_gpu() -> bool {
    gpu_count() > 0
}

/// The backend for a machine with `gpus` usable GPUs: "cuda" where there is one, else "cpu".
pub fn default_backend_for(gpus: usize) -> &'static str {
    if gpus > 0 {
        "cuda"
    } else {
        "cpu"
    }
}

/// The backend commands use when none is named: "cuda" where nvidia-smi lists a GPU (that
/// `CUDA_VISIBLE_DEVICES` leaves visible), else "cpu".
pub fn default_backend() -> &'static str {
    default_backend_for(gpu_count())
}

/// How many of `listed` GPUs a `CUDA_VISIBLE_DEVICES` value leaves visible. CUDA reads the list
/// up to its first invalid entry ("-1", empty, or an index past the listed GPUs); UUIDs
/// (`GPU-...`, `MIG-...`) are taken as valid.
fn visible_gpus(listed: usize, cuda_visible_devices: Option<&str>) -> usize {
    let Some(list) = cuda_visible_devices else {
        return listed;
    };
    let visible = list
        .split(',')
        .map(str::trim)
        .take_while(|e| match e.parse::<usize>() {
            Ok(i) => i < listed,
            Err(_) => e.starts_with("GPU-") || e.starts_with("MIG-"),
        })
        .count();
    visible.min(listed)
}

/// Free memory of the GPU that CUDA numbers `ordinal` in this process, in bytes, as nvidia-smi
/// reports it now (`None` without nvidia-smi or that GPU). `CUDA_VISIBLE_DEVICES` maps the
/// ordinal to nvidia-smi's index when it lists indices.
pub fn gpu_free_bytes(ordinal: usize) -> Option<u64> {
    let out = nvidia_smi_query("memory.free")?;
    let index = smi_index(
        ordinal,
        std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
    )?;
    parse_mib_lines(&out).get(index).copied().flatten()
}

/// nvidia-smi's index of CUDA ordinal `ordinal`: the `ordinal`-th entry of
/// `CUDA_VISIBLE_DEVICES` when it is a number, the ordinal itself when the variable is unset,
/// `None` when the entry is a UUID or missing.
fn smi_index(ordinal: usize, cuda_visible_devices: Option<&str>) -> Option<usize> {
    match cuda_visible_devices {
        None => Some(ordinal),
        Some(list) => list.split(',').nth(ordinal)?.trim().parse().ok(),
    }
}

/// "143771 MiB\n512 MiB\n" (nvidia-smi's csv) -> bytes per line.
fn parse_mib_lines(text: &str) -> Vec<Option<u64>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let n = l.trim().trim_end_matches("MiB").trim();
            n.parse::<u64>().ok().map(|mib| mib << 20)
        })
        .collect()
}

/// `nvidia-smi --query-gpu=<field>` (one line per GPU), when it runs and succeeds.
fn nvidia_smi_query(field: &str) -> Option<String> {
    std::process::Command::new("nvidia-smi")
        .args([&format!("--query-gpu={field}"), "--format=csv,noheader"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// "9.0\n" (nvidia-smi's first line) -> "sm_90".
fn parse_compute_cap(text: &str) -> Option<String> {
    let (major, minor) = text.lines().next()?.trim().split_once('.')?;
    let (major, minor): (u32, u32) = (major.parse().ok()?, minor.parse().ok()?);
    Some(format!("sm_{major}{minor}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_visible_devices_narrows_the_gpus() {
        assert_eq!(visible_gpus(2, None), 2);
        assert_eq!(visible_gpus(2, Some("1")), 1);
        assert_eq!(visible_gpus(2, Some("0,1")), 2);
        assert_eq!(visible_gpus(2, Some("")), 0);
        assert_eq!(visible_gpus(2, Some("-1")), 0);
        assert_eq!(visible_gpus(2, Some("0,5,1")), 1);
        assert_eq!(visible_gpus(0, Some("0")), 0);
        assert_eq!(visible_gpus(8, Some("GPU-1a2b, GPU-3c4d")), 2);
    }

    #[test]
    fn free_memory_lines_and_visible_indices() {
        assert_eq!(
            parse_mib_lines("143771 MiB\n512 MiB\n\n"),
            vec![Some(143771 << 20), Some(512 << 20)]
        );
        assert_eq!(parse_mib_lines("[N/A]\n"), vec![None]);
        assert_eq!(smi_index(1, None), Some(1));
        assert_eq!(smi_index(1, Some("3,5")), Some(5));
        assert_eq!(smi_index(2, Some("3,5")), None);
        assert_eq!(smi_index(0, Some("GPU-1a2b")), None);
    }

    #[test]
    fn compute_capability_becomes_an_arch() {
        assert_eq!(parse_compute_cap("9.0\n9.0\n").as_deref(), Some("sm_90"));
        assert_eq!(parse_compute_cap("8.6").as_deref(), Some("sm_86"));
        assert_eq!(parse_compute_cap("N/A"), None);
        assert_eq!(resolve_arch("sm_80"), "sm_80");
        assert!(resolve_arch("auto").starts_with("sm_"));
    }
}
