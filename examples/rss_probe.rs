fn rss(tag: &str) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    for l in s.lines() {
        if l.starts_with("VmRSS") || l.starts_with("VmHWM") {
            eprint!("{tag} {l}  ");
        }
    }
    eprintln!();
}
fn main() {
    rss("start");
    let t = gpumem_top::trace::load(std::path::Path::new("../shared/traces/resnet50_long.pickle.gz")).unwrap();
    rss("loaded");
    let d = t.main_device().unwrap();
    eprintln!("events {} cap {} stacks {}", d.events.len(), d.events.capacity(), t.stacks.len());
    let opts = gpumem_top::replay::ReplayOptions::new(t.settings.as_ref().unwrap().config(), 150109880320);
    let r = gpumem_top::replay::replay_events(&d.events, &opts, ());
    rss("replayed");
    eprintln!("{:?}", r.divergence.is_none());
}
