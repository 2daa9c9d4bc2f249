//! The live view: every GPU NVML sees with its processes, and for the
//! selected GPU the allocator screens of the PyTorch process that publishes
//! its state. Samples arrive as events from the sampler thread into the
//! model (`Watch`, shared with a recording's screen); this app adds what
//! only a running process has: the command `run` started or `attach`
//! follows, and snapshots asked of a process.

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::Rect;

use super::event::{AppEvent, Command, Interactive};
use super::watch::Watch;
use crate::monitor::Snapshot;
use crate::view::live::{Awaited, Position};

/// The command `gpumem-top run` started, as the view follows it.
#[derive(Debug, Clone)]
pub struct RunChild {
    pub(crate) pid: u32,
    pub(crate) command: String,
    /// Where its output goes while the view is open.
    pub(crate) log: Option<std::path::PathBuf>,
    /// How it ended, once it has.
    pub(crate) exited: Option<String>,
    /// Its publisher has been seen (and selected once).
    pub(crate) found: bool,
    /// We started it (`run`): quitting asks first. False for `attach`.
    pub(crate) ours: bool,
}

/// A snapshot asked of a process and not yet answered.
#[derive(Debug, Clone)]
struct Pending {
    pid: u32,
    request: crate::monitor::snapshot::SnapshotRequest,
}

pub struct LiveApp {
    /// The model, the selection and the job screen.
    pub watch: Watch,
    /// The pid whose snapshot is open in the replay view.
    pub(crate) opened_pid: Option<u32>,
    /// Set by `gpumem-top run`.
    pub(crate) child: Option<RunChild>,
    /// `q` once while the child runs: the next `q` leaves it running.
    confirm_quit: bool,
    /// False for the demo: there is no process to ask for a snapshot.
    pub(crate) snapshots: bool,
    pending: Option<Pending>,
    /// A snapshot delivered here, for the caller to open in the replay view.
    pub(crate) open: Option<std::path::PathBuf>,
    /// Where delivered snapshots go (the current directory).
    pub(crate) snapshot_dir: std::path::PathBuf,
}

impl LiveApp {
    pub fn new(source: String, banner: Option<String>, color: bool) -> Self {
        LiveApp {
            watch: Watch::new(source, banner, color),
            opened_pid: None,
            child: None,
            confirm_quit: false,
            snapshots: false,
            pending: None,
            open: None,
            snapshot_dir: std::path::PathBuf::new(),
        }
    }

    /// The live view over the simulated device (`--source demo`): said so
    /// in a banner and on the device bar; no snapshots (no PyTorch runs).
    pub fn of_demo(color: bool) -> Self {
        let mut app = LiveApp::new("simulated device".into(), Some("demo source: simulated device".to_string()), color);
        app.watch.simulated = true;
        app
    }

    /// Follows the command `run` started: its publisher is selected once
    /// seen, its end is shown, and `q` asks before leaving it running.
    pub(crate) fn follow(&mut self, child: RunChild) {
        self.child = Some(child);
    }

    /// Selects the child's publisher (or one of its descendants': the ranks
    /// torchrun starts) the first time one appears.
    fn find_child(&mut self) {
        let Some(c) = &self.child else { return };
        if c.found {
            return;
        }
        let model = &self.watch.model;
        if model.latest.is_none() {
            return;
        }
        let pid = c.pid;
        let hit = model
            .procs
            .iter()
            .filter(|(_, h)| h.fresh)
            .find(|((_, p), _)| crate::monitor::procfs::descends_from(*p, pid))
            .map(|((d, p), _)| (*d, *p));
        let Some((dev, ppid)) = hit else { return };
        self.watch.pick(dev, ppid);
        if let Some(c) = &mut self.child {
            c.found = true;
        }
    }

    /// Asks the selected process for a snapshot.
    fn ask_snapshot(&mut self) {
        let w = &mut self.watch;
        if !self.snapshots {
            w.status = " the demo's process is simulated: it has no PyTorch to snapshot (a real one: gpumem-top replay tests/fixtures/traces/gpt2_train.pickle.gz)".into();
            return;
        }
        let Some(h) = w.selected() else {
            w.status = " no process on this GPU publishes its allocator state to ask for a snapshot".into();
            return;
        };
        if h.gone {
            w.status = format!(" pid {} is gone", h.last.pid);
            return;
        }
        let (pid, who, dir) =
            (h.last.pid, h.last.key(), h.last.path.parent().map(|d| d.to_path_buf()).unwrap_or_default());
        match crate::monitor::snapshot::SnapshotRequest::ask(&dir, &who, std::time::Duration::from_secs(60)) {
            Ok(request) => self.pending = Some(Pending { pid, request }),
            Err(e) => w.status = format!(" cannot ask pid {pid} for a snapshot: {}: {e}", dir.display()),
        }
    }

