//! Property tests over random operation sequences and random configs on the
//! simulated device. 4 properties × 2,500 cases = 10,000 generated cases.

use gpumem_top::alloc::{Action, AllocatorConfig, BlockId, CachingAllocator, Kind};
use gpumem_top::device::{Device, Sim, SimFault};
use proptest::prelude::*;

const CONFIGS: [&str; 9] = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:40",
    "max_split_size_mb:20,max_non_split_rounding_mb:40",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[1:2,16:4,>:8]",
    "garbage_collection_threshold:0.5",
    "expandable_segments:True,max_split_size_mb:64",
    "large_segment_size_mb:12",
];

#[derive(Debug, Clone)]
enum Op {
    Alloc { size: u64, stream: u64 },
    Free { pick: usize },
    FreeAfterUse { pick: usize, other: u64 },
    EmptyCache,
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..(1 << 20),
        3 => (1u64 << 20)..(10 << 20),
        2 => (10u64 << 20)..(160 << 20),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (size(), prop_oneof![3 => Just(0u64), 1 => Just(0x5555_0000u64)]).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        4 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => (any::<usize>(), Just(0x7777_0000u64)).prop_map(|(pick, other)| Op::FreeAfterUse { pick, other }),
        1 => Just(Op::EmptyCache),
    ]
}

fn config() -> impl Strategy<Value = (String, Option<f64>)> {
    (0..CONFIGS.len(), prop_oneof![Just(None), (0.05f64..0.9).prop_map(Some)])
        .prop_map(|(i, f)| (CONFIGS[i].to_string(), f))
}

/// A device of 1–3 GiB, so that OOMs, retries and GC happen.
fn sim(cap_mib: u64, fault: SimFault) -> Sim {
    Sim::new("sim", cap_mib << 20, 64 << 20).with_fault(fault)
}

fn run(
    conf: &str,
    frac: Option<f64>,
    device: Sim,
    ops: &[Op],
    mut each: impl FnMut(&CachingAllocator<Sim>, &Op, Result<(), String>) -> Result<(), TestCaseError>,
) -> Result<(CachingAllocator<Sim>, Vec<BlockId>), TestCaseError> {
    let mut a = CachingAllocator::new(AllocatorConfig::parse(conf).unwrap(), device);
    a.set_recording(false);
    if let Some(f) = frac {
        a.set_memory_fraction(f);
    }
    let mut live: Vec<BlockId> = Vec::new();
    for op in ops {
        let r = match *op {
            Op::Alloc { size, stream } => match a.malloc(size, stream) {
                Ok(b) => {
                    live.push(b);
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            },
            Op::Free { pick } if !live.is_empty() => {
                let b = live.swap_remove(pick % live.len());
                a.free(b).unwrap();
                Ok(())
            }
            Op::FreeAfterUse { pick, other } if !live.is_empty() => {
                let b = live.swap_remove(pick % live.len());
                a.record_stream(b, other).unwrap();
                a.free(b).unwrap();
                Ok(())
            }
            Op::EmptyCache => {
                a.empty_cache();
                Ok(())
            }
            _ => Ok(()),
        };
        each(&a, op, r)?;
    }
    Ok((a, live))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2500, .. ProptestConfig::default() })]

    /// Blocks tile every segment with no overlap, free neighbours are merged,
    /// every stat equals its recomputation from the blocks, and
    /// allocated <= active <= reserved, after every operation.
    #[test]
    fn invariants_hold_after_every_operation((conf, frac) in config(), cap in 1024u64..3072, ops in prop::collection::vec(op(), 1..80)) {
        run(&conf, frac, sim(cap, SimFault::default()), &ops, |a, op, _| {
            a.check_invariants().map_err(|e| TestCaseError::fail(format!("{conf} after {op:?}: {e}")))
        })?;
    }

    /// Freeing everything and emptying the cache returns every byte, with
    /// expandable segments too; the device never hands out more than it has.
    #[test]
    fn freeing_everything_returns_all_memory((conf, frac) in config(), cap in 1024u64..3072, ops in prop::collection::vec(op(), 1..80)) {
        let (mut a, live) = run(&conf, frac, sim(cap, SimFault::default()), &ops, |_, _, _| Ok(()))?;
        for b in live {
            a.free(b).unwrap();
        }
        a.empty_cache();
        a.check_invariants().map_err(TestCaseError::fail)?;
        let s = a.stats();
        prop_assert_eq!(s.get(Kind::ReservedBytes, 0).current, 0);
        prop_assert_eq!(s.get(Kind::AllocatedBytes, 0).current, 0);
        prop_assert_eq!(s.get(Kind::ActiveBytes, 0).current, 0);
        prop_assert_eq!(s.get(Kind::Segment, 0).current, 0);
        prop_assert_eq!(a.device().used(), 0);
        prop_assert!(a.device().peak_used() <= a.device().capacity() - (64 << 20));
        prop_assert!(a.snapshot().is_empty());
    }

    /// Every OOM follows PyTorch's path: the release-and-retry ran
    /// (`num_alloc_retries` +1, a stream sync), then one `oom` event with the
    /// rounded size, `num_ooms` +1; state stays consistent. A memory limit,
    /// when set, is never exceeded by cudaMalloc'd segments.
    #[test]
    fn ooms_follow_the_retry_path((conf, frac) in config(), cap in 1024u64..3072, ops in prop::collection::vec(op(), 1..80)) {
        let mut before = (0, 0, 0);
        let mut a0 = CachingAllocator::new(AllocatorConfig::parse(&conf).unwrap(), sim(cap, SimFault::default()));
        if let Some(f) = frac { a0.set_memory_fraction(f); }
        let limit = a0.memory_limit();
        let es = conf.contains("expandable");
        run(&conf, frac, sim(cap, SimFault::default()), &ops, |a, op, r| {
            let s = a.stats();
            let now = (s.num_alloc_retries, s.num_ooms, s.num_sync_all_streams);
            if let (Op::Alloc { .. }, Err(msg)) = (op, &r) {
                prop_assert_eq!(now.0, before.0 + 1, "{}", msg);
                prop_assert_eq!(now.1, before.1 + 1);
                prop_assert!(now.2 > before.2);
                prop_assert!(msg.starts_with("CUDA out of memory. Tried to allocate "));
                prop_assert_eq!(limit.is_some(), msg.contains(" allowed; "));
            } else {
                prop_assert_eq!(now.1, before.1);
            }
            if let (Some(l), false) = (limit, es) {
                prop_assert!(a.total_allocated_memory() <= l);
            }
            before = now;
            a.check_invariants().map_err(TestCaseError::fail)
        })?;
    }

    /// An injected cudaMalloc failure leaves the allocator consistent and ends
    /// either in a successful retry after freeing the cache or in an OOM.
    #[test]
    fn injected_device_failures_end_in_retry_or_oom(
        (conf, frac) in config(), ops in prop::collection::vec(op(), 1..60), fails in prop::collection::vec(1u64..12, 1..4),
    ) {
        let fault = SimFault { fail_mallocs: fails.clone(), fail_maps: fails };
        let mut before = (0, 0);
        run(&conf, frac, sim(4096, fault), &ops, |a, op, r| {
            let s = a.stats();
            if let (Op::Alloc { .. }, Err(_)) = (op, &r) {
                prop_assert_eq!(s.num_ooms, before.1 + 1);
                prop_assert_eq!(s.num_alloc_retries, before.0 + 1);
            }
            before = (s.num_alloc_retries, s.num_ooms);
            a.check_invariants().map_err(TestCaseError::fail)
        })?;
    }
}

