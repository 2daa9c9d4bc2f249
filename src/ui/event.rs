//! The terminal loop: one channel of `AppEvent`s fed by an input thread, a
//! signal thread, the sampler (live) and a ticker (synth); keys become
//! `Command`s an app applies to its model; a frame is drawn through
//! ratatui's `Terminal` only after something changed. The terminal is
//! restored on every way out: `q`, `Esc`, Ctrl-C, SIGINT, SIGQUIT, SIGTERM,
//! SIGHUP, a closed terminal, and panics (`enter_terminal`'s hook).

use std::sync::mpsc::{self, Receiver, SyncSender};
use std::time::Duration;

use crossterm::event::KeyEvent;
use ratatui_core::terminal::Frame;

use crate::monitor::Snapshot;
use crate::view::parts::Selection;
use crate::view::{Focus, SegmentOrder};

/// What reaches an app.
#[derive(Debug)]
pub enum AppEvent {
    Key(KeyEvent),
    /// The terminal changed size (the next draw takes the new size).
    Resize,
    /// The ticker's beat (synth runs its workload on it).
    Tick,
    /// A sample from the sampler thread (live).
    Sample(Box<Snapshot>),
    /// The command `gpumem-top run` started has exited.
    Exited(std::process::ExitStatus),
    /// SIGINT, SIGQUIT, SIGTERM or SIGHUP, or the terminal went away.
    Quit,
}

pub use crate::keys::{Command, Mode};

/// What the actions shared by every screen change: the selection, and
/// whether to quit.
#[derive(Debug, Default)]
pub(crate) struct Screen {
    pub(crate) sel: Selection,
    pub(crate) quit: bool,
}

impl Screen {
    /// Applies an action every screen shares; false for the others.
    pub fn apply(&mut self, a: Command) -> bool {
        let s = &mut self.sel;
        // The help is on top: it scrolls, closes or quits, and keeps every
        // other key from the screen behind it.
        if s.help {
            match a {
                Command::Quit => self.quit = true,
                Command::Back | Command::Help => {
                    s.help = false;
                    s.help_scroll = 0;
                }
                Command::Up => s.help_scroll = s.help_scroll.saturating_sub(1),
                Command::Down => s.help_scroll += 1,
                Command::PageUp => s.help_scroll = s.help_scroll.saturating_sub(10),
                Command::PageDown => s.help_scroll += 10,
                Command::Home => s.help_scroll = 0,
                _ => {}
            }
            return true;
        }
        match a {
            Command::Quit => self.quit = true,
            Command::Back => {
                if s.help {
                    s.help = false;
                } else if s.zoom {
                    s.zoom = false;
                } else {
                    self.quit = true;
                }
            }
            Command::Help => s.help = !s.help,
            Command::Focus => s.focus = if s.focus == Focus::Map { Focus::Timeline } else { Focus::Map },
            Command::Up if s.zoom => s.block = s.block.saturating_sub(1),
            Command::Down if s.zoom => s.block += 1,
            Command::Up => s.select(-1),
            Command::Down => s.select(1),
            Command::Zoom => {
                s.zoom = !s.zoom;
                s.block = 0;
            }
            Command::Compact => s.compact = !s.compact,
            Command::HistogramBytes => s.hist_bytes = !s.hist_bytes,
            Command::RowScale => s.flip_scale = !s.flip_scale,
            Command::ByCategory => s.by_category = !s.by_category,
            Command::Order => {
                s.order = if s.order == SegmentOrder::Address { SegmentOrder::Size } else { SegmentOrder::Address };
            }
            _ => return false,
        }
        true
    }
}

/// An app the terminal loop drives.
pub trait Interactive {
    /// Draws the app's state into `buf`; the view drawn is built from it and immutable.
    fn draw_into(&self, area: ratatui_core::layout::Rect, buf: &mut ratatui_core::buffer::Buffer);
    /// A frame of the whole terminal: below 80x24 it says so instead.
    fn draw(&self, frame: &mut Frame) {
        let area = frame.area();
        if !crate::view::too_small(area, frame.buffer_mut()) {
            self.draw_into(area, frame.buffer_mut());
        }
    }
    fn apply(&mut self, a: Command);
    /// Which keys it answers to (`crate::keys::KEYS`).
    fn mode(&self) -> Mode;
    /// Puts `msg` on the status line.
    fn say(&mut self, msg: String);
    /// An action from a key: applied where this mode answers to it, else
    /// the status line says where it belongs.
    fn dispatch(&mut self, a: Command) {
        match a.answered_in(self.mode()) {
            Ok(()) => self.apply(a),
            Err(msg) => self.say(msg),
        }
    }
    /// A key, as the loop applies it (tests press keys through this).
    fn handle_key(&mut self, k: KeyEvent) {
        if let Some(a) = Command::of(&k) {
            self.dispatch(a);
        }
    }
    /// A tick or a sample; true when the screen changed.
    fn update(&mut self, e: AppEvent) -> bool {
        let _ = e;
        false
    }
    fn quit(&self) -> bool;
    /// How often the app wants `AppEvent::Tick`, if at all.
    fn tick_every(&self) -> Option<Duration> {
        None
    }
}

