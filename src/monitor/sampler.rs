//! Sources of snapshots, and the thread that samples one every interval
//! and sends it to the UI (or `serve`, or `record`) over a channel.

use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::publisher::{self, Published, StepRecord};
use super::{now, GpuQuery, GpuSample, ProcessSample, Snapshot};
use crate::device::{Device, Sim};
use crate::workload::driver::Driver;

/// Produces one snapshot when asked.
pub trait Source: Send {
    fn snapshot(&mut self) -> Snapshot;
    /// "NVML" or "simulated device".
    fn describe(&self) -> String;
}

/// NVML plus the publisher directory.
pub struct LiveSource {
    query: Box<dyn GpuQuery>,
    /// GPU indices to watch (empty: all).
    devices: Vec<u32>,
    dir: Option<PathBuf>,
    scanner: publisher::Scanner,
    previous: Vec<u32>,
    /// Each publisher instance's pid as we see it, and whether it was
    /// running at the last look (`resolve`).
    resolved: std::collections::HashMap<String, (u32, bool)>,
}

impl LiveSource {
    pub fn new(query: Box<dyn GpuQuery>, devices: Vec<u32>, dir: Option<PathBuf>) -> Self {
        LiveSource {
            query,
            devices,
            dir,
            scanner: publisher::Scanner::new(publisher::current_uid(), publisher::DEFAULT_CAP),
            previous: Vec::new(),
            resolved: std::collections::HashMap::new(),
        }
    }

    /// The pid we see `p`'s writer as, and whether it still runs. A file
    /// carrying its start time is its writer's only while a process of
    /// that start time knows itself by that pid: pid 1 of every container
    /// is a different process, and the host's pid 1 is none of them. Found
    /// once per instance (a pass over /proc for one in another namespace),
    /// then checked with one read a sample; a file without it (an older
    /// publisher) is its pid's while that pid runs.
    fn resolve(&mut self, p: &Published) -> (u32, bool) {
        let (Some(inst), Some(w)) = (&p.instance, writer_of(p)) else { return resolve(p) };
        if let Some(&(pid, running)) = self.resolved.get(inst) {
            let still = running && w.started(pid);
            self.resolved.insert(inst.clone(), (pid, still));
            return (pid, still);
        }
        let r = resolve(p);
        self.resolved.insert(inst.clone(), r);
        r
    }
}

/// What `p`'s file says of its writer, when it says when it started.
fn writer_of(p: &Published) -> Option<super::procfs::Writer> {
    let ticks = p.start_ticks.filter(|_| p.instance.is_some())?;
    Some(super::procfs::Writer { inner: p.own_pid, ticks, pid_ns: p.pid_ns })
}

/// `LiveSource::resolve` without its memory: one look (a pass over /proc
/// for a writer in another pid namespace).
pub(crate) fn resolve(p: &Published) -> (u32, bool) {
    let Some(w) = writer_of(p) else {
        return (p.pid, alive(p.pid) || p.nspid.iter().any(|&q| alive(q)));
    };
    let here = std::iter::once(p.own_pid).chain(p.nspid.iter().copied()).find(|&q| w.is(q));
    let found = here.or_else(|| w.find());
    (found.unwrap_or(p.own_pid), found.is_some())
}

/// A file unchanged for longer than this (and ten of its intervals) is
/// retired: its writer no longer publishes (docs/user/cluster.md).
const STALE_S: f64 = 30.0;

/// A final file older than this is from a run nobody watched: removed
/// unread.
const FINAL_FILE_FRESH_S: f64 = 30.0;

/// A process that exists and has not exited: a zombie (exited, not yet
/// reaped by its parent, as a crashed rank under a launcher that waits for
/// its ranks in order) publishes nothing more and is gone.
fn alive(pid: u32) -> bool {
    match std::fs::read(format!("/proc/{pid}/stat")) {
        // The state follows the command name's closing parenthesis (the
        // name itself may hold one).
        Ok(stat) => match stat.iter().rposition(|&b| b == b')') {
            Some(i) => !matches!(stat.get(i + 2), Some(b'Z' | b'X')),
            None => true,
        },
        Err(_) => false,
    }
}

impl Source for LiveSource {
    fn describe(&self) -> String {
        "NVML".into()
    }

