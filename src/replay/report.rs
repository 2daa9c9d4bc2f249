//! `replay --json` as types; docs/user/json.md is the schema.

use std::collections::BTreeMap;

use serde::Serialize;

use super::session::{Start, Totals};
use crate::alloc::Event;
use crate::analysis::{round4, Fragmentation, PoolUsage};

#[derive(Debug, Clone, Serialize)]
pub(crate) struct TorchReleaseReport {
    /// The release whose rules were followed, e.g. "2.15.0".
    pub(crate) rules: String,
    pub(crate) why: String,
    /// Trace entries with actions this reader does not know, skipped.
    pub(crate) unknown_actions: std::collections::BTreeMap<String, usize>,
    /// `annotate` entries (`torch.cuda.memory._annotate_tensor`, 2.14+),
    /// the first 100.
    pub(crate) annotations: Vec<AnnotationReport>,
}

/// One `annotate` entry of the trace.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AnnotationReport {
    pub(crate) time_us: i64,
    pub(crate) addr: String,
    pub(crate) text: String,
}

/// One rank of `replay RANK0 RANK1 … --json`: its replay's report as alone,
/// with its rank and path (docs/user/ranks.md).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RankReport {
    pub(crate) rank: u32,
    pub(crate) path: String,
    #[serde(flatten)]
    pub(crate) report: ReplayReport,
}

/// `replay RANK0 RANK1 … --json`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RanksReport {
    pub(crate) ranks: Vec<RankReport>,
    pub(crate) imbalance: Option<crate::analysis::ranks::Imbalance>,
}

impl ReplayReport {
    /// `memory_stats()`'s counter `key` (0 where the report has none).
    pub(crate) fn stat(&self, key: &str) -> u64 {
        self.stats.get(key).map_or(0, |&v| v.max(0) as u64)
    }
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct ReplayReport {
    pub(crate) trace: String,
    /// "pytorch-snapshot", "jsonl" or "rmm-csv".
    pub(crate) format: &'static str,
    pub(crate) device: i32,
    pub(crate) events: usize,
    /// The allocator config replayed (the recorded one unless `--alloc-conf`).
    pub(crate) alloc_conf: String,
    pub(crate) start: Start,
    pub(crate) memory_limit_bytes: Option<u64>,
    /// The run's own limit, found from the trace (docs/user/replay.md, "Conditions").
    pub(crate) memory_limit_found: Option<crate::replay::conditions::LimitFound>,
    /// What the search for the run's conditions could not settle.
    pub(crate) conditions_note: Option<String>,
    /// "exact", "exact-window", "state-only", "what-if" or "diverged".
    pub(crate) fidelity: &'static str,
    /// Whose allocator rules were followed, and why (docs/user/replay.md, "Which release").
    pub(crate) torch_release: TorchReleaseReport,
    /// What `stats` covers: "process", "window" or "state".
    pub(crate) stats_cover: &'static str,
    pub(crate) first_divergence: Option<DivergenceReport>,
    /// A what-if that runs out of memory where the recording did not.
    pub(crate) first_new_oom: Option<NewOomReport>,
    /// The out-of-memory errors the run itself had, as its trace recorded them.
    pub(crate) recorded_ooms: Vec<RecordedOomReport>,
    pub(crate) inferred_empty_cache_calls: usize,
    pub(crate) directed_releases: usize,
    /// Of `num_alloc_retries`, those inferred from a release burst before a
    /// segment that could not have fitted without it: each could as well
    /// have been an `empty_cache()` called just then (docs/user/replay.md).
    pub(crate) retries_or_empty_cache: usize,
    pub(crate) placed_allocs: usize,
    /// What the snapshot's own segments sum to.
    pub(crate) recorded_totals: Totals,
    /// Which call stacks the trace carries: "per_event", "blocks_only" or
    /// "none" (`DeviceTrace::call_stacks`).
    pub(crate) call_stacks: crate::trace::CallStacks,
    /// When the run ran out of memory: the setting that avoids it, or that
    /// none does, as replays of the run under every setting found
    /// (`tune::oom_advice`); null otherwise.
    pub(crate) oom_advice: Option<String>,
    /// The run changed its allocator settings (`_set_allocator_settings`):
    /// `{event, from}`, the first event replayed under the final settings
    /// and the settings before it; null otherwise.
    pub(crate) settings_changed: Option<crate::replay::session::SettingsChange>,
    /// Counters the trace cannot tell (docs/user/replay.md).
    pub(crate) not_in_trace: Vec<&'static str>,
    /// `torch.cuda.memory_stats()`: the 121 keys and `max_split_size`.
    pub(crate) stats: BTreeMap<String, i64>,
    pub(crate) peak: Option<PeakReport>,
    /// What the memory is (docs/user/categories.md).
    pub(crate) categories: CategoriesReport,
    pub(crate) fragmentation: FragmentationReport,
    pub(crate) pools: Vec<PoolUsage>,
    pub(crate) segments: Vec<SegmentReport>,
    pub(crate) compare: Vec<CompareRow>,
    #[serde(serialize_with = "round4")]
    pub(crate) elapsed_ms: f64,
}

/// An out-of-memory error the trace recorded: the request PyTorch could not
/// serve, what the device had free then, and the call stack that asked.
/// Why a recorded OOM happened (JSON: "device_full", "process_limit").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OomCause {
    /// The device had less free than the request.
    DeviceFull,
    /// The device had room: a per-process memory limit refused it.
    ProcessLimit,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct RecordedOomReport {
    pub(crate) event: usize,
    /// Microseconds since the trace's first event; null without times.
    pub(crate) time_us: Option<i64>,
    /// The request (PyTorch records it rounded to its block size).
    pub(crate) size_bytes: u64,
    pub(crate) stream: u64,
    /// What `cudaMemGetInfo` said was free on the device (PyTorch records
    /// it in the OOM entry's address field).
    pub(crate) device_free_bytes: u64,
    /// The innermost frame of the user's own code, `file:line function`
    /// ("" without frames).
    pub(crate) call_site: String,
    /// The innermost frame of the program's own scripts, when not `call_site`.
    pub(crate) script_site: Option<String>,
    /// The whole stack, innermost first, `file:line function` each.
    pub(crate) frames: Vec<String>,
    /// `device_full` when the device had less free than the request, else
    /// `process_limit`: a per-process limit (`set_per_process_memory_fraction`)
    /// refused it while the device had room.
    pub(crate) cause: OomCause,
}

impl RecordedOomReport {
    /// Every OOM entry of `dev`.
    pub(crate) fn all(dev: &crate::trace::DeviceTrace, stacks: &[Vec<crate::trace::Frame>]) -> Vec<Self> {
        let t0 = dev.time_us.first();
        dev.events
            .ooms()
            .map(|i| (i, dev.events.at(i)))
            .map(|(i, e)| {
                let frames = dev.stacks.get(i).and_then(|&sid| stacks.get((sid as usize).wrapping_sub(1)));
                let call_site = frames.map(|f| crate::analysis::call_site(f)).unwrap_or_default();
                RecordedOomReport {
                    cause: if e.addr >= e.size { OomCause::ProcessLimit } else { OomCause::DeviceFull },
                    event: i,
                    time_us: dev.time_us.get(i).zip(t0).map(|(t, t0)| t - t0),
                    size_bytes: e.size,
                    stream: e.stream,
                    device_free_bytes: e.addr,
                    script_site: frames.and_then(|f| crate::analysis::script_site(f)).filter(|s| *s != call_site),
                    call_site,
                    frames: frames
                        .map(|f| f.iter().map(|x| format!("{}:{} {}", x.filename, x.line, x.name)).collect())
                        .unwrap_or_default(),
                }
            })
            .collect()
    }