/// The channel apps' events arrive on; sources send through `sender()`.
pub struct Events {
    tx: SyncSender<AppEvent>,
    rx: Receiver<AppEvent>,
    /// The input thread and the ticker run once per channel, however many
    /// views it feeds in turn (live, then a snapshot's replay, then live).
    input: std::sync::Once,
    ticker: std::sync::Once,
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
        Events { tx, rx, input: std::sync::Once::new(), ticker: std::sync::Once::new() }
    }

    pub(crate) fn sender(&self) -> SyncSender<AppEvent> {
        self.tx.clone()
    }
}

/// Reads the terminal until it goes away; blocks in `read`, so an idle
/// screen costs nothing.
fn spawn_input(tx: SyncSender<AppEvent>) -> std::io::Result<()> {
    std::thread::Builder::new().name("gpumem-input".into()).spawn(move || loop {
        let e = match crossterm::event::read() {
            Ok(crossterm::event::Event::Key(k)) => AppEvent::Key(k),
            Ok(crossterm::event::Event::Resize(..)) => AppEvent::Resize,
            Ok(_) => continue,
            // The terminal hung up (crossterm's /dev/tty source returns an error).
            Err(_) => AppEvent::Quit,
        };
        let last = matches!(e, AppEvent::Quit);
        if tx.send(e).is_err() || last {
            return;
        }
    })?;
    Ok(())
}

/// Signals as events: SIGWINCH a resize, the others a quit.
fn spawn_signals(tx: SyncSender<AppEvent>) -> std::io::Result<signal_hook::iterator::Handle> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGWINCH};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGHUP, SIGINT, SIGQUIT, SIGWINCH])?;
    let handle = signals.handle();
    std::thread::Builder::new().name("gpumem-signals".into()).spawn(move || {
        for s in signals.forever() {
            let e = if s == SIGWINCH { AppEvent::Resize } else { AppEvent::Quit };
            if tx.send(e).is_err() {
                return;
            }
        }
    })?;
    Ok(handle)
}

/// Ticks every `every` until the loop is gone.
fn spawn_ticker(tx: SyncSender<AppEvent>, every: Duration) -> std::io::Result<()> {
    std::thread::Builder::new().name("gpumem-ticker".into()).spawn(move || loop {
        std::thread::sleep(every);
        // A full channel means the app is behind: skip this beat.
        if let Err(mpsc::TrySendError::Disconnected(_)) = tx.try_send(AppEvent::Tick) {
            return;
        }
    })?;
    Ok(())
}

/// A backend that asks the terminal's size once, and again only after a
/// resize. ratatui's `Terminal` asks before every frame, and crossterm
/// answers by opening `/dev/tty` (open, ioctl, close): three system calls
/// a frame, for a size that only SIGWINCH changes, and SIGWINCH reaches the
/// loop as `AppEvent::Resize`. The one piece kept beside ratatui's own, for the
/// live monitor's budget (docs/benchmarks.md).
pub struct CachedSize<B> {
    inner: B,
    size: std::cell::Cell<Option<ratatui_core::layout::Size>>,
}

impl<B: ratatui_core::backend::Backend> CachedSize<B> {
    pub fn new(inner: B) -> Self {
        CachedSize { inner, size: std::cell::Cell::new(None) }
    }

    /// The terminal was resized: ask again.
    pub fn resized(&self) {
        self.size.set(None);
    }
}

impl<B: ratatui_core::backend::Backend> ratatui_core::backend::Backend for CachedSize<B> {
    type Error = B::Error;

