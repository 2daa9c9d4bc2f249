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
            Command::ByCategory => s.color_by = s.color_by.toggled(),
            Command::Order => {
                s.order = if s.order == SegmentOrder::Address { SegmentOrder::Size } else { SegmentOrder::Address };
            }
            _ => return false,
        }
        true
    }
}

/// A screen one screen asks to open over itself (the loop's caller opens
/// it: `cli` loads files, `ui` does not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Open {
    /// A snapshot to replay (the live view's `S`, a rank's Enter).
    Replay(std::path::PathBuf),
}

/// What a screen says to the one under it as it closes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Closed {
    /// For the status line below ("… closed", or why it did not open).
    pub note: String,
    /// What tuning its snapshot found (`tune::verdict`), for the live
    /// view's alerts.
    pub tuned: Option<String>,
}

/// Opens what a screen asked for, or says why not.
pub type Opener<'o> = dyn FnMut(Open) -> Result<Box<dyn Interactive + 'o>, String> + 'o;

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
    /// Closes this screen (the one under it comes back; the last one
    /// closing ends the loop).
    fn quit(&self) -> bool;
    /// How often the app wants `AppEvent::Tick`, if at all.
    fn tick_every(&self) -> Option<Duration> {
        None
    }
    /// A screen to open over this one, asked for since the last call.
    fn opening(&mut self) -> Option<Open> {
        None
    }
    /// What this screen says to the one under it as it closes.
    fn closing(&mut self) -> Closed {
        Closed::default()
    }
    /// The screen it opened closed (or could not open) with `c`.
    fn back(&mut self, c: Closed) {
        let _ = c;
    }
}

/// The channel apps' events arrive on; sources send through `sender()`.
pub struct Events {
    tx: SyncSender<AppEvent>,
    rx: Receiver<AppEvent>,
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
/// live monitor's budget (docs/measurements/benchmarks.md).
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

/// The most threads a frame is drawn on: a jump's frame has about four
/// parts that can go apart once its seek is done (the timeline, the map's
/// rows, the histogram, the bars), a step's the same without the seek
/// (docs/measurements/benchmarks.md, "The map's rows on free threads").
const FRAME_THREADS: usize = 4;

/// Makes the calling thread, the one that draws the frames, a worker of
/// rayon's pool, a thread per core up to `FRAME_THREADS` (two at least),
/// on which a long run's timeline is drawn beside the other panes
/// (docs/measurements/benchmarks.md, "The timeline beside the other
/// panes"). The pool is made once in a process; where another thread made
/// it, frames here are drawn on this thread alone.
pub fn share_frames() {
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, FRAME_THREADS))
        .use_current_thread()
        .thread_name(|i| format!("gpumem-top frames {i}"))
        .build_global();
}

/// Runs `app` in the terminal until it quits or a quit event arrives; it
/// opens no other screen.
pub fn run_app(app: &mut dyn Interactive, events: Events) -> std::io::Result<()> {
    run_screens(app, events, &mut |_| Err(" nothing can be opened from here".into()))
}

/// The one loop every screen runs in (`Screens`), in the terminal. Ends
/// when the root closes or a quit event (a signal, a closed terminal)
/// arrives.
pub fn run_screens<'o>(root: &mut dyn Interactive, events: Events, open: &mut Opener<'o>) -> std::io::Result<()> {
    share_frames();
    let signals = spawn_signals(events.sender())?;
    // Frames go out through a 16 KiB buffer: a live frame's changes (about
    // 5 KB) in one write, where the line-buffered stdout made dozens.
    let result = (|| -> std::io::Result<()> {
        enter_terminal()?;
        let backend =
            ratatui_crossterm::CrosstermBackend::new(std::io::BufWriter::with_capacity(1 << 14, std::io::stdout()));
        let mut terminal = ratatui_core::terminal::Terminal::new(CachedSize::new(backend))?;
        spawn_input(events.sender())?;
        let mut screens = Screens::new(root, open);
        let mut ticking = false;
        let mut dirty = true;
        loop {
            let mut drawn = Ok(());
            // Opening reads a file: the screen says so first.
            let open = screens.settle(|s| drawn = terminal.draw(|f| s.draw(f)).map(|_| ()));
            drawn?;
            if !open {
                break;
            }
            if let Some(every) = screens.top().tick_every().filter(|_| !ticking) {
                spawn_ticker(events.sender(), every)?;
                ticking = true;
            }
            if dirty || screens.changed {
                terminal.draw(|f| screens.top().draw(f))?;
                dirty = false;
                screens.changed = false;
            }
            let Ok(e) = events.rx.recv() else { break };
            match e {
                AppEvent::Quit => break,
                AppEvent::Resize => {
                    terminal.backend().resized();
                    terminal.autoresize()?;
                    dirty = true;
                }
                e => dirty |= screens.handle(e),
            }
        }
        Ok(())
    })();
    signals.close();
    restore_terminal();
    result
}

