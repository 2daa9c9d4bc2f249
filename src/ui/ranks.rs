//! The app of `replay rank0 rank1 …`: a selection among the ranks; Enter
//! hands the selected rank to the caller to open in the replay view.

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
    /// The rank (index) Enter asked to open.
    pub(crate) open: Option<usize>,
}

impl RanksApp {
    pub(crate) fn new(model: RanksModel, color: bool) -> RanksApp {
        RanksApp { model, selected: 0, color, status: String::new(), help: false, quit: false, open: None }
    }

    /// Back from a rank's replay view.
    pub(crate) fn reopened(&mut self, note: String) {
        self.open = None;
        self.status = note;
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
            Command::Zoom if n > 0 => self.open = Some(self.selected),
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
        self.quit || self.open.is_some()
    }
}