    fn snapshot(&mut self) -> Snapshot {
        let mut snap = Snapshot { time: now(), ..Default::default() };
        let n = match self.query.device_count() {
            Ok(n) => n,
            Err(e) => {
                snap.skipped.push(e.to_string());
                0
            }
        };
        let indices: Vec<u32> = if self.devices.is_empty() { (0..n).collect() } else { self.devices.clone() };
        snap.gpus = indices.into_iter().map(|i| self.query.sample(i)).collect();
        if let Some(dir) = &self.dir {
            let scan = self.scanner.scan(dir);
            snap.skipped.extend(scan.skipped);
            // A file whose process is gone is history, not a live process;
            // its final file (written at exit) is read once, then removed,
            // so the last steps and an OOM that ended the run are seen.
            let seen: std::collections::HashSet<String> =
                scan.published.iter().filter_map(|p| p.instance.clone()).collect();
            self.resolved.retain(|k, _| seen.contains(k));
            for mut p in scan.published {
                let (pid, running) = self.resolve(&p);
                p.pid = pid;
                // A file that has not changed for ten of its intervals (and
                // 30 s) is retired whatever its pid: its writer stopped.
                let stale = snap.time - p.time > (10.0 * p.interval).max(STALE_S);
                if running && !stale {
                    snap.publishers.push(p);
                } else if p.last_words {
                    let _ = std::fs::remove_file(&p.path);
                    if snap.time - p.time < FINAL_FILE_FRESH_S {
                        snap.gone.push(p.pid);
                        snap.publishers.push(p);
                    }
                } else {
                    snap.gone.push(p.pid);
                }
            }
        }
        publisher::assign_gpus(&mut snap.publishers, &snap.gpus, self.devices.is_empty());
        let now_pids: Vec<u32> = snap.publishers.iter().map(|p| p.pid).collect();
        for &p in &self.previous {
            if !now_pids.contains(&p) && !snap.gone.contains(&p) {
                snap.gone.push(p);
            }
        }
        self.previous = now_pids;
        snap
    }
}

/// The simulated device running the demo's training loop, reported as one
/// GPU with one publishing process (ourselves).
pub struct DemoSource {
    driver: Driver<Sim>,
    last: Instant,
    /// Requests per second of wall time (a GPT-2 step of the demo, about
    /// 1,900 requests, every 1.2 s or so).
    rate: f64,
    /// The steps as a publisher logs them, with the times they ended.
    steps: std::collections::VecDeque<StepRecord>,
}

impl DemoSource {
    pub fn new(seed: u64) -> Self {
        let mut driver = crate::workload::driver::demo(seed).bounded(4096);
        driver.alloc.set_recording(false);
        DemoSource { driver, last: Instant::now(), rate: 1600.0, steps: Default::default() }
    }

    /// Runs `n` requests now (tests step it deterministically); the steps
    /// that ended are logged as ending between `t0` and `t1`.
    fn advance_between(&mut self, n: usize, t0: f64, t1: f64) {
        let before = self.driver.step_log.back().map_or(0, |s| s.n);
        self.driver.advance(n);
        let new: Vec<_> = self.driver.step_log.iter().filter(|s| s.n > before).copied().collect();
        let k = new.len();
        for (i, s) in new.into_iter().enumerate() {
            if self.steps.len() == 512 {
                self.steps.pop_front();
            }
            let t = t0 + (t1 - t0) * (i + 1) as f64 / k as f64;
            self.steps.push_back(StepRecord(
                s.n,
                t,
                0,
                s.allocated_end,
                Some(s.reserved_end),
                Some(s.peak_allocated),
                Some(s.peak_reserved),
            ));
        }
    }

    /// Runs `n` requests now (tests step it deterministically).
    pub fn advance(&mut self, n: usize) {
        let t = now();
        let t0 = self.steps.back().map_or(t - 1.0, |s| s.time());
        self.advance_between(n, t0, t);
    }

    pub fn snapshot_now(&self) -> Snapshot {
        let a = &self.driver.alloc;
        let dev = a.device();
        let pid = std::process::id();
        let used = dev.process_used().unwrap_or(0);
        let total = dev.total_memory();
        let gpu = GpuSample {
            index: 0,
            name: Some(dev.describe()),
            uuid: None,
            total_bytes: Some(total),
            used_bytes: Some(used),
            free_bytes: Some(total - used.min(total)),
            utilization_percent: None,
            memory_utilization_percent: None,
            processes: vec![ProcessSample {
                pid,
                local_pid: Some(pid),
                command: Some("gpumem-top demo".into()),
                used_bytes: Some(used),
            }],
            mig: Vec::new(),
            errors: Vec::new(),
        };
        let published = Published {
            pid,
            own_pid: pid,
            instance: None,
            start_ticks: None,
            pid_ns: None,
            nspid: vec![pid],
            device: 0,
            cuda_device: 0,
            uuid: None,
            time: now(),
            interval: 0.5,
            command: Some("gpumem-top demo (synthetic GPT-2)".into()),
            stats: a.stats().flat().into_iter().collect(),
            segments: a.snapshot().into(),
            steps: self.driver.step_ends.iter().copied().collect(),
            // The simulated process resets nothing of anyone's: its step
            // peaks come from its own timeline.
            step_peaks: true,
            step_log: self.steps.iter().copied().collect(),
            window_peak: None,
            layout_time: None,
            last_words: false,
            history: None,
            true_peaks: None,
            // What a real publisher counts at a step's end: the synthetic
            // model knows it exactly.
            categories: self.driver.step_categories.map(|(step, b)| {
                use crate::analysis::categories::Category;
                crate::monitor::publisher::StepCategories {
                    step,
                    allocated: b.total(),
                    parameter: b.get(Category::Parameter),
                    gradient: b.get(Category::Gradient),
                    optimizer_state: b.get(Category::OptimizerState),
                }
            }),
            job: None,
            path: PathBuf::new(),
        };
        Snapshot {
            time: published.time,
            gpus: vec![gpu],
            publishers: vec![published],
            skipped: Vec::new(),
            gone: Vec::new(),
        }
    }
}