/// A stack of screens, the root at the bottom: keys go to the top screen;
/// samples and a command's exit reach every screen (a live view under a
/// snapshot's replay keeps its histories whole); a screen asks to open
/// another over itself (`Interactive::opening`, opened by the caller's
/// `Opener`), and closing that one brings it back with what it said
/// (`Interactive::back`). The terminal loop drives it; tests drive it
/// without a terminal.
pub struct Screens<'r, 'o, 'p> {
    root: &'r mut dyn Interactive,
    over: Vec<Box<dyn Interactive + 'o>>,
    open: &'p mut Opener<'o>,
    /// A screen opened or closed since the last frame.
    changed: bool,
}

impl<'r, 'o, 'p> Screens<'r, 'o, 'p> {
    pub fn new(root: &'r mut dyn Interactive, open: &'p mut Opener<'o>) -> Self {
        Screens { root, over: Vec::new(), open, changed: false }
    }

    /// The screen on top.
    pub fn top(&self) -> &dyn Interactive {
        match self.over.last() {
            Some(s) => s.as_ref(),
            None => &*self.root,
        }
    }

    fn top_mut(&mut self) -> &mut dyn Interactive {
        match self.over.last_mut() {
            Some(s) => s.as_mut(),
            None => &mut *self.root,
        }
    }

    /// Screens open (1: the root alone).
    pub fn depth(&self) -> usize {
        1 + self.over.len()
    }

    /// Closes the screens that quit (each says its note to the one under
    /// it) and opens what a screen asked for (`opening` is shown the top
    /// screen saying so first); false once the root has closed.
    pub fn settle(&mut self, mut opening: impl FnMut(&dyn Interactive)) -> bool {
        loop {
            if self.top().quit() {
                let closed = self.top_mut().closing();
                if self.over.pop().is_none() {
                    return false;
                }
                self.top_mut().back(closed);
                self.changed = true;
            } else if let Some(what) = self.top_mut().opening() {
                let Open::Replay(path) = &what;
                self.top_mut().say(format!(" opening {} …", path.display()));
                opening(self.top());
                match (self.open)(what) {
                    Ok(screen) => self.over.push(screen),
                    Err(note) => self.top_mut().back(Closed { note, tuned: None }),
                }
                self.changed = true;
            } else {
                return true;
            }
        }
    }

    /// A key, a tick, a sample or an exit; true when the top screen changed.
    pub fn handle(&mut self, e: AppEvent) -> bool {
        match e {
            AppEvent::Key(k) => match Command::of(&k) {
                Some(a) => {
                    self.top_mut().dispatch(a);
                    true
                }
                None => false,
            },
            AppEvent::Tick => self.top_mut().update(AppEvent::Tick),
            AppEvent::Sample(_) | AppEvent::Exited(_) => self.deliver(e),
            AppEvent::Resize | AppEvent::Quit => true,
        }
    }

    /// `e` to every screen, a copy to each under the top (none when the
    /// root is alone); whether the top one changed.
    fn deliver(&mut self, e: AppEvent) -> bool {
        let copy = |e: &AppEvent| match e {
            AppEvent::Sample(s) => Some(AppEvent::Sample(s.clone())),
            AppEvent::Exited(st) => Some(AppEvent::Exited(*st)),
            _ => None,
        };
        let Some(mut top) = self.over.pop() else { return self.root.update(e) };
        if let Some(c) = copy(&e) {
            self.root.update(c);
        }
        for s in &mut self.over {
            if let Some(c) = copy(&e) {
                s.update(c);
            }
        }
        let changed = top.update(e);
        self.over.push(top);
        changed
    }
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

