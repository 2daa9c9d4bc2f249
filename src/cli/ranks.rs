//! `replay rank0.pickle rank1.pickle …`: one snapshot per rank of a job,
//! each replayed exactly as it would be alone, reported side by side with
//! the median and the worst rank (docs/user/ranks.md).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, Result};

use super::replay::ReplayArgs;
use crate::analysis::human_bytes;
use crate::analysis::ranks::{Imbalance, Measure, RankReplay, RanksModel};
use crate::replay::report::{RankReport, RanksReport, ReplayReport};
use crate::trace::Trace;

/// Each input's rank: the number after "rank" in every file's name when
/// all have one and no two share it (`snapshot --job` names them so), else
/// the order given.
pub(crate) fn ranks_of(paths: &[PathBuf]) -> Vec<u32> {
    let named: Vec<Option<u32>> = paths.iter().map(|p| rank_in_name(p)).collect();
    let mut seen = std::collections::BTreeSet::new();
    if named.iter().all(|r| r.is_some_and(|r| seen.insert(r))) {
        return named.into_iter().flatten().collect();
    }
    (0..paths.len() as u32).collect()
}

fn rank_in_name(p: &Path) -> Option<u32> {
    let name = p.file_name()?.to_string_lossy().to_lowercase();
    let at = name.rfind("rank")?;
    let digits: String =
        name[at + 4..].chars().skip_while(|c| *c == '_' || *c == '-').take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// One rank's replay args: `args` for `path` alone.
fn alone(args: &ReplayArgs, path: &Path) -> ReplayArgs {
    ReplayArgs { trace: path.to_path_buf(), more: Vec::new(), ..args.clone() }
}

/// Each rank replayed once, exactly as alone: its `replay --json` report,
/// its exit code, and with `text` its summary.
fn reports(
    args: &ReplayArgs,
    paths: &[PathBuf],
    traces: &[Trace],
    text: bool,
) -> Result<Vec<(ReplayReport, ExitCode, Vec<u8>)>> {
    paths.iter().zip(traces).map(|(p, t)| super::replay::replay_report(&alone(args, p), t, text)).collect()
}

/// The figure each rank is compared on, from its report: its peak where
/// every rank has one, else what its snapshot holds allocated.
fn measure_of(reports: &[(ReplayReport, ExitCode, Vec<u8>)]) -> (Measure, Vec<u64>) {
    let peaks: Option<Vec<u64>> = reports.iter().map(|(r, _, _)| r.peak.as_ref().map(|p| p.allocated_bytes)).collect();
    match peaks {
        Some(p) => (Measure::PeakAllocated, p),
        None => (
            Measure::AllocatedInSnapshot,
            reports.iter().map(|(r, _, _)| r.stat("allocated_bytes.all.current")).collect(),
        ),
    }
}

pub(crate) fn replay_ranks(args: &ReplayArgs) -> Result<ExitCode> {
    if args.dump_events.is_some() {
        return Err(anyhow!(super::args::InputError(
            "--dump-events writes one trace's events: give it one input, not several".into()
        )));
    }
    let paths: Vec<PathBuf> = std::iter::once(args.trace.clone()).chain(args.more.iter().cloned()).collect();
    // Each input is read once (a FIFO or `<(…)` has no second reading):
    // told from a recording, then loaded, then replayed from memory.
    let mut traces = Vec::with_capacity(paths.len());
    for p in &paths {
        let input = crate::trace::input::Input::open(p)?;
        if input.kind() == crate::trace::input::InputKind::Recording {
            return Err(anyhow!(super::args::InputError(format!(
                "{}: a recording holds every rank already; replay it alone (its job screen, key j, shows them side by side)",
                p.display()
            ))));
        }
        traces.push(super::io::load_input(input, args.max_unpacked)?);
    }
    let ranks = ranks_of(&paths);
    let interactive = !args.json && std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    if interactive && args.compare.is_empty() && args.at.is_none() {
        return tui(args, &paths, traces, &ranks);
    }
    let reports = reports(args, &paths, &traces, !args.json)?;
    let (measure, figures) = measure_of(&reports);
    let by_rank: Vec<(u32, u64)> = ranks.iter().copied().zip(figures.iter().copied()).collect();
    let imbalance = Imbalance::of(&by_rank, measure);
    // The worst exit of the ranks': 1 where one diverged or would run out.
    let code =
        if reports.iter().any(|(_, c, _)| *c != ExitCode::SUCCESS) { ExitCode::from(1) } else { ExitCode::SUCCESS };
    let mut so = super::io::text_out();
    if args.json {
        let ranks = reports
            .into_iter()
            .zip(&ranks)
            .zip(&paths)
            .map(|(((report, _, _), &rank), p)| RankReport { rank, path: p.display().to_string(), report })
            .collect();
        serde_json::to_writer(&mut so, &RanksReport { ranks, imbalance })?;
        writeln!(so)?;
        return Ok(code);
    }
    write!(so, "{}", side_by_side(&reports, &ranks, &paths, imbalance.as_ref()))?;
    for ((p, rank), (_, _, summary)) in paths.iter().zip(&ranks).zip(&reports) {
        writeln!(so, "\n── rank {rank}: {} ──", p.display())?;
        so.write_all(summary)?;
    }
    Ok(code)
}

/// The table at the top of the summary: one row per rank.
fn side_by_side(
    reports: &[(ReplayReport, ExitCode, Vec<u8>)],
    ranks: &[u32],
    paths: &[PathBuf],
    imb: Option<&Imbalance>,
) -> String {
    let mut out = format!("{} ranks side by side, each replayed alone:\n", ranks.len());
    let row = |c: [&str; 8]| {
        format!(
            "  {:>4}  {:<24} {:>11} {:>14} {:>13} {:>9} {:>4}  {}\n",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]
        )
    };
    out.push_str(&row(["rank", "file", "allocated", "peak allocated", "peak reserved", "vs median", "OOMs", "replay"]));
    let m = imb.map_or(0, |i| i.median_peak_bytes);
    let by_peak = imb.is_some_and(|i| i.measure == Measure::PeakAllocated);
    for (((r, _, _), rank), p) in reports.iter().zip(ranks).zip(paths) {
        let peak = r.peak.as_ref().map(|p| p.allocated_bytes);
        let now = r.stat("allocated_bytes.all.current");
        let figure = if by_peak { peak.unwrap_or(0) } else { now };
        let vs = if m > 0 { format!("{:+.1}%", (figure as f64 / m as f64 - 1.0) * 100.0) } else { "n/a".into() };
        out.push_str(&row([
            &rank.to_string(),
            &crate::view::ellipsis(super::io::trace_name(p), 24),
            &human_bytes(now),
            &peak.map_or("no history".into(), human_bytes),
            &peak.map(|_| r.stat("reserved_bytes.all.peak")).map_or("no history".into(), human_bytes),
            &vs,
            &r.stat("num_ooms").to_string(),
            r.fidelity,
        ]));
    }
    if let Some(i) = imb {
        let what =
            if by_peak { "peak allocated" } else { "allocated in the snapshots (without history they hold no peaks)" };
        out.push_str(&format!(
            "median {what}: {}; worst rank {} at {} ({:+.1}% over the median)\n",
            human_bytes(i.median_peak_bytes),
            i.worst_rank,
            human_bytes(i.worst_peak_bytes),
            i.over_median * 100.0
        ));
    }
    out
}

