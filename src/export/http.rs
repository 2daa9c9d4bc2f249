//! The few HTTP/1.1 answers `serve` gives (`GET`/`HEAD` of `/metrics` and
//! `/`), from one thread that never waits on a client: every connection is
//! non-blocking in one poll(2) set, has a total deadline from its accept,
//! and a bounded request buffer; past `MAX_CONNECTIONS` the oldest is
//! dropped. So idle, dripping or hostile clients cost each other nothing
//! and `/metrics` stays prompt (docs/user/serve.md).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Connections open at once, at most: fewer where the descriptor limit is
/// lower (`connection_cap`).
pub(crate) const MAX_CONNECTIONS: usize = 1024;
/// Descriptors left for everything else (NVML, publisher files, logs).
const RESERVED_FDS: u64 = 64;
/// How long the listener rests when the process is out of descriptors.
const EMFILE_BACKOFF: Duration = Duration::from_millis(50);

/// The connections to keep open at once: `MAX_CONNECTIONS`, or the
/// descriptor limit (RLIMIT_NOFILE) less `RESERVED_FDS`, whichever is less.
pub(crate) fn connection_cap() -> usize {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit through a valid pointer.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
    let soft = if ok { lim.rlim_cur } else { 1024 };
    (soft.saturating_sub(RESERVED_FDS).max(8) as usize).min(MAX_CONNECTIONS)
}
/// From accept to the last byte of the answer.
pub(crate) const DEADLINE: Duration = Duration::from_secs(2);
/// A request's head (line and headers).
const MAX_REQUEST: usize = 16 * 1024;

/// What `/metrics` answers: the latest exposition, or none yet.
pub(crate) type Body = Arc<Mutex<Option<Arc<String>>>>;

struct Conn {
    stream: TcpStream,
    since: Instant,
    req: Vec<u8>,
    /// The answer once the request is read, and how much of it is sent.
    out: Option<(Vec<u8>, usize)>,
}

/// The answer to one request head.
pub(crate) fn respond(req: &[u8], body: Option<&str>) -> Vec<u8> {
    let line = String::from_utf8_lossy(req);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let head = method == "HEAD";
    let (status, ctype, text): (&str, &str, &str) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET" | "HEAD", "/metrics") => match body {
            Some(b) => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", b),
            None => ("503 Service Unavailable", "text/plain", "no sample yet\n"),
        },
        ("GET" | "HEAD", "/") => ("200 OK", "text/plain", "gpumem-top: metrics at /metrics\n"),
        ("GET" | "HEAD", _) => ("404 Not Found", "text/plain", "not found\n"),
        _ => ("405 Method Not Allowed", "text/plain", "GET or HEAD only\n"),
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        text.len()
    )
    .into_bytes();
    if !head {
        out.extend_from_slice(text.as_bytes());
    }
    out
}

const POLLIN: i16 = libc::POLLIN;
const POLLOUT: i16 = libc::POLLOUT;

/// Serves until `stop` is set (checked at least every 200 ms).
pub fn serve(listener: TcpListener, body: Body, stop: Arc<AtomicBool>) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let cap = connection_cap();
    let mut conns: std::collections::VecDeque<Conn> = std::collections::VecDeque::new();
    // Out of descriptors: the listener is left out of poll until then, so
    // a pending connection cannot make poll return at once, forever.
    let mut resting_until: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        // Past their deadline: dropped, whatever they were doing.
        conns.retain(|c| now.duration_since(c.since) < DEADLINE);
        let resting = resting_until.is_some_and(|t| now < t);
        let mut fds = Vec::with_capacity(conns.len() + 1);
        fds.push(libc::pollfd { fd: listener.as_raw_fd(), events: if resting { 0 } else { POLLIN }, revents: 0 });
        for c in &conns {
            let events = if c.out.is_some() { POLLOUT } else { POLLIN };
            fds.push(libc::pollfd { fd: c.stream.as_raw_fd(), events, revents: 0 });
        }
        // The nearest deadline, at most 200 ms away (and the listener's
        // rest, when it rests).
        let wait = conns
            .iter()
            .map(|c| DEADLINE.saturating_sub(now.duration_since(c.since)))
            .min()
            .unwrap_or(Duration::from_millis(200))
            .min(Duration::from_millis(200))
            .min(
                resting_until.map_or(Duration::MAX, |t| t.saturating_duration_since(now).max(Duration::from_millis(1))),
            );
        // SAFETY: `fds` is a valid array of pollfd for the call; the
        // descriptors stay open (owned by `listener` and `conns`) across it.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait.as_millis() as i32) };
        if n <= 0 {
            continue; // timeout, or EINTR from a signal: look at the flag
        }
        // Serve the ready connections, then accept new ones.
        let latest = body.lock().ok().and_then(|b| b.clone());
        let mut done = vec![false; conns.len()];
        for (i, c) in conns.iter_mut().enumerate() {
            if fds[i + 1].revents == 0 {
                continue;
            }
            done[i] = !step(c, latest.as_deref().map(String::as_str));
        }
        let mut k = 0;
        conns.retain(|_| {
            k += 1;
            !done[k - 1]
        });
        if fds[0].revents != 0 {
            loop {
                match listener.accept() {
                    Ok((stream, _)) => {
                        if stream.set_nonblocking(true).is_err() {
                            continue;
                        }
                        if conns.len() >= cap {
                            // The oldest makes room: it has waited longest.
                            conns.pop_front();
                        }
                        conns.push_back(Conn { stream, since: Instant::now(), req: Vec::new(), out: None });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                        // Out of descriptors: the oldest connection gives
                        // one back, and the listener rests a moment.
                        conns.pop_front();
                        resting_until = Some(Instant::now() + EMFILE_BACKOFF);
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
    }
    Ok(())
}

/// Reads or writes what the connection has ready; false once it is done
/// (answered, closed or broken).
fn step(c: &mut Conn, body: Option<&str>) -> bool {
    if c.out.is_none() {
        let mut buf = [0u8; 4096];
        loop {
            match c.stream.read(&mut buf) {
                Ok(0) => return false,
                Ok(k) => {
                    c.req.extend_from_slice(&buf[..k]);
                    let complete = c.req.windows(4).any(|w| w == b"\r\n\r\n") || c.req.windows(2).any(|w| w == b"\n\n");
                    if complete || c.req.len() >= MAX_REQUEST {
                        c.out = Some((respond(&c.req, body), 0));
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }
    let Some((out, sent)) = c.out.as_mut() else { return true };
    while *sent < out.len() {
        match c.stream.write(&out[*sent..]) {
            Ok(0) => return false,
            Ok(k) => *sent += k,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    false
}
