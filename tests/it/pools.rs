//! Private pools as PyTorch 2.11 has them (docs/design/allocator.md "Private
//! pools"): CUDA-graph captures, `MemPool` + `use_mem_pool`, freeable pools
//! released by `empty_cache`, `~MemPool`'s `emptyCache(id)`, `use_on_oom`
//! and `no_split`, and frees deferred while a capture is underway. Each
//! figure is one PyTorch showed on the H200 or that its source implies.

use gpumem_top::alloc::{Action, AllocError, AllocatorConfig, CachingAllocator, Event, Kind, PoolSlot, Route};
use gpumem_top::device::Sim;

const MIB: u64 = 1 << 20;

fn alloc() -> CachingAllocator<Sim> {
    CachingAllocator::new(AllocatorConfig::default(), Sim::h200())
}

fn reserved(a: &CachingAllocator<Sim>) -> i64 {
    a.stats().get(Kind::ReservedBytes, 0).current
}

fn segment_events(a: &mut CachingAllocator<Sim>) -> Vec<Event> {
    a.take_events().into_iter().filter(|e| e.action.is_segment()).collect()
}

/// One capture: its stream's mallocs go to the graph's pool, the others'
/// to the default pools, and reserved counts both (H200: 44 MiB = 20 + 2
/// default + 20 + 2 private).
#[test]
fn a_capture_routes_its_streams_mallocs_to_the_graphs_pool() {
    let mut a = alloc();
    let d_large = a.malloc(3 * MIB, 0).unwrap();
    let d_small = a.malloc(1000, 0).unwrap();
    let g = a.begin_allocate_to_pool((1, 0), Route::Stream(7)).unwrap();
    let p_large = a.malloc(3 * MIB, 7).unwrap();
    let p_small = a.malloc(1000, 7).unwrap();
    // Another stream during the capture: default pools (a cached block).
    let other = a.malloc(1000, 0).unwrap();
    a.end_allocate_to_pool(g);
    assert_eq!(reserved(&a), (44 * MIB) as i64);
    let segs = a.snapshot();
    assert_eq!(segs.len(), 4);
    assert_eq!(segs.iter().filter(|s| s.private).count(), 2);
    assert!(segs.iter().filter(|s| s.private).all(|s| s.pool == Some((1, 0)) && s.stream == 7));
    // The default small segment holds both 1000 B blocks of stream 0.
    let small0 = segs.iter().find(|s| !s.private && s.segment_type == "small").unwrap();
    assert_eq!(
        small0.blocks.iter().filter(|b| b.size == 1024 && b.state != gpumem_top::alloc::BlockState::Inactive).count(),
        2
    );
    for b in [d_large, d_small, p_large, p_small, other] {
        a.free(b).unwrap();
    }
    a.check_invariants().unwrap();
}

/// A live graph's pool keeps its segments through `empty_cache`; once the
/// graph is gone, `empty_cache` releases the default large, default small,
/// then the pool's small and large segments, and the pool is erased.
#[test]
fn empty_cache_releases_a_freeable_pool_small_before_large_after_the_defaults() {
    let mut a = alloc();
    let x = a.malloc(3 * MIB, 0).unwrap();
    let y = a.malloc(1000, 0).unwrap();
    let g = a.begin_allocate_to_pool((1, 0), Route::Stream(7)).unwrap();
    let px = a.malloc(3 * MIB, 7).unwrap();
    let py = a.malloc(1000, 7).unwrap();
    a.end_allocate_to_pool(g);
    for b in [x, y, px, py] {
        a.free(b).unwrap();
    }
    a.take_events();
    a.empty_cache();
    let ev = segment_events(&mut a);
    assert_eq!(ev.len(), 2, "the graph's pool is alive: only the default segments go");
    assert_eq!((ev[0].size, ev[0].stream), (20 * MIB, 0));
    assert_eq!((ev[1].size, ev[1].stream), (2 * MIB, 0));
    assert_eq!(reserved(&a), (22 * MIB) as i64);
    // The graph dies (reset / del): the pool is freeable.
    a.release_pool(g);
    let _keep = a.malloc(3 * MIB, 0).unwrap();
    a.take_events();
    a.empty_cache();
    let ev = segment_events(&mut a);
    assert_eq!(ev.iter().map(|e| (e.size, e.stream)).collect::<Vec<_>>(), vec![(2 * MIB, 7), (20 * MIB, 7)]);
    assert!(a.pools().iter().all(|p| p.slot == PoolSlot::DEFAULT), "the emptied pool is erased");
    assert_eq!(a.stats().num_sync_all_streams, 2);
    a.check_invariants().unwrap();
}

