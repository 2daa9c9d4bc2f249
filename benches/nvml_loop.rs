//! The floor for a monitor's cost: a bare loop making the NVML calls a
//! sample needs (memory info, utilization, processes) every 500 ms, drawing
//! nothing. `measurements/live/monitor_cost.py` runs it beside the monitors.
//! Without NVML it says so and exits 0 (so `cargo bench` passes anywhere).
#![allow(clippy::unwrap_used, reason = "a benchmark fails loudly on a fixture it cannot read")]

fn main() {
    let Ok(nvml) = nvml_wrapper::Nvml::init() else {
        println!("no NVML: nothing measured");
        return;
    };
    let seconds: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    if seconds == 0 {
        println!("usage: nvml_loop SECONDS (a monitor-cost peer)");
        return;
    }
    let dev = nvml.device_by_index(0).expect("GPU 0");
    let end = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    let mut n = 0u64;
    while std::time::Instant::now() < end {
        let m = dev.memory_info().map(|m| m.used).unwrap_or(0);
        let u = dev.utilization_rates().map(|u| u.gpu).unwrap_or(0);
        let p = dev.running_compute_processes().map(|p| p.len()).unwrap_or(0);
        n += (m > 0) as u64 + u as u64 + p as u64;
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    println!("{n}");
}