    /// "event N (T s in): X on stream S, Y free on the device, at SITE".
    pub(crate) fn describe(&self) -> String {
        format!(
            "event {}{}: a request of {} on stream {} with {} free on the device{}{}",
            self.event,
            self.time_us.map_or(String::new(), |t| format!(" ({:.3} s in)", t as f64 / 1e6)),
            crate::analysis::human_bytes(self.size_bytes),
            self.stream,
            crate::analysis::human_bytes(self.device_free_bytes),
            if self.cause == OomCause::ProcessLimit {
                " (room enough: a per-process memory limit refused it)"
            } else {
                ""
            },
            if self.call_site.is_empty() {
                " (no call stack recorded)".to_string()
            } else {
                format!(", at {}", self.call_site)
            }
        )
    }
}

/// Where a what-if run first cannot allocate what the recording did.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct NewOomReport {
    /// The recorded event of the request.
    pub(crate) event: usize,
    pub(crate) requested_bytes: u64,
    pub(crate) stream: u64,
    /// The innermost frame of the user's own code, `file:line function`
    /// ("" when the trace has no frames for it).
    pub(crate) call_site: String,
    /// The innermost frame of the program's own scripts, when that is not
    /// `call_site` (a library's code made the request).
    pub(crate) script_site: Option<String>,
    /// Allocations that fail in the what-if in all (the program would
    /// have stopped at the first).
    pub(crate) failing_allocations: u64,
}

/// One recorded or replayed trace entry.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct EventReport {
    pub(crate) action: &'static str,
    pub(crate) addr: u64,
    pub(crate) size: u64,
    pub(crate) stream: u64,
}

