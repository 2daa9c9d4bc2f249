//! What the live view and a recording of it share: the model of samples,
//! the GPU and process the keys picked, the allocator screens' selection,
//! the job screen while it is open, and how all that is drawn
//! (`view::live::LiveScreen`, `view::job::JobView`).

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::Rect;
use ratatui_core::widgets::Widget;

use super::event::{Command, Screen};
use super::job::{JobKey, JobScreen};
use crate::keys::Mode;
use crate::monitor::alerts::Alert;
use crate::monitor::model::{LiveModel, ProcHistory};
use crate::monitor::GpuSample;
use crate::view::live::{Awaited, LiveScreen, Position};

pub struct Watch {
    pub model: LiveModel,
    /// Per pid: what tuning its snapshot found (`tune::verdict`), quoted by
    /// its alerts instead of a hint no replay checked.
    pub(crate) tuned: std::collections::BTreeMap<u32, String>,
    /// Index into the latest snapshot's GPUs.
    pub selected_gpu: usize,
    /// Index among the selected GPU's publishers.
    pub(crate) selected_proc: usize,
    pub(crate) screen: Screen,
    pub(crate) banner: Option<String>,
    pub(crate) source: String,
    pub(crate) color: bool,
    /// The answer to the last key.
    pub(crate) status: String,
    /// The samples come from the simulated device (`--source demo`).
    pub(crate) simulated: bool,
    /// `j`: the job screen, while it is open.
    pub(crate) job: Option<JobScreen>,
}

impl Watch {
    pub(crate) fn new(source: String, banner: Option<String>, color: bool) -> Self {
        Watch {
            model: LiveModel::default(),
            tuned: Default::default(),
            selected_gpu: 0,
            selected_proc: 0,
            screen: Screen::default(),
            banner,
            source,
            color,
            status: String::new(),
            simulated: false,
            job: None,
        }
    }

    /// The keys' mode: the job screen's while it is open.
    pub(crate) fn mode(&self, own: Mode) -> Mode {
        if self.job.is_some() {
            Mode::Job
        } else {
            own
        }
    }

    pub(crate) fn gpu(&self) -> Option<&GpuSample> {
        self.model.latest.as_ref().and_then(|s| s.gpus.get(self.selected_gpu))
    }

