//! Screen snapshots (insta) of the views, drawn from real traces at fixed
//! positions into ratatui's test backend.

use crate::common;

use common::{fixture, replay_app, replay_app_with};
use gpumem_top::alloc::Action;
use gpumem_top::replay::scrub::Scrubber;
use gpumem_top::replay::ReplayOptions;
use gpumem_top::trace;
use gpumem_top::ui::app::ReplayApp;
use gpumem_top::ui::event::{Command, Interactive};
use gpumem_top::view::{segment_cells, Cell};
use ratatui_core::backend::TestBackend;
use ratatui_core::terminal::Terminal;

/// The peak: where the replay opens.
const PEAK: Option<fn(&trace::DeviceTrace) -> usize> = None;

fn screen(name: &str, limit: Option<u64>, at: Option<fn(&trace::DeviceTrace) -> usize>, w: u16, h: u16) -> String {
    screen_with(name, limit, at, w, h, None, &[])
}

/// The replay app on `name` as `gpumem-top replay` opens it (with
/// `--memory-limit limit`), moved to `at` (or left at the peak) and driven
/// by actions: `zoom` sorts by size, goes down to that segment and zooms;
/// `compact` switches the map to compact. Drawn through the app's own
/// `Interactive::draw` into ratatui's test backend.
fn screen_with(
    name: &str,
    limit: Option<u64>,
    at: Option<fn(&trace::DeviceTrace) -> usize>,
    w: u16,
    h: u16,
    zoom: Option<usize>,
    actions: &[Command],
) -> String {
    let (mut app, d) = replay_app_with(&format!("traces/{name}.pickle.gz"), limit);
    if let Some(at) = at {
        app.go(at(d));
    }
    if let Some(k) = zoom {
        app.apply(Command::Order);
        for _ in 0..k {
            app.apply(Command::Down);
        }
        app.apply(Command::Zoom);
    }
    for &a in actions {
        app.dispatch(a);
    }
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| app.draw(f)).unwrap();
    term.backend().to_string()
}

fn first_oom(d: &trace::DeviceTrace) -> usize {
    d.events.iter().position(|e| e.action == Action::Oom).unwrap()
}

#[test]
fn resnet50_at_its_peak_100x30() {
    insta::assert_snapshot!(screen("resnet50_train", None, PEAK, 100, 30));
}

#[test]
fn resnet50_at_its_peak_200x60() {
    insta::assert_snapshot!(screen("resnet50_train", None, PEAK, 200, 60));
}

#[test]
fn llama_at_its_oom_100x30() {
    insta::assert_snapshot!(screen("llama_pressure", Some(9_006_592_819), Some(first_oom), 100, 30));
}

#[test]
fn llama_at_its_oom_200x60() {
    insta::assert_snapshot!(screen("llama_pressure", Some(9_006_592_819), Some(first_oom), 200, 60));
}

#[test]
fn a_small_terminal_gets_a_message() {
    let s = screen("resnet50_train", None, PEAK, 79, 24);
    assert!(s.contains("gpumem-top needs a terminal of at least 80x24; this one is 79x24."), "{s}");
}

#[test]
fn peak_screen_shows_the_figures_pytorch_reported() {
    let s = screen("resnet50_train", None, PEAK, 120, 32);
    // allocated_bytes.all.peak 5,855,043,584 = 5.45 GiB, at event 3041.
    assert!(s.contains("5.45 GiB   peak    5.45 GiB"), "{s}");
    assert!(s.contains("peak 5.45 GiB @ event 3041"), "{s}");
}

#[test]
fn cells_are_drawn_to_scale_within_a_segment() {
    use gpumem_top::alloc::{BlockInfo, BlockState, SegmentInfo};
    let b = |address, size, requested_size, state| BlockInfo { address, size, requested_size, state, tag: 0 };
    let seg = SegmentInfo {
        device: 0,
        address: 0,
        total_size: 100,
        allocated_size: 0,
        active_size: 0,
        requested_size: 0,
        stream: 0,
        segment_type: "large",
        is_expandable: false,
        pool: Some((0, 0)),
        private: false,
        blocks: vec![
            b(0, 40, 30, BlockState::ActiveAllocated),
            b(40, 20, 20, BlockState::ActivePendingFree),
            b(60, 40, 0, BlockState::Inactive),
        ],
    };
    let cells: String = segment_cells(&seg, 10).into_iter().map(Cell::glyph).collect();
    assert_eq!(cells, "███▓▒▒░░░░");
    let free = SegmentInfo { blocks: vec![b(0, 100, 0, BlockState::Inactive)], ..seg };
    let cells: String = segment_cells(&free, 4).into_iter().map(Cell::glyph).collect();
    assert_eq!(cells, "····");
}

/// At the OOM, the screen shows what PyTorch's OOM message said: "Of the
/// allocated memory 7.87 GiB is allocated by PyTorch, and 423.02 MiB is
/// reserved by PyTorch but unallocated" (llama_pressure.truth.json).
#[test]
fn oom_screen_matches_pytorchs_oom_message() {
    let s = screen("llama_pressure", Some(9_006_592_819), Some(first_oom), 120, 32);
    assert!(s.contains("allocated ") && s.contains("7.87 GiB   peak    7.87 GiB"), "{s}");
    assert!(s.contains("reserved but unallocated 423.02 MiB"), "{s}");
    assert!(s.contains("✗"), "the OOM is marked on the timeline: {s}");
}

fn demo_screen(w: u16, h: u16) -> String {
    let mut app = gpumem_top::ui::app::DemoApp::demo(42, "no NVIDIA GPU found: simulated device".into(), false);
    app.advance(3000);
    draw_demo(&mut app, w, h)
}

#[test]
fn demo_at_seed_42_100x30() {
    insta::assert_snapshot!(demo_screen(100, 30));
}

#[test]
fn demo_at_seed_42_200x60() {
    let s = demo_screen(200, 60);
    // The banner says the numbers are simulated.
    assert!(s.lines().next().unwrap_or("").contains("no NVIDIA GPU found: simulated device"), "{s}");
    insta::assert_snapshot!(s);
}

