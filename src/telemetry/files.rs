//! The run directory's growing files, kept bounded: size rotation with gzip, a disk budget that
//! removes the oldest archives, and the free space left on the disk.
//!
//! A rotated file is first renamed to its archive name (`episodes.000001.jsonl`,
//! `trace-0003.p0001.json`), then compressed next to itself (`*.gz.tmp`, fsynced, renamed to
//! `*.gz`) and only then removed. A crash at any point leaves either the plain archive (compressed
//! by the next [`finish_pending`]) or the `.gz` (a `.gz.tmp` is a torn compression and is removed):
//! nothing written is lost, and readers read either form ([`open_text`]).
//!
//! Archives are the only files the budget ever removes; the write-ahead log, the learner's record,
//! checkpoints and `metrics.jsonl` with its archives are never touched.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;

/// Suffix of a compressed archive.
pub const GZ: &str = ".gz";
const GZ_TMP: &str = ".gz.tmp";

/// Compresses `path` into `path.gz` and removes `path`; returns the new path.
pub fn gzip_in_place(path: &Path) -> io::Result<PathBuf> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io::Error::other(format!("{}: not a file name", path.display())))?;
    let tmp = path.with_file_name(format!("{name}{GZ_TMP}"));
    let done = path.with_file_name(format!("{name}{GZ}"));
    let mut input = BufReader::new(File::open(path)?);
    let out = File::create(&tmp)?;
    let mut enc = GzEncoder::new(BufWriter::new(out), Compression::fast());
    io::copy(&mut input, &mut enc)?;
    let out = enc.finish()?.into_inner().map_err(|e| e.into_error())?;
    out.sync_all()?;
    fs::rename(&tmp, &done)?;
    fs::remove_file(path)?;
    if let Some(dir) = path.parent() {
        File::open(dir).and_then(|d| d.sync_all()).ok();
    }
    Ok(done)
}

/// Reads a text file, plain or gzip (by its `.gz` suffix).
pub fn open_text(path: &Path) -> io::Result<Box<dyn BufRead>> {
    let file = File::open(path)?;
    if path.extension().is_some_and(|e| e == "gz") {
        Ok(Box::new(BufReader::new(GzDecoder::new(file))))
    } else {
        Ok(Box::new(BufReader::new(file)))
    }
}

/// The whole text of a plain or gzip file.
pub fn read_text(path: &Path) -> io::Result<String> {
    let mut s = String::new();
    open_text(path)?.read_to_string(&mut s)?;
    Ok(s)
}

/// A rotated file of the run directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archive {
    /// The file.
    pub path: PathBuf,
    /// Its size on disk.
    pub bytes: u64,
    /// When it was last written.
    pub modified: SystemTime,
}

/// True for a rotated file's name: `<stem>.<number>.<ext>[.gz]` or `<stem>.p<number>.<ext>[.gz]`
/// where the number is all digits.
fn is_archive_name(name: &str) -> bool {
    let name = name.strip_suffix(GZ).unwrap_or(name);
    let mut parts = name.rsplitn(3, '.');
    let (Some(ext), Some(num), Some(_stem)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let digits = num.strip_prefix('p').unwrap_or(num);
    !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && !ext.is_empty()
        && ext.bytes().all(|b| b.is_ascii_alphabetic())
}

/// The rotated files of `dir` (compressed or not yet), oldest first (by modification time, then
/// name).
pub fn archives(dir: &Path) -> io::Result<Vec<Archive>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let Some(entry) = gone(entry)? else { continue };
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !is_archive_name(name) {
            continue;
        }
        let Some(meta) = gone(entry.metadata())? else {
            continue;
        };
        if meta.is_file() {
            out.push(Archive {
                path: entry.path(),
                bytes: meta.len(),
                modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            });
        }
    }
    out.sort_by(|a, b| (a.modified, &a.path).cmp(&(b.modified, &b.path)));
    Ok(out)
}

/// Compresses the archives whose names start with `prefix` that a crash left plain, and removes
/// their torn compressions (`*.gz.tmp`), in `dir`. Only the owner of those files may call it, and
/// before it writes any: each writer finishes its own (episodes, a session's trace parts, the
/// learner's record), so none touches a compression another is running.
pub fn finish_pending(dir: &Path, prefix: &str) -> io::Result<usize> {
    let mut done = 0;
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !name.starts_with(prefix) {
            continue;
        }
        if name.ends_with(GZ_TMP) {
            gone(fs::remove_file(&path))?;
        } else if is_archive_name(name) && !name.ends_with(GZ) {
            gzip_in_place(&path)?;
            done += 1;
        }
    }
    Ok(done)
}

