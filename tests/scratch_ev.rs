use gpumem_top::alloc::{AllocatorConfig, CachingAllocator};
use gpumem_top::device::Sim;
use gpumem_top::workload::driver::{Driver, OnOom};
use gpumem_top::workload::{Checkpoint, ModelKind, Optimizer, SynthSpec, Synthetic};
#[test]
fn scratch_ev() {
    let Ok(cfg) = std::env::var("SCRATCH") else { return };
    let v: Vec<&str> = cfg.split(',').collect();
    let model = match v[0] {
        "gpt2" => ModelKind::Gpt2,
        "bert" => ModelKind::Bert,
        "mlp" => ModelKind::Mlp,
        "resnet50" => ModelKind::Resnet50,
        _ => ModelKind::Llama,
    };
    let mut s = SynthSpec::new(model);
    s.batch = v[1].parse().unwrap();
    s.seq = v[2].parse().unwrap();
    s.amp = v[3] == "1";
    s.accum = v[4].parse().unwrap();
    s.checkpoint = if v[5] == "1" { Checkpoint::Layer } else { Checkpoint::None };
    s.optimizer = Optimizer::Adam;
    s.iterations = Some(3);
    let alloc = CachingAllocator::new(AllocatorConfig::default(), Sim::h200());
    let mut d = Driver::new(alloc, Synthetic::new(s), OnOom::Stop);
    d.run();
    let mut out = String::new();
    for e in d.alloc.events() {
        use gpumem_top::alloc::Action as A;
        let a = match e.action {
            A::Alloc => "alloc",
            A::FreeCompleted => "free_completed",
            A::SegmentAlloc => "segment_alloc",
            A::SegmentFree => "segment_free",
            _ => continue,
        };
        out += &format!("{a} {} {}\n", e.addr, e.size);
    }
    std::fs::write("/tmp/ours_events.txt", out).unwrap();
}