/// Enter on a segment lists its blocks with sizes, requested sizes, states
/// and where each live block was allocated (from the trace's Python frames).
#[test]
fn zooming_into_a_segment_lists_its_blocks_and_call_sites() {
    let s = screen_with("llama_pressure", Some(9_006_592_819), Some(first_oom), 160, 40, Some(0), &[]);
    assert!(s.contains("segment 0x7fc71c000000: 126.00 MiB large pool, stream 0"), "{s}");
    assert!(s.contains("req"), "{s}");
    assert!(s.contains("modeling_llama.py:381 forward"), "a call site from the trace: {s}");
    // Each live block's category, before its call site.
    assert!(s.contains("allocated    activ   modeling_llama.py:381 forward"), "{s}");
    // The highlighted block's whole Python stack, innermost frame first.
    assert!(s.contains("call stack of the block at +0B (innermost first)"), "{s}");
    assert!(s.contains("  embedding  site-packages/torch/nn/functional.py:2567"), "{s}");
    insta::assert_snapshot!(s);
}

/// Training iterations come from the trace's `Optimizer.step` annotations;
/// each is marked and its peak labelled, and the live bytes at the cursor are
/// grouped by the line of Python that allocated them.
#[test]
fn iterations_peaks_and_call_sites_at_the_resnet_peak() {
    let s = screen("resnet50_train", None, PEAK, 200, 60);
    assert!(s.contains("╵ 4 iterations"), "{s}");
    // The first iteration's peak is lower (no optimizer state yet); the global
    // peak is in the second.
    assert!(s.contains("peak 5.45 GiB @ event 3041 (iteration 2)"), "{s}");
    // Four steps end four iterations; the fifth (after the last step) is partial.
    assert_eq!(s.matches('╵').count(), 4 + 1, "{s}");
    assert_eq!(s.matches("▲5.5G").count(), 3, "{s}");
    assert!(s.contains("live bytes by call site"), "{s}");
    assert!(s.contains("  1.3G ×48  resnet.py:155 forward"), "{s}");
}

/// Compact mode: all 202 segments of the llama OOM back to back at a fixed
/// scale, each given ceil(size / scale) cells.
#[test]
fn compact_map_fits_every_segment_at_a_fixed_scale() {
    let s = screen_with("llama_pressure", Some(9_006_592_819), Some(first_oom), 100, 30, None, &[Command::Compact]);
    // The long form ("compact: 1 cell = … ─ segments back to back by
    // address ─ selected …") does not fit the pane's 60 columns.
    assert!(s.contains("│1 cell = 16.0M ─ by address ─ sel 0x7fc57c000000 118M       │"), "{s}");
    assert!(!s.contains("not shown"), "{s}");
    // The segments at the OOM, counted independently of the renderer.
    let t = trace::load(&fixture("traces/llama_pressure.pickle.gz")).unwrap();
    let d = &t.devices[0];
    let mut opts = ReplayOptions::new(t.settings.as_ref().unwrap().config(), 150_109_880_320);
    opts.memory_limit = Some(9_006_592_819);
    let mut sc = Scrubber::new(d.events.view(), &opts, &[], 512).unwrap();
    let segs = sc.seek(first_oom(d)).snapshot();
    assert_eq!(segs.len(), 202);
    let expected: u64 = segs.iter().map(|g| g.total_size.div_ceil(16 << 20).max(1)).sum();
    // At 8 MiB a cell they would not fit in the pane's 13 rows of 60.
    assert!(segs.iter().map(|g| g.total_size.div_ceil(8 << 20).max(1)).sum::<u64>() > 13 * 60);
    // The map pane is the left 62% of a 100-wide screen: inner width 60.
    let map_cells: usize =
        s.lines().skip(7).take(13).map(|l| l.chars().skip(2).take(60).filter(|c| "█▓▒░·".contains(*c)).count()).sum();
    assert_eq!(map_cells as u64, expected, "{s}");
    insta::assert_snapshot!(s);
}

/// At 80x24 the compact map's footer keeps what matters in shorter words
/// (the scale, how many segments are hidden, the selection) instead of
/// cutting the long form mid-word.
#[test]
fn compact_map_footer_reads_at_80x24() {
    let s = screen_with("llama_pressure", Some(9_006_592_819), Some(first_oom), 80, 24, None, &[Command::Compact]);
    // The pane's 48 columns hold the scale and the selection, whole.
    assert!(s.contains("│1 cell = 64.0M ─ 0x7fc57c000000 118M            ││"), "{s}");
}

/// The demo app drawn through its own `draw_into` at `w`x`h`.
fn draw_demo(app: &mut gpumem_top::ui::app::DemoApp, w: u16, h: u16) -> String {
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| {
        let area = f.area();
        app.draw_into(area, f.buffer_mut())
    })
    .unwrap();
    term.backend().to_string()
}

/// The help lists the keys of the screen it is on, from the table the apps
/// dispatch on; a key of another mode says where it belongs instead of
/// doing nothing (the demo has no GPUs to pick, and steps back only when
/// paused).
#[test]
fn the_help_and_unbound_keys_follow_the_mode() {
    use crossterm::event::{KeyCode, KeyEvent};
    let mut app = gpumem_top::ui::app::DemoApp::demo(42, "demo".into(), false);
    app.advance(500);
    let draw = |app: &mut gpumem_top::ui::app::DemoApp| draw_demo(app, 120, 40);
    app.handle_key(KeyEvent::from(KeyCode::Char('2')));
    let s = draw(&mut app);
    assert!(
        s.contains(
            "1-9 (pick a GPU) is for the live view and a recording, not synth and the demo; ? lists this screen's keys"
        ),
        "{s}"
    );
    // Stepping back needs a pause first, and says so.
    app.handle_key(KeyEvent::from(KeyCode::Left));
    assert!(draw(&mut app).contains("pause (space) to step back through what has run"));
    app.handle_key(KeyEvent::from(KeyCode::Char('?')));
    let s = draw(&mut app);
    assert!(s.contains("space        pause / resume"), "{s}");
    assert!(s.contains("+ / -        twice / half as fast"), "{s}");
    assert!(s.contains("paused: jump to the peak of what has run"), "{s}");
    assert!(!s.contains("jump to the next OOM") && !s.contains("pick a GPU"), "only this mode's keys: {s}");
    // And what the figures on the screen mean.
    assert!(s.contains("peak_ratio                1 − peak allocated / peak reserved"), "{s}");
    assert!(s.contains("blocks of each size allocated / free: how many, or (b) how many bytes"), "{s}");
    // The replay's help: its keys, not the demo's.
    let r = screen_with("llama_pressure", None, None, 120, 40, None, &[Command::Help]);
    assert!(r.contains("p            jump to the peak") && r.contains("←/→          one event back / forward"), "{r}");
    assert!(!r.contains("pause / resume"), "{r}");
}