/// Ok(None) for a file that went away (the daemon renames and removes files while it runs).
fn gone<T>(r: io::Result<T>) -> io::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Bytes of every file under `dir` (files removed while it looks are not counted).
pub fn dir_bytes(dir: &Path) -> io::Result<u64> {
    let mut total = 0;
    let Some(entries) = gone(fs::read_dir(dir))? else {
        return Ok(0);
    };
    for entry in entries {
        let Some(entry) = gone(entry)? else { continue };
        let Some(meta) = gone(entry.metadata())? else {
            continue;
        };
        total += if meta.is_dir() {
            dir_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// What [`enforce_budget`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BudgetCheck {
    /// The run directory's size before.
    pub before: u64,
    /// Its size after.
    pub after: u64,
    /// Archives removed, oldest first.
    pub removed: Vec<PathBuf>,
}

impl BudgetCheck {
    /// True when the directory is still over `budget` with no archive left to remove.
    pub fn over(&self, budget: u64) -> bool {
        self.after > budget
    }
}

/// Logs whose archives the budget never removes: `metrics.jsonl` is the run's whole history for
/// `kevin report` (about 1 KB a learner step, a fifth of that compressed).
pub const KEPT_LOGS: &[&str] = &["metrics"];

fn kept(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    KEPT_LOGS
        .iter()
        .any(|stem| archive_number(name, stem).is_some())
}

/// Removes the oldest compressed archives of `dir` (never those of [`KEPT_LOGS`]) until the directory's size is within `budget`
/// bytes (or none is left). Plain archives are left for their compression to finish.
pub fn enforce_budget(dir: &Path, budget: u64) -> io::Result<BudgetCheck> {
    let before = dir_bytes(dir)?;
    let mut check = BudgetCheck {
        before,
        after: before,
        removed: Vec::new(),
    };
    if before <= budget {
        return Ok(check);
    }
    for a in archives(dir)? {
        if check.after <= budget {
            break;
        }
        if !a.path.to_str().is_some_and(|p| p.ends_with(GZ)) || kept(&a.path) {
            continue;
        }
        gone(fs::remove_file(&a.path))?;
        check.after = check.after.saturating_sub(a.bytes);
        check.removed.push(a.path);
    }
    Ok(check)
}

/// Bytes free for an unprivileged writer on the file system holding `path`.
#[cfg(unix)]
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::other(format!("{}: NUL in path", path.display())))?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Free space is not measured off unix: always plenty.
#[cfg(not(unix))]
pub fn free_bytes(_path: &Path) -> io::Result<u64> {
    Ok(u64::MAX)
}

/// One more than the highest archive number of the log `stem` in `dir` (`<stem>.<N>.<ext>[.gz]`).
pub fn next_archive_number(dir: &Path, stem: &str) -> io::Result<u64> {
    let mut last = 0;
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name();
        if let Some(n) = name.to_str().and_then(|n| archive_number(n, stem)) {
            last = last.max(n);
        }
    }
    Ok(last + 1)
}