/// The first cudaMalloc of a new segment fails; a cached free segment exists,
/// so PyTorch frees the cache and the retry succeeds.
#[test]
fn a_failed_cudamalloc_is_retried_after_freeing_the_cache() {
    let dev = Sim::new("sim", 1 << 30, 0).with_fault(SimFault { fail_mallocs: vec![2], fail_maps: vec![] });
    let mut a = CachingAllocator::new(AllocatorConfig::default(), dev);
    let b = a.malloc(30 << 20, 0).unwrap();
    a.free(b).unwrap();
    a.clear_events();
    let c = a.malloc(50 << 20, 0).unwrap();
    let acts: Vec<Action> = a.events().iter().map(|e| e.action).collect();
    assert_eq!(acts, [Action::SegmentFree, Action::SegmentAlloc, Action::Alloc]);
    assert_eq!(a.stats().num_alloc_retries, 1);
    assert_eq!(a.stats().num_sync_all_streams, 1);
    assert_eq!(a.stats().num_ooms, 0);
    assert_eq!(a.block(c).unwrap().size, 50 << 20);
    assert_eq!(a.device().mallocs(), 3);
}

/// With nothing cached to release, the same failure is PyTorch's OOM, with
/// its message, an `oom` event holding the rounded size and device free bytes.
#[test]
fn an_unrecoverable_failure_is_an_oom_with_pytorchs_message() {
    let dev = Sim::new("sim", 1 << 30, 100 << 20);
    let mut a = CachingAllocator::new(AllocatorConfig::default(), dev);
    let _keep = a.malloc(600 << 20, 0).unwrap();
    let e = a.malloc(400 << 20, 7).unwrap_err();
    assert_eq!(
        e.to_string(),
        "CUDA out of memory. Tried to allocate 400.00 MiB. GPU 0 has a total capacity of 1024.00 MiB of which 324.00 MiB is free. \
         Including non-PyTorch memory, this process has 700.00 MiB memory in use. Of the allocated memory 600.00 MiB is allocated \
         by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting \
         PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  \
         (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    );
    let last = *a.events().last().unwrap();
    assert_eq!((last.action, last.addr, last.size, last.stream), (Action::Oom, 324 << 20, 400 << 20, 7));
    assert_eq!(a.stats().num_ooms, 1);
    assert_eq!(a.stats().num_alloc_retries, 1);
    a.check_invariants().unwrap();
    assert_eq!(a.device().free_memory(0), 324 << 20);
}

/// A block used on another stream stays `active_pending_free` until that
/// stream's event completes, and cannot be merged or reused meanwhile.
#[test]
fn record_stream_defers_the_free() {
    let mut a = CachingAllocator::new(AllocatorConfig::default(), Sim::h200());
    let x = a.malloc(4096, 0).unwrap();
    a.record_stream(x, 9).unwrap();
    a.free(x).unwrap();
    assert_eq!(a.snapshot()[0].blocks[0].state.name(), "active_pending_free");
    assert_eq!(a.stats().get(Kind::AllocatedBytes, 0).current, 0);
    assert_eq!(a.stats().get(Kind::ActiveBytes, 0).current, 4096);
    a.check_invariants().unwrap();
    let acts: Vec<Action> = a.events().iter().map(|e| e.action).collect();
    assert_eq!(acts, [Action::SegmentAlloc, Action::Alloc, Action::FreeRequested]);
    let _y = a.malloc(512, 0).unwrap();
    let acts: Vec<Action> = a.events().iter().skip(3).map(|e| e.action).collect();
    assert_eq!(acts, [Action::FreeCompleted, Action::Alloc]);
    assert_eq!(a.stats().get(Kind::ActiveBytes, 0).current, 512);
}
