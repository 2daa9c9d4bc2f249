//! `cargo bench --bench alloc`
//!
//! - `pair/cached_mixed`: one malloc+free served from the cache, sizes cycling
//!   through a mixed set (512 B .. 48 MiB, both pools), with 1,000 other
//!   allocations live so the free-block maps are not trivially small.
//! - `pair/system_malloc_mixed`: the same sizes through the system allocator
//!   (glibc malloc+free), a peer measured in the same run.
//! - `replay/vector_default`: trace-driven replay of a recorded vector (4,563 events),
//!   reported per event.
//! - `scrub/gpt2_step_back_and_forth`: at GPT-2's peak (event 4,400 of 14,327),
//!   one step back and one step forward, as the TUI's arrow keys do.
//! - `frame/gpt2_peak_200x60`: the whole screen at GPT-2's peak drawn into a
//!   200x60 buffer (view built from the allocator state, then rendered).
//! - `frame/big_step_200x60`, only with `GPUMEM_TOP_BIG_TRACE=PATH` (a trace
//!   `tools/big-snapshot.py` makes, millions of events): a frame stepping
//!   the cursor at the trace's middle, whole and zoomed in (`+` five times),
//!   by state and by category (`w`); and jumps far back and forth, each
//!   frame replaying from a checkpoint.
#![allow(clippy::unwrap_used, reason = "a benchmark fails loudly on a fixture it cannot read")]

use std::hint::black_box;
use std::io::Read;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gpumem_top::alloc::{Action, AllocatorConfig, CachingAllocator, Event};
use gpumem_top::device::Sim;
use gpumem_top::replay::{replay_events, ReplayOptions};

fn sizes() -> Vec<u64> {
    // A deterministic mix: many small tensors, some mid-size, a few large.
    let mut v = Vec::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..256 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let s = match x % 10 {
            0..=5 => 512 + (x >> 8) % (1 << 20),
            6..=8 => (1 << 20) + (x >> 8) % (9 << 20),
            _ => (10 << 20) + (x >> 8) % (38 << 20),
        };
        v.push(s);
    }
    v
}

fn bench_pairs(c: &mut Criterion) {
    let sizes = sizes();
    assert_eq!(sizes.len(), 256);
    let mut a = CachingAllocator::new(AllocatorConfig::default(), Sim::h200());
    a.set_recording(false);
    // 1,000 live allocations, then one cached block of every size.
    let live: Vec<_> = (0..1000).map(|i| a.malloc(sizes[i % sizes.len()], 0).unwrap()).collect();
    let warm: Vec<_> = sizes.iter().map(|&s| a.malloc(s, 0).unwrap()).collect();
    for b in warm {
        a.free(b).unwrap();
    }
    let segments_before = a.stats().num_device_alloc;
    let mut g = c.benchmark_group("pair");
    let mut i = 0usize;
    g.bench_function("cached_mixed", |bch| {
        bch.iter(|| {
            let s = sizes[i & 255];
            i += 1;
            let b = a.malloc(black_box(s), 0).unwrap();
            a.free(black_box(b)).unwrap();
        })
    });
    assert_eq!(a.stats().num_device_alloc, segments_before, "every pair must be served from the cache");
    let mut j = 0usize;
    g.bench_function("system_malloc_mixed", |bch| {
        bch.iter(|| {
            let s = sizes[j & 255] as usize;
            j += 1;
            let layout = std::alloc::Layout::from_size_align(s, 512).unwrap();
            // SAFETY: layout has a non-zero size; the pointer is freed with the same layout.
            unsafe {
                let p = std::alloc::alloc(black_box(layout));
                std::alloc::dealloc(black_box(p), layout);
            }
        })
    });
    g.finish();
    drop(live);
}

fn vector_trace(name: &str) -> (gpumem_top::alloc::Events, AllocatorConfig, u64) {
    let path = format!("{}/tests/fixtures/vectors/{name}.json.gz", env!("CARGO_MANIFEST_DIR"));
    let mut s = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap()).read_to_string(&mut s).unwrap();
    let d: serde_json::Value = serde_json::from_str(&s).unwrap();
    let rec = d["trace"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            Event::new(
                Action::from_name(t[0].as_str().unwrap()).unwrap(),
                t[1].as_u64().unwrap_or(0),
                t[2].as_u64().unwrap(),
                t[3].as_u64().unwrap(),
            )
        })
        .collect();
    (rec, AllocatorConfig::parse(d["conf"].as_str().unwrap()).unwrap(), d["total"].as_u64().unwrap())
}