impl EventReport {
    pub(crate) fn of(e: &Event) -> Self {
        EventReport { action: e.action.name(), addr: e.addr, size: e.size, stream: e.stream }
    }
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct DivergenceReport {
    pub(crate) event: usize,
    pub(crate) expected: Option<EventReport>,
    pub(crate) got: Option<EventReport>,
    pub(crate) reason: String,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct PeakReport {
    pub(crate) event: usize,
    pub(crate) time_us: Option<i64>,
    pub(crate) allocated_bytes: u64,
    pub(crate) reserved_bytes: u64,
}

/// Allocated bytes per category at the peak, at `--at` and at the end.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CategoriesReport {
    /// What they were told from: "stacks", "markers", "block_stacks" or "none".
    pub(crate) evidence: &'static str,
    pub(crate) method: &'static str,
    /// None for a state-only snapshot (it has no peak).
    pub(crate) at_peak: Option<CategoryPoint>,
    /// With `--at`.
    pub(crate) at: Option<CategoryPoint>,
    pub(crate) at_end: CategoryPoint,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct CategoryPoint {
    /// The event after which the bytes are counted (none: the snapshot's state).
    pub(crate) event: Option<usize>,
    pub(crate) bytes: crate::analysis::categories::CategoryBytes,
}

/// One block of a segment, with `--at`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BlockReport {
    pub(crate) address: u64,
    pub(crate) size: u64,
    pub(crate) requested_size: u64,
    pub(crate) state: &'static str,
    /// Null for a free block.
    pub(crate) category: Option<crate::analysis::categories::Category>,
}

/// The figures of docs/design/architecture.md §Fragmentation figures, now and at the peak.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct FragmentationReport {
    pub(crate) at_peak_reserved_minus_allocated_bytes: Option<u64>,
    /// 1 − peak allocated / peak reserved; none for a state-only snapshot.
    #[serde(serialize_with = "round4_opt")]
    pub(crate) peak_ratio: Option<f64>,
    #[serde(flatten)]
    pub(crate) now: Fragmentation,
}

fn round4_opt<S: serde::Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match x {
        Some(v) => round4(v, s),
        None => s.serialize_none(),
    }
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct SegmentReport {
    pub(crate) address: u64,
    pub(crate) total_size: u64,
    pub(crate) allocated_size: u64,
    pub(crate) stream: u64,
    pub(crate) segment_type: &'static str,
    pub(crate) is_expandable: bool,
    pub(crate) segment_pool_id: Option<[u64; 2]>,
    pub(crate) private_pool: bool,
    /// With `--at`: the segment's blocks at that point.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) blocks: Option<Vec<BlockReport>>,
}

impl SegmentReport {
    pub(crate) fn of(s: &crate::alloc::SegmentInfo) -> Self {
        SegmentReport {
            address: s.address,
            total_size: s.total_size,
            allocated_size: s.allocated_size,
            stream: s.stream,
            segment_type: s.segment_type,
            is_expandable: s.is_expandable,
            segment_pool_id: s.pool.map(|p| [p.0, p.1]),
            private_pool: s.private,
            blocks: None,
        }
    }

    /// With each block and its category (`at`: the event the state is after).
    pub(crate) fn with_blocks(
        s: &crate::alloc::SegmentInfo,
        cats: &crate::analysis::categories::Categories,
        at: Option<usize>,
    ) -> Self {
        let blocks = s
            .blocks
            .iter()
            .map(|b| BlockReport {
                address: b.address,
                size: b.size,
                requested_size: b.requested_size,
                state: b.state.name(),
                category: (b.state != crate::alloc::BlockState::Inactive).then(|| cats.of_block(b.address, at)),
            })
            .collect();
        SegmentReport { blocks: Some(blocks), ..Self::of(s) }
    }
}

/// The same requests under another config (`--compare`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CompareRow {
    pub(crate) alloc_conf: String,
    pub(crate) memory_limit_bytes: Option<u64>,
    pub(crate) peak_allocated_bytes: i64,
    pub(crate) peak_reserved_bytes: i64,
    #[serde(serialize_with = "round4")]
    pub(crate) peak_ratio: f64,
    pub(crate) num_alloc_retries: i64,
    pub(crate) num_ooms: i64,
    /// Allocations that fail under this config but succeeded when recorded
    /// (none for the recorded row).
    pub(crate) new_ooms: Option<u64>,
    /// Allocations that failed when recorded but succeed under this config.
    pub(crate) avoided_ooms: Option<u64>,
}

impl CompareRow {
    pub(crate) fn from_stats(alloc_conf: String, limit: Option<u64>, s: &crate::alloc::DeviceStats) -> Self {
        use crate::alloc::Kind;
        CompareRow {
            alloc_conf,
            memory_limit_bytes: limit,
            peak_allocated_bytes: s.get(Kind::AllocatedBytes, 0).peak,
            peak_reserved_bytes: s.get(Kind::ReservedBytes, 0).peak,
            peak_ratio: crate::analysis::peak_ratio(s),
            num_alloc_retries: s.num_alloc_retries,
            num_ooms: s.num_ooms,
            new_ooms: None,
            avoided_ooms: None,
        }
    }
}

/// What the stats cover, by kind of start.
pub(crate) fn covers(start: Start) -> &'static str {
    match start {
        Start::ProcessStart => "process",
        Start::Window => "window",
        Start::StateOnly => "state",
    }
}