/// The timeline says its scale and which line is which, and an OOM right
/// after the peak leaves the peak's label readable (the ✗ sits on the floor
/// with the iteration ticks).
#[test]
fn the_timeline_has_a_scale_a_key_and_both_marks() {
    let s = screen("llama_pressure", Some(9_006_592_819), Some(first_oom), 160, 40);
    // The run kept under its 8.39 GiB limit: the scale reaches it, and its
    // line is keyed.
    assert!(s.contains("0–8.4G ┄ the limit ─ ━ allocated under ━ reserved"), "{s}");
    assert!(s.contains("▲7.9G"), "the peak's label: {s}");
    // The labels have the plot's top row to themselves: no line under them.
    let lines: Vec<&str> = s.lines().collect();
    let row = lines.iter().position(|l| l.contains("┌ Timeline")).map(|i| lines[i + 1]).unwrap_or("");
    assert!(row.contains("▲7.9G") && !row.chars().any(|c| ('\u{2801}'..='\u{28ff}').contains(&c)), "{row}");
    let floor = s.lines().rev().find(|l| l.contains('╵')).unwrap_or("");
    assert!(floor.contains('✗'), "the OOM on the floor row: {s}");
}

/// The header, the bars and the timeline's footer speak of one moment: at
/// the first event of llama_pressure (a segment_alloc whose alloc replays
/// with it) all three say the state after the alloc, event 1.
#[test]
fn header_bars_and_footer_agree_at_the_first_event() {
    let s = screen("llama_pressure", None, Some(|_| 0), 160, 40);
    assert!(s.contains("─ event 1/4547 ─"), "{s}");
    assert!(s.contains("cursor: event 1 of 4547 ─ allocated 126.00 MiB ─ reserved 126.00 MiB"), "{s}");
    let bar = s.lines().find(|l| l.contains("│ allocated ")).unwrap_or("");
    assert!(bar.contains("126.00 MiB"), "{s}");
}

/// A long run keeps its latest events only: the timeline then says so, its
/// peak is "in view" (the bars' peak is the run's), and event numbers are
/// the run's, not the window's.
#[test]
fn a_long_runs_timeline_says_it_is_a_window() {
    let mut app = gpumem_top::ui::app::DemoApp::demo(42, "demo".into(), false);
    // Past the 20,000 points a run's screen keeps.
    app.advance(30_000);
    let mut term = Terminal::new(TestBackend::new(200, 60)).unwrap();
    term.draw(|f| {
        let area = f.area();
        app.draw_into(area, f.buffer_mut())
    })
    .unwrap();
    let s = term.backend().to_string();
    let title = s.lines().find(|l| l.contains("┌ Timeline")).unwrap_or("");
    // A running synth's timeline has a point per request it made (a
    // malloc or a free), and says so; a paused one steps through events.
    assert!(title.contains("requests ─ peak in view"), "{title}");
    let footer = s.lines().find(|l| l.contains("cursor: request")).unwrap_or("");
    let of: usize = footer.split(" of ").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse().ok()).unwrap();
    assert!(of >= 30_000, "the run's request count, not the window's: {footer}");
}

/// At an OOM the map's lower half says what was asked and by whom, down to
/// the program's own frame, with what is left out counted.
#[test]
fn the_oom_screen_names_the_request_and_the_programs_frame() {
    let s = screen("llama_pressure", Some(9_006_592_819), Some(first_oom), 100, 30);
    assert!(
        s.contains("┌ OOM at event 3816: 117.05 MiB on stream 0 ┐")
            || s.contains("OOM at event 3816: 117.05 MiB on stream 0 ─"),
        "{s}"
    );
    assert!(s.contains("│ functional.py:2397 silu"), "{s}");
    assert!(
        s.contains("│ … 19 frames") && s.contains("│ … 2 frames"),
        "what is left out is counted on both sides: {s}"
    );
    // What held the memory when the request failed (docs/user/categories.md).
    // In the bars' letters where two whole categories do not fit the box.
    assert!(s.contains("│ held: A 5.2G O 1.3G T 714M P 668M"), "{s}");
    assert!(s.contains("│ train_workloads.py:67 workload"), "{s}");
    // Away from the OOM, no box.
    let s = screen("llama_pressure", Some(9_006_592_819), PEAK, 100, 30);
    assert!(!s.contains("OOM at event"), "{s}");
}

/// The histogram has column heads, counts blocks, and `b` sums their bytes
/// instead; sizes that do not fit fold into the first row shown, so the
/// counts still add up to every block.
#[test]
fn the_histogram_counts_or_sums_bytes_with_heads() {
    let rows = |s: &str| -> Vec<String> {
        s.lines()
            .filter_map(|l| l.split("││").nth(1))
            .map(|r| r.trim_end_matches(['│', '"']).to_string())
            .filter(|r| r.starts_with('≤'))
            .collect()
    };
    let s = screen("resnet50_train", None, PEAK, 100, 30);
    assert!(s.contains("┌ Block sizes ─ counts (b: bytes) ─"), "{s}");
    assert!(s.contains("││size        allocated           free│"), "{s}");
    let counts: u64 =
        rows(&s).iter().map(|r| r.split_whitespace().filter_map(|w| w.parse::<u64>().ok()).sum::<u64>()).sum();
    // Every block at the peak, counted independently of the screen.
    let t = trace::load(&fixture("traces/resnet50_train.pickle.gz")).unwrap();
    let d = &t.devices[0];
    let opts = ReplayOptions::new(t.settings.as_ref().unwrap().config(), 150_109_880_320);
    let mut sc = Scrubber::new(d.events.view(), &opts, &[], 512).unwrap();
    let blocks: usize = sc.seek(3041).snapshot().iter().map(|g| g.blocks.len()).sum();
    assert_eq!(counts, blocks as u64, "{s}");
    let b = screen_with("resnet50_train", None, PEAK, 100, 30, None, &[Command::HistogramBytes]);
    assert!(b.contains("┌ Block sizes ─ bytes (b: counts) ─"), "{b}");
    // The allocated column sums to the allocated bytes at the peak, 5.45
    // GiB (each figure rounded to 2 significant digits as the screen shows).
    let bytes = |w: &str| -> Option<f64> {
        let w = w.trim();
        let (n, u) = w.split_at(w.len().checked_sub(1)?);
        let k = match u {
            "B" => 1.0,
            "K" => 1024.0,
            "M" => 1024.0 * 1024.0,
            "G" => 1024.0 * 1024.0 * 1024.0,
            _ => return None,
        };
        n.parse::<f64>().ok().map(|v| v * k)
    };
    // A row: size (7 columns), bar (8), allocated (6), space, bar (8), free (6).
    let column = |r: &String, from: usize| r.chars().skip(from).take(6).collect::<String>();
    let allocated: f64 = rows(&b).iter().filter_map(|r| bytes(&column(r, 15))).sum();
    let want = 5_855_043_584.0;
    assert!((allocated / want - 1.0).abs() < 0.03, "{allocated} against {want}: {b}");
}

