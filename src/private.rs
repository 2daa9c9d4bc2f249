//! Directories no other local user can plant files in or swap: where the
//! hooks a training command imports, and the snapshots it writes, live
//! (docs/design/security.md).
//!
//! A directory is private when it is a real directory (not a link), owned
//! by our effective uid, and writable by nobody else. A fresh one is made
//! with `mkdir(2)` under a random name, which fails on anything already
//! there, so a name another user guessed and planted is never reused.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Creates `dir` (mode 0700, its missing parents too) or checks that the
/// existing one is private: a directory, not a link, owned by us, writable
/// by nobody else. Anything else is refused
/// with a sentence saying why.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).recursive(true).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    check_private(dir)
}

/// Checks that `dir` is private (see `ensure_private_dir`).
pub fn check_private(dir: &Path) -> io::Result<()> {
    let m = std::fs::symlink_metadata(dir)?;
    if m.file_type().is_symlink() {
        return Err(refused("is a symbolic link"));
    }
    if !m.is_dir() {
        return Err(refused("is not a directory"));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if m.uid() != me {
        return Err(refused(&format!("belongs to uid {}, not to us (uid {me})", m.uid())));
    }
    if m.permissions().mode() & 0o022 != 0 {
        return Err(refused(&format!("is writable by others (mode {:o})", m.permissions().mode() & 0o7777)));
    }
    Ok(())
}

fn refused(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, format!("{why}; refusing to use it"))
}

/// A new directory `PREFIX-XXXXXXXXXXXX` (random) inside `parent`, mode
/// 0700, created by us now: never one that existed before.
pub fn fresh_dir(parent: &Path, prefix: &str) -> io::Result<PathBuf> {
    for _ in 0..32 {
        let dir = parent.join(format!("{prefix}-{:012x}", random() & 0xffff_ffff_ffff));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {
                // mkdir honours the umask: 0700 or less. Checked anyway, so
                // that a parent with odd ACL defaults cannot widen it.
                check_private(&dir)?;
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
                return Ok(dir);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("no fresh name for {prefix}-… in {}", parent.display())))
}

/// Our own private directory: `dir` when it is (or can be made) private;
/// when it cannot and `dir` is only the default `/tmp/gpumem-top-UID` (no
/// `--publish-dir`, `GPUMEM_TOP_DIR` or `XDG_RUNTIME_DIR` named it), a
/// fresh `$TMPDIR/gpumem-top-UID-XXXXXXXXXXXX` instead, as the publisher
/// falls back (and the live view reads those), with a sentence saying so.
/// Another user who made the default first then neither gets code run nor
/// stops us. A directory the user named is refused instead.
pub fn own_dir(dir: &Path, named: bool) -> io::Result<(PathBuf, Option<String>)> {
    match ensure_private_dir(dir) {
        Ok(()) => Ok((dir.to_path_buf(), None)),
        Err(e) if !named && e.kind() == io::ErrorKind::PermissionDenied => {
            // SAFETY: geteuid has no preconditions and cannot fail.
            let uid = unsafe { libc::geteuid() };
            let tmp = std::path::absolute(std::env::temp_dir())?;
            let fresh = fresh_dir(&tmp, &format!("gpumem-top-{uid}"))?;
            Ok((fresh.clone(), Some(format!("{}: {e}; using {} instead", dir.display(), fresh.display()))))
        }
        Err(e) => Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
    }
}

/// Whether the publish directory was named (`GPUMEM_TOP_DIR`,
/// `XDG_RUNTIME_DIR`) rather than the shared default.
pub fn dir_named_by_environment() -> bool {
    ["GPUMEM_TOP_DIR", "XDG_RUNTIME_DIR"].iter().any(|k| std::env::var_os(k).is_some_and(|v| !v.is_empty()))
}

/// A file created for writing that did not exist (O_EXCL, no link
/// followed), mode 0600.
pub fn create_new(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)
}

/// Writes `bytes` to a new file at `path` (O_EXCL: never through a link,
/// never over an existing file); with `force`, an existing regular file or
/// link at `path` is removed first (the link itself, not its target), and
/// anything else (a directory, a device, a FIFO) is still refused.
pub fn write_new(path: &Path, bytes: &[u8], force: bool) -> io::Result<()> {
    use std::io::Write;
    let mut f = open_new(path, force)?;
    f.write_all(bytes)?;
    f.flush()
}

/// `write_new` for a picture or report meant to be shared (an export, a
/// screenshot): mode 0644 under the umask, as any file a user makes, so a
/// report's pictures open for teammates; traces and the publisher's files
/// stay 0600.
pub fn write_report(path: &Path, bytes: &[u8], force: bool) -> io::Result<()> {
    use std::io::Write;
    let mut f = open_new_mode(path, force, 0o644)?;
    f.write_all(bytes)?;
    f.flush()
}

/// The file `write_new` writes to, opened: for output written as it is made.
pub fn open_new(path: &Path, force: bool) -> io::Result<std::fs::File> {
    open_new_mode(path, force, 0o600)
}

/// `open_new` with `mode` (the umask applies).
fn open_new_mode(path: &Path, force: bool, mode: u32) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    if force {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.is_file() || m.file_type().is_symlink() => std::fs::remove_file(path)?,
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "not a regular file; --force replaces only files and links",
                ))
            }
            Err(_) => {}
        }
    }
    std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(path).map_err(|e| {
        if e.kind() == io::ErrorKind::AlreadyExists {
            io::Error::new(io::ErrorKind::AlreadyExists, "already exists (--force replaces it)")
        } else {
            e
        }
    })
}

/// 64 random bits from the kernel (getrandom(2)), falling back to the
/// clock and pid where it is unavailable: names need only be unguessable
/// enough that a planted one is a collision `mkdir` reports.
fn random() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: the buffer is 8 writable bytes and getrandom writes at most
    // its length; flags 0 reads the urandom pool.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == 8 {
        return u64::from_ne_bytes(b);
    }
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_dirs_are_new_private_and_distinct() {
        let parent = std::env::temp_dir().join(format!("gpumem-top-test-private-{}", std::process::id()));
        ensure_private_dir(&parent).unwrap();
        let a = fresh_dir(&parent, "hook").unwrap();
        let b = fresh_dir(&parent, "hook").unwrap();
        assert_ne!(a, b);
        let mode = std::fs::metadata(&a).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // A file there cannot be created twice.
        create_new(&a.join("f")).unwrap();
        assert_eq!(create_new(&a.join("f")).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        // A group- or world-writable directory, and a link to a private
        // one, are refused.
        std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(check_private(&b).unwrap_err().to_string().contains("writable by others"));
        let link = parent.join("link");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        assert!(ensure_private_dir(&link).unwrap_err().to_string().contains("symbolic link"));
        std::fs::remove_dir_all(&parent).unwrap();
    }
}
