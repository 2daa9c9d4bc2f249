//! The keys: one table that the apps dispatch on (`Command::of`), the help
//! overlay lists and the status line's hints are built from, per mode.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

/// What a key asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
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
    /// `b`: the block-size histogram counts blocks, or sums their bytes.
    HistogramBytes,
    /// `t`: map rows to one scale, or each stretched to the width.
    RowScale,
    /// `w`: the map and the timeline by what the memory is (category), or
    /// by block state.
    ByCategory,
    Left,
    Right,
    PageUp,
    PageDown,
    Home,
    End,
    Peak,
    NextOom,
    Pause,
    /// `+`: faster (synth), zoom the timeline in (replay).
    Plus,
    /// `-`: slower (synth), zoom the timeline out (replay).
    Minus,
    Screenshot,
    /// `S`: ask the selected process for a PyTorch memory snapshot (live).
    Snapshot,
    /// `1`–`9`: the GPU at that position (0-based).
    Gpu(usize),
    NextProcess,
    /// `P`: the new run's peak (diff; `p` is the base's).
    NewPeak,
    /// `j`: the job screen, every rank of the selected process's job (live).
    Job,
}

/// Which app is answering: the keys differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A PyTorch snapshot replayed through the allocator.
    Replay,
    /// A synthetic training loop (`synth`, the demo).
    Synth,
    /// NVML and publishing processes.
    Live,
    /// `replay RECORDING.jsonl`: what the live view recorded, to step through.
    Recording,
    /// `diff BASE NEW`: two runs on one axis.
    Diff,
    /// `replay rank0 rank1 …`: one snapshot per rank, side by side.
    Ranks,
    /// A snapshot taken without memory history: one state, nothing to step.
    Snapshot,
    /// `j` in the live view or a recording: every rank of a job.
    Job,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Replay => "replay",
            Mode::Synth => "synth and the demo",
            Mode::Live => "the live view",
            Mode::Recording => "a recording",
            Mode::Diff => "diff",
            Mode::Ranks => "ranks side by side",
            Mode::Snapshot => "a snapshot without history",
            Mode::Job => "the job screen",
        }
    }
}

const ALL: &[Mode] = &[Mode::Replay, Mode::Synth, Mode::Live, Mode::Recording, Mode::Snapshot];
/// Every screen, the diff's too.
const EVERY: &[Mode] =
    &[Mode::Replay, Mode::Synth, Mode::Live, Mode::Recording, Mode::Diff, Mode::Ranks, Mode::Snapshot, Mode::Job];
/// Replay, a paused synth, a recording: a cursor that steps.
const STEPS: &[Mode] = &[Mode::Replay, Mode::Synth, Mode::Recording];
/// The live view and a recording of it.
const LIVE: &[Mode] = &[Mode::Live, Mode::Recording];

/// One row of the table.
pub(crate) struct Binding {
    /// The keys as the help shows them.
    pub(crate) label: &'static str,
    codes: &'static [KeyCode],
    /// `Gpu(0)` stands for every digit.
    action: Command,
    /// What it does, for the help.
    pub(crate) help: &'static str,
    /// Its part of the status line's hints ("" for none).
    hint: &'static str,
    modes: &'static [Mode],
}

const fn b(
    label: &'static str,
    codes: &'static [KeyCode],
    action: Command,
    help: &'static str,
    hint: &'static str,
    modes: &'static [Mode],
) -> Binding {
    Binding { label, codes, action, help, hint, modes }
}

use KeyCode::Char as C;

