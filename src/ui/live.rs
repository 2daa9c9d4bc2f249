//! The live view: every GPU NVML sees with its processes, and for the
//! selected GPU the allocator screens of the PyTorch process that publishes
//! its state. Samples arrive as events from the sampler thread into the
//! `LiveModel`; this keeps only what the keys selected, and draws.

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::{Constraint, Layout, Rect};
use ratatui_core::style::{Modifier, Style};
use ratatui_core::text::{Line, Span};
use ratatui_core::widgets::Widget;
use ratatui_widgets::paragraph::Paragraph;

use super::event::{AppEvent, Command, Interactive, Screen};
use crate::analysis::{human_bytes, short_bytes};
use crate::monitor::model::{LiveModel, ProcHistory};
use crate::monitor::recording::Recording;
use crate::monitor::{GpuSample, Published, Snapshot};
use crate::view::parts::{Chrome, Clock, Marks, Totals};
use crate::view::View;

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
    pub model: LiveModel,
    /// Per pid: what tuning its snapshot found (`tune::verdict`), quoted by
    /// its alerts instead of a hint no replay checked.
    pub(crate) tuned: std::collections::BTreeMap<u32, String>,
    /// The pid whose snapshot is open in the replay view.
    pub(crate) opened_pid: Option<u32>,
    /// Index into the latest snapshot's GPUs.
    pub selected_gpu: usize,
    /// Index among the selected GPU's publishers.
    pub(crate) selected_proc: usize,
    pub(crate) screen: Screen,
    banner: Option<String>,
    source: String,
    pub(crate) color: bool,
    status: String,
    /// Set by `gpumem-top run`.
    pub(crate) child: Option<RunChild>,
    /// `q` once while the child runs: the next `q` leaves it running.
    confirm_quit: bool,
    /// False for a recording: there is no process to ask for a snapshot.
    pub(crate) snapshots: bool,
    pending: Option<Pending>,
    /// A snapshot delivered here, for the caller to open in the replay view.
    pub(crate) open: Option<std::path::PathBuf>,
    /// Where delivered snapshots go (the current directory).
    pub(crate) snapshot_dir: std::path::PathBuf,
    /// Set for a recording: the app shows one of its samples.
    recording: Option<Recording>,
    /// `j`: the job screen is open, on this rank's row.
    job_view: Option<usize>,
    /// The samples come from the simulated device (`--source demo`).
    pub(crate) simulated: bool,
}

impl LiveApp {
    pub fn new(source: String, banner: Option<String>, color: bool) -> Self {
        LiveApp {
            model: LiveModel::default(),
            selected_gpu: 0,
            selected_proc: 0,
            tuned: Default::default(),
            opened_pid: None,
            screen: Screen::default(),
            banner,
            source,
            color,
            status: String::new(),
            child: None,
            confirm_quit: false,
            snapshots: false,
            pending: None,
            open: None,
            snapshot_dir: std::path::PathBuf::new(),
            recording: None,
            job_view: None,
            simulated: false,
        }
    }

    /// The live view over the simulated device (`--source demo`): said so
    /// in a banner and on the device bar; no snapshots (no PyTorch runs).
    pub fn of_demo(color: bool) -> Self {
        let mut app = LiveApp::new("simulated device".into(), Some("demo source: simulated device".to_string()), color);
        app.simulated = true;
        app
    }

    /// The view of a recording (`replay RECORDING.jsonl`), at its last
    /// sample; ←/→ and the rest step through it.
    pub fn of_recording(name: &str, snaps: Vec<Snapshot>, color: bool) -> Self {
        let mut app = LiveApp::new(format!("recording {name}"), None, color);
        let mut rec = Recording::new(snaps);
        app.model = rec.show(usize::MAX);
        app.recording = Some(rec);
        app
    }

