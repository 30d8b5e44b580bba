//! The replay queue's write-ahead log, in segments that are deleted once trained on.
//!
//! Layout: `wal/<first seq, 20 digits>.jsonl` in the run directory, one JSON line per accepted
//! group (`{"seq": .., "group": ..}`), sequence numbers contiguous and increasing across the
//! segments. Only the newest segment is written (the *active* one); when it reaches the segment
//! size, the next append opens a new segment named by that group's sequence number. A closed
//! segment is never written again.
//!
//! Compaction ([`compact`]): a closed segment is deleted once every sequence number in its range
//! (its first up to the next segment's first) is consumed (trained on or dropped as stale) by a
//! learner record line that a complete checkpoint covers. Recovery then never needs it: it
//! requeues only the groups no such line consumed. The active segment is never deleted, so its
//! name keeps the next sequence number even when everything before it is gone. Deleting is one
//! `unlink` per segment: a kill during compaction leaves some covered segments on disk, which
//! the next compaction deletes; nothing pending is ever in a deleted segment.
//!
//! Crash rules: every append is fsynced before it returns (an accepted group survives kill -9);
//! a torn last line of the active segment (the process died mid-write) is cut on open; an append
//! that fails midway is cut back at once, so the log never holds a torn line before an intact
//! one. A bad line in a closed segment is corruption, not a crash: opening fails naming the file
//! and line, and nothing is cut.
//!
//! A run directory from before segments (one `replay.wal` file, starting at sequence 0) is moved
//! to `wal/` as its first segment on open.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::replay::{GroupLog, ReplayError, ScoredGroup};

/// The segments' folder inside the run directory.
pub const WAL_DIR: &str = "wal";
/// The single-file log of run directories from before segments.
pub const LEGACY_WAL: &str = "replay.wal";
/// Default size at which the active segment is closed (bytes): `replay.wal_segment_kb`'s default.
pub const DEFAULT_SEGMENT_BYTES: u64 = crate::config::DEFAULT_WAL_SEGMENT_KB << 10;

/// One WAL line, as read: its `seq` has been read already (and checked against the group's)
/// by [`read_segment`].
#[derive(Deserialize)]
struct WalRecord {
    group: ScoredGroup,
}

/// One WAL line, as written (the same fields, borrowed: an append copies nothing).
#[derive(Serialize)]
struct WalRecordRef<'a> {
    seq: u64,
    group: &'a ScoredGroup,
}

/// A WAL line's sequence numbers only: the rest of the line is checked to be whole JSON but not
/// built (no strings, token ids or floats), so a consumed record costs a scan, not a parse.
#[derive(Deserialize)]
struct WalHead {
    seq: u64,
    group: GroupSeq,
}

#[derive(Deserialize)]
struct GroupSeq {
    seq: u64,
}

fn wal_err(path: &Path) -> impl Fn(std::io::Error) -> ReplayError + '_ {
    move |e| ReplayError::Wal {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// A segment file: its first sequence number and path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Segment {
    /// The sequence number of its first record (its name).
    pub first: u64,
    /// The file.
    pub path: PathBuf,
}

fn segment_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("{first:020}.jsonl"))
}

/// The segments of the log folder `dir`, oldest first (none when the folder does not exist).
/// Files that are not segments are ignored.
pub fn segments(dir: &Path) -> Result<Vec<Segment>, ReplayError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(wal_err(dir)(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let path = entry.map_err(wal_err(dir))?.path();
        let first = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".jsonl"))
            .filter(|n| n.len() == 20)
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(first) = first {
            out.push(Segment { first, path });
        }
    }
    out.sort();
    Ok(out)
}

/// The sequence numbers of every record of the log folder `dir`, oldest first (for tests and
/// tools; a torn tail ends a segment's list).
pub fn recorded_seqs(dir: &Path) -> Result<Vec<u64>, ReplayError> {
    let mut out = Vec::new();
    for seg in segments(dir)? {
        read_segment(&seg.path, |_| false, |seq, _, _| out.push(seq))?;
    }
    Ok(out)
}

/// How a segment's reading ended.
struct SegmentRead {
    /// Bytes of intact lines.
    good_len: u64,
    /// The file's length.
    len: u64,
    /// Intact lines.
    lines: usize,
}

