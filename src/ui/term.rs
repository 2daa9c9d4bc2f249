//! The terminal's double buffer, as ratatui's `Terminal` keeps it, made
//! cheaper for a monitor that redraws twice a second for days.
//! ratatui 0.30's `Buffer::diff` asks every cell of both frames for its
//! display width through unicode-width, a quarter of a live frame's cost
//! (155 µs of 620 µs at 200x50, most cells being box-drawing, block or
//! braille glyphs), and `Terminal` keeps a second 48-byte-cell buffer (480 KB
//! at 200x50) to diff against. [`OnScreen::diff`] is the same algorithm, cell
//! for cell, with those glyphs' width known without a table lookup, against
//! what is on screen kept as 8-byte cells (80 KB); tests hold it equal to
//! ratatui's on random buffers.

use ratatui::backend::Backend;
use ratatui::buffer::{Buffer, Cell, CellDiffOption, CellWidth};
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier};

/// Display width of a cell: `Cell::cell_width`, with the answer
/// for one ASCII byte or one box-drawing, block-element or braille glyph
/// (U+2500..=U+259F, U+2800..=U+28FF: all width 1) known up front.
#[inline]
pub fn cell_width(cell: &Cell) -> usize {
    if let CellDiffOption::ForcedWidth(w) = cell.diff_option {
        return w.get() as usize;
    }
    symbol_width(cell.symbol())
}

#[inline]
fn symbol_width(s: &str) -> usize {
    let b = s.as_bytes();
    if b.len() == 1 {
        return 1;
    }
    // Three-byte UTF-8: E2 94..96 xx is U+2500..=U+259F; E2 A0..A3 xx is U+2800..=U+28FF.
    if b.len() == 3 && b[0] == 0xE2 && matches!(b[1], 0x94..=0x96 | 0xA0..=0xA3) {
        return 1;
    }
    s.cell_width() as usize
}

const VISIBLE_ON_BLANK: Modifier = Modifier::REVERSED
    .union(Modifier::UNDERLINED)
    .union(Modifier::SLOW_BLINK)
    .union(Modifier::RAPID_BLINK)
    .union(Modifier::CROSSED_OUT);

#[allow(deprecated)] // `Cell::skip`, which ratatui's diff still honours
fn is_skip(cell: &Cell) -> bool {
    matches!(cell.diff_option, CellDiffOption::Skip) || (cell.skip && matches!(cell.diff_option, CellDiffOption::None))
}

/// How one cell of the screen looks apart from its symbol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Look {
    fg: Color,
    bg: Color,
    underline: Color,
    modifier: Modifier,
    option: CellDiffOption,
    skip: bool,
}

impl Look {
    #[allow(deprecated)] // `Cell::skip`
    fn of(cell: &Cell) -> Look {
        Look {
            fg: cell.fg,
            bg: cell.bg,
            underline: cell.underline_color,
            modifier: cell.modifier,
            option: cell.diff_option,
            skip: cell.skip,
        }
    }

    const BLANK: Look = Look {
        fg: Color::Reset,
        bg: Color::Reset,
        underline: Color::Reset,
        modifier: Modifier::empty(),
        option: CellDiffOption::None,
        skip: false,
    };
}

/// What one cell of the screen holds, in 8 bytes instead of a `Cell`'s 48:
/// the frame on screen is kept in this form (80 KB at 200x50 rather than a
/// second 480 KB buffer). Symbols over 4 bytes (emoji sequences, combining
/// marks) live in a side table, looks in a table of the few in use.
#[derive(Debug, Clone, Copy)]
struct Shown {
    sym: [u8; 4],
    /// Bytes of `sym` used; `LONG` when the symbol is in the side table.
    len: u8,
    /// Index into the screen's looks.
    look: u16,
}

const LONG: u8 = u8::MAX;

impl Shown {
    const BLANK: Shown = Shown { sym: [b' ', 0, 0, 0], len: 1, look: 0 };
}

/// Up to four bytes as a little-endian integer, zero-padded.
#[inline]
fn packed(b: &[u8]) -> u32 {
    match *b {
        [] => 0,
        [a] => a as u32,
        [a, b] => u32::from_le_bytes([a, b, 0, 0]),
        [a, b, c] => u32::from_le_bytes([a, b, c, 0]),
        [a, b, c, d] => u32::from_le_bytes([a, b, c, d]),
        _ => u32::MAX,
    }
}

/// The frame on screen, to diff the next one against.
#[derive(Debug, Clone)]
pub struct OnScreen {
    area: Rect,
    cells: Vec<Shown>,
    long: std::collections::HashMap<usize, String>,
    looks: Vec<Look>,
    look_index: std::collections::HashMap<Look, u16>,
    /// Looks of cells past the table's numbering (`ODD`), by cell.
    odd: std::collections::HashMap<usize, Look>,
    /// The look numbered last (an index into `looks`, which may have been rebuilt since).
    last_look: u16,
}

/// The look number of a cell whose look is in `OnScreen::odd`.
const ODD: u16 = u16::MAX;