/// Every key, in the order the help lists them.
pub(crate) const KEYS: &[Binding] = &[
    b(
        "q / Esc",
        &[C('q'), KeyCode::Esc],
        Command::Back,
        "close the help or the block list, else quit",
        "q quit",
        EVERY,
    ),
    b("Ctrl-C", &[], Command::Quit, "quit", "", EVERY),
    b("←/→", &[KeyCode::Left], Command::Left, "one event back / forward", "←/→ PgUp/PgDn step", &[Mode::Replay]),
    b("←/→", &[KeyCode::Left], Command::Left, "paused: one event back / forward", "", &[Mode::Synth]),
    b("←/→", &[KeyCode::Left], Command::Left, "one sample back / forward", "←/→ PgUp/PgDn step", &[Mode::Recording]),
    b("", &[KeyCode::Right], Command::Right, "", "", STEPS),
    b("PgUp/PgDn", &[KeyCode::PageUp], Command::PageUp, "jump 1/20 of the way", "", STEPS),
    b("", &[KeyCode::PageDown], Command::PageDown, "", "", STEPS),
    b("Home/End", &[KeyCode::Home], Command::Home, "first / last event", "", &[Mode::Replay, Mode::Synth]),
    b("Home/End", &[KeyCode::Home], Command::Home, "first / last sample", "", &[Mode::Recording]),
    b("", &[KeyCode::End], Command::End, "", "", STEPS),
    b("p", &[C('p')], Command::Peak, "jump to the peak", "p peak", &[Mode::Replay]),
    b("p", &[C('p')], Command::Peak, "jump to the sample after the process's peak", "p peak", &[Mode::Recording]),
    b("p", &[C('p')], Command::Peak, "paused: jump to the peak of what has run", "", &[Mode::Synth]),
    b("o", &[C('o')], Command::NextOom, "jump to the next OOM", "o OOM", &[Mode::Replay]),
    b("o", &[C('o')], Command::NextOom, "jump to the process's next OOM", "o OOM", &[Mode::Recording]),
    b("space", &[C(' ')], Command::Pause, "pause / resume", "space pause", &[Mode::Synth]),
    b("+ / -", &[C('+')], Command::Plus, "twice / half as fast", "+/- speed", &[Mode::Synth]),
    b("", &[C('-')], Command::Minus, "", "", &[Mode::Synth]),
    b("+ / -", &[C('+')], Command::Plus, "zoom the timeline in / out around the cursor", "+/- zoom", &[Mode::Replay]),
    b("", &[C('-')], Command::Minus, "", "", &[Mode::Replay]),
    b(
        "1-9",
        &[C('1'), C('2'), C('3'), C('4'), C('5'), C('6'), C('7'), C('8'), C('9')],
        Command::Gpu(0),
        "pick a GPU",
        "1-9 GPU",
        LIVE,
    ),
    b("n", &[C('n')], Command::NextProcess, "the next publishing process on this GPU", "n next process", LIVE),
    b(
        "j",
        &[C('j')],
        Command::Job,
        "the job: every rank side by side, their timelines on one axis (↑/↓ Enter a rank)",
        "j job",
        LIVE,
    ),
    b("S", &[C('S')], Command::Snapshot, "ask the process for a snapshot, open it", "S snapshot", &[Mode::Live]),
    b("↑/↓", &[KeyCode::Up], Command::Up, "select a segment (a block in the list)", "↑/↓ Enter segment", ALL),
    b("", &[KeyCode::Down], Command::Down, "", "", ALL),
    b("Enter", &[KeyCode::Enter], Command::Zoom, "list its blocks and where they were allocated", "", ALL),
    b("c", &[C('c')], Command::Compact, "compact map: fixed bytes per cell", "c compact", &[Mode::Synth]),
    b(
        "c",
        &[C('c')],
        Command::Compact,
        "compact map: fixed bytes per cell",
        "",
        &[Mode::Replay, Mode::Live, Mode::Recording, Mode::Snapshot],
    ),
    b("a", &[C('a')], Command::Order, "order segments by address / size", "", ALL),
    b("t", &[C('t')], Command::RowScale, "map rows to one scale / each to the full width", "", ALL),
    b(
        "w",
        &[C('w')],
        Command::ByCategory,
        "what the memory is: map and timeline by category / by block state",
        "w what",
        &[Mode::Replay, Mode::Snapshot, Mode::Synth],
    ),
    b("b", &[C('b')], Command::HistogramBytes, "block sizes: count blocks / sum their bytes", "", ALL),
    b("tab", &[KeyCode::Tab], Command::Focus, "focus map / timeline", "tab focus", ALL),
    b("s", &[C('s')], Command::Screenshot, "write the focused view as SVG here", "s screenshot", ALL),
    b("s", &[C('s')], Command::Screenshot, "write both runs' timelines as SVG here", "s screenshot", &[Mode::Diff]),
    b("←/→", &[KeyCode::Left], Command::Left, "move the cursor along both runs", "←/→ move", &[Mode::Diff]),
    b("", &[KeyCode::Right], Command::Right, "", "", &[Mode::Diff]),
    b("PgUp/PgDn", &[KeyCode::PageUp], Command::PageUp, "jump a tenth of an iteration", "", &[Mode::Diff]),
    b("", &[KeyCode::PageDown], Command::PageDown, "", "", &[Mode::Diff]),
    b("Home/End", &[KeyCode::Home], Command::Home, "the start / the end", "", &[Mode::Diff]),
    b("", &[KeyCode::End], Command::End, "", "", &[Mode::Diff]),
    b("p / P", &[C('p')], Command::Peak, "the base's / the new run's peak", "p/P peaks", &[Mode::Diff]),
    b("", &[C('P')], Command::NewPeak, "", "", &[Mode::Diff]),
    b("↑/↓", &[KeyCode::Up], Command::Up, "select a rank", "↑/↓ rank", &[Mode::Ranks, Mode::Job]),
    b("", &[KeyCode::Down], Command::Down, "", "", &[Mode::Ranks, Mode::Job]),
    b("Enter", &[KeyCode::Enter], Command::Zoom, "the rank's own map and timeline", "Enter its map", &[Mode::Job]),
    b("j", &[C('j')], Command::Job, "back to the GPUs and the selected process", "j back", &[Mode::Job]),
    b(
        "Enter",
        &[KeyCode::Enter],
        Command::Zoom,
        "open the rank in the replay view (q there comes back)",
        "Enter open",
        &[Mode::Ranks],
    ),
    b("? / h", &[C('?'), C('h')], Command::Help, "this help", "? help", EVERY),
];

