//! The app of `replay rank0 rank1 …`: a selection among the ranks; Enter
//! opens the selected rank's file in the replay view over it.

use crate::analysis::ranks::RanksModel;
use crate::keys::{Command, Mode};
use crate::view::ranks::RanksView;

pub struct RanksApp {
    pub(crate) model: RanksModel,
    pub(crate) selected: usize,
    pub(crate) color: bool,
    status: String,
    help: bool,
    quit: bool,
    /// The file Enter asked to open.
    open: Option<std::path::PathBuf>,
}

impl RanksApp {
    pub(crate) fn new(model: RanksModel, color: bool) -> RanksApp {
        RanksApp { model, selected: 0, color, status: String::new(), help: false, quit: false, open: None }
    }
}

impl super::event::Interactive for RanksApp {
    fn draw_into(&self, area: ratatui_core::layout::Rect, buf: &mut ratatui_core::buffer::Buffer) {
        let v = RanksView {
            model: &self.model,
            selected: self.selected,
            color: self.color,
            status: self.status.clone(),
            help: self.help,
        };
        ratatui_core::widgets::Widget::render(&v, area, buf);
    }

    fn apply(&mut self, a: Command) {
        self.status.clear();
        let n = self.model.ranks.len();
        match a {
            Command::Quit => self.quit = true,
            Command::Back if self.help => self.help = false,
            Command::Back => self.quit = true,
            Command::Help => self.help = !self.help,
            Command::Up => self.selected = self.selected.saturating_sub(1),
            Command::Down => self.selected = (self.selected + 1).min(n.saturating_sub(1)),
            Command::Zoom => self.open = self.model.ranks.get(self.selected).map(|r| r.path.clone()),
            _ => {}
        }
    }

    fn mode(&self) -> Mode {
        Mode::Ranks
    }

    fn say(&mut self, msg: String) {
        self.status = msg;
    }

    fn quit(&self) -> bool {
        self.quit
    }

    fn opening(&mut self) -> Option<super::event::Open> {
        self.open.take().map(super::event::Open::Replay)
    }

    /// Back from a rank's replay view.
    fn back(&mut self, c: super::event::Closed) {
        self.status = c.note;
    }
}