/// The number of an archive of the log `stem` (`<stem>.<N>.<ext>[.gz]`), if `name` is one.
fn archive_number(name: &str, stem: &str) -> Option<u64> {
    if name.ends_with(GZ_TMP) || !is_archive_name(name) {
        return None;
    }
    name.strip_prefix(stem)?
        .strip_prefix('.')?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// A JSON-lines file that rotates by size: `<stem>.<ext>` is written; at `max_bytes` it becomes
/// `<stem>.<NNNNNN>.<ext>.gz` and a new `<stem>.<ext>` starts.
#[derive(Debug)]
pub struct RotatingLog {
    dir: PathBuf,
    stem: String,
    ext: String,
    max_bytes: u64,
    out: BufWriter<File>,
    len: u64,
}

impl RotatingLog {
    /// Opens (appending) `dir/<stem>.<ext>`, first compressing archives a crash left plain.
    /// `max_bytes` 0 never rotates.
    pub fn open(dir: &Path, stem: &str, ext: &str, max_bytes: u64) -> io::Result<RotatingLog> {
        finish_pending(dir, &format!("{stem}."))?;
        let path = dir.join(format!("{stem}.{ext}"));
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        let len = file.metadata()?.len();
        Ok(RotatingLog {
            dir: dir.to_path_buf(),
            stem: stem.to_owned(),
            ext: ext.to_owned(),
            max_bytes,
            out: BufWriter::new(file),
            len,
        })
    }

    /// The live file.
    pub fn path(&self) -> PathBuf {
        self.dir.join(format!("{}.{}", self.stem, self.ext))
    }

    /// Writes one line (a newline is added), rotating first when the live file is full.
    pub fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        if self.max_bytes > 0 && self.len >= self.max_bytes {
            self.rotate()?;
        }
        self.out.write_all(line)?;
        self.out.write_all(b"\n")?;
        self.len += line.len() as u64 + 1;
        Ok(())
    }

    /// Flushes the live file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Closes the live file as the next archive, compresses it, and starts a new one.
    pub fn rotate(&mut self) -> io::Result<PathBuf> {
        self.out.flush()?;
        let next = next_archive_number(&self.dir, &self.stem)?;
        let live = self.path();
        let archive = self
            .dir
            .join(format!("{}.{next:06}.{}", self.stem, self.ext));
        fs::rename(&live, &archive)?;
        let file = OpenOptions::new().create(true).append(true).open(&live)?;
        self.out = BufWriter::new(file);
        self.len = 0;
        gzip_in_place(&archive)
    }

    /// Every line of the log, oldest first: its archives, then the live file.
    pub fn read_all(dir: &Path, stem: &str, ext: &str) -> io::Result<Vec<String>> {
        match read_rotated(&dir.join(format!("{stem}.{ext}"))) {
            Ok(text) => Ok(text.lines().map(str::to_owned).collect()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }
}

/// The files of the log `dir/<stem>.<ext>`, oldest first: its archives by number, then the live
/// file (which may not exist).
fn log_parts(dir: &Path, stem: &str, ext: &str) -> io::Result<Vec<PathBuf>> {
    let mut parts: Vec<(u64, PathBuf)> = Vec::new();
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let n = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| archive_number(n, stem));
        if let Some(n) = n {
            parts.push((n, path));
        }
    }
    parts.sort();
    let live = dir.join(format!("{stem}.{ext}"));
    Ok(parts
        .into_iter()
        .map(|(_, p)| p)
        .chain(Some(live))
        .collect())
}