/// Reads the intact lines of a segment in order, handing each record's sequence number and line
/// number (from 1) to `f`, with the line's text when `want(seq)` says so (recovery wants only the
/// pending ones, and builds them with [`build_groups`]); stops at the first line that is torn (no
/// newline, or neither of the log's own shape nor whole JSON) or whose sequence numbers differ.
fn read_segment(
    path: &Path,
    mut want: impl FnMut(u64) -> bool,
    mut f: impl FnMut(u64, usize, Option<String>),
) -> Result<SegmentRead, ReplayError> {
    let mut file = File::open(path).map_err(wal_err(path))?;
    let len = file.metadata().map_err(wal_err(path))?.len();
    // Whether the last line is whole: a line that runs to the end of the file is then intact.
    let ends_whole = len > 0 && {
        let mut last = [0u8];
        file.seek(SeekFrom::Start(len - 1))
            .and_then(|_| std::io::Read::read_exact(&mut file, &mut last))
            .and_then(|_| file.seek(SeekFrom::Start(0)))
            .map_err(wal_err(path))?;
        last[0] == b'\n'
    };
    let mut reader = BufReader::with_capacity(1 << 16, file);
    // Bytes, not text: a consumed record is never checked as UTF-8 or copied. Its head is read
    // in the reader's buffer and the rest skipped to the newline.
    let mut line = Vec::new();
    let (mut good_len, mut lines) = (0u64, 0usize);
    loop {
        let head = reader.fill_buf().map_err(wal_err(path))?;
        if head.is_empty() {
            break;
        }
        if let Some((seq, _)) = quick_head(head).filter(|&(a, b)| a == b && !want(a)) {
            let n = reader.skip_until(b'\n').map_err(wal_err(path))? as u64;
            if good_len + n == len && !ends_whole {
                break;
            }
            good_len += n;
            lines += 1;
            f(seq, lines, None);
            continue;
        }
        line.clear();
        let n = reader.read_until(b'\n', &mut line).map_err(wal_err(path))?;
        if n == 0 || line.last() != Some(&b'\n') {
            break;
        }
        let seqs = quick_seqs(&line).or_else(|| {
            serde_json::from_slice::<WalHead>(&line)
                .ok()
                .map(|h| (h.seq, h.group.seq))
        });
        let seq = match seqs {
            Some((seq, group_seq)) if seq == group_seq => seq,
            _ => break,
        };
        let text = match want(seq) {
            false => None,
            true => Some(String::from_utf8(std::mem::take(&mut line)).map_err(|_| {
                ReplayError::Wal {
                    path: path.display().to_string(),
                    reason: format!(
                        "line {} is not UTF-8: the file is corrupt, not torn by a crash; move \
                         the segment aside to resume without its groups",
                        lines + 1
                    ),
                }
            })?),
        };
        good_len += n as u64;
        lines += 1;
        f(seq, lines, text);
    }
    Ok(SegmentRead {
        good_len,
        len,
        lines,
    })
}

/// The two sequence numbers of a line as [`Wal::append`] writes it (`{"seq":N,"group":{"seq":M,`
/// first, the object closed at the end), read from its start without scanning the rest: a
/// consumed record of hundreds of KB then costs next to nothing. `None` for any other shape
/// (the caller then parses the line as JSON).
fn quick_seqs(line: &[u8]) -> Option<(u64, u64)> {
    let seqs = quick_head(line)?;
    line.trim_ascii_end().ends_with(b"}}").then_some(seqs)
}

/// The two sequence numbers at the start of a line of the log's own shape, from as much of it
/// as is at hand (None when it is not of that shape, or the numbers run past what is at hand).
fn quick_head(start: &[u8]) -> Option<(u64, u64)> {
    fn number(s: &[u8]) -> Option<(u64, &[u8])> {
        let end = s.iter().position(|c| !c.is_ascii_digit())?;
        let digits = std::str::from_utf8(&s[..end]).ok()?;
        Some((digits.parse().ok()?, &s[end..]))
    }
    let (seq, rest) = number(start.strip_prefix(b"{\"seq\":")?)?;
    let (group_seq, _) = number(rest.strip_prefix(b",\"group\":{\"seq\":")?)?;
    Some((seq, group_seq))
}