/// Equal when every cell shows the same symbol the same way (however the
/// looks happen to be numbered).
impl PartialEq for OnScreen {
    fn eq(&self, other: &Self) -> bool {
        self.area == other.area
            && (0..self.cells.len()).all(|i| self.symbol(i) == other.symbol(i) && self.look(i) == other.look(i))
    }
}

impl OnScreen {
    /// A blank screen (every cell `Cell::EMPTY`, as a reset buffer).
    pub fn blank(area: Rect) -> Self {
        OnScreen {
            area,
            cells: vec![Shown::BLANK; area.area() as usize],
            long: Default::default(),
            looks: vec![Look::BLANK],
            look_index: [(Look::BLANK, 0)].into_iter().collect(),
            odd: Default::default(),
            last_look: 0,
        }
    }

    /// The screen as `buf` would leave it.
    pub fn of(buf: &Buffer) -> Self {
        let mut s = OnScreen::blank(buf.area);
        for (i, c) in buf.content.iter().enumerate() {
            s.set(i, c);
        }
        s
    }

    fn symbol(&self, i: usize) -> &str {
        let c = &self.cells[i];
        if c.len == LONG {
            self.long.get(&i).map_or(" ", String::as_str)
        } else {
            std::str::from_utf8(&c.sym[..c.len as usize]).unwrap_or(" ")
        }
    }

    fn look(&self, i: usize) -> &Look {
        match self.cells[i].look {
            ODD => self.odd.get(&i).unwrap_or(&Look::BLANK),
            n => &self.looks[n as usize],
        }
    }

    /// `cell == what is shown at i`, as ratatui's `Cell` equality.
    fn same(&self, i: usize, cell: &Cell) -> bool {
        self.same_with(i, cell, cell.symbol())
    }

    /// `same`, with the cell's symbol already at hand.
    #[allow(deprecated)] // `Cell::skip`
    #[inline]
    fn same_with(&self, i: usize, cell: &Cell, symbol: &str) -> bool {
        let c = &self.cells[i];
        let l = self.look(i);
        (if c.len == LONG {
            self.symbol(i) == symbol
        } else {
            // Four bytes at most, zero-padded when stored: one integer
            // compare (a memcmp call per cell was a tenth of the diff).
            let b = symbol.as_bytes();
            b.len() == c.len as usize && packed(b) == u32::from_le_bytes(c.sym)
        }) && l.fg == cell.fg
            && l.bg == cell.bg
            && l.modifier == cell.modifier
            && l.underline == cell.underline_color
            && l.option == cell.diff_option
            && l.skip == cell.skip
    }

    /// `cell_width` of what is shown at i.
    fn width(&self, i: usize) -> usize {
        match self.look(i).option {
            CellDiffOption::ForcedWidth(w) => w.get() as usize,
            _ => symbol_width(self.symbol(i)),
        }
    }

    /// The number of `look`, added to the table if new. A table that fills
    /// up (a screen cycling through many colours) is rebuilt from the looks
    /// still on screen; past a u16's numbering a look is `ODD` (kept by
    /// cell in `odd`).
    fn look_number(&mut self, look: Look) -> u16 {
        // Runs of changed cells mostly share a look: no hashing for those.
        if self.looks.get(self.last_look as usize) == Some(&look) {
            return self.last_look;
        }
        if let Some(&n) = self.look_index.get(&look) {
            self.last_look = n;
            return n;
        }
        if self.looks.len() >= ODD as usize {
            let old = std::mem::take(&mut self.looks);
            self.look_index.clear();
            for k in 0..self.cells.len() {
                if self.cells[k].look == ODD {
                    continue;
                }
                let l = old[self.cells[k].look as usize];
                let n = match self.look_index.get(&l) {
                    Some(&n) => n,
                    None => self.add_look(l),
                };
                if n == ODD {
                    self.odd.insert(k, l);
                }
                self.cells[k].look = n;
            }
            if let Some(&n) = self.look_index.get(&look) {
                return n;
            }
        }
        self.add_look(look)
    }

    /// Numbers a look not in the table yet: `ODD` when the table is full.
    fn add_look(&mut self, look: Look) -> u16 {
        if self.looks.len() >= ODD as usize {
            return ODD;
        }
        self.looks.push(look);
        let n = (self.looks.len() - 1) as u16;
        self.look_index.insert(look, n);
        n
    }

    fn set(&mut self, i: usize, cell: &Cell) {
        let b = cell.symbol().as_bytes();
        let mut sym = [0u8; 4];
        let len = if b.len() <= 4 {
            sym[..b.len()].copy_from_slice(b);
            if self.cells[i].len == LONG {
                self.long.remove(&i);
            }
            b.len() as u8
        } else {
            self.long.insert(i, cell.symbol().to_string());
            LONG
        };
        let l = Look::of(cell);
        let look = self.look_number(l);
        if look == ODD {
            self.odd.insert(i, l);
        } else if self.cells[i].look == ODD {
            self.odd.remove(&i);
        }
        self.cells[i] = Shown { sym, len, look };
    }