fn same(a: Command, b: Command) -> bool {
    matches!((a, b), (Command::Gpu(_), Command::Gpu(_))) || a == b
}

impl Command {
    /// The action of a key press, from `KEYS`.
    pub(crate) fn of(k: &KeyEvent) -> Option<Command> {
        if k.kind != KeyEventKind::Press {
            return None;
        }
        if k.code == C('c') && k.modifiers.contains(KeyModifiers::CONTROL) {
            return Some(Command::Quit);
        }
        let found = KEYS.iter().find(|b| b.codes.contains(&k.code))?;
        Some(match (found.action, k.code) {
            (Command::Gpu(_), C(c @ '1'..='9')) => Command::Gpu(c as usize - '1' as usize),
            (a, _) => a,
        })
    }

    /// Whether `mode` answers to it; otherwise a line saying where it
    /// does, for the status line.
    pub(crate) fn answered_in(self, mode: Mode) -> Result<(), String> {
        let rows: Vec<&Binding> = KEYS.iter().filter(|b| same(b.action, self)).collect();
        if rows.iter().any(|b| b.modes.contains(&mode)) {
            return Ok(());
        }
        let Some(first) = rows.first() else { return Ok(()) };
        // The row that carries a pair's label and help (←/→ for →): the
        // first of the labelled rows just before it.
        let at = KEYS.iter().position(|b| std::ptr::eq(b, *first)).unwrap_or(0);
        let shown = if first.label.is_empty() {
            let before = &KEYS[..at];
            let pair = before.last().map(|b| b.action);
            let run = before.iter().rev().take_while(|b| !b.label.is_empty() && Some(b.action) == pair).count();
            before.get(before.len() - run).filter(|_| run > 0).unwrap_or(first)
        } else {
            first
        };
        let whose: Vec<&str> =
            ALL.iter().filter(|m| rows.iter().any(|b| b.modes.contains(m))).map(|m| m.name()).collect();
        let whose = match whose.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => whose.join(""),
        };
        Err(format!(
            " {} ({}) is for {}, not {}; ? lists this screen's keys",
            shown.label,
            shown.help,
            whose,
            mode.name()
        ))
    }
}

/// The status line's key hints for `mode` that fit in `width` columns: the first ones, and always
/// "? help" last (it lists the rest), so a narrow screen drops hints whole
/// instead of cutting one.
pub(crate) fn hints_within(mode: Mode, width: usize) -> String {
    let all: Vec<&str> =
        KEYS.iter().filter(|b| !b.hint.is_empty() && b.modes.contains(&mode)).map(|b| b.hint).collect();
    let (help, rest) = match all.split_last() {
        Some((h, r)) if *h == "? help" => (Some(*h), r),
        _ => (None, &all[..]),
    };
    let mut s = String::from(" ");
    let tail = help.map_or(0, |h| h.chars().count() + 1);
    for h in rest {
        if s.chars().count() + h.chars().count() + 2 + tail > width {
            break;
        }
        s.push_str(h);
        s.push_str("  ");
    }
    if let Some(h) = help {
        s.push_str(h);
    }
    s.truncate(s.trim_end().len());
    s.push(' ');
    s
}