/// The whole text of the rotated log whose live file is `live` (`dir/<stem>.<ext>`): its
/// archives, oldest first, then the live file, each ending in a newline (line numbers count
/// through them all). NotFound when there is neither.
pub fn read_rotated(live: &Path) -> io::Result<String> {
    let (dir, name) = match (live.parent(), live.file_name().and_then(|n| n.to_str())) {
        (Some(d), Some(n)) => (
            if d.as_os_str().is_empty() {
                Path::new(".")
            } else {
                d
            },
            n,
        ),
        _ => return Err(io::Error::other(format!("{}: not a file", live.display()))),
    };
    let Some((stem, ext)) = name.split_once('.') else {
        return read_text(live);
    };
    let mut text = String::new();
    let mut found = false;
    for path in log_parts(dir, stem, ext)? {
        match open_text(&path) {
            Ok(mut r) => {
                found = true;
                // Bytes that are not UTF-8 (a torn write) become U+FFFD: the line is then a bad
                // line for the reader to report, not an unreadable file.
                let mut bytes = Vec::new();
                r.read_to_end(&mut bytes)?;
                text.push_str(&String::from_utf8_lossy(&bytes));
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    if !found {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{}: no such file, and no archives of it", live.display()),
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kevin-files-{name}-{}", std::process::id()));
        fs::remove_dir_all(&d).ok();
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_log_rotates_compresses_and_reads_back_in_order() {
        let dir = tmp("rotate");
        let mut log = RotatingLog::open(&dir, "episodes", "jsonl", 100).unwrap();
        for i in 0..50 {
            log.write_line(format!("{{\"i\":{i},\"pad\":\"xxxxxxxxxx\"}}").as_bytes())
                .unwrap();
        }
        log.flush().unwrap();
        drop(log);
        let archives = archives(&dir).unwrap();
        assert!(archives.len() >= 5, "{archives:?}");
        assert!(archives
            .iter()
            .all(|a| a.path.to_str().unwrap().ends_with(".jsonl.gz")));
        let lines = RotatingLog::read_all(&dir, "episodes", "jsonl").unwrap();
        let want: Vec<String> = (0..50)
            .map(|i| format!("{{\"i\":{i},\"pad\":\"xxxxxxxxxx\"}}"))
            .collect();
        assert_eq!(lines, want);
        // Reopened, it appends after the archives, numbering on.
        let mut log = RotatingLog::open(&dir, "episodes", "jsonl", 100).unwrap();
        log.write_line(b"{\"i\":50}").unwrap();
        log.rotate().unwrap();
        let lines = RotatingLog::read_all(&dir, "episodes", "jsonl").unwrap();
        assert_eq!(lines.last().unwrap(), "{\"i\":50}");
        assert_eq!(lines.len(), 51);
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_rotated_log_reads_back_whole_through_its_live_path() {
        let dir = tmp("rotated");
        let live = dir.join("metrics.jsonl");
        assert_eq!(
            read_rotated(&live).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        let mut log = RotatingLog::open(&dir, "metrics", "jsonl", 30).unwrap();
        for i in 0..10 {
            log.write_line(format!("{{\"step\":{i},\"x\":\"0123456789\"}}").as_bytes())
                .unwrap();
        }
        log.rotate().unwrap();
        drop(log);
        // Every line is in an archive now, the live file is empty; another log's archive and an
        // unterminated live line do not get in the way.
        fs::write(dir.join("episodes.000001.jsonl"), "{\"other\":1}\n").unwrap();
        assert_eq!(fs::read_to_string(&live).unwrap(), "");
        fs::write(&live, "{\"step\":10}").unwrap();
        let text = read_rotated(&live).unwrap();
        let steps: Vec<u64> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(steps, (0..=10).collect::<Vec<_>>());
        // Only archives, no live file: still read.
        fs::remove_file(&live).unwrap();
        assert_eq!(read_rotated(&live).unwrap().lines().count(), 10);
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_crash_mid_compression_loses_nothing() {
        let dir = tmp("crash");
        // A rotation renamed the file, then died while compressing it.
        fs::write(dir.join("episodes.000001.jsonl"), "{\"a\":1}\n").unwrap();
        fs::write(dir.join("episodes.000001.jsonl.gz.tmp"), "torn").unwrap();
        fs::write(dir.join("episodes.jsonl"), "{\"a\":2}\n").unwrap();
        let log = RotatingLog::open(&dir, "episodes", "jsonl", 0).unwrap();
        drop(log);
        assert!(dir.join("episodes.000001.jsonl.gz").exists());
        assert!(!dir.join("episodes.000001.jsonl").exists());
        assert!(!dir.join("episodes.000001.jsonl.gz.tmp").exists());
        assert_eq!(
            RotatingLog::read_all(&dir, "episodes", "jsonl").unwrap(),
            vec!["{\"a\":1}", "{\"a\":2}"]
        );
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_budget_removes_the_oldest_archives_only() {
        let dir = tmp("budget");
        fs::write(dir.join("metrics.jsonl"), vec![b'm'; 1000]).unwrap();
        fs::create_dir_all(dir.join("wal")).unwrap();
        fs::write(
            dir.join("wal").join("00000000000000000000.jsonl"),
            vec![b'w'; 1000],
        )
        .unwrap();
        for (i, name) in [
            "metrics.000001.jsonl",
            "episodes.000001.jsonl",
            "trace-0001.p0001.json",
            "episodes.000002.jsonl",
        ]
        .iter()
        .enumerate()
        {
            let p = dir.join(name);
            fs::write(&p, vec![b'x'; 5000]).unwrap();
            let gz = gzip_in_place(&p).unwrap();
            let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000 + i as u64);
            File::options()
                .write(true)
                .open(&gz)
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        let sizes: Vec<u64> = archives(&dir).unwrap().iter().map(|a| a.bytes).collect();
        let total = dir_bytes(&dir).unwrap();
        // Room for everything but the oldest archive that may go (the metrics' is older, and
        // kept).
        let check = enforce_budget(&dir, total - sizes[1]).unwrap();
        assert_eq!(check.removed, vec![dir.join("episodes.000001.jsonl.gz")]);
        assert!(!check.over(total - sizes[1]));
        // A budget below what may not be removed: every archive goes, the rest stays, and the
        // check says it is still over.
        let check = enforce_budget(&dir, 100).unwrap();
        assert_eq!(check.removed.len(), 2);
        assert!(check.over(100));
        assert!(dir.join("metrics.jsonl").exists());
        assert!(dir.join("metrics.000001.jsonl.gz").exists());
        assert!(dir.join("wal").join("00000000000000000000.jsonl").exists());
        assert!(free_bytes(&dir).unwrap() > 0);
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn archive_names() {
        for ok in [
            "episodes.000001.jsonl",
            "episodes.000001.jsonl.gz",
            "trace-0003.p0001.json.gz",
        ] {
            assert!(is_archive_name(ok), "{ok}");
        }
        for not in [
            "episodes.jsonl",
            "trace-0003.json",
            "metrics.jsonl",
            "config.toml",
            "kevin.lock",
            "a.b.c",
            "learner.000003.tmp-1234",
        ] {
            assert!(!is_archive_name(not), "{not}");
        }
    }
}