impl Source for DemoSource {
    fn describe(&self) -> String {
        "simulated device".into()
    }
    fn snapshot(&mut self) -> Snapshot {
        let dt = self.last.elapsed().as_secs_f64();
        self.last = Instant::now();
        let n = (dt * self.rate).clamp(1.0, 100_000.0) as usize;
        let t = now();
        self.advance_between(n, t - dt, t);
        self.snapshot_now()
    }
}

/// A sampling thread; dropping it stops the thread.
pub(crate) struct Sampler {
    stop: Option<Sender<Wake>>,
    handle: Option<JoinHandle<()>>,
}

impl Sampler {
    /// Takes a snapshot at once, then every `interval`, onto the channel
    /// returned. It is bounded: a consumer that falls behind loses samples,
    /// never memory.
    pub(crate) fn spawn(source: Box<dyn Source>, interval: Duration) -> (Sampler, Receiver<Snapshot>) {
        let (tx, rx) = mpsc::sync_channel(8);
        let s = Sampler::spawn_into(source, interval, move |snap| {
            !matches!(tx.try_send(snap), Err(mpsc::TrySendError::Disconnected(_)))
        });
        (s, rx)
    }

    /// As `spawn`, handing each snapshot to `sink` (the TUI's event
    /// channel) until it returns false.
    pub(crate) fn spawn_into(
        mut source: Box<dyn Source>,
        interval: Duration,
        mut sink: impl FnMut(Snapshot) -> bool + Send + 'static,
    ) -> Sampler {
        let (stop_tx, stop_rx) = mpsc::channel::<Wake>();
        let handle = std::thread::Builder::new()
            .name("gpumem-sampler".into())
            .spawn(move || {
                let mut n = 0u64;
                loop {
                    let started = Instant::now();
                    if !sink(source.snapshot()) {
                        return;
                    }
                    // Start-up (NVML's init, the first scan, the first frames)
                    // and parsing leave freed heap pages behind; a monitor
                    // that runs for days gives them back: after samples 1, 2,
                    // 4, ... 64, then every 64th (32 s at the default interval).
                    n += 1;
                    if n.is_power_of_two() && n <= 64 || n % 64 == 0 {
                        trim_heap();
                    }
                    let wait = interval.saturating_sub(started.elapsed());
                    match stop_rx.recv_timeout(wait) {
                        Err(RecvTimeoutError::Timeout) | Ok(Wake::Now) => {}
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            })
            .ok();
        Sampler { stop: Some(stop_tx), handle }
    }

    /// Takes the next sample at once (the command being recorded exited:
    /// the file it wrote at exit is read now, not an interval later).
    pub(crate) fn sample_now(&self) {
        if let Some(s) = &self.stop {
            let _ = s.send(Wake::Now);
        }
    }
}

/// A message to the sampler's thread (dropping its sender stops it).
enum Wake {
    /// Take the next sample now instead of at the end of the interval.
    Now,
}

impl Drop for Sampler {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Returns freed heap memory to the system (glibc's malloc_trim).
pub(crate) fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: glibc's malloc_trim takes no pointers and is thread-safe.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

#[cfg(test)]
mod tests {
    /// A child that exited but was not waited for is a zombie: gone, though
    /// /proc still lists it; running, it is alive; reaped, it is gone.
    #[test]
    fn a_zombie_is_not_alive() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let pid = child.id();
        assert!(super::alive(pid));
        let _ = child.kill();
        // Not waited for yet: a zombie once the signal lands.
        let t = std::time::Instant::now();
        while super::alive(pid) && t.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists(), "still listed until reaped");
        assert!(!super::alive(pid));
        let _ = child.wait();
        assert!(!super::alive(pid));
    }
}