    /// A screen that records what reached it in `log`.
    struct Fake {
        name: &'static str,
        log: std::rc::Rc<std::cell::RefCell<Vec<String>>>,
        open: Option<Open>,
        quit: bool,
    }

    impl Interactive for Fake {
        fn draw_into(&self, _: ratatui_core::layout::Rect, _: &mut ratatui_core::buffer::Buffer) {}
        fn apply(&mut self, a: Command) {
            match a {
                Command::Snapshot => self.open = Some(Open::Replay("snap.pickle".into())),
                Command::Zoom => self.open = Some(Open::Replay("missing.pickle".into())),
                Command::Back => self.quit = true,
                a => self.log.borrow_mut().push(format!("{} {a:?}", self.name)),
            }
        }
        fn mode(&self) -> Mode {
            Mode::Live
        }
        fn say(&mut self, msg: String) {
            self.log.borrow_mut().push(format!("{} says{msg}", self.name));
        }
        fn quit(&self) -> bool {
            self.quit
        }
        fn update(&mut self, e: AppEvent) -> bool {
            self.log.borrow_mut().push(format!(
                "{} {}",
                self.name,
                if matches!(e, AppEvent::Sample(_)) { "sample" } else { "other" }
            ));
            true
        }
        fn opening(&mut self) -> Option<Open> {
            self.open.take()
        }
        fn closing(&mut self) -> Closed {
            Closed { note: format!(" {} closed", self.name), tuned: Some("tuned".into()) }
        }
        fn back(&mut self, c: Closed) {
            self.log.borrow_mut().push(format!("{} back:{}:{:?}", self.name, c.note, c.tuned));
        }
    }

    /// One loop for every screen: the root opens a screen over itself, keys
    /// go to the top one, samples reach both, closing the top brings the
    /// root back with its note, a screen that cannot open is the root's
    /// status, and the root closing ends it.
    #[test]
    fn screens_open_over_each_other_and_close_back() {
        use crossterm::event::KeyCode;
        let log = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let fake = |name| Fake { name, log: log.clone(), open: None, quit: false };
        let mut root = fake("live");
        let mut opener = |o: Open| -> Result<Box<dyn Interactive>, String> {
            match o {
                Open::Replay(p) if p.as_os_str() == "snap.pickle" => Ok(Box::new(fake("replay"))),
                Open::Replay(p) => Err(format!(" {}: no such file", p.display())),
            }
        };
        let mut s = Screens::new(&mut root, &mut opener);
        let mut shown = Vec::new();
        assert!(s.settle(|_| shown.push(())) && s.depth() == 1);
        let key = |c: char| AppEvent::Key(KeyEvent::from(KeyCode::Char(c)));
        assert!(s.handle(key('S')));
        assert!(s.settle(|_| shown.push(())));
        assert_eq!((s.depth(), shown.len()), (2, 1), "opened, and the root said so first");
        assert!(s.handle(key('h')));
        let snap = || AppEvent::Sample(Box::default());
        assert!(s.handle(snap()));
        assert!(s.handle(key('q')) && s.settle(|_| {}));
        assert_eq!(s.depth(), 1);
        assert!(s.handle(AppEvent::Key(KeyEvent::from(KeyCode::Enter))) && s.settle(|_| {}));
        assert_eq!(s.depth(), 1, "a screen that cannot open stays closed");
        assert!(s.handle(key('q')));
        assert!(!s.settle(|_| {}), "the root closed: the loop ends");
        assert_eq!(
            *log.borrow(),
            [
                "live says opening snap.pickle …",
                "replay Help",
                "live sample",
                "replay sample",
                "live back: replay closed:Some(\"tuned\")",
                "live says opening missing.pickle …",
                "live back: missing.pickle: no such file:None",
            ]
        );
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