/// The exact replay of `rec` from an empty allocator, as one benchmark of `g`.
fn replays(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    rec: gpumem_top::alloc::EventsRef<'_>,
    opts: &ReplayOptions,
) {
    g.throughput(Throughput::Elements(rec.len() as u64));
    g.bench_function(name, |b| {
        b.iter(|| {
            let r = replay_events(rec, opts);
            assert!(r.divergence.is_none());
            r.reproduced
        })
    });
}

fn bench_replay(c: &mut Criterion) {
    let (rec, config, total) = vector_trace("default");
    let mut g = c.benchmark_group("replay");
    replays(&mut g, "vector_default", rec.view(), &ReplayOptions::new(config, total));
    // A real recording: most of its events are frees, which the exact
    // replay takes with their completion in one step.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces/gpt2_train.pickle.gz");
    let t = gpumem_top::trace::load(&path).unwrap();
    let opts = ReplayOptions::new(t.settings.as_ref().unwrap().config(), 150_109_880_320);
    replays(&mut g, "gpt2_train", t.devices[0].events.view(), &opts);
    g.finish();
    // A big snapshot of one's own (`tools/big-snapshot.py` makes one):
    // the exact replay alone, after the decoding, on one thread.
    let Some(path) = std::env::var_os("GPUMEM_TOP_BIG_TRACE") else { return };
    let t = gpumem_top::trace::load(std::path::Path::new(&path)).unwrap();
    let opts = ReplayOptions::new(t.settings.as_ref().map(|s| s.config()).unwrap_or_default(), 150_109_880_320);
    let mut g = c.benchmark_group("replay");
    g.sample_size(10);
    replays(&mut g, "big", t.devices[0].events.view(), &opts);
    g.finish();
}

fn bench_scrub(c: &mut Criterion) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces/gpt2_train.pickle.gz");
    let t = gpumem_top::trace::load(&path).unwrap();
    let d = &t.devices[0];
    let opts = ReplayOptions::new(t.settings.as_ref().unwrap().config(), 150_109_880_320);
    let mut s = gpumem_top::replay::scrub::Scrubber::new(d.events.view(), &opts, &[], 256).unwrap();
    let mut g = c.benchmark_group("scrub");
    g.throughput(Throughput::Elements(2));
    let mut back = true;
    g.bench_function("gpt2_step_back_and_forth", |b| {
        b.iter(|| {
            let e = if back { 4399 } else { 4400 };
            back = !back;
            black_box(s.seek(e).stats().get(gpumem_top::alloc::Kind::AllocatedBytes, 0).current)
        })
    });
    g.finish();
}

fn bench_frame(c: &mut Criterion) {
    use gpumem_top::ui::app::ReplayApp;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces/gpt2_train.pickle.gz");
    let t = gpumem_top::trace::load(&path).unwrap();
    let opened = gpumem_top::replay::open(&t, "gpt2_train.pickle.gz", &Default::default()).unwrap();
    let model = opened.model("gpt2_train.pickle.gz".into()).unwrap();
    // The app's own path, as `replay` draws a frame: seek, snapshot,
    // histogram, figures, View, ratatui widgets.
    let mut app = ReplayApp::new(model, true);
    app.go(4400);
    let area = ratatui_core::layout::Rect::new(0, 0, 200, 60);
    let mut buf = ratatui_core::buffer::Buffer::empty(area);
    c.bench_function("frame/gpt2_peak_200x60", |b| {
        b.iter(|| {
            buf.reset();
            app.draw_into(area, &mut buf);
            black_box(&buf);
        })
    });
    // The whole frame as the loop draws it: ratatui's Terminal (its buffers
    // and diff) over its test backend, the cursor stepping so frames differ.
    use gpumem_top::ui::event::{Command, Interactive};
    stepping_frames(c, "frame/gpt2_step_200x60_terminal", &mut app);
    // By category (`w`): the map's cells and the stacked timeline read the
    // categories (docs/user/categories.md).
    app.apply(Command::ByCategory);
    stepping_frames(c, "frame/gpt2_step_200x60_by_category", &mut app);
}