    /// A recording: shows sample `at`, keeping the selected process where
    /// it is still there.
    fn show(&mut self, at: usize) {
        let picked = self.selected().map(|h| (h.last.device, h.last.pid));
        let Some(rec) = &mut self.recording else { return };
        self.model = rec.show(at);
        let gpus = self.model.latest.as_ref().map_or(0, |s| s.gpus.len());
        self.selected_gpu = self.selected_gpu.min(gpus.saturating_sub(1));
        let pubs = self.publishers();
        let kept = picked.and_then(|k| pubs.iter().position(|h| (h.last.device, h.last.pid) == k));
        let sel = kept.unwrap_or(self.selected_proc).min(pubs.len().saturating_sub(1));
        let clamped = pubs.get(sel).map(|h| self.screen.sel.clamped(&h.last.segments));
        self.selected_proc = sel;
        if let Some(c) = clamped {
            self.screen.sel = c;
        }
    }

    /// A recording at sample `at`, process `pid` on NVML's GPU `gpu` selected.
    pub(crate) fn show_process(&mut self, at: usize, gpu: u32, pid: u32) {
        self.show(at);
        self.pick(gpu, pid);
    }

    /// A recording's step keys: the sample they go to, or why none.
    fn target(&self, a: Command) -> Result<usize, String> {
        let Some(rec) = &self.recording else { return Err(String::new()) };
        let picked = self.selected();
        let key = picked.map(|h| (h.last.device, h.last.pid));
        match a {
            Command::Peak => match (key, picked.and_then(|h| h.peak_time())) {
                (Some(key), Some(t)) => Ok(rec.peak(key, t)),
                _ => Err(" no publishing process is selected".into()),
            },
            Command::NextOom => {
                key.and_then(|k| rec.next_oom(k)).ok_or_else(|| " no OOM of this process after this sample".to_string())
            }
            a => super::app::step_of(a).map(|s| rec.step(s)).ok_or_else(String::new),
        }
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
        let Some(snap) = &self.model.latest else { return };
        let pid = c.pid;
        let hit = self
            .model
            .procs
            .iter()
            .filter(|(_, h)| h.fresh)
            .find(|((_, p), _)| crate::monitor::procfs::descends_from(*p, pid))
            .map(|((d, p), _)| (*d, *p));
        let Some((dev, ppid)) = hit else { return };
        if let Some(gi) = snap.gpus.iter().position(|g| g.index == dev) {
            self.selected_gpu = gi;
            self.selected_proc = self.model.publishers_on(dev).iter().position(|h| h.last.pid == ppid).unwrap_or(0);
        }
        if let Some(c) = &mut self.child {
            c.found = true;
        }
    }

    /// Asks the selected process for a snapshot.
    fn ask_snapshot(&mut self) {
        if !self.snapshots {
            self.status = if self.recording.is_some() {
                " snapshots come from a running process; this is a recording".into()
            } else {
                " the demo's process is simulated: it has no PyTorch to snapshot (a real one: gpumem-top replay tests/fixtures/traces/gpt2_train.pickle.gz)".into()
            };
            return;
        }
        let Some(h) = self.selected() else {
            self.status = " no process on this GPU publishes its allocator state to ask for a snapshot".into();
            return;
        };
        if h.gone {
            self.status = format!(" pid {} is gone", h.last.pid);
            return;
        }
        let (pid, who, dir) =
            (h.last.pid, h.last.key(), h.last.path.parent().map(|d| d.to_path_buf()).unwrap_or_default());
        match crate::monitor::snapshot::SnapshotRequest::ask(&dir, &who, std::time::Duration::from_secs(60)) {
            Ok(request) => self.pending = Some(Pending { pid, request }),
            Err(e) => self.status = format!(" cannot ask pid {pid} for a snapshot: {}: {e}", dir.display()),
        }
    }

    /// Takes a snapshot answer, if one came. The process is taken to be
    /// alive: one that exits stops publishing, and the request times out.
    fn check_snapshot(&mut self) {
        use crate::monitor::snapshot::{deliver, RequestState};
        let Some(p) = &self.pending else { return };
        match p.request.poll(true) {
            RequestState::Waiting => return,
            RequestState::Failed(why) => self.status = format!(" pid {} {why}", p.pid),
            RequestState::Ready(from) => {
                let dest = self.snapshot_dir.join(crate::monitor::snapshot::default_name(p.pid, crate::monitor::now()));
                match deliver(&from, &dest) {
                    Ok(()) => {
                        self.status = format!(" snapshot of pid {} written to {}", p.pid, dest.display());
                        self.open = Some(dest);
                        self.opened_pid = Some(p.pid);
                    }
                    Err(e) => self.status = format!(" snapshot of pid {}: {}: {e}", p.pid, dest.display()),
                }
            }
        }
        self.pending = None;
    }