/// The interactive view: the ranks' table and their maps side by side;
/// Enter opens a rank in the replay view, q there comes back.
fn tui(args: &ReplayArgs, paths: &[PathBuf], traces: Vec<Trace>, ranks: &[u32]) -> Result<ExitCode> {
    let color = super::io::color(args.no_color);
    let mut app = ranks_screen(paths, traces, ranks, args.device, args.device_total, color)?;
    let events = crate::ui::event::Events::new();
    crate::ui::event::run_screens(&mut app, events, &mut |o| super::screen::open_screen(o, color))
        .map_err(|e| anyhow!("terminal: {e}"))?;
    Ok(ExitCode::SUCCESS)
}

fn ranks_screen(
    paths: &[PathBuf],
    traces: Vec<Trace>,
    ranks: &[u32],
    device: Option<i32>,
    device_total: u64,
    color: bool,
) -> Result<crate::ui::ranks::RanksApp> {
    let mut model_ranks = Vec::new();
    for ((p, trace), &rank) in paths.iter().zip(traces).zip(ranks) {
        model_ranks.push(open_rank(p, &trace, rank, device, device_total)?);
    }
    Ok(crate::ui::ranks::RanksApp::new(RanksModel::new(model_ranks), color))
}

/// The screen of `replay PATHS…` on a terminal, as it opens (tests drive it
/// through its own code).
pub fn ranks_app(paths: &[PathBuf], color: bool) -> Result<crate::ui::ranks::RanksApp> {
    let traces = paths
        .iter()
        .map(|p| super::io::load_input(crate::trace::input::Input::open(p)?, None))
        .collect::<Result<Vec<_>>>()?;
    ranks_screen(paths, traces, &ranks_of(paths), None, crate::device::DEFAULT_DEVICE_TOTAL, color)
}

/// One rank's exact replay, as the side-by-side view shows it: its peak,
/// and its segments there (a snapshot without history: its state).
fn open_rank(path: &Path, trace: &Trace, rank: u32, device: Option<i32>, device_total: u64) -> Result<RankReplay> {
    use crate::replay::session::Start;
    let opts = crate::replay::OpenOptions { device, device_total, ..Default::default() };
    let crate::replay::Opened { dev, session, .. } = crate::replay::open(trace, &path.display().to_string(), &opts)?;
    let exact = session.exact.divergence.is_none() && session.start != Start::StateOnly;
    let peak = exact.then_some(session.exact.peak);
    let stats = session.exact.allocator.stats();
    let segments = match peak {
        Some(p) => match session.forward_scrubber() {
            Ok(mut sc) => sc.seek(p.event).snapshot(),
            Err(_) => session.exact.allocator.snapshot(),
        },
        None => session.exact.allocator.snapshot(),
    };
    let get = |k| stats.get(k, 0);
    Ok(RankReplay {
        rank,
        name: super::io::trace_name(path),
        path: path.to_path_buf(),
        fidelity: session.fidelity.name(),
        peak_allocated: peak.map(|p| p.allocated),
        peak_reserved: exact.then(|| get(crate::alloc::Kind::ReservedBytes).peak.max(0) as u64),
        allocated: get(crate::alloc::Kind::AllocatedBytes).current.max(0) as u64,
        ooms: dev.events.ooms().count(),
        segments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_come_from_the_names_when_every_name_has_its_own() {
        let p = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
        assert_eq!(ranks_of(&p(&["a/job-rank2.pickle", "job-rank0.pickle", "x_rank_1.pickle.gz"])), [2, 0, 1]);
        // Two named alike, or one without: the order given.
        assert_eq!(ranks_of(&p(&["rank1.pickle", "b/rank1.pickle"])), [0, 1]);
        assert_eq!(ranks_of(&p(&["rank3.pickle", "other.pickle"])), [0, 1]);
    }
}
