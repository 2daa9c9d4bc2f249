//! The job screen (`j`): every rank of the selected process's job side by
//! side, their timelines on one axis (docs/user/ranks.md). It draws from the
//! live model its app keeps updating, so it lives in that app (`Watch`)
//! rather than on the screen stack: a screen there would need its own copy
//! of the histories.

use ratatui_core::buffer::Buffer;
use ratatui_core::layout::Rect;
use ratatui_core::widgets::Widget;

use super::event::Command;
use crate::monitor::job::Job;
use crate::monitor::model::LiveModel;

/// The job screen's state: which job, which rank's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobScreen {
    /// The job shown (None: the first job seen).
    job: Option<String>,
    row: usize,
}

/// What a key did on the job screen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobKey {
    /// Answered here; the screen stays.
    Stay,
    /// Back to the screen under it.
    Close,
    /// Closes on this rank: its GPU and process selected there.
    Pick(u32, u32),
    /// Not the job screen's: the app answers it (quit, help).
    Pass,
}

impl JobScreen {
    /// The job of `selected` (its job id and pid), else the first job seen,
    /// its row selected; None when no process publishes a rank.
    pub(crate) fn open(model: &LiveModel, selected: Option<(Option<String>, u32)>) -> Option<JobScreen> {
        let (want, pid) = selected.map_or((None, None), |(j, p)| (j, Some(p)));
        let mut s = JobScreen { job: want, row: 0 };
        let job = s.of(model)?;
        s.row = job.ranks.iter().position(|r| Some(r.pid) == pid).unwrap_or(0);
        s.job = Some(job.job);
        Some(s)
    }

    /// Its job in `model`, else the first job seen.
    fn of(&self, model: &LiveModel) -> Option<Job> {
        let jobs = model.jobs();
        let at = self.job.as_ref().and_then(|w| jobs.iter().position(|j| &j.job == w)).unwrap_or(0);
        jobs.into_iter().nth(at)
    }

    /// A key on the job screen.
    pub(crate) fn apply(&mut self, a: Command, model: &LiveModel) -> JobKey {
        let Some(job) = self.of(model).filter(|j| !j.ranks.is_empty()) else {
            // The job is gone from the model (a recording stepped before it).
            return JobKey::Close;
        };
        let n = job.ranks.len();
        match a {
            Command::Up => self.row = self.row.saturating_sub(1),
            Command::Down => self.row = (self.row + 1).min(n - 1),
            Command::Job | Command::Back => return JobKey::Close,
            // The rank's own map and timeline: its GPU and process selected.
            Command::Zoom => {
                return job.ranks.get(self.row.min(n - 1)).map_or(JobKey::Close, |r| JobKey::Pick(r.gpu, r.pid))
            }
            Command::Quit | Command::Help => return JobKey::Pass,
            _ => {}
        }
        JobKey::Stay
    }

    /// Draws the job screen; false when there is no job to show (the app
    /// draws its own screen instead).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn draw(
        &self,
        model: &LiveModel,
        source: &str,
        status: String,
        alerts: &[String],
        color: bool,
        area: Rect,
        buf: &mut Buffer,
    ) -> bool {
        let Some(job) = self.of(model) else { return false };
        let selected = self.row.min(job.ranks.len().saturating_sub(1));
        let series =
            job.ranks.iter().map(|r| model.procs.get(&(r.gpu, r.pid)).map_or(&[][..], |h| h.series.points())).collect();
        let status =
            if alerts.is_empty() { status } else { format!("{} ⚠ {}", status.trim_end(), alerts.join("; ")) };
        let view = crate::view::job::JobView {
            job: &job,
            series,
            selected,
            threshold: model.thresholds.imbalance,
            source: source.to_string(),
            status,
            color,
        };
        (&view).render(area, buf);
        true
    }
}