/// Map rows are to one scale (the largest segment's) or each stretched to
/// the width; the title says which, and `t` switches. To scale, a 2 MiB
/// segment beside a 304 MiB one gets a cell, not a full row.
#[test]
fn map_rows_to_scale_or_stretched_say_which() {
    let cells = |s: &str, label: &str| -> usize {
        let row = s.lines().find(|l| l.contains(label)).unwrap_or("");
        row.split("││").next().unwrap_or("").chars().skip(24).filter(|c| "█▓▒░·".contains(*c)).count()
    };
    let s = screen("resnet50_train", None, PEAK, 200, 60);
    let t = screen_with("resnet50_train", None, PEAK, 200, 60, None, &[Command::RowScale]);
    let (scaled, stretched) = if s.contains("─ to scale ─") { (&s, &t) } else { (&t, &s) };
    assert!(scaled.contains("─ by address ─ to scale ─"), "{scaled}");
    assert!(stretched.contains("─ by address ─ stretched ─"), "{stretched}");
    let (big, small) = ("0x7fa130000000    304M", "0x7fa143000000    2.0M");
    assert_eq!(cells(scaled, small), 1, "{scaled}");
    assert_eq!(cells(stretched, small), cells(stretched, big), "{stretched}");
    assert_eq!(cells(scaled, big), cells(stretched, big));
}

/// At 80x24 every pane says its piece whole: titles, key hints, the
/// histogram's figures and call sites, the timeline's footer and the map's
/// legend shorten instead of being cut mid-word.
#[test]
fn at_80x24_nothing_is_cut_without_a_word() {
    let s = screen("llama_pressure", Some(9_006_592_819), Some(first_oom), 80, 24);
    let l: Vec<&str> = s.lines().map(|l| l.trim_matches('"')).collect();
    assert!(l[0].contains(" replay llama_pressure.pickle.gz ─ event 3816/4547 ") && l[0].contains(" ? help "), "{s}");
    assert!(l[23].trim_end().ends_with("? help"), "{s}");
    assert!(s.contains("┌ Sizes ─ counts ─") && s.contains("│size   allocated   free"), "{s}");
    let sites = l.iter().position(|r| r.contains("live bytes by call site")).unwrap_or(usize::MAX);
    // Cut where it does not fit, and says so.
    assert!(l.get(sites + 1).is_some_and(|r| r.contains(" 2.2G modeling_llama.py:175…")), "{s}");
    assert!(s.contains("│ event 3816/4547 ─ allocated 7.87 GiB ─ reserved 8.28 GiB ─ ✗ 1 ─ E 0 ─ ╵ 1 "), "{s}");
    assert!(s.contains("┌ OOM at event 3816: 117.05 MiB on stream 0 ─"), "{s}");
    let r = screen("resnet50_train", None, PEAK, 80, 24);
    assert!(r.contains("│█ alloc ▓ waste ▒ pending ░ split · empty "), "{r}");
}

