//! Snapshots on demand: asking a publishing process for
//! `torch.cuda.memory._snapshot()` through its publish directory, and
//! taking the answer to where the user is (docs/user/live.md).
//!
//! We create `<dir>/<who>.snapshot-request`; within one of its intervals the
//! publisher writes `<dir>/<who>.snapshot.pickle` (atomically) or
//! `<dir>/<who>.snapshot.error`. `<who>` is `<pid>-<instance>` as the
//! process knows itself (`Published::key`): the pid alone would be every
//! container's pid 1; a publisher from before instances answers to its pid.
//! The directory is the user's own 0700 one,
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

/// A snapshot asked of one process, from the request to its answer: the
/// live view's `S` and the `snapshot` command poll it until it is ready,
/// refused, or given up on (the process gone, or no answer in time), and a
/// request given up on is withdrawn.
#[derive(Debug, Clone)]
pub(crate) struct SnapshotRequest {
    dir: PathBuf,
    who: String,
    since: std::time::Instant,
    timeout: std::time::Duration,
}

/// Where a request stands after a poll.
#[derive(Debug)]
pub(crate) enum RequestState {
    Waiting,
    /// The snapshot, still in the publish directory: `deliver` takes it.
    Ready(PathBuf),
    /// No snapshot will come.
    Failed(NoSnapshot),
}

/// Why no snapshot will come.
#[derive(Debug, PartialEq)]
pub(crate) enum NoSnapshot {
    /// The process could not take it: its reason.
    Refused(String),
    /// The process exited before answering.
    Exited,
    /// No answer within the timeout: a publisher from before snapshots, or
    /// a process stuck.
    TimedOut(std::time::Duration),
}

impl std::fmt::Display for NoSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoSnapshot::Refused(why) => write!(f, "could not take a snapshot: {why}"),
            NoSnapshot::Exited => f.write_str("exited before answering the snapshot request"),
            NoSnapshot::TimedOut(t) => write!(
                f,
                "did not answer the snapshot request in {} s (its publisher predates snapshots, or it is stuck)",
                t.as_secs()
            ),
        }
    }
}

impl SnapshotRequest {
    /// Asks `who` (publishing in `dir`) for a snapshot, to be answered
    /// within `timeout`.
    pub(crate) fn ask(dir: &Path, who: &str, timeout: std::time::Duration) -> std::io::Result<SnapshotRequest> {
        request(dir, who)?;
        Ok(SnapshotRequest { dir: dir.to_path_buf(), who: who.to_string(), since: std::time::Instant::now(), timeout })
    }

    /// Where the request stands; `alive`: whether the process still runs.
    /// A request given up on is withdrawn.
    pub(crate) fn poll(&self, alive: bool) -> RequestState {
        match poll(&self.dir, &self.who) {
            Answer::Ready(from) => RequestState::Ready(from),
            Answer::Failed(why) => RequestState::Failed(NoSnapshot::Refused(why)),
            Answer::Pending if !alive => {
                withdraw(&self.dir, &self.who);
                RequestState::Failed(NoSnapshot::Exited)
            }
            Answer::Pending if self.since.elapsed() > self.timeout => {
                withdraw(&self.dir, &self.who);
                RequestState::Failed(NoSnapshot::TimedOut(self.timeout))
            }
            Answer::Pending => RequestState::Waiting,
        }
    }
}

fn name(who: &str, what: &str) -> String {
    format!("{who}.snapshot{what}")
}

/// Our mark that we wait for `who`'s answer: `<who>.snapshot-wait.<us>`.
/// Several askers at once (two `snapshot` commands, a view and a script)
/// each leave one; the answer is removed only by the last to take it, and
/// a stale answer only when nobody waits (docs/user/live.md).
fn mark(dir: &Path, who: &str) -> PathBuf {
    dir.join(format!("{}.{}", name(who, "-wait"), std::process::id()))
}

