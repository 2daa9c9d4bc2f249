//! One palette for the terminal and the pictures (SVG, PNG): each colour
//! is a terminal colour and the fill a picture uses for it, so that a
//! picture pasted in a report reads like the screen it came from. A new
//! colouring adds its swatches here, its meaning to `analysis`, and its
//! legend.

use ratatui_core::style::{Color, Modifier, Style};

use crate::analysis::categories::Category;
use crate::analysis::BlockClass;
use crate::analysis::BlockClass as Cell;

/// A colour as the terminal draws it and as a picture fills it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Swatch {
    pub(crate) term: Color,
    pub(crate) hex: &'static str,
}

const fn swatch(term: Color, hex: &'static str) -> Swatch {
    Swatch { term, hex }
}

/// A block's state: allocated green, rounding yellow, pending-free
/// magenta, free in a used segment red, a free segment blue.
pub(crate) const fn block(c: BlockClass) -> Swatch {
    match c {
        BlockClass::Allocated => swatch(Color::Green, "#38a169"),
        BlockClass::RoundingWaste => swatch(Color::Yellow, "#ecc94b"),
        BlockClass::PendingFree => swatch(Color::Magenta, "#ed64a6"),
        BlockClass::FreeInUsedSegment => swatch(Color::Red, "#fc8181"),
        BlockClass::FreeSegment => swatch(Color::Blue, "#bee3f8"),
    }
}

/// What the memory is (docs/user/categories.md).
pub(crate) const fn category(c: Category) -> Swatch {
    match c {
        Category::Parameter => swatch(Color::Blue, "#3182ce"),
        Category::Gradient => swatch(Color::Magenta, "#b83280"),
        Category::OptimizerState => swatch(Color::Cyan, "#00a3c4"),
        Category::Activation => swatch(Color::Green, "#38a169"),
        Category::Input => swatch(Color::Yellow, "#d69e2e"),
        Category::Temporary => swatch(Color::LightRed, "#e53e3e"),
        Category::Unknown => swatch(Color::Gray, "#a0aec0"),
    }
}

/// `diff`'s two runs: the base blue, the new one red.
pub(crate) const RUN_BASE: Swatch = swatch(Color::Blue, "#2b6cb0");
pub(crate) const RUN_NEW: Swatch = swatch(Color::LightRed, "#e53e3e");

/// Timelines' series: allocated green, reserved blue.
pub(crate) const ALLOCATED: Swatch = swatch(Color::Green, "#2f855a");
pub(crate) const RESERVED: Swatch = swatch(Color::Blue, "#2b6cb0");

/// Styles, or none at all under NO_COLOR: glyphs carry the meaning either way.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Theme {
    pub(crate) color: bool,
}

impl Theme {
    pub(crate) fn fg(self, c: Color) -> Style {
        if self.color {
            Style::default().fg(c)
        } else {
            Style::default()
        }
    }
    pub(crate) fn bold(self) -> Style {
        Style::default().add_modifier(Modifier::BOLD)
    }
}

impl Cell {
    pub fn glyph(self) -> char {
        match self {
            Cell::Allocated => '█',
            Cell::RoundingWaste => '▓',
            Cell::PendingFree => '▒',
            Cell::FreeInUsedSegment => '░',
            Cell::FreeSegment => '·',
        }
    }
    pub(crate) fn color(self) -> Color {
        block(self).term
    }
    pub(crate) const LEGEND: [(Cell, &'static str); 5] = [
        (Cell::Allocated, "allocated"),
        (Cell::RoundingWaste, "rounding"),
        (Cell::PendingFree, "pending free"),
        (Cell::FreeInUsedSegment, "free in used segment"),
        (Cell::FreeSegment, "free segment"),
    ];
}

/// A category's colour on screens and in pictures, and its letter where
/// there is no colour (docs/user/categories.md).
pub(crate) fn category_color(c: Category) -> Color {
    category(c).term
}

pub(crate) fn category_letter(c: Category) -> char {
    match c {
        Category::Parameter => 'P',
        Category::Gradient => 'G',
        Category::OptimizerState => 'O',
        Category::Activation => 'A',
        Category::Input => 'I',
        Category::Temporary => 'T',
        Category::Unknown => '?',
    }
}