/// A paused demo steps back through what it has run, as a replay does: the
/// screen is the state at the chosen event, exact (the events are our
/// allocator's own), and End or resuming returns to the newest.
#[test]
fn a_paused_demo_steps_back_through_what_it_ran() {
    use crossterm::event::{KeyCode, KeyEvent};
    let mut app = gpumem_top::ui::app::DemoApp::demo(42, "demo".into(), false);
    // Paused before anything ran: nothing to step through, and it says so.
    app.handle_key(KeyEvent::from(KeyCode::Char(' ')));
    assert!(draw_demo(&mut app, 160, 40).contains("paused (nothing has run yet)"));
    app.handle_key(KeyEvent::from(KeyCode::Home));
    assert!(draw_demo(&mut app, 160, 40).contains("nothing has run yet to step back through"));
    app.handle_key(KeyEvent::from(KeyCode::Char(' ')));
    app.advance(3000);
    let draw = |app: &mut gpumem_top::ui::app::DemoApp| draw_demo(app, 160, 40);
    // The allocated bar's figures (the running model splits its bar by
    // category, which the events stepped back through do not carry).
    let bar = |s: &str| {
        let l = s.lines().find(|l| l.contains("│ allocated ")).unwrap_or("");
        l.split_whitespace().filter(|w| w.chars().any(|c| c.is_ascii_digit())).collect::<Vec<_>>().join(" ")
    };
    let live = draw(&mut app);
    app.handle_key(KeyEvent::from(KeyCode::Char(' ')));
    let paused = draw(&mut app);
    assert!(paused.contains("step back through what has run"), "{paused}");
    // At the newest event the recording's state is the live one.
    app.handle_key(KeyEvent::from(KeyCode::End));
    let end = draw(&mut app);
    let n = end
        .lines()
        .find_map(|l| l.split("of the last ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or("")
        .to_string();
    assert!(n.parse::<usize>().is_ok_and(|n| n > 3000), "the events run so far: {end}");
    assert_eq!(bar(&end), bar(&live), "{end}");
    // Home: the first event, an allocator with next to nothing in it.
    app.handle_key(KeyEvent::from(KeyCode::Home));
    let home = draw(&mut app);
    assert_ne!(bar(&home), bar(&live), "{home}");
    // The status line, the header and the footer name one event: the
    // first whole state (a segment_alloc and the alloc it is for show one).
    let said = |s: &str| -> (usize, usize, usize) {
        let num = |after: &str| -> usize {
            s.split(after)
                .nth(1)
                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                .unwrap_or("")
                .parse()
                .unwrap_or(usize::MAX)
        };
        (num("paused: event "), num("─ event "), num("cursor: event "))
    };
    let (status, header, footer) = said(&home);
    assert!(status <= 1 && status == header && header == footer, "{home}");
    // Stepping moves to the next state; resuming returns to the live run.
    app.handle_key(KeyEvent::from(KeyCode::Right));
    let next = draw(&mut app);
    let (s2, h2, f2) = said(&next);
    assert!(s2 > status && s2 == h2 && h2 == f2, "{next}");
    app.handle_key(KeyEvent::from(KeyCode::Char(' ')));
    let resumed = draw(&mut app);
    assert!(!resumed.contains("paused: event") && resumed.contains("running"), "{resumed}");
}

/// Every flag a command offers does something, and says what (#37 item 20):
/// `record` and `serve` have no screen, so no `--json` or `--no-color`;
/// `replay`, `synth` and `diff` take `--no-color` as the live view does;
/// every synth shape flag has help.
#[test]
fn flags_that_would_do_nothing_are_refused_and_every_flag_has_help() {
    use std::process::Command;
    let bin = common::bin();
    for args in [&["record", "--json", "-o", "x.jsonl"][..], &["serve", "--no-color"], &["run", "--json", "--", "true"]]
    {
        let out = Command::new(bin).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("unexpected argument"), "{args:?}");
    }
    let trace = fixture("traces/small_snapshot.pickle");
    let plain = Command::new(bin).arg("replay").arg(&trace).output().unwrap();
    let mono = Command::new(bin).arg("replay").arg(&trace).arg("--no-color").output().unwrap();
    assert!(mono.status.success(), "{}", String::from_utf8_lossy(&mono.stderr));
    assert_eq!(plain.stdout, mono.stdout);
    for cmd in ["synth", "diff", "run"] {
        let help =
            String::from_utf8_lossy(&Command::new(bin).args([cmd, "--help"]).output().unwrap().stdout).to_string();
        assert!(help.contains("--no-color") && help.contains("Draw without colour"), "{cmd}: {help}");
    }
    let help =
        String::from_utf8_lossy(&Command::new(bin).args(["synth", "--help"]).output().unwrap().stdout).to_string();
    // Each long flag is followed by its help text, not by the next flag.
    let lines: Vec<&str> = help.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if l.trim_start().starts_with("--") && !l.contains("--help") && !l.contains("--version") {
            let rest = l.trim_start().split_once("  ").map_or("", |x| x.1.trim());
            let next = lines.get(i + 1).map_or("", |n| n.trim());
            assert!(
                !rest.is_empty() || (!next.is_empty() && !next.starts_with('-') && !next.starts_with('[')),
                "no help for {l}"
            );
        }
    }
    assert!(help.contains("Key/value heads"), "{help}");
}

/// The help overlay (#37 item 13): at 80×24 and 200×50 every key's line is
/// whole (wrapped, not cut), it scrolls with ↑/↓ and PgUp/PgDn and says so,
/// and keys under it never reach the screen behind (PgUp left the cursor).
#[test]
fn the_help_overlay_wraps_scrolls_and_keeps_keys_from_the_screen_behind() {
    let base = screen("gpt2_train", None, None, 80, 24);
    // The header says which event the screen shows.
    let cursor = |s: &str| s.lines().next().unwrap_or("").to_string();
    assert!(cursor(&base).contains("event 4400/14327"), "{base}");
    let help = screen_with("gpt2_train", None, None, 80, 24, None, &[Command::Help]);
    assert!(help.contains(" help ─ lines 1–22 of "), "{help}");
    // Wrapped: the longest help row's last words are on screen.
    assert!(help.contains("keys"), "{help}");
    let scrolled = screen_with("gpt2_train", None, None, 80, 24, None, &[Command::Help, Command::Down, Command::Down]);
    assert!(scrolled.contains(" help ─ lines 3–24 of "), "{scrolled}");
    // PgUp, End and ← under the help: the screen behind does not move.
    let pressed = screen_with(
        "gpt2_train",
        None,
        None,
        80,
        24,
        None,
        &[Command::Help, Command::PageUp, Command::End, Command::Left, Command::Help],
    );
    assert_eq!(cursor(&pressed), cursor(&base), "{pressed}");
    // At 200×50 the whole help fits: nothing to scroll, every row whole.
    let big = screen_with("gpt2_train", None, None, 200, 50, None, &[Command::Help]);
    assert!(big.contains(" help ─ q closes "), "{big}");
    for (k, what) in [("w", "what the memory is"), ("Enter", "list its blocks and where they were allocated")] {
        assert!(big.lines().any(|l| l.contains(k) && l.contains(what)), "{k}: {big}");
    }
    // Every figure's explanation ends on screen (wrapped lines included).
    let text: String = big.lines().map(|l| l.trim_matches('"').trim_matches('│').trim()).collect::<Vec<_>>().join(" ");
    assert!(text.contains("peak_ratio"), "{big}");
}

/// A message longer than the screen is wide wraps onto the rows above the
/// bottom one instead of losing its end, where the advice is (#37 item 14).
#[test]
fn a_long_status_message_wraps_instead_of_losing_its_end() {
    let s = screen_with("gpt2_train", None, None, 80, 24, None, &[Command::Gpu(0)]);
    let rows: Vec<String> = s.lines().map(|l| l.trim_matches('"').to_string()).collect();
    let tail = rows[rows.len() - 2..].join(" ");
    let words = tail.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains("1-9 (pick a GPU) is for the live view and a recording, not replay; ? lists this screen's keys q quit ? help"),
        "{s}"
    );
    // The screen above gave the row up: the timeline's box still closes.
    assert!(rows[rows.len() - 3].starts_with('└'), "{s}");
}

