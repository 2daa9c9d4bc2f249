//! The terminal loop: one channel of `Event`s fed by an input thread, a
//! signal thread, the sampler (live) and a ticker (synth); keys become
//! `Action`s an app applies to its model; a frame is drawn through
//! ratatui's `Terminal` only after something changed. The terminal is
//! restored on every way out: `q`, `Esc`, Ctrl-C, SIGINT, SIGQUIT, SIGTERM,
//! SIGHUP, a closed terminal, and panics (ratatui's hook).

use std::sync::mpsc::{self, Receiver, SyncSender};
use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::Frame;

use crate::monitor::Snapshot;
use crate::view::parts::Selection;
use crate::view::{Focus, SegmentOrder};

/// What reaches an app.
#[derive(Debug)]
pub enum Event {
    Key(KeyEvent),
    /// The terminal changed size (the next draw takes the new size).
    Resize,
    /// The ticker's beat (synth runs its workload on it).
    Tick,
    /// A sample from the sampler thread (live).
    Sample(Box<Snapshot>),
    /// SIGINT, SIGQUIT, SIGTERM or SIGHUP, or the terminal went away.
    Quit,
}

/// What a key asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Quit,
    /// `q`/`Esc`: close the help or the zoom, else quit.
    Back,
    Help,
    Focus,
    Up,
    Down,
    Zoom,
    Compact,
    Order,
    Left,
    Right,
    PageUp,
    PageDown,
    Home,
    End,
    Peak,
    NextOom,
    Pause,
    Faster,
    Slower,
    Screenshot,
    /// `1`–`9`: the GPU at that position (0-based).
    Gpu(usize),
    NextProcess,
}

impl Action {
    pub(crate) fn of(k: &KeyEvent) -> Option<Action> {
        if k.kind != KeyEventKind::Press {
            return None;
        }
        Some(match k.code {
            KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => Action::Quit,
            KeyCode::Char('q') | KeyCode::Esc => Action::Back,
            KeyCode::Char('?') | KeyCode::Char('h') => Action::Help,
            KeyCode::Tab => Action::Focus,
            KeyCode::Up => Action::Up,
            KeyCode::Down => Action::Down,
            KeyCode::Enter => Action::Zoom,
            KeyCode::Char('c') => Action::Compact,
            KeyCode::Char('a') => Action::Order,
            KeyCode::Left => Action::Left,
            KeyCode::Right => Action::Right,
            KeyCode::PageUp => Action::PageUp,
            KeyCode::PageDown => Action::PageDown,
            KeyCode::Home => Action::Home,
            KeyCode::End => Action::End,
            KeyCode::Char('p') => Action::Peak,
            KeyCode::Char('o') => Action::NextOom,
            KeyCode::Char(' ') => Action::Pause,
            KeyCode::Char('+') => Action::Faster,
            KeyCode::Char('-') => Action::Slower,
            KeyCode::Char('s') => Action::Screenshot,
            KeyCode::Char(c @ '1'..='9') => Action::Gpu(c as usize - '1' as usize),
            KeyCode::Char('n') => Action::NextProcess,
            _ => return None,
        })
    }
}

/// What the actions shared by every screen change: the selection, and
/// whether to quit.
#[derive(Debug, Default)]
pub(crate) struct Screen {
    pub(crate) sel: Selection,
    pub(crate) quit: bool,
}

impl Screen {
    /// Applies an action every screen shares; false for the others.
    pub fn apply(&mut self, a: Action) -> bool {
        let s = &mut self.sel;
        match a {
            Action::Quit => self.quit = true,
            Action::Back => {
                if s.help {
                    s.help = false;
                } else if s.zoom {
                    s.zoom = false;
                } else {
                    self.quit = true;
                }
            }
            Action::Help => s.help = !s.help,
            Action::Focus => s.focus = if s.focus == Focus::Map { Focus::Timeline } else { Focus::Map },
            Action::Up if s.zoom => s.block = s.block.saturating_sub(1),
            Action::Down if s.zoom => s.block += 1,
            Action::Up => s.select(-1),
            Action::Down => s.select(1),
            Action::Zoom => {
                s.zoom = !s.zoom;
                s.block = 0;
            }
            Action::Compact => s.compact = !s.compact,
            Action::Order => {
                s.order = if s.order == SegmentOrder::Address { SegmentOrder::Size } else { SegmentOrder::Address };
            }
            _ => return false,
        }
        true
    }
}