/// Builds the pending groups from their lines (segment index, line number, text), in order, on
/// every core: a restart's cost is parsing what is pending (token ids and log-probabilities,
/// hundreds of KB a group). A line that is whole JSON with matching sequence numbers but not a
/// group is corruption, not a torn write: an error naming the file and line, and nothing is cut.
fn build_groups(
    raw: Vec<(usize, usize, String)>,
    segs: &[Segment],
) -> Result<Vec<ScoredGroup>, ReplayError> {
    let build = |(seg, line, text): &(usize, usize, String)| {
        let rec = serde_json::from_str::<WalRecord>(text);
        rec.map(|rec| rec.group).map_err(|e| ReplayError::Wal {
            path: segs[*seg].path.display().to_string(),
            reason: format!(
                "line {line} is a record whose group cannot be read ({e}): the file is corrupt, \
                 not torn by a crash; move the segment aside to resume without its groups"
            ),
        })
    };
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(raw.len());
    if threads <= 1 {
        return raw.iter().map(build).collect();
    }
    let chunk = raw.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let parts: Vec<_> = raw
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().map(build).collect::<Vec<_>>()))
            .collect();
        let mut out = Vec::with_capacity(raw.len());
        for part in parts {
            out.extend(part.join().expect("parsing a WAL line does not panic"));
        }
        out.into_iter().collect()
    })
}

/// The open log: appends go to the active segment.
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    segment_bytes: u64,
    active: PathBuf,
    file: File,
    len: u64,
}

/// What [`Wal::open`] found.
#[derive(Debug)]
pub struct Opened {
    /// The log, ready to append.
    pub wal: Wal,
    /// The records no consumed set covers, oldest first.
    pub pending: Vec<ScoredGroup>,
    /// The next sequence number to assign.
    pub next_seq: u64,
    /// Records read (pending or not) and segments read: what recovery cost.
    pub records_read: usize,
    /// Segments read.
    pub segments_read: usize,
}

impl Wal {
    /// Opens (creating) the log of the run directory `root`, closing segments at
    /// `segment_bytes`, and returns the records whose sequence number is not in `consumed`.
    /// Moves a single-file log from before segments into place first, and cuts a torn tail off
    /// the active segment.
    pub fn open(
        root: &Path,
        segment_bytes: u64,
        consumed: &BTreeSet<u64>,
    ) -> Result<Opened, ReplayError> {
        let dir = root.join(WAL_DIR);
        fs::create_dir_all(&dir).map_err(wal_err(&dir))?;
        let legacy = root.join(LEGACY_WAL);
        if legacy.is_file() {
            let existing = segments(&dir)?;
            if let Some(seg) = existing.first() {
                return Err(ReplayError::Wal {
                    path: legacy.display().to_string(),
                    reason: format!(
                        "a single-file log beside the segments in {} (first {}): move one aside",
                        dir.display(),
                        seg.path.display()
                    ),
                });
            }
            let to = segment_path(&dir, 0);
            fs::rename(&legacy, &to).map_err(wal_err(&legacy))?;
            sync_dir(&dir)?;
            tracing::info!(from = %legacy.display(), to = %to.display(), "moved the write-ahead log into segments");
        }
        let mut segs = segments(&dir)?;
        if segs.is_empty() {
            let path = segment_path(&dir, 0);
            File::create(&path).map_err(wal_err(&path))?;
            sync_dir(&dir)?;
            segs.push(Segment { first: 0, path });
        }
        let mut raw: Vec<(usize, usize, String)> = Vec::new();
        let mut next_seq = 0u64;
        let mut records_read = 0usize;
        let last = segs.len() - 1;
        for (i, seg) in segs.iter().enumerate() {
            let end = segs.get(i + 1).map(|s| s.first);
            let mut bad: Option<String> = None;
            let read = read_segment(
                &seg.path,
                |seq| !consumed.contains(&seq),
                |seq, line, text| {
                    if bad.is_some() {
                        return;
                    }
                    if seq < seg.first.max(next_seq) || end.is_some_and(|e| seq >= e) {
                        bad = Some(format!(
                        "record {seq} is out of order (segment starts at {}, previous record {})",
                        seg.first,
                        next_seq.saturating_sub(1)
                    ));
                        return;
                    }
                    next_seq = seq + 1;
                    if let Some(text) = text {
                        raw.push((i, line, text));
                    }
                },
            )?;
            if let Some(reason) = bad {
                return Err(ReplayError::Wal {
                    path: seg.path.display().to_string(),
                    reason,
                });
            }
            records_read += read.lines;
            if read.good_len != read.len {
                if i != last {
                    return Err(ReplayError::Wal {
                        path: seg.path.display().to_string(),
                        reason: format!(
                            "line {} of a closed segment is not a whole record (the file is \
                             corrupt, not torn by a crash): move the segment aside to resume \
                             without its groups",
                            read.lines + 1
                        ),
                    });
                }
                tracing::warn!(path = %seg.path.display(), kept = read.good_len, cut = read.len - read.good_len, "cutting a torn tail off the write-ahead log");
                let f = OpenOptions::new()
                    .write(true)
                    .open(&seg.path)
                    .map_err(wal_err(&seg.path))?;
                f.set_len(read.good_len).map_err(wal_err(&seg.path))?;
                f.sync_all().map_err(wal_err(&seg.path))?;
            }
        }
        let pending = build_groups(raw, &segs)?;
        let active = segs[last].clone();
        next_seq = next_seq.max(active.first);
        let mut file = OpenOptions::new()
            .append(true)
            .open(&active.path)
            .map_err(wal_err(&active.path))?;
        let len = file.seek(SeekFrom::End(0)).map_err(wal_err(&active.path))?;
        Ok(Opened {
            wal: Wal {
                dir,
                segment_bytes: segment_bytes.max(1),
                active: active.path,
                file,
                len,
            },
            pending,
            next_seq,
            records_read,
            segments_read: segs.len(),
        })
    }