/// A paused demo says what it is and on which device, `p` goes to the peak
/// of what has run, and `s` saves the moment on the screen, not the run's
/// newest (#37 items 11 and 12).
#[test]
fn a_paused_demo_names_itself_jumps_to_its_peak_and_screenshots_what_it_shows() {
    use crossterm::event::{KeyCode, KeyEvent};
    let mut app = gpumem_top::ui::app::DemoApp::demo(42, "demo".into(), false);
    app.advance(3000);
    app.handle_key(KeyEvent::from(KeyCode::Char('p')));
    assert!(draw_demo(&mut app, 120, 30).contains("pause (space) first: p then jumps to the peak"));
    app.handle_key(KeyEvent::from(KeyCode::Char(' ')));
    app.handle_key(KeyEvent::from(KeyCode::Char('p')));
    let s = draw_demo(&mut app, 120, 30);
    let head = s.lines().next().unwrap();
    assert!(head.contains("simulated NVIDIA H200 ─ paused: the last 4333 events run ─ event 959/4333"), "{head}");
    assert!(!s.contains("recorded device") && !s.contains("replay the last"), "{s}");
    assert!(s.contains("the peak of what has run: event 959"), "{s}");
    assert!(s.contains("peak 11.38 GiB @ event 959"), "{s}");
    app.handle_key(KeyEvent::from(KeyCode::Char('s')));
    let s = draw_demo(&mut app, 120, 30);
    let name = s
        .lines()
        .find_map(|l| l.split(" wrote ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("{s}"))
        .to_string();
    let svg = std::fs::read_to_string(&name).unwrap();
    let _ = std::fs::remove_file(&name);
    assert!(name.contains("-event959-"), "{name}");
    assert!(svg.contains("event 959 of 4333 (peak)"), "the moment on screen: {}", &svg[..svg.len().min(1500)]);
}

/// A snapshot without history offers only the keys that do something
/// there: no stepping, peak or OOM in its hints, and those keys say why
/// (#37 item 12).
#[test]
fn a_snapshot_without_history_offers_no_keys_that_step() {
    let (mut app, _) = replay_app("snapshot_kinds/history_less_gpt2.pickle.gz");
    let draw = |app: &mut ReplayApp| {
        let mut term = Terminal::new(TestBackend::new(120, 30)).unwrap();
        term.draw(|f| app.draw(f)).unwrap();
        term.backend().to_string()
    };
    let s = draw(&mut app);
    let hints = s.lines().last().unwrap();
    assert!(hints.contains("q quit") && hints.contains("? help"), "{hints}");
    assert!(!hints.contains("←/→") && !hints.contains("p peak") && !hints.contains("o OOM"), "{hints}");
    app.dispatch(Command::Left);
    assert!(
        draw(&mut app).contains("is for replay, synth and the demo and a recording, not a snapshot without history")
    );
    app.dispatch(Command::Peak);
    assert!(draw(&mut app).contains("p (jump to the peak) is for"));
}

/// Home is the first state (event 1: event 0 is the segment_alloc of the
/// first malloc, which shows with it) in the header and the footer alike,
/// End the last event, numbered as `--at end` and `--json` number it (#37
/// item 16).
#[test]
fn home_and_end_number_events_from_zero_as_the_cli_does() {
    use crossterm::event::{KeyCode, KeyEvent};
    let (mut app, d) = replay_app("traces/gpt2_train.pickle.gz");
    let n = d.events.len();
    app.handle_key(KeyEvent::from(KeyCode::Home));
    let home = common::render_app(&mut app, 160, 40);
    assert_eq!(d.events.at(0).action, gpumem_top::alloc::Action::SegmentAlloc);
    assert!(home.lines().next().unwrap().contains(&format!(" event 1/{n} ")), "{home}");
    assert!(home.contains(&format!("cursor: event 1 of {n} ")), "{home}");
    // ← from there stays: nothing is before the first state.
    app.handle_key(KeyEvent::from(KeyCode::Left));
    assert!(common::render_app(&mut app, 160, 40).contains(&format!("cursor: event 1 of {n} ")));
    // The bars are to the trace's peak reserved (18.46 GiB), at every event.
    assert!(home.contains("scale     18.46 GiB: the trace's peak reserved"), "{home}");
    app.handle_key(KeyEvent::from(KeyCode::End));
    let end = common::render_app(&mut app, 160, 40);
    assert!(end.lines().next().unwrap().contains(&format!(" event {}/{n} ", n - 1)), "{end}");
    let cli = std::process::Command::new(common::bin())
        .args(["replay", &fixture("traces/gpt2_train.pickle.gz").to_string_lossy(), "--at", "end"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&cli.stdout);
    assert!(text.contains(&format!("at the end: event {} (the last of {n} events, numbered from 0)", n - 1)), "{text}");
    let cli = std::process::Command::new(common::bin())
        .args(["replay", &fixture("traces/gpt2_train.pickle.gz").to_string_lossy(), "--at", &(n - 1).to_string()])
        .output()
        .unwrap();
    assert!(cli.status.success(), "--at {}: {}", n - 1, String::from_utf8_lossy(&cli.stderr));
}

/// A paused demo keeps what it showed running: its blocks' call sites and
/// its iteration marks (#37 item 12).
#[test]
fn a_paused_demo_keeps_its_call_sites_and_iterations() {
    use crossterm::event::{KeyCode, KeyEvent};
    let mut app = gpumem_top::ui::app::DemoApp::demo(42, "demo".into(), false);
    app.advance(12_000);
    let running = draw_demo(&mut app, 160, 50);
    app.handle_key(KeyEvent::from(KeyCode::Char(' ')));
    let paused = draw_demo(&mut app, 160, 50);
    println!("{running}\n{paused}");
    // The call-site panel's rows (bytes ×count site): the same sites.
    let sites = |s: &str| -> Vec<String> {
        s.lines()
            .skip_while(|l| !l.contains("live bytes by call site"))
            .skip(1)
            .take_while(|l| l.contains(" ×"))
            .filter_map(|l| l.split('×').nth(1))
            .map(|r| r.split_whitespace().skip(1).take(3).collect::<Vec<_>>().join(" "))
            .collect()
    };
    let (r, p) = (sites(&running), sites(&paused));
    assert!(r.len() >= 3, "{running}");
    assert_eq!(p, r, "{paused}");
    assert!(!paused.contains("no stack recorded"), "{paused}");
    // Iteration ends within the window, as many as the footer counts.
    let iters = |s: &str| -> usize {
        s.split(" iteration")
            .next()
            .and_then(|h| h.rsplit("╵ ").next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    };
    assert!(iters(&paused) >= 2, "{paused}");
}

/// A real recording (GPT-2 training on the H200, `gpumem-top run -o`) read
/// through the recording reader.
fn recorded_samples() -> Vec<gpumem_top::monitor::Snapshot> {
    let p = common::root().join("tests/fixtures/live/reset_peaks_gpt2.jsonl");
    let f = std::io::BufReader::new(std::fs::File::open(p).unwrap());
    gpumem_top::cli::read_recording(f, "reset_peaks_gpt2.jsonl").unwrap()
}

/// The live view as it draws a publishing process: the recording's
/// samples arriving as the sampler would send them, drawn through the
/// app's own code at 120×40 (the newest sample's age, which the clock
/// moves, written N).
#[test]
fn live_view_of_a_publishing_process_120x40() {
    let mut app = gpumem_top::ui::live::LiveApp::new("live (NVML)".into(), None, false);
    for s in recorded_samples() {
        app.update(gpumem_top::ui::event::AppEvent::Sample(Box::new(s)));
    }
    let s = common::render_live(&mut app, 120, 40);
    assert!(s.contains(" s ago"), "{s}");
    insta::assert_snapshot!(without_age(&s));
}

/// "0.0 s ago" and "0.1 s ago" alike: the draw's delay after the last sample.
fn without_age(s: &str) -> String {
    s.lines()
        .map(|l| match l.find(" s ago") {
            Some(i) => {
                // The age's width varies with how slow the run was: keep the
                // title's rule as long as it would be with one digit.
                let start = l[..i].rfind(' ').map_or(0, |j| j + 1);
                let extra = "─".repeat(l[start..i].chars().count().saturating_sub(1));
                let rest = &l[i + " s ago".len()..];
                match rest.strip_prefix(" ─") {
                    Some(r) => format!("{}N s ago ─{extra}{r}", &l[..start]),
                    None => format!("{}N{}", &l[..start], &l[i..]),
                }
            }
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `replay RECORDING.jsonl`, stepped back three samples from its end with
/// ← (to one where the training process publishes, mid-run), through the
/// app's own code at 120×40.
#[test]
fn a_recording_stepped_back_120x40() {
    let mut app = gpumem_top::ui::recording::RecordingApp::new("reset_peaks_gpt2.jsonl", recorded_samples(), false);
    for _ in 0..3 {
        app.handle_key(crossterm::event::KeyEvent::from(crossterm::event::KeyCode::Left));
    }
    let s = common::render_live(&mut app, 120, 40);
    assert!(s.contains("sample 28 of 31"), "{s}");
    insta::assert_snapshot!(s);
}

/// The OOM box ends with the checked advice at any size: the `held:` row
/// and the frames give way to it (it was pushed out by `held:`).
#[test]
fn the_oom_box_ends_with_its_advice_at_any_size() {
    let advice = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True avoids it";
    for (w, h) in [(100, 30), (120, 32), (160, 40), (200, 60)] {
        let (mut app, d) = replay_app_with("traces/llama_pressure.pickle.gz", Some(9_006_592_819));
        app.set_oom_advice(Some(advice.into()));
        app.go(first_oom(d));
        let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
        term.draw(|f| app.draw(f)).unwrap();
        let s = term.backend().to_string();
        let lines: Vec<&str> = s.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.contains(" ⇒ PYTORCH_CUDA_ALLOC_CONF=expandable_segments"))
            .unwrap_or_else(|| panic!("{w}x{h}: no advice\n{s}"));
        // The row below it is the box's bottom edge.
        let col = lines[at].find(" ⇒").unwrap();
        let below: String =
            lines[at + 1].chars().skip(lines[at][..col].chars().count().saturating_sub(1)).take(2).collect();
        assert!(below.contains('└') || below.contains('─'), "{w}x{h}: {:?}\n{s}", lines[at + 1]);
        assert!(s.contains(" held: "), "{w}x{h}: the held row stays where it fits\n{s}");
    }
}

/// At 80x24 the replay screen at an OOM keeps the legend of the bars'
/// letters (the sentence on what the bars are scaled to shrinks beside the
/// unallocated figure), and the OOM box's held: row says what held the
/// memory in the bars' letters rather than cut mid-word.
#[test]
fn at_80x24_the_oom_screen_keeps_its_legend_and_a_whole_held_row() {
    let s = screen("llama_pressure", Some(9_006_592_819), Some(first_oom), 80, 24);
    assert!(s.contains("│ what it is A activ 5.2G  O optim 1.3G  T temp 714M  P params 668M"), "{s}");
    assert!(s.contains("│ unallocated 423.02 MiB (5.0%)   peak_ratio 0.0552   bars: limit 8.39 GiB"), "{s}");
    assert!(s.contains("│ held: A 5.2G O 1.3G T 714M P 668M"), "{s}");
    // With room, the long forms, as many whole categories as fit.
    let s = screen("llama_pressure", Some(9_006_592_819), Some(first_oom), 200, 60);
    assert!(s.contains("limit     8.39 GiB: the per-process memory limit, the bars' full width"), "{s}");
    assert!(s.contains("│ held: activations 5.21 GiB (66%), optimizer state 1.31 GiB (17%), temporaries"), "{s}");
}

/// At 80x24 a segment's block list keeps each block's state and what it
/// is: the requested size gives way and the figures shorten, and the
/// heading keeps the segment's address and size.
#[test]
fn at_80x24_the_block_list_keeps_each_blocks_state() {
    let s = screen_with("llama_pressure", Some(9_006_592_819), Some(first_oom), 80, 24, Some(0), &[]);
    assert!(s.contains("│0x7fc71c000000: 126.00 MiB large"), "{s}");
    assert!(s.contains("│█ +0B      42.6M allocated activ   modeling_llam"), "{s}");
    // With room, the full row.
    let s = screen_with("llama_pressure", Some(9_006_592_819), Some(first_oom), 160, 40, Some(0), &[]);
    assert!(s.contains("allocated    activ   modeling_llama.py:381 forward") && s.contains(" req "), "{s}");
}

/// `w` in the demo (and synth): the map by category while the run runs,
/// from the synthetic model's own knowledge of each request, with the key;
/// its letters' bytes are the header's, which the bars always showed.
#[test]
fn w_in_the_demo_shows_the_map_by_category() {
    use crossterm::event::{KeyCode, KeyEvent};
    let mut app = gpumem_top::ui::app::DemoApp::demo(42, "demo".into(), false);
    app.advance(3000);
    let before = draw_demo(&mut app, 160, 40);
    app.handle_key(KeyEvent::from(KeyCode::Char('w')));
    let s = draw_demo(&mut app, 160, 40);
    assert!(s.contains("P params G grads O optim A activ I input T temp"), "{s}");
    assert!(!s.contains("not in this screen") && !s.contains("not here"), "{s}");
    // The map's rows: by state before (█), in category letters after.
    let map_rows = |s: &str| -> String {
        s.lines().filter(|l| l.contains("│0x")).map(|l| l.chars().skip(24).take(60).collect::<String>()).collect()
    };
    let (was, now) = (map_rows(&before), map_rows(&s));
    assert!(was.contains('█') && !was.contains('P'), "{before}");
    for c in ['P', 'O', 'A'] {
        assert!(now.contains(c), "{c} in the map: {s}");
    }
    // The parameters' segment comes first by address: weights alone.
    let first = s.lines().find(|l| l.contains("│0x")).unwrap_or_default();
    assert!(first.contains("PPPPPPPPPP"), "{s}");
    // `w` again: back to block states.
    app.handle_key(KeyEvent::from(KeyCode::Char('w')));
    assert_eq!(map_rows(&draw_demo(&mut app, 160, 40)), was);
    // Paused, the screen replays the latest events, which carry none: `w`
    // says so.
    app.handle_key(KeyEvent::from(KeyCode::Char(' ')));
    app.handle_key(KeyEvent::from(KeyCode::Char('w')));
    let s = draw_demo(&mut app, 160, 40);
    assert!(s.contains("w: the map shows categories while the run runs (space)"), "{s}");
}

/// A replay of 10,000 iterations of 3 events each, every 1000th asking
/// 4 MiB and the rest 2 MiB, its cursor at the peak (event 1501).
fn ten_thousand_iterations_at_the_peak() -> ReplayApp<'static> {
    let d = common::TmpDir::new("longrun");
    let path = d.0.join("long.pickle");
    std::fs::write(
        &path,
        common::pickler::iterations_snapshot(10_000, |i| if i % 1000 == 500 { 4 << 20 } else { 2 << 20 }),
    )
    .unwrap();
    let (mut app, _) = replay_app(path.to_str().unwrap());
    app.dispatch(Command::Peak);
    app
}

/// `app` through ratatui's `Terminal` at 200x60, as text.
fn draw_200x60(app: &ReplayApp) -> String {
    let mut term = Terminal::new(TestBackend::new(200, 60)).unwrap();
    term.draw(|f| app.draw(f)).unwrap();
    term.backend().to_string()
}

/// 10,000 iterations on a 200-column timeline: the three highest peaks
/// labelled, then one label per value not labelled yet (the 2 MiB ones; it
/// drew a row of identical ones), and iteration ticks at least three cells apart instead of a
/// comb, while the title still counts all 10,000.
#[test]
fn the_timeline_of_ten_thousand_iterations_reads() {
    let app = ten_thousand_iterations_at_the_peak();
    let s = draw_200x60(&app);
    let plot: Vec<&str> =
        s.lines().skip_while(|l| !l.contains("┌ Timeline")).skip(1).take_while(|l| !l.contains('└')).collect();
    let text = plot.join("\n");
    // The top three, then only what differs.
    assert_eq!(text.matches("▲4.0M").count(), 3, "{s}");
    assert_eq!(text.matches("▲2.0M").count(), 1, "{s}");
    let ticks = text.matches('╵').count();
    assert!((10..=66).contains(&ticks), "{ticks} ticks: {s}");
    assert!(ticks < 9999, "thinned");
    let row = plot.iter().find(|l| l.contains('╵')).unwrap();
    let at: Vec<usize> = row.chars().enumerate().filter(|(_, c)| *c == '╵').map(|(i, _)| i).collect();
    assert!(at.windows(2).all(|w| w[1] - w[0] >= 3), "{row}");
    // The trace's last marker comes after its last event: 9,999 end in it.
    assert!(s.contains("╵ 9999 iterations"), "{s}");
}

/// `+` zooms the timeline around the cursor, each press halving the
/// window, and the title says which events and iterations it shows; the
/// footer still counts the whole run; `-` goes back out, and past the
/// whole run says so.
#[test]
fn plus_and_minus_zoom_the_timeline_around_the_cursor() {
    let mut app = ten_thousand_iterations_at_the_peak();
    let draw = draw_200x60;
    let whole = draw(&app);
    let title = |s: &str| s.lines().find(|l| l.contains("┌ Timeline")).unwrap().to_string();
    assert!(title(&whole).contains(" Timeline ─ allocated / reserved ─ peak 4.00 MiB @ event 1501 (iteration 501) "));
    for _ in 0..5 {
        app.dispatch(Command::Plus);
    }
    // 30,001 points: a 32nd is 937, centred on the peak at 1501.
    let s = draw(&app);
    assert!(
        title(&s).contains(
            " Timeline ─ events 1033–1970 of 30001 (×32, - out) ─ iterations 345–657 of 10000 ─ peak in view 4.00 MiB @ event 1501 "
        ),
        "{s}"
    );
    assert!(s.contains(" cursor: event 1501 of 30001 ─ allocated 4.00 MiB ─ reserved 20.00 MiB ─ ✗ 0 OOMs ─ E 0 empty_cache ─ ╵ 313 iterations ▲ peaks "), "{s}");
    assert!(s.contains("▲4.0M"), "the peak keeps its label: {s}");
    // As close as it goes: 64 events.
    for _ in 0..10 {
        app.dispatch(Command::Plus);
    }
    let s = draw(&app);
    assert!(
        title(&s).contains(" Timeline ─ events 1469–1533 of 30001 (×512, - out) ─ iterations 490–511 of 10000 "),
        "{s}"
    );
    assert!(s.contains(" the timeline is as close as it zooms (64 events)"), "{s}");
    for _ in 0..9 {
        app.dispatch(Command::Minus);
    }
    assert_eq!(title(&draw(&app)), title(&whole), "back out to the whole run");
    app.dispatch(Command::Minus);
    assert!(draw(&app).contains(" the timeline shows the whole run"));
}