/// What the screens' figures mean, for the help (docs/user/json.md defines
/// them with the JSON's names).
pub(crate) const FIGURES: &[(&str, &str)] = &[
    ("reserved but unallocated", "reserved − allocated now: the cache"),
    ("peak_ratio", "1 − peak allocated / peak reserved: reserved that never held tensors at once"),
    ("external_fragmentation", "1 − largest free block / all free bytes"),
    ("inactive_split", "free bytes in segments with live blocks: empty_cache cannot release them"),
    ("rounding_waste", "allocated − requested: blocks rounded up"),
    ("Block sizes", "blocks of each size allocated / free: how many, or (b) how many bytes"),
    ("split, empty (narrow map)", "free in a segment with live blocks; a segment with none (releasable)"),
];

/// The help's rows for `mode`: (keys, what they do).
pub(crate) fn help_rows(mode: Mode) -> Vec<(&'static str, &'static str)> {
    KEYS.iter().filter(|b| !b.label.is_empty() && b.modes.contains(&mode)).map(|b| (b.label, b.help)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn press(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    #[test]
    fn the_hints_are_the_table_read_per_mode() {
        assert_eq!(
            hints_within(Mode::Replay, usize::MAX),
            " q quit  ←/→ PgUp/PgDn step  p peak  o OOM  +/- zoom  ↑/↓ Enter segment  w what  tab focus  s screenshot  ? help "
        );
        assert_eq!(
            hints_within(Mode::Synth, usize::MAX),
            " q quit  space pause  +/- speed  ↑/↓ Enter segment  c compact  w what  tab focus  s screenshot  ? help "
        );
        assert_eq!(
            hints_within(Mode::Recording, usize::MAX),
            " q quit  ←/→ PgUp/PgDn step  p peak  o OOM  1-9 GPU  n next process  j job  ↑/↓ Enter segment  tab focus  s screenshot  ? help "
        );
        assert_eq!(
            hints_within(Mode::Live, usize::MAX),
            " q quit  1-9 GPU  n next process  j job  S snapshot  ↑/↓ Enter segment  tab focus  s screenshot  ? help "
        );
        assert_eq!(hints_within(Mode::Ranks, usize::MAX), " q quit  ↑/↓ rank  Enter open  ? help ");
        // Narrow: whole hints drop from the end, and "? help" stays.
        assert_eq!(hints_within(Mode::Replay, 60), " q quit  ←/→ PgUp/PgDn step  p peak  o OOM  ? help ");
        assert!(hints_within(Mode::Replay, 80).chars().count() <= 80);
        assert_eq!(hints_within(Mode::Replay, 10), " ? help ");
    }

    #[test]
    fn every_key_dispatches_to_its_row_and_other_modes_say_where_it_belongs() {
        assert_eq!(Command::of(&press(C('7'))), Some(Command::Gpu(6)));
        assert_eq!(Command::of(&press(KeyCode::Right)), Some(Command::Right));
        assert_eq!(Command::of(&KeyEvent::new(C('c'), KeyModifiers::CONTROL)), Some(Command::Quit));
        assert_eq!(Command::of(&press(C('z'))), None);
        assert_eq!(
            Command::Right.answered_in(Mode::Live).unwrap_err(),
            " ←/→ (one event back / forward) is for replay, synth and the demo and a recording, not the live view; ? lists this screen's keys"
        );
        assert_eq!(Command::Right.answered_in(Mode::Synth), Ok(()));
        assert_eq!(
            Command::Gpu(1).answered_in(Mode::Synth).unwrap_err(),
            " 1-9 (pick a GPU) is for the live view and a recording, not synth and the demo; ? lists this screen's keys"
        );
        assert!(Command::Compact.answered_in(Mode::Live).is_ok());
        // Every row's keys come back as its action (the help lists what is dispatched).
        for b in KEYS {
            for &code in b.codes {
                let a = Command::of(&press(code)).unwrap();
                assert!(same(a, b.action) || KEYS.iter().any(|o| o.codes.contains(&code) && same(o.action, a)));
            }
        }
    }
}