/// Frames as the loop draws them: ratatui's Terminal (its buffers and
/// diff) over its test backend at 200x60, the cursor stepping one event
/// right then left so that frames differ.
fn stepping_frames(c: &mut Criterion, name: &str, app: &mut gpumem_top::ui::app::ReplayApp) {
    use gpumem_top::ui::event::{Command, Interactive};
    let mut term = ratatui_core::terminal::Terminal::new(ratatui_core::backend::TestBackend::new(200, 60)).unwrap();
    let mut right = true;
    c.bench_function(name, |b| {
        b.iter(|| {
            app.apply(if right { Command::Right } else { Command::Left });
            right = !right;
            term.draw(|f| app.draw(f)).unwrap();
        })
    });
}

/// A frame of a big trace (`GPUMEM_TOP_BIG_TRACE`): what the timeline's
/// binning costs at millions of points (docs/measurements/benchmarks.md,
/// "Ten million events").
fn bench_big_frame(c: &mut Criterion) {
    use gpumem_top::ui::app::ReplayApp;
    use gpumem_top::ui::event::{Command, Interactive};
    let Some(path) = std::env::var_os("GPUMEM_TOP_BIG_TRACE") else { return };
    // As the screens' loop draws: the timeline beside the other panes.
    gpumem_top::ui::event::share_frames();
    let t = gpumem_top::trace::load(std::path::Path::new(&path)).unwrap();
    let opened = gpumem_top::replay::open(&t, "big", &Default::default()).unwrap();
    let n = opened.dev.events.len();
    let mut app = ReplayApp::new(opened.model("big".into()).unwrap(), true);
    app.go(n / 2);
    stepping_frames(c, "frame/big_step_200x60", &mut app);
    for _ in 0..5 {
        app.apply(Command::Plus);
    }
    stepping_frames(c, "frame/big_step_200x60_zoomed", &mut app);
    // By category (`w`), zoomed in and whole: the stacked lines' bytes at
    // each column's peak, from the categories' samples 128 events apart.
    app.apply(Command::ByCategory);
    stepping_frames(c, "frame/big_step_200x60_zoomed_by_category", &mut app);
    for _ in 0..5 {
        app.apply(Command::Minus);
    }
    stepping_frames(c, "frame/big_step_200x60_by_category", &mut app);
    // The worst frame at any cursor: a jump (a page, `g`, an OOM) to an
    // event 2,040 past a checkpoint (they are 2,048 apart at ten million),
    // far from the last, so that no rung helps: each frame replays from a
    // checkpoint, by category.
    let near_end = |e: usize| e / 2048 * 2048 + 2040;
    let (a, b) = (near_end(n / 4), near_end(3 * n / 4));
    let mut term = ratatui_core::terminal::Terminal::new(ratatui_core::backend::TestBackend::new(200, 60)).unwrap();
    let mut to_a = true;
    c.bench_function("frame/big_jump_200x60_by_category", |bch| {
        bch.iter(|| {
            app.go(if to_a { a } else { b });
            to_a = !to_a;
            term.draw(|f| app.draw(f)).unwrap();
        })
    });
}

/// What categorizing adds to a replay (docs/measurements/benchmarks.md, "Categories"):
/// `Categories::of` beside the exact replay (`replay::open`) of the same
/// trace, the repository's longest with stacks.
fn bench_categories(c: &mut Criterion) {
    use gpumem_top::analysis::categories::Categories;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/categories/gpt2_adamw_bf16_accum2.pickle.gz");
    let t = gpumem_top::trace::load(&path).unwrap();
    let d = t.main_device().unwrap();
    let mut g = c.benchmark_group("categories");
    g.throughput(Throughput::Elements(d.events.len() as u64));
    g.bench_function("replay_gpt2_accum2", |b| {
        b.iter(|| black_box(gpumem_top::replay::open(&t, "gpt2", &Default::default()).unwrap()))
    });
    g.bench_function("categorize_gpt2_accum2", |b| {
        b.iter(|| black_box(Categories::of(d, &t.stacks, &t.annotations, &[], None)))
    });
    g.finish();
}

criterion_group!(benches, bench_pairs, bench_replay, bench_scrub, bench_frame, bench_big_frame, bench_categories);
criterion_main!(benches);