    /// Histories of the selected GPU's publishers, live ones first.
    pub(crate) fn publishers(&self) -> Vec<&ProcHistory> {
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

    /// The selected publisher of the selected GPU (the index kept within
    /// those there are).
    pub(crate) fn selected(&self) -> Option<&ProcHistory> {
        let pubs = self.publishers();
        pubs.get(self.selected_proc.min(pubs.len().saturating_sub(1))).copied()
    }

    /// Takes a sample into the model: its first ignored publisher file on
    /// the status line, the GPU index kept within those listed.
    pub(crate) fn ingest(&mut self, snap: crate::monitor::Snapshot) {
        self.model.ingest(snap);
        if self.status.is_empty() {
            if let Some(why) = &self.model.ignored {
                self.status = format!(" ignored: {why}");
            }
        }
        self.clamp_gpu();
    }

    /// Once a process records history with less than every stack (to keep
    /// PyTorch 2.11 from crashing its training), the status line says so
    /// while it is on screen: docs/user/live.md, "Memory history and
    /// PyTorch 2.11".
    pub(crate) fn history_note(&self) -> String {
        match self.selected().and_then(|h| h.last.history.as_ref()).and_then(|h| h.note.as_ref()) {
            Some(note) => format!(" history: {note} "),
            None => String::new(),
        }
    }

    /// Keeps the GPU index within the latest sample's GPUs.
    pub(crate) fn clamp_gpu(&mut self) {
        let gpus = self.model.latest.as_ref().map_or(0, |s| s.gpus.len());
        self.selected_gpu = self.selected_gpu.min(gpus.saturating_sub(1));
    }

    /// Selects process `pid` on NVML's GPU `gpu` (its index among the
    /// GPUs and among that GPU's publishers).
    pub(crate) fn pick(&mut self, gpu: u32, pid: u32) {
        if let Some(gi) = self.model.latest.as_ref().and_then(|s| s.gpus.iter().position(|g| g.index == gpu)) {
            self.selected_gpu = gi;
        }
        if let Some(i) = self.publishers().iter().position(|h| h.last.pid == pid && h.last.device == gpu) {
            self.selected_proc = i;
        }
        self.screen.sel.selected = 0;
        self.screen.sel.zoom = false;
    }

    /// An alert as the status line shows it: for a process whose snapshot
    /// was tuned, what the replays found replaces the generic hint.
    pub(crate) fn alert_text(&self, a: &Alert) -> String {
        // What tuning this process's snapshot found replaces the hint to
        // take one, where the settings may be what runs out.
        match a.pid.and_then(|p| self.tuned.get(&p)).filter(|_| a.kind.settings_may_help()) {
            Some(t) => format!("{}; {t}", a.fact),
            None => a.message(),
        }
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

    /// The keys the live view and a recording answer alike (the job
    /// screen's while it is open); false for the others.
    pub(crate) fn apply(&mut self, a: Command) -> bool {
        if let Some(job) = &mut self.job {
            if !self.screen.sel.help {
                match job.apply(a, &self.model) {
                    JobKey::Stay => return true,
                    JobKey::Close => {
                        self.job = None;
                        return true;
                    }
                    JobKey::Pick(gpu, pid) => {
                        self.job = None;
                        self.pick(gpu, pid);
                        return true;
                    }
                    JobKey::Pass => {}
                }
            }
        }
        if self.screen.apply(a) {
            if let Some(h) = self.selected() {
                let sel = self.screen.sel.clamped(&h.last.segments);
                self.screen.sel = sel;
            }
            return true;
        }
        match a {
            Command::Gpu(i) => self.pick_gpu(i),
            Command::NextProcess => {
                let n = self.publishers().len();
                if n > 0 {
                    self.selected_proc = (self.selected_proc + 1) % n;
                    self.screen.sel.selected = 0;
                }
            }
            Command::Screenshot => self.status = self.screenshot(),
            Command::Job => {
                let pid = self.selected().map(|h| (h.last.job.as_ref().map(|j| j.job.clone()), h.last.pid));
                match JobScreen::open(&self.model, pid) {
                    Some(j) => self.job = Some(j),
                    None => self.status = " no distributed job: the selected process publishes no rank (RANK and WORLD_SIZE, as torchrun sets them)".into(),
                }
            }
            _ => return false,
        }
        true
    }

    /// `1`–`9`: the GPU at that position.
    fn pick_gpu(&mut self, i: usize) {
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

    /// The alerts as the status line says them.
    fn alerts(&self) -> Vec<String> {
        self.model.alerts.iter().map(|a| self.alert_text(a)).collect()
    }

    /// Draws the job screen while it is open (the help over it), else the
    /// live screen.
    pub(crate) fn draw(
        &self,
        mode: Mode,
        notes: String,
        awaited: Awaited,
        position: Position,
        area: Rect,
        buf: &mut Buffer,
    ) {
        if let Some(job) = &self.job {
            let alerts = self.model.alerts.iter().filter(|a| a.kind != crate::monitor::alerts::AlertKind::Imbalance);
            let alerts: Vec<String> = alerts.map(|a| self.alert_text(a)).collect();
            if job.draw(&self.model, &self.source, format!("{notes}{}", self.status), &alerts, self.color, area, buf) {
                if self.screen.sel.help {
                    crate::view::help_overlay(self.color, Mode::Job, false, self.screen.sel.help_scroll, area, buf);
                }
                return;
            }
        }
        let publishers = self.publishers();
        let proc = self.selected_proc.min(publishers.len().saturating_sub(1));
        let screen = LiveScreen {
            model: &self.model,
            gpu: self.selected_gpu,
            publishers,
            proc,
            sel: self.screen.sel,
            source: &self.source,
            banner: self.banner.clone(),
            color: self.color,
            simulated: self.simulated,
            mode,
            status: &self.status,
            notes,
            alerts: self.alerts(),
            awaited,
            position,
        };
        (&screen).render(area, buf);
    }
}
