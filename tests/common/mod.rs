//! Helpers shared by the integration tests.

use std::io::Read;
use std::path::PathBuf;

pub mod pickler;

use gpumem_top::alloc::{Action, Event};
use serde_json::Value;

/// The project root. Read at run time first, so test binaries copied to
/// another machine (the GPU bundle) find the fixtures beside them.
pub fn root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

pub fn fixture(rel: &str) -> PathBuf {
    root().join("tests/fixtures").join(rel)
}

pub fn read_gz_json(path: &std::path::Path) -> Value {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut s = String::new();
    flate2::read::GzDecoder::new(f).read_to_string(&mut s).unwrap();
    serde_json::from_str(&s).unwrap()
}

pub const VECTORS: [&str; 10] = [
    "default",
    "fraction_0999",
    "expandable",
    "fraction_default",
    "fraction_expandable",
    "fraction_gc_threshold",
    "fraction_max_split",
    "max_split",
    "roundup_divisions_4",
    "roundup_list",
];

pub fn vector(name: &str) -> Value {
    read_gz_json(&fixture(&format!("vectors/{name}.json.gz")))
}

pub fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

/// A vector's recorded trace: `[action, addr, size, stream]` rows.
pub fn recorded_trace(d: &Value) -> gpumem_top::alloc::Events {
    d["trace"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let action = Action::from_name(t[0].as_str().unwrap()).unwrap();
            Event::new(action, t[1].as_u64().unwrap_or(0), u(&t[2]), u(&t[3]))
        })
        .collect()
}

/// The live view drawn on a `w`×`h` test terminal, as text.
pub fn render_live(app: &mut impl gpumem_top::ui::event::Interactive, w: u16, h: u16) -> String {
    render_app(app, w, h)
}

/// Any app drawn on a `w`×`h` test terminal through its own code, as text.
pub fn render_app(app: &mut impl gpumem_top::ui::event::Interactive, w: u16, h: u16) -> String {
    render_screen(app, w, h)
}

/// `render_app` of a screen of a stack (`Screens::top`).
pub fn render_screen(app: &dyn gpumem_top::ui::event::Interactive, w: u16, h: u16) -> String {
    let mut t = ratatui_core::terminal::Terminal::new(ratatui_core::backend::TestBackend::new(w, h)).unwrap();
    t.draw(|f| {
        let a = f.area();
        app.draw_into(a, f.buffer_mut())
    })
    .unwrap();
    t.backend().to_string()
}

/// The `gpumem-top` binary cargo built for these tests, or on the GPU
/// machine (where the build tree is not) the bundle's copy in `.gpu/`.
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let built = env!("CARGO_BIN_EXE_gpumem-top");
        if std::path::Path::new(built).exists() {
            return built.to_string();
        }
        root().join(".gpu/gpumem-top").to_string_lossy().into_owned()
    })
}

/// One HTTP/1.1 GET over a fresh connection: (head, body).
pub fn http_get(addr: &str, path: &str) -> (String, String) {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: */*\r\nConnection: close\r\n\r\n").unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    let (head, body) = r.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP head from {addr}: {r:?}"));
    (head.to_string(), body.to_string())
}

/// `serve --source demo` on a free port; its address from the line it prints.
pub fn start_serve(interval_ms: &str) -> (std::process::Child, String) {
    start_serve_with_fds(interval_ms, None)
}

/// As `start_serve`, with RLIMIT_NOFILE set to `fds` for the server.
pub fn start_serve_with_fds(interval_ms: &str, fds: Option<u64>) -> (std::process::Child, String) {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(bin());
    cmd.args(["serve", "--source", "demo", "--listen", "127.0.0.1:0", "--interval", interval_ms])
        .stderr(std::process::Stdio::piped());
    if let Some(n) = fds {
        // SAFETY: runs in the child between fork and exec, calling only
        // setrlimit (async-signal-safe) on a local value.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit { rlim_cur: n, rlim_max: n };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    let err = child.stderr.take().unwrap();
    std::io::BufReader::new(err).read_line(&mut line).unwrap();
    let addr = line.split("http://").nth(1).and_then(|r| r.split('/').next()).expect(&line).to_string();
    (child, addr)
}

/// A test's own temporary directory, removed with everything in it when
/// the test ends (also when it fails), so that test runs leave nothing in
/// the system's temporary directory. Use it where a path is wanted.
pub struct TmpDir(pub std::path::PathBuf);

impl TmpDir {
    /// `$TMPDIR/gpumem-top-TAG-PID-N`, fresh (an old one is removed first).
    pub fn new(tag: &str) -> TmpDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("gpumem-top-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TmpDir(d)
    }
    /// Takes over `path` (made by the caller) to remove it at the end.
    pub fn of(path: std::path::PathBuf) -> TmpDir {
        TmpDir(path)
    }
}

impl std::ops::Deref for TmpDir {
    type Target = std::path::PathBuf;
    fn deref(&self) -> &std::path::PathBuf {
        &self.0
    }
}

impl AsRef<std::path::Path> for TmpDir {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TmpDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A file path in a directory of its own, removed at the end of the test.
pub struct TmpFile {
    _dir: TmpDir,
    path: std::path::PathBuf,
}

impl TmpFile {
    pub fn new(tag: &str, name: &str) -> TmpFile {
        let dir = TmpDir::new(tag);
        let path = dir.join(name);
        TmpFile { _dir: dir, path }
    }
}

impl std::ops::Deref for TmpFile {
    type Target = std::path::PathBuf;
    fn deref(&self) -> &std::path::PathBuf {
        &self.path
    }
}

impl AsRef<std::path::Path> for TmpFile {
    fn as_ref(&self) -> &std::path::Path {
        &self.path
    }
}

impl AsRef<std::ffi::OsStr> for TmpFile {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.path.as_os_str()
    }
}

/// The replay app on a fixture (a path under tests/fixtures) as `replay`
/// opens it with no flags, with the trace it replays.
pub fn replay_app(rel: &str) -> (gpumem_top::ui::app::ReplayApp<'static>, &'static gpumem_top::trace::DeviceTrace) {
    replay_app_with(rel, None)
}

/// `replay_app` under `--memory-limit limit`.
pub fn replay_app_with(
    rel: &str,
    limit: Option<u64>,
) -> (gpumem_top::ui::app::ReplayApp<'static>, &'static gpumem_top::trace::DeviceTrace) {
    let t: &'static gpumem_top::trace::Trace = Box::leak(Box::new(gpumem_top::trace::load(&fixture(rel)).unwrap()));
    let opts = gpumem_top::replay::OpenOptions {
        device: Some(t.devices[0].device()),
        memory_limit: limit,
        ..Default::default()
    };
    let opened = gpumem_top::replay::open(t, rel, &opts).unwrap();
    assert!(opened.is_exact(), "{rel}: {:?}", opened.session.fidelity);
    let name = rel.rsplit('/').next().unwrap_or(rel).to_string();
    (gpumem_top::ui::app::ReplayApp::new(opened.model(name).unwrap(), false), opened.dev)
}