    /// The cells to write to turn this screen into `next`, which it then
    /// holds: ratatui-core 0.1.2's `BufferDiff` (wide glyphs, VS16 emoji,
    /// trailing cells of a wider glyph replaced by a narrower one), with
    /// [`cell_width`].
    pub fn diff<'n>(&mut self, next: &'n Buffer) -> Vec<(u16, u16, &'n Cell)> {
        assert!(
            self.area.x == next.area.x && self.area.y == next.area.y && self.area.width == next.area.width,
            "buffer areas must have the same x, y, and width"
        );
        let n = &next.content;
        let len = n.len().min(self.cells.len());
        let w = (self.area.width as usize).max(1);
        let (ax, ay) = (self.area.x, self.area.y);
        let pos_of = |i: usize| ((i % w) as u16 + ax, (i / w) as u16 + ay);
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < len {
            let i = pos;
            pos += 1;
            let cur = &n[i];
            let mut unchanged = false;
            match cur.diff_option {
                CellDiffOption::Skip => {}
                _ if is_skip(cur) => {}
                CellDiffOption::ForcedWidth(width) => {
                    pos = pos.saturating_add(width.get().saturating_sub(1) as usize);
                    if !self.same(i, cur) {
                        out.push((pos_of(i).0, pos_of(i).1, cur));
                    }
                }
                CellDiffOption::None | CellDiffOption::AlwaysUpdate => {
                    // The symbol is looked up once (CompactString decodes it).
                    let symbol = cur.symbol();
                    let width = symbol_width(symbol);
                    if matches!(cur.diff_option, CellDiffOption::None) && self.same_with(i, cur, symbol) {
                        pos += width.saturating_sub(1);
                        unchanged = true;
                    } else {
                        let old_width = self.width(i);
                        let (old_bg, old_mod) = (self.look(i).bg, self.look(i).modifier);
                        let vs16 = width > 1 && cur.symbol().chars().any(|c| c == '\u{FE0F}');
                        let (x, y) = pos_of(i);
                        out.push((x, y, cur));
                        // Cells under this one's tail: ratatui's trailing pass.
                        let trailing = if vs16 {
                            Some(((i + width).min(len), false))
                        } else if width > 1 {
                            pos += width.saturating_sub(1);
                            None
                        } else if old_width > width && (old_bg != Color::Reset || old_mod.intersects(VISIBLE_ON_BLANK))
                        {
                            Some((i + old_width, true))
                        } else {
                            None
                        };
                        if let Some((end0, force)) = trailing {
                            let mut end = end0.min(len);
                            let mut j = i + 1;
                            while j < end {
                                let k = j;
                                j += cell_width(&n[k]).max(1);
                                end = end.max(j).min(len);
                                if !is_skip(&n[k]) && (force || self.symbol(k) != n[k].symbol()) {
                                    let (x, y) = pos_of(k);
                                    out.push((x, y, &n[k]));
                                }
                            }
                            pos = end;
                        }
                    }
                }
            }
            // What is on screen now: next's cells from i up to where the
            // diff goes on (an unchanged cell is already right).
            let from = i + usize::from(unchanged);
            for (k, cell) in n.iter().enumerate().take(pos.min(len)).skip(from) {
                self.set(k, cell);
            }
        }
        out
    }
}

/// A full-screen terminal: draws a frame into its buffer, writes what
/// differs from the screen. Resizes clear and redraw all.
pub struct Frames<B: Backend> {
    backend: B,
    buffer: Buffer,
    screen: OnScreen,
    /// Ask the terminal its size before the next frame (crossterm opens
    /// /dev/tty to ask: not something to do at every frame).
    size_unknown: bool,
}

impl<B: Backend> Frames<B> {
    pub fn new(mut backend: B) -> Result<Self, B::Error> {
        let size = backend.size()?;
        let area = Rect::new(0, 0, size.width, size.height);
        backend.hide_cursor()?;
        backend.clear()?;
        Ok(Frames { backend, buffer: Buffer::empty(area), screen: OnScreen::blank(area), size_unknown: false })
    }

    /// The terminal may have changed size (SIGWINCH, a resize event).
    pub fn resized(&mut self) {
        self.size_unknown = true;
    }

    pub fn draw(&mut self, render: impl FnOnce(Rect, &mut Buffer)) -> Result<(), B::Error> {
        let mut area = self.buffer.area;
        if std::mem::take(&mut self.size_unknown) {
            let size = self.backend.size()?;
            area = Rect::new(0, 0, size.width, size.height);
        }
        if area != self.buffer.area {
            self.buffer.resize(area);
            self.screen = OnScreen::blank(area);
            self.backend.clear()?;
        }
        self.buffer.reset();
        render(area, &mut self.buffer);
        let updates = self.screen.diff(&self.buffer);
        self.backend.draw(updates.into_iter())?;
        self.backend.hide_cursor()?;
        self.backend.flush()
    }
}