    /// Takes a snapshot answer, if one came. The process is taken to be
    /// alive: one that exits stops publishing, and the request times out.
    fn check_snapshot(&mut self) {
        use crate::monitor::snapshot::{deliver, RequestState};
        let Some(p) = &self.pending else { return };
        let status = &mut self.watch.status;
        match p.request.poll(true) {
            RequestState::Waiting => return,
            RequestState::Failed(why) => *status = format!(" pid {} {why}", p.pid),
            RequestState::Ready(from) => {
                let dest = self.snapshot_dir.join(crate::monitor::snapshot::default_name(p.pid, crate::monitor::now()));
                match deliver(&from, &dest) {
                    Ok(()) => {
                        *status = format!(" snapshot of pid {} written to {}", p.pid, dest.display());
                        self.open = Some(dest);
                        self.opened_pid = Some(p.pid);
                    }
                    Err(e) => *status = format!(" snapshot of pid {}: {}: {e}", p.pid, dest.display()),
                }
            }
        }
        self.pending = None;
    }

    /// A snapshot was opened and closed: back to the live view.
    pub(crate) fn reopened(&mut self, c: super::event::Closed) {
        self.watch.status = c.note;
        if let (Some(pid), Some(t)) = (self.opened_pid.take(), c.tuned) {
            self.watch.tuned.insert(pid, t);
        }
    }

    /// The status line's note about the child and a pending snapshot.
    fn notes(&self) -> String {
        let mut out = String::new();
        if let Some(p) = &self.pending {
            out.push_str(&format!(" asking pid {} for a snapshot… ", p.pid));
        }
        if let Some(c) = &self.child {
            let log = c.log.as_ref().map_or(String::new(), |l| format!(", output in {}", l.display()));
            match &c.exited {
                Some(how) => out.push_str(&format!(" `{}` {how}{log}; q quits ", c.command)),
                None if !c.found => out.push_str(&format!(
                    " {} `{}` (pid {}{log}); it appears here once it initialises CUDA ",
                    if c.ours { "running" } else { "attached to" },
                    c.command,
                    c.pid
                )),
                None => {}
            }
        }
        out.push_str(&self.watch.history_note());
        out
    }

    /// Takes a sample into the model.
    pub fn ingest(&mut self, snap: Snapshot) {
        self.watch.ingest(snap);
    }

    /// `q` while the command `run` started still runs: the first asks, the
    /// second leaves it running. True when the key was taken for that.
    fn confirm(&mut self, a: Command) -> bool {
        let sel = self.watch.screen.sel;
        let top = !sel.help && !sel.zoom && (self.watch.job.is_none() || a == Command::Quit);
        let running = self.child.as_ref().filter(|c| c.ours && c.exited.is_none());
        match (running, a, top) {
            (Some(c), Command::Back | Command::Quit, true) if !self.confirm_quit => {
                self.confirm_quit = true;
                self.watch.status = format!(
                    " `{}` (pid {}) is still running: q again leaves it running{}",
                    c.command,
                    c.pid,
                    c.log.as_ref().map_or(String::new(), |l| format!(" (its output goes to {})", l.display()))
                );
                true
            }
            (Some(_), Command::Back | Command::Quit, true) => false,
            _ => {
                self.confirm_quit = false;
                false
            }
        }
    }
}

impl Interactive for LiveApp {
    fn mode(&self) -> crate::keys::Mode {
        self.watch.mode(crate::keys::Mode::Live)
    }
    fn say(&mut self, msg: String) {
        self.watch.status = msg;
    }
    fn draw_into(&self, area: Rect, buf: &mut Buffer) {
        let awaited = match &self.child {
            Some(c) if c.exited.is_none() => Awaited::Child { command: &c.command, pid: c.pid, log: c.log.as_deref() },
            Some(c) => Awaited::Ended { command: &c.command },
            None => Awaited::Nothing,
        };
        let position = Position::Live { now: crate::monitor::now() };
        self.watch.draw(self.mode(), self.notes(), awaited, position, area, buf);
    }

    fn apply(&mut self, a: Command) {
        self.watch.status.clear();
        if self.confirm(a) || self.watch.apply(a) {
            return;
        }
        if a == Command::Snapshot {
            self.ask_snapshot();
        }
    }