/// A freeable pool whose segment still holds a live output keeps that
/// segment (and its id) until the output is freed.
#[test]
fn a_freeable_pool_keeps_segments_with_live_blocks() {
    let mut a = alloc();
    let g = a.begin_allocate_to_pool((1, 0), Route::Stream(7)).unwrap();
    let out = a.malloc(3 * MIB, 7).unwrap();
    let tmp = a.malloc(30 * MIB, 7).unwrap();
    a.end_allocate_to_pool(g);
    a.free(tmp).unwrap();
    a.release_pool(g);
    a.take_events();
    a.empty_cache();
    let ev = segment_events(&mut a);
    assert_eq!(ev.iter().map(|e| e.size).collect::<Vec<_>>(), vec![30 * MIB]);
    assert_eq!(a.snapshot().iter().filter(|s| s.private && s.pool == Some((1, 0))).count(), 1);
    a.free(out).unwrap();
    a.empty_cache();
    assert_eq!(reserved(&a), 0);
    assert!(a.pools().iter().all(|p| p.slot == PoolSlot::DEFAULT));
}

/// `MemPool` + `use_mem_pool`: every malloc of the thread goes to the pool,
/// whatever its stream; the pool's id can be shared (graph_pool_handle);
/// `~MemPool` releases that pool only and syncs once.
#[test]
fn mempool_destruction_empties_only_its_pool() {
    let mut a = alloc();
    let d = a.malloc(4 * MIB, 0).unwrap();
    // MemPool(): the object's reference; use_mem_pool: one more.
    let p = a.create_pool(Some((0, 1))).unwrap();
    assert_eq!(a.begin_allocate_to_pool((0, 1), Route::Always).unwrap(), p);
    let m1 = a.malloc(4 * MIB, 0).unwrap();
    let m2 = a.malloc(4 * MIB, 5).unwrap();
    a.end_allocate_to_pool(p);
    // use_mem_pool's exit: one reference less; the MemPool object holds one.
    a.release_pool(p);
    assert_eq!(a.pools().iter().find(|v| v.slot == p).unwrap().use_count, 1);
    // graph_pool_handle-style sharing: the same id is another reference.
    assert_eq!(a.create_pool(Some((0, 1))).unwrap(), p);
    a.release_pool(p);
    let segs = a.snapshot();
    assert_eq!(segs.iter().filter(|s| s.pool == Some((0, 1))).count(), 2, "one segment per stream");
    for b in [d, m1, m2] {
        a.free(b).unwrap();
    }
    a.take_events();
    let syncs = a.stats().num_sync_all_streams;
    // ~MemPool: releasePool, then emptyCache(id).
    a.release_pool(p);
    a.empty_cache_pool(p);
    let ev = segment_events(&mut a);
    assert_eq!(ev.len(), 2);
    assert!(ev.iter().all(|e| e.action == Action::SegmentFree && e.size == 20 * MIB));
    assert_eq!(a.stats().num_sync_all_streams, syncs + 1);
    assert_eq!(reserved(&a), (20 * MIB) as i64, "the default segment stays");
    // A released pool's id cannot be revived while it still exists; once
    // erased, the id makes a fresh pool.
    assert!(a.pools().iter().all(|v| v.slot == PoolSlot::DEFAULT));
    assert!(a.create_pool(Some((0, 1))).is_ok());
}

