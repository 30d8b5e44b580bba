//! A nats-server of kevin's own: JetStream with file storage in a folder, listening on a free
//! loopback port, stopped and its folder removed when dropped. `kevin bench remote` starts one
//! when it is given no `--nats`, and the remote tests start one each. nats-server comes from
//! Debian's `nats-server` package (2.9) or any other installation on `PATH`.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running nats-server.
pub struct LocalNatsServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

/// Why nats-server cannot run here, or None when it can.
pub fn missing() -> Option<String> {
    match Command::new("nats-server").arg("--version").output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "nats-server --version failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!(
            "nats-server is not installed ({e}; apt-get install nats-server)"
        )),
    }
}

impl LocalNatsServer {
    /// Starts nats-server in `dir` (created; its config, log and JetStream storage go there),
    /// with `extra` appended to its config (an `authorization` or `tls` block; "" for none), and
    /// waits until it listens.
    pub fn start(dir: &Path, extra: &str) -> Result<LocalNatsServer, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("finding a free port: {e}"))?
            .port();
        let mut conf = format!(
            "listen: \"127.0.0.1:{port}\"\njetstream {{ store_dir: {:?} }}\n",
            dir.join("js").display().to_string()
        );
        conf.push_str(extra);
        let conf_path = dir.join("nats.conf");
        std::fs::write(&conf_path, conf).map_err(|e| format!("{}: {e}", conf_path.display()))?;
        let child = spawn(dir, port)?;
        Ok(LocalNatsServer {
            child,
            port,
            dir: dir.to_path_buf(),
        })
    }

    /// Kills the server (as a crash would) and starts it again on the same port and storage.
    pub fn restart(&mut self) -> Result<(), String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn(&self.dir, self.port)?;
        Ok(())
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Its folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for LocalNatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts nats-server with `dir`'s config (its log appended to `dir/nats.log`) and waits until it
/// listens on `port`.
fn spawn(dir: &Path, port: u16) -> Result<Child, String> {
    let log_path = dir.join("nats.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("{}: {e}", log_path.display()))?;
    let mut child = Command::new("nats-server")
        .arg("-c")
        .arg(dir.join("nats.conf"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("starting nats-server: {e}"))?;
    let t0 = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "nats-server exited ({status}); see {}",
                log_path.display()
            ));
        }
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("nats-server did not listen on port {port} in 10 s"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(child)
}