    /// The segments' folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends one group and fsyncs: when this returns Ok, the group survives kill -9. The
    /// active segment is closed first when it has reached the segment size. A failed write is
    /// cut back so that the next append follows the last intact record.
    pub fn append(&mut self, group: &ScoredGroup) -> Result<(), ReplayError> {
        let mut line = serde_json::to_string(&WalRecordRef {
            seq: group.seq,
            group,
        })
        .map_err(|e| ReplayError::Wal {
            path: self.active.display().to_string(),
            reason: e.to_string(),
        })?;
        line.push('\n');
        if self.len >= self.segment_bytes {
            self.rotate(group.seq)?;
        }
        let written = self
            .file
            .write_all(line.as_bytes())
            .and_then(|()| self.file.sync_data());
        match written {
            Ok(()) => {
                self.len += line.len() as u64;
                Ok(())
            }
            Err(e) => {
                // Best effort: if this fails too, the torn line is cut on the next open, and
                // the caller stops accepting (the error reaches the daemon).
                let _ = self.file.set_len(self.len);
                Err(wal_err(&self.active)(e))
            }
        }
    }

    /// Closes the active segment and opens a new one whose first record will be `first`.
    fn rotate(&mut self, first: u64) -> Result<(), ReplayError> {
        let path = segment_path(&self.dir, first);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(wal_err(&path))?;
        let len = file.metadata().map_err(wal_err(&path))?.len();
        if len != 0 {
            return Err(ReplayError::Wal {
                path: path.display().to_string(),
                reason: format!("a new segment for record {first} already holds {len} bytes"),
            });
        }
        sync_dir(&self.dir)?;
        self.file = file;
        self.active = path;
        self.len = 0;
        Ok(())
    }
}

impl GroupLog for Wal {
    fn append(&mut self, group: &ScoredGroup) -> Result<(), ReplayError> {
        Wal::append(self, group)
    }
}

fn sync_dir(dir: &Path) -> Result<(), ReplayError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(wal_err(dir))
}

/// What [`compact`] deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Compaction {
    /// Segments deleted.
    pub deleted: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Segments left (the active one included).
    pub kept: usize,
}