/// Whether another asker still waits for `who`'s answer (marks of askers
/// that have exited are removed).
fn others_wait(dir: &Path, who: &str) -> bool {
    let prefix = format!("{}.", name(who, "-wait"));
    let me = std::process::id();
    let Ok(rd) = std::fs::read_dir(dir) else { return false };
    rd.flatten().any(|e| {
        let n = e.file_name().to_string_lossy().into_owned();
        let Some(asker) = n.strip_prefix(&prefix).and_then(|a| a.parse::<u32>().ok()) else { return false };
        if asker == me {
            return false;
        }
        let alive = Path::new(&format!("/proc/{asker}")).exists();
        if !alive {
            let _ = std::fs::remove_file(e.path());
        }
        alive
    })
}

/// Asks `who` (publishing into `dir`) for a snapshot, or joins a request
/// another asker made; an answer from an earlier request nobody waits for
/// is removed first.
pub(crate) fn request(dir: &Path, who: &str) -> std::io::Result<()> {
    match std::fs::OpenOptions::new().write(true).create_new(true).open(mark(dir, who)) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    if !others_wait(dir, who) {
        for stale in [".pickle", ".error"] {
            let _ = std::fs::remove_file(dir.join(name(who, stale)));
        }
    }
    // O_EXCL|O_NOFOLLOW through create_new: never through a link.
    match std::fs::OpenOptions::new().write(true).create_new(true).open(dir.join(name(who, "-request"))) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Where the answer to `who`'s request stands.
pub(crate) fn poll(dir: &Path, who: &str) -> Answer {
    let done = dir.join(name(who, ".pickle"));
    if std::fs::symlink_metadata(&done).is_ok_and(|m| m.is_file()) {
        return Answer::Ready(done);
    }
    let err = dir.join(name(who, ".error"));
    if let Ok(m) = std::fs::symlink_metadata(&err) {
        if m.is_file() {
            let why = std::fs::read(&err).map(|b| String::from_utf8_lossy(&b[..b.len().min(500)]).into_owned());
            if !others_wait(dir, who) {
                let _ = std::fs::remove_file(&err);
            }
            let _ = std::fs::remove_file(mark(dir, who));
            return Answer::Failed(why.unwrap_or_else(|e| e.to_string()));
        }
    }
    Answer::Pending
}

/// Withdraws our wait (and the request, when nobody else waits: a process
/// that never answers must not find it later and pay for a snapshot nobody
/// reads).
pub(crate) fn withdraw(dir: &Path, who: &str) {
    let _ = std::fs::remove_file(mark(dir, who));
    if !others_wait(dir, who) {
        let _ = std::fs::remove_file(dir.join(name(who, "-request")));
    }
}

/// Puts the answer at `dest` (a new file: an existing one is never
/// replaced), across file systems if need be; the answer leaves the
/// publish directory once nobody else waits for it. `dest` failing leaves
/// nothing behind either.
pub(crate) fn deliver(from: &Path, dest: &Path) -> std::io::Result<()> {
    let (dir, who) = answer_of(from);
    let done = || {
        if let Some(dir) = dir {
            let _ = std::fs::remove_file(mark(dir, who));
            if !others_wait(dir, who) {
                let _ = std::fs::remove_file(from);
            }
        }
    };
    let r = copy_new(from, dest);
    done();
    r
}

fn copy_new(from: &Path, dest: &Path) -> std::io::Result<()> {
    if std::fs::symlink_metadata(dest).is_ok() {
        return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, "already exists"));
    }
    if std::fs::hard_link(from, dest).is_ok() {
        return Ok(());
    }
    let mut src = std::fs::File::open(from)?;
    let mut out = std::fs::OpenOptions::new().write(true).create_new(true).open(dest)?;
    std::io::copy(&mut src, &mut out)?;
    out.sync_all()
}

