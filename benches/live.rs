//! Per-sample cost of the live view: parsing a publisher's file, taking a
//! snapshot, ingesting it and drawing a 200x50 frame (GPT-2 at its peak).
#![allow(clippy::unwrap_used, reason = "a benchmark fails loudly on a fixture it cannot read")]

use criterion::{criterion_group, criterion_main, Criterion};
use gpumem_top::alloc::BlockState;
use gpumem_top::monitor::publisher::{parse_bytes, Scanner};
use gpumem_top::monitor::sampler::DemoSource;
use gpumem_top::ui::event::Interactive;
use gpumem_top::ui::live::LiveApp;
use ratatui_core::buffer::Buffer;
use ratatui_core::layout::Rect;
use serde_json::json;

/// A publisher file of the demo's GPT-2 loop after 3,000 requests.
fn file() -> Vec<u8> {
    let mut d = DemoSource::new(42);
    d.advance(3000);
    let s = d.snapshot_now();
    let p = &s.publishers[0];
    let segs: Vec<_> = p
        .segments
        .iter()
        .map(|s| {
            json!({"address": s.address, "total_size": s.total_size, "stream": 0, "segment_type": s.segment_type,
                   "is_expandable": false, "blocks": s.blocks.iter().map(|b| (b.size, b.requested_size, match b.state {
                       BlockState::ActiveAllocated => 0, BlockState::ActivePendingFree => 1, BlockState::Inactive => 2 })).collect::<Vec<_>>()})
        })
        .collect();
    serde_json::to_vec(&json!({"version": 1, "pid": 1, "device": 0, "time": 1.0, "stats": p.stats, "segments": segs}))
        .unwrap()
}

fn bench(c: &mut Criterion) {
    let bytes = file();
    let path = std::path::Path::new("x.json");
    let blocks: usize = parse_bytes(&bytes, path).unwrap().segments.iter().map(|s| s.blocks.len()).sum();
    eprintln!("publisher file: {} bytes, {blocks} blocks", bytes.len());
    c.bench_function("live/parse_publisher_file", |b| b.iter(|| parse_bytes(&bytes, path).unwrap()));
    // A live source's scan of one publisher's directory: the file read and
    // parsed, its layout parsed again only when its text changed.
    let dir = std::env::temp_dir().join(format!("gpumem-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let other = String::from_utf8(bytes.clone()).unwrap().replacen("[[", "[ [", 1).into_bytes();
    let mut scanner = Scanner::new(gpumem_top::monitor::publisher::current_uid(), 16 << 20);
    let f = dir.join("1-0.json");
    let mut k = 0;
    for (name, changes) in [("live/scan_layout_unchanged", false), ("live/scan_layout_changed", true)] {
        c.bench_function(name, |b| {
            b.iter_batched(
                || {
                    // The publisher's write, not timed.
                    k += 1;
                    std::fs::write(&f, if changes && k % 2 == 1 { &other } else { &bytes }).unwrap();
                },
                |()| assert_eq!(scanner.scan(&dir).published.len(), 1),
                criterion::BatchSize::PerIteration,
            )
        });
    }
    std::fs::remove_dir_all(&dir).unwrap();
    let mut d = DemoSource::new(42);
    d.advance(3000);
    let snap = d.snapshot_now();
    let mut app = LiveApp::new("live".into(), None, true);
    let area = Rect::new(0, 0, 200, 50);
    let mut buf = Buffer::empty(area);
    app.ingest(snap.clone());
    c.bench_function("live/draw_200x50", |b| b.iter(|| app.draw_into(area, &mut buf)));
    c.bench_function("live/ingest", |b| b.iter(|| app.ingest(snap.clone())));
    let mut src = DemoSource::new(42);
    src.advance(3000);
    c.bench_function("live/demo_snapshot", |b| b.iter(|| src.snapshot_now()));
    c.bench_function("live/ingest_and_draw_200x50", |b| {
        b.iter(|| {
            app.ingest(snap.clone());
            app.draw_into(area, &mut buf);
        })
    });
    // A whole frame as the terminal loop does it: ingest the next sample,
    // draw into ratatui's buffer, diff against the last frame and write the
    // escape codes, over samples that change as training does.
    let mut src = DemoSource::new(42);
    let samples: Vec<_> = (0..16)
        .map(|_| {
            src.advance(150);
            src.snapshot_now()
        })
        .collect();
    let mut app = LiveApp::new("live".into(), None, true);
    let mut term = ratatui_core::terminal::Terminal::new(ratatui_core::backend::TestBackend::new(200, 50)).unwrap();
    let mut k = 0;
    c.bench_function("live/frame_200x50_ingest_draw_diff_write", |b| {
        b.iter(|| {
            app.ingest(samples[k % samples.len()].clone());
            k += 1;
            term.draw(|f| app.draw(f)).unwrap();
        })
    });
    let mut b1 = Buffer::empty(area);
    let mut b2 = Buffer::empty(area);
    app.ingest(samples[3].clone());
    app.draw_into(area, &mut b1);
    app.ingest(samples[4].clone());
    app.draw_into(area, &mut b2);
    eprintln!("cells changed between two frames: {}", b1.diff(&b2).len());
    c.bench_function("live/diff_ratatui", |b| b.iter(|| b1.diff(&b2).len()));
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
