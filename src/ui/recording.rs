//! A recording of the live view (`replay RECORDING.jsonl`): the live
//! screens at one of its samples, stepped with the replay's keys. No
//! process runs, so nothing is asked of one.

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::Rect;

use super::event::{Command, Interactive};
use super::watch::Watch;
use crate::monitor::recording::Recording;
use crate::monitor::Snapshot;
use crate::view::live::{Awaited, Position};

pub struct RecordingApp {
    /// The model at the sample shown, the selection and the job screen.
    pub watch: Watch,
    recording: Recording,
}

impl RecordingApp {
    /// The recording `name` at its last sample.
    pub fn new(name: &str, snaps: Vec<Snapshot>, color: bool) -> Self {
        let mut recording = Recording::new(snaps);
        let mut watch = Watch::new(format!("recording {name}"), None, color);
        watch.model = recording.show(usize::MAX);
        RecordingApp { watch, recording }
    }

    /// Shows sample `at`, keeping the selected process where it is still
    /// there.
    fn show(&mut self, at: usize) {
        let w = &mut self.watch;
        let picked = w.selected().map(|h| (h.last.device, h.last.pid));
        w.model = self.recording.show(at);
        w.clamp_gpu();
        let pubs = w.publishers();
        let kept = picked.and_then(|k| pubs.iter().position(|h| (h.last.device, h.last.pid) == k));
        let sel = kept.unwrap_or(w.selected_proc).min(pubs.len().saturating_sub(1));
        let clamped = pubs.get(sel).map(|h| w.screen.sel.clamped(&h.last.segments));
        w.selected_proc = sel;
        if let Some(c) = clamped {
            w.screen.sel = c;
        }
    }

    /// Sample `at`, process `pid` on NVML's GPU `gpu` selected.
    pub(crate) fn show_process(&mut self, at: usize, gpu: u32, pid: u32) {
        self.show(at);
        self.watch.pick(gpu, pid);
    }

    /// A step key: the sample it goes to, or why none.
    fn target(&self, a: Command) -> Result<usize, String> {
        let rec = &self.recording;
        let picked = self.watch.selected();
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
}

impl Interactive for RecordingApp {
    fn mode(&self) -> crate::keys::Mode {
        self.watch.mode(crate::keys::Mode::Recording)
    }
    fn say(&mut self, msg: String) {
        self.watch.status = msg;
    }
    fn draw_into(&self, area: Rect, buf: &mut Buffer) {
        let (at, of) = self.recording.at();
        let position = Position::Recording { at, of, elapsed: self.recording.elapsed() };
        let notes = self.watch.history_note();
        self.watch.draw(self.mode(), notes, Awaited::Nothing, position, area, buf);
    }

    fn apply(&mut self, a: Command) {
        self.watch.status.clear();
        if self.watch.apply(a) {
            return;
        }
        if let Command::Left
        | Command::Right
        | Command::PageUp
        | Command::PageDown
        | Command::Home
        | Command::End
        | Command::Peak
        | Command::NextOom = a
        {
            match self.target(a) {
                Ok(to) => self.show(to),
                Err(why) => self.watch.status = why,
            }
        }
    }

    fn quit(&self) -> bool {
        self.watch.screen.quit
    }
}