/// An app the terminal loop drives.
pub trait Interactive {
    /// Draws the app's state; the view drawn is built from it and immutable.
    fn draw(&mut self, frame: &mut Frame);
    fn apply(&mut self, a: Action);
    /// A tick or a sample; true when the screen changed.
    fn update(&mut self, e: Event) -> bool {
        let _ = e;
        false
    }
    fn quit(&self) -> bool;
    /// How often the app wants `Event::Tick`, if at all.
    fn tick_every(&self) -> Option<Duration> {
        None
    }
}

/// The channel apps' events arrive on; sources send through `sender()`.
pub struct Events {
    tx: SyncSender<Event>,
    rx: Receiver<Event>,
}

impl Default for Events {
    fn default() -> Self {
        Events::new()
    }
}

impl Events {
    pub fn new() -> Self {
        // Bounded: a source that outpaces drawing waits or drops, never grows memory.
        let (tx, rx) = mpsc::sync_channel(64);
        Events { tx, rx }
    }

    pub(crate) fn sender(&self) -> SyncSender<Event> {
        self.tx.clone()
    }
}

/// Reads the terminal until it goes away; blocks in `read`, so an idle
/// screen costs nothing.
fn spawn_input(tx: SyncSender<Event>) -> std::io::Result<()> {
    std::thread::Builder::new().name("gpumem-input".into()).spawn(move || loop {
        let e = match crossterm::event::read() {
            Ok(crossterm::event::Event::Key(k)) => Event::Key(k),
            Ok(crossterm::event::Event::Resize(..)) => Event::Resize,
            Ok(_) => continue,
            // The terminal hung up (crossterm's /dev/tty source returns an error).
            Err(_) => Event::Quit,
        };
        let last = matches!(e, Event::Quit);
        if tx.send(e).is_err() || last {
            return;
        }
    })?;
    Ok(())
}

/// Signals as events: SIGWINCH a resize, the others a quit.
fn spawn_signals(tx: SyncSender<Event>) -> std::io::Result<signal_hook::iterator::Handle> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGWINCH};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGHUP, SIGINT, SIGQUIT, SIGWINCH])?;
    let handle = signals.handle();
    std::thread::Builder::new().name("gpumem-signals".into()).spawn(move || {
        for s in signals.forever() {
            let e = if s == SIGWINCH { Event::Resize } else { Event::Quit };
            if tx.send(e).is_err() {
                return;
            }
        }
    })?;
    Ok(handle)
}

/// Ticks every `every` until the loop is gone.
fn spawn_ticker(tx: SyncSender<Event>, every: Duration) -> std::io::Result<()> {
    std::thread::Builder::new().name("gpumem-ticker".into()).spawn(move || loop {
        std::thread::sleep(every);
        // A full channel means the app is behind: skip this beat.
        if let Err(mpsc::TrySendError::Disconnected(_)) = tx.try_send(Event::Tick) {
            return;
        }
    })?;
    Ok(())
}

/// Runs `app` in the terminal until it quits or a quit event arrives.
pub fn run_app(app: &mut impl Interactive, events: Events) -> std::io::Result<()> {
    let signals = spawn_signals(events.sender())?;
    // ratatui's init: raw mode, the alternate screen, and a panic hook that
    // restores the terminal. Frames go out through a 16 KiB buffer: a live
    // frame's changes (about 5 KB) in one write, where the line-buffered
    // stdout made dozens.
    drop(ratatui::init());
    let result = (|| -> std::io::Result<()> {
        let backend =
            ratatui::backend::CrosstermBackend::new(std::io::BufWriter::with_capacity(1 << 14, std::io::stdout()));
        let mut terminal = ratatui::Terminal::new(backend)?;
        spawn_input(events.sender())?;
        if let Some(every) = app.tick_every() {
            spawn_ticker(events.sender(), every)?;
        }
        let mut dirty = true;
        while !app.quit() {
            if dirty {
                terminal.draw(|f| app.draw(f))?;
                dirty = false;
            }
            let Ok(e) = events.rx.recv() else { break };
            match e {
                Event::Quit => break,
                Event::Key(k) => {
                    if let Some(a) = Action::of(&k) {
                        app.apply(a);
                        dirty = true;
                    }
                }
                Event::Resize => {
                    terminal.autoresize()?;
                    dirty = true;
                }
                e => dirty |= app.update(e),
            }
        }
        Ok(())
    })();
    signals.close();
    ratatui::restore();
    // restore() leaves raw mode and the alternate screen; drawing hid the
    // cursor, so show it again.
    let _ = crossterm::execute!(std::io::stdout(), crossterm::cursor::Show);
    result
}