    /// A snapshot was opened and closed: back to the live view.
    pub(crate) fn reopened(&mut self, c: super::event::Closed) {
        self.status = c.note;
        if let (Some(pid), Some(t)) = (self.opened_pid.take(), c.tuned) {
            self.tuned.insert(pid, t);
        }
    }

    /// An alert as the status line shows it: for a process whose snapshot
    /// was tuned, what the replays found replaces the generic hint.
    fn alert_text(&self, a: &crate::monitor::alerts::Alert) -> String {
        // What tuning this process's snapshot found replaces the hint to
        // take one, where the settings may be what runs out.
        match a.pid.and_then(|p| self.tuned.get(&p)).filter(|_| a.kind.settings_may_help()) {
            Some(t) => format!("{}; {t}", a.fact),
            None => a.message(),
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
        // Once a process records history with less than every stack (to
        // keep PyTorch 2.11 from crashing its training), say so while it
        // is on screen: docs/user/live.md, "Memory history and PyTorch 2.11".
        if let Some(note) = self.selected().and_then(|h| h.last.history.as_ref()).and_then(|h| h.note.as_ref()) {
            out.push_str(&format!(" history: {note} "));
        }
        out
    }

    /// Takes a sample into the model.
    pub fn ingest(&mut self, snap: Snapshot) {
        self.model.ingest(snap);
        if self.status.is_empty() {
            if let Some(why) = &self.model.ignored {
                self.status = format!(" ignored: {why}");
            }
        }
        let gpus = self.model.latest.as_ref().map_or(0, |s| s.gpus.len());
        self.selected_gpu = self.selected_gpu.min(gpus.saturating_sub(1));
    }

    /// The selected publisher of the selected GPU (the index kept within
    /// those there are).
    fn selected(&self) -> Option<&ProcHistory> {
        let pubs = self.publishers();
        pubs.get(self.selected_proc.min(pubs.len().saturating_sub(1))).copied()
    }

    fn gpu(&self) -> Option<&GpuSample> {
        self.model.latest.as_ref().and_then(|s| s.gpus.get(self.selected_gpu))
    }

    /// Histories of the selected GPU's publishers, live ones first.
    fn publishers(&self) -> Vec<&ProcHistory> {
        match self.gpu() {
            Some(g) => self.model.publishers_on(g.index),
            // Without NVML: every publisher.
            None => {
                let mut v: Vec<&ProcHistory> = self.model.procs.values().collect();
                v.sort_by_key(|h| (h.gone, h.last.pid));
                v
            }
        }
    }

    fn publisher_of(&self, gpu: u32, p: &crate::monitor::ProcessSample) -> Option<&Published> {
        self.model.publisher_of(gpu, p)
    }

    /// `s`: the focused view of the selected publisher, as SVG here.
    fn screenshot(&self) -> String {
        let view = super::app::focused_view(&self.screen);
        let Some(h) = self.selected() else {
            return " nothing to screenshot: no process publishes its allocator state on this GPU".into();
        };
        let p = &h.last;
        let svg = crate::export::live::process_svg(h, p, view, 1600, "");
        let name = super::app::screenshot_name(&format!("pid{}", p.pid), view, "live");
        super::app::save(&name, svg.as_bytes())
    }

    /// No publishing process to show yet: what is awaited (the command `run`
    /// started, or how to start one), the status, the key hints and the help.
    fn draw_waiting(&self, area: Rect, buf: &mut Buffer) {
        // The answer to a key and the alerts; what is awaited is said below.
        let alerts: Vec<String> = self.model.alerts.iter().map(|a| self.alert_text(a)).collect();
        let status = if alerts.is_empty() {
            self.status.clone()
        } else {
            format!("{} ⚠ {}", self.status.trim_end(), alerts.join("; "))
        };
        let on = self.gpu().map_or(String::new(), |g| format!(" on GPU {}", g.index));
        let mut msg = vec![Line::from("")];
        match &self.child {
            Some(c) if c.exited.is_none() => {
                msg.push(Line::from(format!(
                    " Waiting for `{}` (pid {}): it appears here once it initialises CUDA{}.",
                    c.command,
                    c.pid,
                    c.log.as_ref().map_or(String::new(), |l| format!("; its output goes to {}", l.display()))
                )));
                msg.push(Line::from(
                    " Processes that never touch CUDA publish nothing (torchrun's launcher itself, a data loader).",
                ));
            }
            Some(c) => {
                msg.push(Line::from(format!(" `{}` ended without publishing its allocator state{on}.", c.command)));
            }
            None => {
                msg.push(Line::from(format!(" No process{on} publishes its allocator state.")));
                msg.push(Line::from(""));
                msg.push(Line::from(
                    " Start training under gpumem-top (no code change):  gpumem-top run -- python3 train.py",
                ));
                msg.push(Line::from(" or in the script (pip install gpumem-top, or a clone's pip install .):"));
                msg.push(Line::from("     import gpumem_top; gpumem_top.publish()"));
            }
        }
        let [body, foot] = Layout::vertical([Constraint::Min(0), Constraint::Length(1)]).areas(area);
        let inner = crate::view::boxed(buf, body, Line::from(" Allocator "), Some(Line::from(" ? help ")));
        let mut lines = msg;
        if !status.trim().is_empty() {
            lines.push(Line::from(""));
            lines.push(Line::from(format!(" {}", status.trim())));
        }
        // Long lines wrap here: the advice is at their end.
        Paragraph::new(lines).wrap(ratatui_widgets::paragraph::Wrap { trim: false }).render(inner, buf);
        let hints = crate::keys::hints_within(self.mode(), foot.width as usize);
        let style =
            if self.color { Style::default().fg(ratatui_core::style::Color::DarkGray) } else { Style::default() };
        crate::view::put_rows(buf, foot, vec![Line::from(Span::styled(hints, style))]);
        if self.screen.sel.help {
            crate::view::help_overlay(self.color, self.mode(), false, self.screen.sel.help_scroll, area, buf);
        }
    }

    /// The job of the selected process, else the first job seen.
    fn job_of_selected(&self) -> Option<crate::monitor::job::Job> {
        let jobs = self.model.jobs();
        let want = self.selected().and_then(|h| h.last.job.as_ref()).map(|j| j.job.clone());
        let at = want.and_then(|w| jobs.iter().position(|j| j.job == w)).unwrap_or(0);
        jobs.into_iter().nth(at)
    }

    /// A key on the job screen; false for those it leaves to the rest.
    fn job_key(&mut self, a: Command) -> bool {
        let Some(sel) = self.job_view else { return false };
        let n = self.job_of_selected().map_or(0, |j| j.ranks.len());
        if n == 0 {
            // The job is gone from the model (a recording stepped before it).
            self.job_view = None;
            return false;
        }
        match a {
            Command::Up => self.job_view = Some(sel.saturating_sub(1)),
            Command::Down => self.job_view = Some((sel + 1).min(n.saturating_sub(1))),
            Command::Job | Command::Back => self.job_view = None,
            // The rank's own map and timeline: its GPU and process selected.
            Command::Zoom => {
                let row = self.job_of_selected().and_then(|j| j.ranks.get(sel).cloned());
                if let Some(r) = row {
                    self.pick(r.gpu, r.pid);
                }
                self.job_view = None;
            }
            Command::Quit | Command::Help | Command::Screenshot => return false,
            _ => {}
        }
        true
    }

    /// Selects process `pid` on NVML's GPU `gpu` (its index among the
    /// GPUs and among that GPU's publishers).
    fn pick(&mut self, gpu: u32, pid: u32) {
        if let Some(gi) = self.model.latest.as_ref().and_then(|s| s.gpus.iter().position(|g| g.index == gpu)) {
            self.selected_gpu = gi;
        }
        if let Some(i) = self.publishers().iter().position(|h| h.last.pid == pid && h.last.device == gpu) {
            self.selected_proc = i;
        }
        self.screen.sel.selected = 0;
        self.screen.sel.zoom = false;
    }

    /// The job screen; false when there is no job to show (it closes).
    fn draw_job(&self, sel: usize, area: Rect, buf: &mut Buffer) -> bool {
        let Some(job) = self.job_of_selected() else { return false };
        let sel = sel.min(job.ranks.len().saturating_sub(1));
        let series = job
            .ranks
            .iter()
            .map(|r| self.model.procs.get(&(r.gpu, r.pid)).map_or(&[][..], |h| h.series.points()))
            .collect();
        let alerts: Vec<String> = self
            .model
            .alerts
            .iter()
            .filter(|a| a.kind != crate::monitor::alerts::AlertKind::Imbalance)
            .map(|a| self.alert_text(a))
            .collect();
        let mut status = format!("{}{}", self.notes(), self.status);
        if !alerts.is_empty() {
            status = format!("{} ⚠ {}", status.trim_end(), alerts.join("; "));
        }
        let view = crate::view::job::JobView {
            job: &job,
            series,
            selected: sel,
            threshold: self.model.thresholds.imbalance,
            source: self.source.clone(),
            status,
            color: self.color,
        };
        (&view).render(area, buf);
        true
    }

    /// The GPU list, as wide as `width`: below 100 columns shorter bars,
    /// names and figures, so that nothing is cut at 80.
    fn gpu_lines(&self, width: usize) -> Vec<Line<'static>> {
        let narrow = width < 100;
        let Some(snap) = &self.model.latest else { return vec![Line::from(" waiting for the first sample…")] };
        let mut lines = Vec::new();
        if snap.gpus.is_empty() {
            lines.push(Line::from(" NVML lists no GPU"));
        }
        for (i, g) in snap.gpus.iter().enumerate() {
            let sel = i == self.selected_gpu;
            let na = "N/A".to_string();
            let mem = match (g.used_bytes, g.total_bytes) {
                (Some(u), Some(t)) => {
                    let w = if narrow { 10usize } else { 20 };
                    let fill = ((u as f64 / t.max(1) as f64) * w as f64).round() as usize;
                    format!(
                        "{}{} {} / {}",
                        "█".repeat(fill.min(w)),
                        "░".repeat(w - fill.min(w)),
                        human_bytes(u),
                        human_bytes(t)
                    )
                }
                _ => format!("memory {na}"),
            };
            let util = g.utilization_percent.map_or(na.clone(), |u| format!("{u}%"));
            let alert = self.model.alerts.iter().any(|a| a.gpu == g.index);
            let style =
                if sel { Style::default().add_modifier(Modifier::BOLD | Modifier::REVERSED) } else { Style::default() };
            lines.push(Line::from(vec![
                Span::styled(
                    format!(
                        "{}{} GPU {} {:<22} {mem}  util {util}{}",
                        if sel { "▶" } else { " " },
                        i + 1,
                        g.index,
                        crate::view::ellipsis(g.name.clone().unwrap_or(na.clone()), 22),
                        if alert { "  ⚠" } else { "" }
                    ),
                    style,
                ),
                Span::raw(if g.errors.is_empty() {
                    String::new()
                } else {
                    format!("  ({} field(s) N/A)", g.errors.len())
                }),
            ]));
            for p in &g.processes {
                let publ = self.publisher_of(g.index, p);
                // What NVML counts beyond the allocator's reserve: the
                // context, NCCL's and other libraries' buffers (docs/user/ranks.md).
                let outside = publ.and_then(|x| crate::monitor::job::outside_allocator(p.used_bytes, x.reserved()));
                let extra = match (publ, narrow) {
                    (Some(x), false) => format!(
                        "  torch: allocated {} reserved {}{}",
                        human_bytes(x.allocated()),
                        human_bytes(x.reserved()),
                        outside.map_or(String::new(), |o| format!(" outside {}", human_bytes(o)))
                    ),
                    (Some(x), true) => format!(
                        "  alloc {} res {}{}",
                        short_bytes(x.allocated()),
                        short_bytes(x.reserved()),
                        outside.map_or(String::new(), |o| format!(" out {}", short_bytes(o)))
                    ),
                    (None, _) => String::new(),
                };
                let name =
                    publ.map(|x| x.name()).or_else(|| p.command.clone()).unwrap_or_else(|| "(not visible here)".into());
                let used = p.used_bytes.map_or("N/A".into(), human_bytes);
                lines.push(Line::from(if narrow {
                    format!("  pid {:>7} {:<22} {used:>10}{extra}", p.pid, crate::view::ellipsis(name, 22))
                } else {
                    format!("      pid {:>7} {:<28} {used:>10}{extra}", p.pid, name)
                }));
            }
            for m in &g.mig {
                lines.push(Line::from(format!(
                    "      MIG {} {:<20} {} / {}",
                    m.index,
                    m.name.clone().unwrap_or_default(),
                    m.used_bytes.map_or("N/A".into(), human_bytes),
                    m.total_bytes.map_or("N/A".into(), human_bytes)
                )));
            }
        }
        lines
    }
}

