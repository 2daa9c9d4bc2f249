//! Snapshots on demand: asking a publishing process for
//! `torch.cuda.memory._snapshot()` through its publish directory, and
//! taking the answer to where the user is (docs/live.md).
//!
//! We create `<dir>/<pid>.snapshot-request`; within one of its intervals the
//! publisher writes `<dir>/<pid>.snapshot.pickle` (atomically) or
//! `<dir>/<pid>.snapshot.error`. The directory is the user's own 0700 one,
//! so nobody else can ask or answer.

use std::path::{Path, PathBuf};

/// What a request has come to so far.
#[derive(Debug, PartialEq)]
pub(crate) enum Answer {
    Pending,
    /// The snapshot, still in the publish directory.
    Ready(PathBuf),
    /// The process could not take it: its reason.
    Failed(String),
}

fn name(pid: u32, what: &str) -> String {
    format!("{pid}.snapshot{what}")
}

/// Asks `pid` (publishing into `dir`) for a snapshot; a stale answer from
/// an earlier request is removed first.
pub(crate) fn request(dir: &Path, pid: u32) -> std::io::Result<()> {
    for stale in [".pickle", ".error"] {
        let _ = std::fs::remove_file(dir.join(name(pid, stale)));
    }
    // O_EXCL|O_NOFOLLOW through create_new: never through a link.
    match std::fs::OpenOptions::new().write(true).create_new(true).open(dir.join(name(pid, "-request"))) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Where the answer to `pid`'s request stands.
pub(crate) fn poll(dir: &Path, pid: u32) -> Answer {
    let done = dir.join(name(pid, ".pickle"));
    if std::fs::symlink_metadata(&done).is_ok_and(|m| m.is_file()) {
        return Answer::Ready(done);
    }
    let err = dir.join(name(pid, ".error"));
    if let Ok(m) = std::fs::symlink_metadata(&err) {
        if m.is_file() {
            let why = std::fs::read(&err).map(|b| String::from_utf8_lossy(&b[..b.len().min(500)]).into_owned());
            let _ = std::fs::remove_file(&err);
            return Answer::Failed(why.unwrap_or_else(|e| e.to_string()));
        }
    }
    Answer::Pending
}

/// Withdraws an unanswered request (a process that never answers must not
/// find it later and pay for a snapshot nobody reads).
pub(crate) fn withdraw(dir: &Path, pid: u32) {
    let _ = std::fs::remove_file(dir.join(name(pid, "-request")));
}

/// Moves the answer to `dest` (a new file: an existing one is never
/// replaced), across file systems if need be.
pub(crate) fn deliver(from: &Path, dest: &Path) -> std::io::Result<()> {
    if std::fs::symlink_metadata(dest).is_ok() {
        return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, "already exists"));
    }
    if std::fs::hard_link(from, dest).is_ok() {
        return std::fs::remove_file(from);
    }
    let mut src = std::fs::File::open(from)?;
    let mut out = std::fs::OpenOptions::new().write(true).create_new(true).open(dest)?;
    std::io::copy(&mut src, &mut out)?;
    out.sync_all()?;
    std::fs::remove_file(from)
}

/// `gpumem-top-snapshot-<pid>-<YYYYmmdd-HHMMSS>.pickle` in the current
/// directory, for time `t` (seconds since the epoch, UTC).
pub(crate) fn default_name(pid: u32, t: f64) -> PathBuf {
    let s = t.max(0.0) as i64;
    let (days, secs) = (s.div_euclid(86_400), s.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    PathBuf::from(format!(
        "gpumem-top-snapshot-{pid}-{y:04}{m:02}{d:02}-{:02}{:02}{:02}.pickle",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_utc_time() {
        assert_eq!(default_name(7, 0.0), PathBuf::from("gpumem-top-snapshot-7-19700101-000000.pickle"));
        // 2026-11-30 22:04:46 UTC.
        assert_eq!(default_name(42, 1_796_076_286.5), PathBuf::from("gpumem-top-snapshot-42-20261130-220446.pickle"));
        assert_eq!(default_name(1, 951_782_400.0), PathBuf::from("gpumem-top-snapshot-1-20000229-000000.pickle"));
    }

    #[test]
    fn a_request_is_answered_or_withdrawn() {
        let d = std::env::temp_dir().join(format!("gpumem-top-snapreq-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        request(&d, 5).unwrap();
        assert!(d.join("5.snapshot-request").exists());
        assert_eq!(poll(&d, 5), Answer::Pending);
        std::fs::write(d.join("5.snapshot.error"), "RuntimeError('no')").unwrap();
        assert_eq!(poll(&d, 5), Answer::Failed("RuntimeError('no')".into()));
        std::fs::write(d.join("5.snapshot.pickle"), b"x").unwrap();
        let Answer::Ready(p) = poll(&d, 5) else { panic!() };
        let dest = d.join("out.pickle");
        deliver(&p, &dest).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"x");
        assert!(!p.exists());
        std::fs::write(&p, b"y").unwrap();
        assert_eq!(deliver(&p, &dest).unwrap_err().kind(), std::io::ErrorKind::AlreadyExists);
        withdraw(&d, 5);
        assert!(!d.join("5.snapshot-request").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