    fn draw<'a, I>(&mut self, content: I) -> Result<(), Self::Error>
    where
        I: Iterator<Item = (u16, u16, &'a ratatui_core::buffer::Cell)>,
    {
        self.inner.draw(content)
    }
    fn append_lines(&mut self, n: u16) -> Result<(), Self::Error> {
        self.inner.append_lines(n)
    }
    fn hide_cursor(&mut self) -> Result<(), Self::Error> {
        self.inner.hide_cursor()
    }
    fn show_cursor(&mut self) -> Result<(), Self::Error> {
        self.inner.show_cursor()
    }
    fn get_cursor_position(&mut self) -> Result<ratatui_core::layout::Position, Self::Error> {
        self.inner.get_cursor_position()
    }
    fn set_cursor_position<P: Into<ratatui_core::layout::Position>>(&mut self, position: P) -> Result<(), Self::Error> {
        self.inner.set_cursor_position(position)
    }
    fn clear(&mut self) -> Result<(), Self::Error> {
        self.inner.clear()
    }
    fn clear_region(&mut self, clear_type: ratatui_core::backend::ClearType) -> Result<(), Self::Error> {
        self.inner.clear_region(clear_type)
    }
    fn size(&self) -> Result<ratatui_core::layout::Size, Self::Error> {
        if let Some(s) = self.size.get() {
            return Ok(s);
        }
        let s = self.inner.size()?;
        self.size.set(Some(s));
        Ok(s)
    }
    fn window_size(&mut self) -> Result<ratatui_core::backend::WindowSize, Self::Error> {
        self.inner.window_size()
    }
    fn flush(&mut self) -> Result<(), Self::Error> {
        self.inner.flush()
    }
}

/// Runs `app` in the terminal until it quits or a quit event arrives.
pub fn run_app(app: &mut impl Interactive, events: &Events) -> std::io::Result<()> {
    let signals = spawn_signals(events.sender())?;
    // Frames go out through a 16 KiB buffer: a live frame's changes (about
    // 5 KB) in one write, where the line-buffered stdout made dozens.
    let result = (|| -> std::io::Result<()> {
        enter_terminal()?;
        let backend =
            ratatui_crossterm::CrosstermBackend::new(std::io::BufWriter::with_capacity(1 << 14, std::io::stdout()));
        let mut terminal = ratatui_core::terminal::Terminal::new(CachedSize::new(backend))?;
        let mut started = Ok(());
        events.input.call_once(|| started = spawn_input(events.sender()));
        started?;
        if let Some(every) = app.tick_every() {
            let mut started = Ok(());
            events.ticker.call_once(|| started = spawn_ticker(events.sender(), every));
            started?;
        }
        let mut dirty = true;
        while !app.quit() {
            if dirty {
                terminal.draw(|f| app.draw(f))?;
                dirty = false;
            }
            let Ok(e) = events.rx.recv() else { break };
            match e {
                AppEvent::Quit => break,
                AppEvent::Key(k) => {
                    if let Some(a) = Command::of(&k) {
                        app.dispatch(a);
                        dirty = true;
                    }
                }
                AppEvent::Resize => {
                    terminal.backend().resized();
                    terminal.autoresize()?;
                    dirty = true;
                }
                e => dirty |= app.update(e),
            }
        }
        Ok(())
    })();
    signals.close();
    restore_terminal();
    result
}

/// What ratatui's `init` does, without the screen buffers it allocates and
/// the panic it raises when there is no terminal: a panic hook that restores
/// the terminal (set once), raw mode, the alternate screen.
fn enter_terminal() -> std::io::Result<()> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_terminal();
            previous(info);
        }));
    });
    crossterm::terminal::enable_raw_mode()?;
    crossterm::execute!(std::io::stdout(), crossterm::terminal::EnterAlternateScreen)
}

/// Raw mode off first (it has more effects than the alternate screen), the
/// main screen back, and the cursor, which drawing hid. Each step is tried
/// even when one before it failed.
fn restore_terminal() {
    let raw = crossterm::terminal::disable_raw_mode();
    let screen =
        crossterm::execute!(std::io::stdout(), crossterm::terminal::LeaveAlternateScreen, crossterm::cursor::Show);
    if let Err(e) = raw.and(screen) {
        eprintln!("gpumem-top: could not restore the terminal: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui_core::backend::{Backend, TestBackend};
    use ratatui_core::layout::Size;

    #[test]
    fn the_size_is_asked_again_only_after_a_resize() {
        let mut b = CachedSize::new(TestBackend::new(100, 30));
        assert_eq!(b.size().unwrap(), Size::new(100, 30));
        b.inner.resize(120, 40);
        // No resize event yet: the size drawn at stays the one asked.
        assert_eq!(b.size().unwrap(), Size::new(100, 30));
        b.resized();
        assert_eq!(b.size().unwrap(), Size::new(120, 40));
        // Through ratatui's Terminal: the next frame after the event has the new size.
        let mut t = ratatui_core::terminal::Terminal::new(b).unwrap();
        t.backend_mut().inner.resize(90, 25);
        t.backend().resized();
        t.autoresize().unwrap();
        let f = t.draw(|_| {}).unwrap();
        assert_eq!((f.area.width, f.area.height), (90, 25));
    }

    #[test]
    fn keys_map_to_actions() {
        use crossterm::event::{KeyCode, KeyModifiers};
        let k = |c| KeyEvent::from(c);
        assert_eq!(Command::of(&k(KeyCode::Char('q'))), Some(Command::Back));
        assert_eq!(Command::of(&KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)), Some(Command::Quit));
        assert_eq!(Command::of(&k(KeyCode::Char('c'))), Some(Command::Compact));
        assert_eq!(Command::of(&k(KeyCode::Char('3'))), Some(Command::Gpu(2)));
        assert_eq!(Command::of(&k(KeyCode::Char('z'))), None);
        let mut s = Screen::default();
        assert!(s.apply(Command::Help) && s.sel.help);
        assert!(s.apply(Command::Back) && !s.sel.help && !s.quit, "q closes the help first");
        assert!(s.apply(Command::Back) && s.quit);
        assert!(!Screen::default().apply(Command::Peak), "not a shared action");
    }
}