impl Interactive for LiveApp {
    fn mode(&self) -> crate::keys::Mode {
        if self.recording.is_some() {
            crate::keys::Mode::Recording
        } else {
            crate::keys::Mode::Live
        }
    }
    fn say(&mut self, msg: String) {
        self.status = msg;
    }
    fn draw_into(&self, area: Rect, buf: &mut Buffer) {
        // The help overlay is the main screen's: it lists the job's key too.
        if let (Some(sel), false) = (self.job_view, self.screen.sel.help) {
            if self.draw_job(sel, area, buf) {
                return;
            }
        }
        let lines = self.gpu_lines(area.width.saturating_sub(2) as usize);
        let top_h = (lines.len() as u16 + 2).min(area.height / 3).max(3);
        let [top, rest] = Layout::vertical([Constraint::Length(top_h), Constraint::Min(0)]).areas(area);
        let title = Line::from(format!(" GPUs ─ {} ─ 1–9 pick, n next process ", self.source));
        let inner = crate::view::boxed(buf, top, title, None);
        crate::view::put_rows(buf, inner, lines);
        let alerts: Vec<String> = self.model.alerts.iter().map(|a| self.alert_text(a)).collect();
        let status = format!("{}{}", self.notes(), self.status);
        // The answer to a key first: the alerts stay until they clear.
        let status = match (alerts.is_empty(), status.trim().is_empty()) {
            (true, _) => status,
            (false, true) => format!(" ⚠ {}", alerts.join("; ")),
            (false, false) => format!("{} ─ ⚠ {}", status.trim_end(), alerts.join("; ")),
        };
        let pubs = self.publishers();
        let sel = self.selected_proc.min(pubs.len().saturating_sub(1));
        let Some(h) = pubs.get(sel) else {
            self.draw_waiting(rest, buf);
            return;
        };
        let p = &h.last;
        let segs = &p.segments;
        let totals = Totals {
            device_memory: self
                .gpu()
                .and_then(|g| Some((g.used_bytes?, g.total_bytes?, if self.simulated { "simulated" } else { "NVML" }))),
            ..Totals::of_published(p)
        };
        let frag = p.fragmentation();
        let points = h.series.state_points();
        let ooms: Vec<usize> = h.series.ooms.iter().map(|&t| h.series.index_at(t)).collect();
        let peak_at = crate::analysis::peak_index(&points);
        let when = h.series.points().last().map_or(0.0, |s| s.t);
        let age = crate::monitor::now() - when;
        // A recording shows one sample: the cursor is there, not at the end.
        let (cursor, position) = match &self.recording {
            Some(rec) => {
                let (at, n) = rec.at();
                let elapsed = crate::view::duration(rec.elapsed());
                (h.series.index_upto(p.time), format!("sample {} of {n}, {elapsed} in", at + 1))
            }
            None if h.gone => (points.len().saturating_sub(1), format!("gone {age:.0} s ago")),
            None => (points.len().saturating_sub(1), format!("{age:.1} s ago")),
        };
        let chrome = Chrome {
            stacks: &[],
            device: self
                .gpu()
                .map_or("GPU".into(), |g| format!("{} #{}", g.name.clone().unwrap_or("GPU".into()), g.index)),
            source: format!(
                "pid {} {}{}",
                p.pid,
                p.name(),
                if pubs.len() > 1 { format!(" ({}/{})", sel + 1, pubs.len()) } else { String::new() }
            ),
            position,
            banner: self.banner.clone(),
            color: self.color,
            status,
            mode: Some(self.mode()),
            oom: None,
        };
        let times = h.series.times();
        let steps = h.series.step_indices();
        let marks = Marks {
            timeline: &points,
            cursor,
            peak_at,
            ooms: &ooms,
            empty_caches: &[],
            iterations: &steps,
            clock: Some(Clock { times: &times, step_peaks: p.step_peaks, recorded: self.recording.is_some() }),
            first_event: 0,
            unit: "event",
            meaning: None,
        };
        View::new(chrome, totals, segs, frag, marks, self.screen.sel).render(rest, buf);
    }