/// The publish directory and asker of an answer `<dir>/<who>.snapshot.pickle`.
fn answer_of(from: &Path) -> (Option<&Path>, &str) {
    let who = from.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".snapshot.pickle")).unwrap_or("");
    (from.parent(), who)
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
        request(&d, "5").unwrap();
        assert!(d.join("5.snapshot-request").exists());
        assert_eq!(poll(&d, "5"), Answer::Pending);
        std::fs::write(d.join("5.snapshot.error"), "RuntimeError('no')").unwrap();
        assert_eq!(poll(&d, "5"), Answer::Failed("RuntimeError('no')".into()));
        std::fs::write(d.join("5.snapshot.pickle"), b"x").unwrap();
        let Answer::Ready(p) = poll(&d, "5") else { panic!() };
        let dest = d.join("out.pickle");
        deliver(&p, &dest).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"x");
        assert!(!p.exists());
        std::fs::write(&p, b"y").unwrap();
        assert_eq!(deliver(&p, &dest).unwrap_err().kind(), std::io::ErrorKind::AlreadyExists);
        withdraw(&d, "5");
        assert!(!d.join("5.snapshot-request").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The request's states: waiting; refused with the process's reason;
    /// given up on (the process gone, or no answer in time), withdrawn;
    /// ready.
    #[test]
    fn a_request_waits_then_is_refused_given_up_on_or_ready() {
        use std::time::Duration;
        let d = std::env::temp_dir().join(format!("gpumem-top-snapreq3-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let r = SnapshotRequest::ask(&d, "3", Duration::from_secs(60)).unwrap();
        assert!(matches!(r.poll(true), RequestState::Waiting));
        std::fs::write(d.join("3.snapshot.error"), "OutOfMemoryError").unwrap();
        let RequestState::Failed(why) = r.poll(true) else { panic!() };
        assert_eq!(why, NoSnapshot::Refused("OutOfMemoryError".into()));
        assert_eq!(why.to_string(), "could not take a snapshot: OutOfMemoryError");
        // A process that exits without answering: withdrawn at once.
        let r = SnapshotRequest::ask(&d, "4", Duration::from_secs(60)).unwrap();
        assert!(matches!(r.poll(false), RequestState::Failed(NoSnapshot::Exited)));
        assert!(!d.join("4.snapshot-request").exists());
        // No answer in time: withdrawn, and said with the time it had.
        let r = SnapshotRequest::ask(&d, "6", Duration::ZERO).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let RequestState::Failed(why) = r.poll(true) else { panic!() };
        assert!(why.to_string().starts_with("did not answer the snapshot request in 0 s"), "{why}");
        assert!(!d.join("6.snapshot-request").exists());
        let r = SnapshotRequest::ask(&d, "7", Duration::from_secs(60)).unwrap();
        std::fs::write(d.join("7.snapshot.pickle"), b"z").unwrap();
        let RequestState::Ready(p) = r.poll(true) else { panic!() };
        assert_eq!(p, d.join("7.snapshot.pickle"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Two askers at once: the second joins the first's request instead
    /// of deleting its answer, both get the snapshot, and the answer
    /// leaves the directory with the last of them. An asker that exited
    /// does not hold it.
    #[test]
    fn two_askers_both_get_the_answer() {
        let d = std::env::temp_dir().join(format!("gpumem-top-snapreq2-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        // Another (live) asker: our parent process stands in for it.
        // SAFETY: getppid has no preconditions.
        let other = unsafe { libc::getppid() } as u32;
        std::fs::write(d.join(format!("9.snapshot-wait.{other}")), "").unwrap();
        std::fs::write(d.join("9.snapshot.pickle"), b"answer").unwrap();
        request(&d, "9").unwrap();
        assert!(d.join("9.snapshot.pickle").exists(), "the other asker's answer was kept");
        let Answer::Ready(p) = poll(&d, "9") else { panic!() };
        deliver(&p, &d.join("mine.pickle")).unwrap();
        assert_eq!(std::fs::read(d.join("mine.pickle")).unwrap(), b"answer");
        assert!(p.exists(), "still there for the other asker");
        std::fs::remove_file(d.join(format!("9.snapshot-wait.{other}"))).unwrap();
        // An exited asker's mark does not keep it.
        std::fs::write(d.join("9.snapshot-wait.4000000000"), "").unwrap();
        request(&d, "9").unwrap();
        assert!(!p.exists(), "nobody alive waits for the old answer: removed");
        std::fs::write(&p, b"second").unwrap();
        deliver(&p, &d.join("again.pickle")).unwrap();
        assert!(!p.exists() && !d.join("9.snapshot-wait.4000000000").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
