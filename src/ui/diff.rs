//! The diff screen's app: a cursor along two runs' timelines
//! (docs/user/diff.md). The model is built headless (`cli::diff`); this only
//! moves the cursor and draws.

use crate::analysis::diff::DiffModel;
use crate::keys::{Command, Mode};
use crate::view::diff::DiffView;

pub struct DiffApp {
    pub(crate) model: DiffModel,
    /// On the shared axis, in iterations.
    pub(crate) cursor: f64,
    pub(crate) color: bool,
    status: String,
    help: bool,
    quit: bool,
}

impl DiffApp {
    /// Opens at the new run's peak: where "why does it need more" is.
    pub(crate) fn new(model: DiffModel, color: bool) -> DiffApp {
        let cursor = model.new.peak.map_or(0.0, |p| model.new.x_of(p));
        DiffApp { model, cursor, color, status: String::new(), help: false, quit: false }
    }
}

impl super::event::Interactive for DiffApp {
    fn draw_into(&self, area: ratatui_core::layout::Rect, buf: &mut ratatui_core::buffer::Buffer) {
        let v = DiffView {
            model: &self.model,
            cursor: self.cursor,
            color: self.color,
            status: self.status.clone(),
            help: self.help,
        };
        ratatui_core::widgets::Widget::render(&v, area, buf);
    }

    fn apply(&mut self, a: Command) {
        let span = self.model.span();
        let step = span / 200.0;
        self.status.clear();
        match a {
            Command::Quit => self.quit = true,
            Command::Back if self.help => self.help = false,
            Command::Back => self.quit = true,
            Command::Help => self.help = !self.help,
            Command::Left => self.cursor -= step,
            Command::Right => self.cursor += step,
            Command::PageUp => self.cursor -= 0.1,
            Command::PageDown => self.cursor += 0.1,
            Command::Home => self.cursor = 0.0,
            Command::End => self.cursor = span,
            Command::Peak => self.cursor = self.model.base.peak.map_or(self.cursor, |p| self.model.base.x_of(p)),
            Command::NewPeak => self.cursor = self.model.new.peak.map_or(self.cursor, |p| self.model.new.x_of(p)),
            Command::Screenshot => {
                let stem = |t: &str| t.split('.').next().unwrap_or("run").to_string();
                let (b, n) = (stem(&self.model.report.base.trace), stem(&self.model.report.new.trace));
                let name = super::app::screenshot_name(
                    &format!("{b}-vs-{n}"),
                    crate::export::picture::ViewKind::Timeline,
                    "diff",
                );
                let svg = crate::export::picture::diff_svg(&self.model, 1600);
                // After the cursor clamp below, which a status does not touch.
                self.status = super::app::save(&name, svg.as_bytes());
            }
            _ => {}
        }
        self.cursor = self.cursor.clamp(0.0, span);
    }

    fn mode(&self) -> Mode {
        Mode::Diff
    }

    fn say(&mut self, msg: String) {
        self.status = msg;
    }

    fn quit(&self) -> bool {
        self.quit
    }
}