    /// A sample from the sampler: into the model, and redraw.
    fn update(&mut self, e: AppEvent) -> bool {
        match e {
            AppEvent::Sample(s) => {
                self.ingest(*s);
                self.find_child();
                self.check_snapshot();
                true
            }
            AppEvent::Exited(st) => {
                if let Some(c) = &mut self.child {
                    c.exited = Some(match (st.code(), std::os::unix::process::ExitStatusExt::signal(&st)) {
                        (Some(0), _) => "finished (exit status 0)".to_string(),
                        (Some(n), _) => format!("failed (exit status {n})"),
                        (None, Some(sig)) => format!("was killed by signal {sig}"),
                        _ => format!("ended ({st})"),
                    });
                }
                true
            }
            _ => false,
        }
    }

    fn quit(&self) -> bool {
        self.watch.screen.quit
    }

    fn opening(&mut self) -> Option<super::event::Open> {
        self.open.take().map(super::event::Open::Replay)
    }

    /// Back from the snapshot's replay view.
    fn back(&mut self, c: super::event::Closed) {
        self.reopened(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::alerts::Alert;

    fn render(app: &mut LiveApp, w: u16, h: u16) -> String {
        let mut buf = Buffer::empty(Rect::new(0, 0, w, h));
        app.draw_into(buf.area, &mut buf);
        (0..h)
            .map(|y| (0..w).map(|x| buf[(x, y)].symbol().to_string()).collect::<String>())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `run` on a machine without a GPU, before the command publishes
    /// (#37 item 15): the screen says what it waits for (not "no process on
    /// no GPU", not advice to run what was just run), shows the key hints,
    /// and `?` opens the help.
    #[test]
    fn run_without_a_gpu_says_what_it_waits_for_and_has_keys() {
        let mut app = LiveApp::new("live (NVML)".into(), None, false);
        app.follow(RunChild {
            pid: 4242,
            command: "python3 train.py".into(),
            log: Some("gpumem-top-run-4242.log".into()),
            exited: None,
            found: false,
            ours: true,
        });
        app.ingest(Snapshot { time: 1.0, ..Default::default() });
        let s = render(&mut app, 140, 30);
        assert!(
            s.contains("Waiting for `python3 train.py` (pid 4242): it appears here once it initialises CUDA; its output goes to gpumem-top-run-4242.log"),
            "{s}"
        );
        assert!(!s.contains("no GPU publishes") && !s.contains("gpumem-top run -- python3 train.py"), "{s}");
        assert!(s.lines().last().unwrap().contains("? help"), "{s}");
        app.handle_key(crossterm::event::KeyEvent::from(crossterm::event::KeyCode::Char('?')));
        let s = render(&mut app, 140, 30);
        assert!(s.contains(" help ─") && s.contains("the next publishing process on this GPU"), "{s}");
        // Once it ended without publishing, that is what the screen says.
        app.handle_key(crossterm::event::KeyEvent::from(crossterm::event::KeyCode::Char('q')));
        if let Some(c) = &mut app.child {
            c.exited = Some("failed (exit status 1)".into());
        }
        let s = render(&mut app, 140, 30);
        assert!(s.contains("`python3 train.py` ended without publishing its allocator state."), "{s}");
    }

    /// Once a process's snapshot was opened from the live view, its
    /// fragmentation, retry and OOM alerts quote what tuning that snapshot
    /// found (a real snapshot: the H200 GPT-2 run at varying lengths)
    /// instead of the generic hint; other processes' alerts keep it.
    #[test]
    fn alerts_quote_what_tuning_the_snapshot_found() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tune/gpt2_varying.pickle.gz");
        let mut screen = crate::cli::open_screen(super::super::event::Open::Replay(path.clone()), false).unwrap();
        let super::super::event::Closed { note, tuned } = screen.closing();
        let tuned = tuned.unwrap();
        assert!(
            tuned.starts_with(
                "tuned: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (peak reserved 5.46 GiB → 4.84 GiB"
            ),
            "{tuned}"
        );
        assert!(note.ends_with(&tuned), "{note}");
        let mut app = LiveApp::new("live".into(), None, false);
        app.opened_pid = Some(5);
        app.back(super::super::event::Closed { note: note.clone(), tuned: Some(tuned.clone()) });
        let alert = |pid: u32| Alert {
            kind: crate::monitor::alerts::AlertKind::Fragmentation,
            gpu: 0,
            pid: Some(pid),
            value: 0.4,
            fact: format!("pid {pid}: at the peaks 40% of reserved never held tensors"),
            hint: Some("press S to snapshot it and tune".into()),
        };
        assert_eq!(
            app.watch.alert_text(&alert(5)),
            format!("pid 5: at the peaks 40% of reserved never held tensors; {tuned}")
        );
        assert_eq!(
            app.watch.alert_text(&alert(6)),
            "pid 6: at the peaks 40% of reserved never held tensors; press S to snapshot it and tune"
        );
    }
}