/// Deletes the closed segments of the log folder `dir` whose every sequence number is in
/// `consumed` (which must hold only what record lines covered by a complete checkpoint
/// consumed). The newest segment is never deleted. `limit` stops after that many deletions (a
/// test's stand-in for a kill midway).
pub fn compact(
    dir: &Path,
    consumed: &BTreeSet<u64>,
    limit: Option<usize>,
) -> Result<Compaction, ReplayError> {
    let segs = segments(dir)?;
    let mut out = Compaction {
        kept: segs.len(),
        ..Compaction::default()
    };
    for pair in segs.windows(2) {
        if limit.is_some_and(|l| out.deleted >= l) {
            break;
        }
        let (seg, next) = (&pair[0], &pair[1]);
        let covered = consumed.range(seg.first..next.first).count() as u64;
        if covered != next.first - seg.first {
            continue;
        }
        let bytes = fs::metadata(&seg.path).map(|m| m.len()).unwrap_or(0);
        fs::remove_file(&seg.path).map_err(wal_err(&seg.path))?;
        out.deleted += 1;
        out.bytes += bytes;
        out.kept -= 1;
    }
    if out.deleted > 0 {
        sync_dir(dir)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ReplaySection;
    use crate::replay::score_group;

    fn scored(seq: u64) -> ScoredGroup {
        score_group(
            seq,
            crate::replay::tests::group(seq, 0),
            &ReplaySection::default(),
        )
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kevin-wal-{name}-{}", std::process::id()));
        fs::remove_dir_all(&d).ok();
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn seqs(groups: &[ScoredGroup]) -> Vec<u64> {
        groups.iter().map(|g| g.seq).collect()
    }

    #[test]
    fn quick_seqs_read_the_logs_own_lines_and_nothing_else() {
        let line = serde_json::to_string(&WalRecordRef {
            seq: 7,
            group: &scored(7),
        })
        .unwrap()
            + "\n";
        assert_eq!(quick_seqs(line.as_bytes()), Some((7, 7)));
        let head: WalHead = serde_json::from_str(&line).unwrap();
        assert_eq!((head.seq, head.group.seq), (7, 7));
        // Other shapes go to the JSON parser: spaces, another field order, a torn line.
        assert_eq!(
            quick_seqs(b"{ \"seq\": 7, \"group\": {\"seq\": 7}}\n"),
            None
        );
        assert_eq!(quick_seqs(b"{\"group\":{\"seq\":7},\"seq\":7}\n"), None);
        assert_eq!(quick_seqs(&line.as_bytes()[..line.len() / 2]), None);
        assert_eq!(quick_seqs(b"{\"seq\":,\"group\":{\"seq\":7}}\n"), None);
    }

    #[test]
    fn records_with_token_arrays_from_before_packing_recover_beside_packed_ones() {
        let root = tmp("packed");
        let dir = root.join(WAL_DIR);
        fs::create_dir_all(&dir).unwrap();
        // The line of an older kevin: token ids and log-probabilities as arrays of numbers.
        let mut old = serde_json::to_value(WalRecordRef {
            seq: 0,
            group: &scored(0),
        })
        .unwrap();
        for traj in old["group"]["group"]["trajectories"]
            .as_array_mut()
            .unwrap()
        {
            for turn in traj.as_array_mut().unwrap() {
                turn["response_tokens"] = serde_json::json!([1, 2, 3]);
                turn["behaviour_logprobs"] = serde_json::json!([-0.5, -0.25, -1.0]);
            }
        }
        fs::write(segment_path(&dir, 0), format!("{old}\n")).unwrap();
        {
            let mut o = Wal::open(&root, DEFAULT_SEGMENT_BYTES, &BTreeSet::new()).unwrap();
            assert_eq!(o.pending, vec![scored(0)]);
            o.wal.append(&scored(1)).unwrap();
        }
        let text = fs::read_to_string(segment_path(&dir, 0)).unwrap();
        let new = text.lines().nth(1).unwrap();
        // [1, 2, 3] as little-endian u32s, and [-0.5, -0.25, -1.0] as f32s.
        assert!(
            new.contains("\"response_tokens\":\"AQAAAAIAAAADAAAA\""),
            "{new}"
        );
        assert!(
            new.contains("\"behaviour_logprobs\":\"AAAAvwAAgL4AAIC/\""),
            "{new}"
        );
        let o = Wal::open(&root, DEFAULT_SEGMENT_BYTES, &BTreeSet::new()).unwrap();
        assert_eq!(o.pending, vec![scored(0), scored(1)]);
        fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn a_line_that_is_not_utf8_is_passed_over_when_consumed_and_an_error_when_pending() {
        let root = tmp("utf8");
        let dir = root.join(WAL_DIR);
        fs::create_dir_all(&dir).unwrap();
        let seg = segment_path(&dir, 0);
        let mut bytes = b"{\"seq\":0,\"group\":{\"seq\":0,\"x\":\"".to_vec();
        bytes.extend_from_slice(&[0xff, 0xfe]);
        bytes.extend_from_slice(b"\"}}\n");
        fs::write(&seg, &bytes).unwrap();
        let o = Wal::open(&root, DEFAULT_SEGMENT_BYTES, &BTreeSet::from([0])).unwrap();
        assert_eq!((o.pending.len(), o.next_seq), (0, 1));
        drop(o);
        let msg = Wal::open(&root, DEFAULT_SEGMENT_BYTES, &BTreeSet::new())
            .unwrap_err()
            .to_string();
        assert!(msg.contains("line 1 is not UTF-8"), "{msg}");
        assert_eq!(fs::read(&seg).unwrap(), bytes, "nothing cut");
        fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn recovery_builds_only_the_pending_groups() {
        // A consumed record is read for its sequence number alone: a line whose group could not
        // be built (not a ScoredGroup) is passed over when consumed, and nothing is cut.
        let root = tmp("heads");
        let dir = root.join(WAL_DIR);
        fs::create_dir_all(&dir).unwrap();
        let seg = segment_path(&dir, 0);
        fs::write(
            &seg,
            b"{\"seq\":0,\"group\":{\"seq\":0,\"turns\":\"not a group\"}}\n",
        )
        .unwrap();
        let consumed = BTreeSet::from([0]);
        {
            let mut o = Wal::open(&root, DEFAULT_SEGMENT_BYTES, &consumed).unwrap();
            assert!(o.pending.is_empty());
            assert_eq!(o.next_seq, 1);
            o.wal.append(&scored(1)).unwrap();
            o.wal.append(&scored(2)).unwrap();
        }
        let o = Wal::open(&root, DEFAULT_SEGMENT_BYTES, &consumed).unwrap();
        assert_eq!(seqs(&o.pending), vec![1, 2]);
        assert_eq!(o.pending[1].group, scored(2).group);
        assert_eq!((o.next_seq, o.records_read), (3, 3));
        assert_eq!(fs::read_to_string(&seg).unwrap().lines().count(), 3);
        // Pending, the same line is corruption: an error naming the file and line; nothing cut.
        let e = Wal::open(&root, DEFAULT_SEGMENT_BYTES, &BTreeSet::new()).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("00000000000000000000.jsonl") && msg.contains("line 1"),
            "{msg}"
        );
        assert_eq!(fs::read_to_string(&seg).unwrap().lines().count(), 3);
        // Many pending groups are built in order (on several threads where there are cores).
        {
            let mut o = Wal::open(&root, DEFAULT_SEGMENT_BYTES, &consumed).unwrap();
            for seq in 3..40 {
                o.wal.append(&scored(seq)).unwrap();
            }
        }
        let o = Wal::open(&root, DEFAULT_SEGMENT_BYTES, &consumed).unwrap();
        assert_eq!(seqs(&o.pending), (1..40).collect::<Vec<_>>());
        fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn a_torn_tail_is_cut_and_appends_follow_the_last_intact_record() {
        let root = tmp("torn");
        let none = BTreeSet::new();
        {
            let mut o = Wal::open(&root, DEFAULT_SEGMENT_BYTES, &none).unwrap();
            assert!(o.pending.is_empty());
            assert_eq!(o.next_seq, 0);
            o.wal.append(&scored(0)).unwrap();
            o.wal.append(&scored(1)).unwrap();
        }
        // A crash in the middle of the third append.
        let seg = segment_path(&root.join(WAL_DIR), 0);
        let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
        f.write_all(b"{\"seq\":2,\"group\":{\"seq\":2,\"gro")
            .unwrap();
        drop(f);
        let mut o = Wal::open(&root, DEFAULT_SEGMENT_BYTES, &none).unwrap();
        assert_eq!(seqs(&o.pending), vec![0, 1]);
        assert_eq!(o.next_seq, 2);
        o.wal.append(&scored(2)).unwrap();
        let o = Wal::open(&root, DEFAULT_SEGMENT_BYTES, &none).unwrap();
        assert_eq!(seqs(&o.pending), vec![0, 1, 2]);
        fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn segments_rotate_compact_and_recovery_reads_only_what_is_left() {
        let root = tmp("rotate");
        let dir = root.join(WAL_DIR);
        let none = BTreeSet::new();
        let mut o = Wal::open(&root, 1, &none).unwrap();
        for s in 0..6 {
            o.wal.append(&scored(s)).unwrap();
        }
        drop(o);
        // One record per segment at a 1-byte segment size.
        let firsts: Vec<u64> = segments(&dir).unwrap().iter().map(|s| s.first).collect();
        assert_eq!(firsts, vec![0, 1, 2, 3, 4, 5]);
        // 0, 1, 2 and 4 consumed: segments 0-2 and 4 go; 3 is pending; 5 is active.
        let consumed: BTreeSet<u64> = [0, 1, 2, 4].into_iter().collect();
        // A kill after the first deletion: the rest is done next time.
        let c = compact(&dir, &consumed, Some(1)).unwrap();
        assert_eq!((c.deleted, c.kept), (1, 5));
        let o = Wal::open(&root, 1, &consumed).unwrap();
        assert_eq!(seqs(&o.pending), vec![3, 5]);
        assert_eq!(o.next_seq, 6);
        drop(o);
        let c = compact(&dir, &consumed, None).unwrap();
        assert_eq!((c.deleted, c.kept), (3, 2));
        assert!(c.bytes > 0);
        let o = Wal::open(&root, 1, &consumed).unwrap();
        assert_eq!(seqs(&o.pending), vec![3, 5]);
        assert_eq!((o.records_read, o.segments_read), (2, 2));
        drop(o);
        // Everything consumed: the active segment stays and keeps the next number.
        let all: BTreeSet<u64> = (0..6).collect();
        let c = compact(&dir, &all, None).unwrap();
        assert_eq!((c.deleted, c.kept), (1, 1));
        let mut o = Wal::open(&root, 1, &all).unwrap();
        assert!(o.pending.is_empty());
        assert_eq!(o.next_seq, 6);
        // The next append opens segment 6 (the active one holds record 5).
        o.wal.append(&scored(6)).unwrap();
        drop(o);
        let c = compact(&dir, &all, None).unwrap();
        assert_eq!((c.deleted, c.kept), (1, 1));
        let o = Wal::open(&root, 1, &all).unwrap();
        assert_eq!(seqs(&o.pending), vec![6]);
        assert_eq!(o.next_seq, 7);
        fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn an_empty_new_segment_keeps_the_next_number() {
        // A kill right after a rotation created the new segment, before its first record.
        let root = tmp("empty");
        let dir = root.join(WAL_DIR);
        let none = BTreeSet::new();
        let mut o = Wal::open(&root, 1, &none).unwrap();
        o.wal.append(&scored(0)).unwrap();
        drop(o);
        File::create(segment_path(&dir, 1)).unwrap();
        let all: BTreeSet<u64> = [0].into_iter().collect();
        compact(&dir, &all, None).unwrap();
        let o = Wal::open(&root, 1, &all).unwrap();
        assert_eq!(o.next_seq, 1);
        assert!(o.pending.is_empty());
        fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn a_legacy_single_file_log_becomes_the_first_segment() {
        let root = tmp("legacy");
        let none = BTreeSet::new();
        let mut o = Wal::open(&root, DEFAULT_SEGMENT_BYTES, &none).unwrap();
        o.wal.append(&scored(0)).unwrap();
        o.wal.append(&scored(1)).unwrap();
        drop(o);
        fs::rename(segment_path(&root.join(WAL_DIR), 0), root.join(LEGACY_WAL)).unwrap();
        fs::remove_dir_all(root.join(WAL_DIR)).unwrap();
        let o = Wal::open(&root, DEFAULT_SEGMENT_BYTES, &none).unwrap();
        assert_eq!(seqs(&o.pending), vec![0, 1]);
        assert!(!root.join(LEGACY_WAL).exists());
        drop(o);
        // Both at once is refused, naming the file.
        fs::write(root.join(LEGACY_WAL), "").unwrap();
        let err = Wal::open(&root, DEFAULT_SEGMENT_BYTES, &none).unwrap_err();
        assert!(err.to_string().contains(LEGACY_WAL), "{err}");
        fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn a_bad_line_in_a_closed_segment_is_an_error_that_names_it() {
        let root = tmp("corrupt");
        let dir = root.join(WAL_DIR);
        let none = BTreeSet::new();
        let mut o = Wal::open(&root, 1, &none).unwrap();
        for s in 0..3 {
            o.wal.append(&scored(s)).unwrap();
        }
        drop(o);
        let first = segment_path(&dir, 0);
        let text = fs::read_to_string(&first).unwrap();
        fs::write(&first, format!("{}garbage\n", text)).unwrap();
        let err = Wal::open(&root, 1, &none).unwrap_err().to_string();
        assert!(err.contains(&first.display().to_string()), "{err}");
        assert!(err.contains("line 2"), "{err}");
        // Nothing was cut.
        assert!(fs::read_to_string(&first).unwrap().ends_with("garbage\n"));
        fs::remove_dir_all(&root).ok();
    }
}