#[test]
fn a_released_pool_still_holding_memory_cannot_be_revived() {
    let mut a = alloc();
    let p = a.create_pool(Some((0, 3))).unwrap();
    let b = a.malloc_in(p, 4 * MIB, 0, 0).unwrap();
    a.release_pool(p);
    assert_eq!(a.create_pool(Some((0, 3))), Err(AllocError::PoolReleased((0, 3))));
    a.free(b).unwrap();
    a.empty_cache();
    assert!(a.create_pool(Some((0, 3))).is_ok());
}

/// `no_split`: blocks are handed out whole (H200: a 1000 B request takes
/// 2 MiB, a 3 MiB request 20 MiB).
#[test]
fn a_no_split_pool_hands_out_whole_blocks() {
    let mut a = alloc();
    let p = a.create_pool(Some((0, 1))).unwrap();
    a.set_pool_flags(p, true, false);
    a.malloc_in(p, 1000, 0, 0).unwrap();
    assert_eq!(a.stats().get(Kind::AllocatedBytes, 0).current, (2 * MIB) as i64);
    a.malloc_in(p, 3 * MIB, 0, 0).unwrap();
    assert_eq!(a.stats().get(Kind::AllocatedBytes, 0).current, (22 * MIB) as i64);
    // A second small request needs a second segment.
    a.malloc_in(p, 1000, 0, 0).unwrap();
    assert_eq!(a.stats().get(Kind::Segment, 0).current, 3);
    a.check_invariants().unwrap();
}

/// `use_on_oom`: a default-pool request that cudaMalloc cannot serve takes
/// a cached block of the pool before any release step (H200: no
/// segment_free, num_alloc_retries 0).
#[test]
fn a_use_on_oom_pool_serves_a_request_the_device_cannot() {
    let mut a = alloc();
    a.set_memory_limit(Some(40 * MIB));
    let p = a.create_pool(Some((0, 1))).unwrap();
    a.set_pool_flags(p, false, true);
    let b = a.malloc_in(p, 12 * MIB, 0, 0).unwrap();
    a.free(b).unwrap();
    let keep = a.malloc(20 * MIB, 0).unwrap();
    a.take_events();
    // 12 MiB more would exceed 40 MiB: the pool's cached block serves it.
    let c = a.malloc(12 * MIB, 0).unwrap();
    let ev = a.take_events();
    assert_eq!(ev.iter().map(|e| e.action).collect::<Vec<_>>(), vec![Action::Alloc]);
    assert_eq!(a.stats().num_alloc_retries, 0);
    assert_eq!(a.block(c).unwrap().ptr, a.snapshot().iter().find(|s| s.private).unwrap().address);
    // Without the flag the same request is an OOM after a retry.
    a.free(c).unwrap();
    a.set_pool_flags(p, false, false);
    assert!(a.malloc(12 * MIB, 0).is_err());
    assert_eq!(a.stats().num_alloc_retries, 1);
    a.free(keep).unwrap();
}

/// A block used on another stream and freed during a capture stays pending
/// (no free_completed) until the first malloc after the capture.
#[test]
fn frees_of_stream_used_blocks_wait_for_the_capture_to_end() {
    let mut a = alloc();
    let g = a.begin_allocate_to_pool((1, 0), Route::Stream(7)).unwrap();
    let b = a.malloc(3 * MIB, 7).unwrap();
    a.record_stream(b, 9).unwrap();
    a.take_events();
    a.free(b).unwrap();
    let ev = a.take_events();
    assert_eq!(ev.iter().map(|e| e.action).collect::<Vec<_>>(), vec![Action::FreeRequested]);
    // A same-size malloc later in the capture gets a new address.
    let c = a.malloc(3 * MIB, 7).unwrap();
    assert_ne!(a.block(c).unwrap().ptr, a.block(b).unwrap().ptr);
    a.end_allocate_to_pool(g);
    a.take_events();
    // The first malloc after the capture completes the deferred free
    // (the use recorded during the capture is dropped), before its alloc.
    a.malloc(1000, 0).unwrap();
    let ev = a.take_events();
    let acts: Vec<Action> = ev.iter().map(|e| e.action).collect();
    assert_eq!(acts[0], Action::FreeCompleted);
    assert!(acts.contains(&Action::Alloc));
    a.check_invariants().unwrap();
}