    fn apply(&mut self, a: Command) {
        self.status.clear();
        let top = !self.screen.sel.help && !self.screen.sel.zoom;
        let running = self.child.as_ref().filter(|c| c.ours && c.exited.is_none());
        if let (Some(c), Command::Back | Command::Quit, true) = (running, a, top) {
            if !self.confirm_quit {
                self.confirm_quit = true;
                self.status = format!(
                    " `{}` (pid {}) is still running: q again leaves it running{}",
                    c.command,
                    c.pid,
                    c.log.as_ref().map_or(String::new(), |l| format!(" (its output goes to {})", l.display()))
                );
                return;
            }
        } else {
            self.confirm_quit = false;
        }
        if self.job_view.is_some() && self.job_key(a) {
            return;
        }
        if self.screen.apply(a) {
            if let Some(h) = self.selected() {
                let sel = self.screen.sel.clamped(&h.last.segments);
                self.screen.sel = sel;
            }
            return;
        }
        match a {
            Command::Left
            | Command::Right
            | Command::PageUp
            | Command::PageDown
            | Command::Home
            | Command::End
            | Command::Peak
            | Command::NextOom => match self.target(a) {
                Ok(to) => self.show(to),
                Err(why) => self.status = why,
            },
            Command::Gpu(i) => {
                let n = self.model.latest.as_ref().map_or(0, |s| s.gpus.len());
                if i < n {
                    self.selected_gpu = i;
                    self.selected_proc = 0;
                    self.screen.sel.selected = 0;
                    self.screen.sel.zoom = false;
                } else {
                    self.status = match n {
                        0 => " no GPU is listed".to_string(),
                        1 => format!(" there is no GPU {}: one GPU is listed (key 1)", i + 1),
                        n => format!(" there is no GPU {} (keys 1–{n})", i + 1),
                    };
                }
            }
            Command::NextProcess => {
                let n = self.publishers().len();
                if n > 0 {
                    self.selected_proc = (self.selected_proc + 1) % n;
                    self.screen.sel.selected = 0;
                }
            }
            Command::Screenshot => self.status = self.screenshot(),
            Command::Snapshot => self.ask_snapshot(),
            Command::Job => match self.job_of_selected() {
                Some(j) => {
                    let at = self.selected().map_or(0, |h| h.last.pid);
                    self.job_view = Some(j.ranks.iter().position(|r| r.pid == at).unwrap_or(0));
                }
                None => {
                    self.status = " no distributed job: the selected process publishes no rank (RANK and WORLD_SIZE, as torchrun sets them)".into()
                }
            },
            _ => {}
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
        self.screen.quit
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
            app.alert_text(&alert(5)),
            format!("pid 5: at the peaks 40% of reserved never held tensors; {tuned}")
        );
        assert_eq!(
            app.alert_text(&alert(6)),
            "pid 6: at the peaks 40% of reserved never held tensors; press S to snapshot it and tune"
        );
    }
}
