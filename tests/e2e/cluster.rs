//! The cluster assets (`assets/grafana/gpumem-top.json`,
//! `assets/prometheus/gpumem-top.rules.yml`) against what `serve` exposes,
//! and against a real Prometheus scraping two `serve --source demo` nodes.
//!
//! The Prometheus tests need Debian's `prometheus` package (`prometheus`
//! and `promtool` on PATH); `.ci/run` installs it and sets
//! `GPUMEM_TOP_REQUIRE_PROMETHEUS=1`, which turns a missing binary into a
//! failure instead of a skip.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{http_get, root, start_serve};
use serde_json::Value;

/// Labels Prometheus adds to every scraped series.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

fn dashboard() -> Value {
    let p = root().join("assets/grafana/gpumem-top.json");
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn rules_path() -> PathBuf {
    root().join("assets/prometheus/gpumem-top.rules.yml")
}

/// Every rule of the rules file: (record or alert name, expr, label and
/// annotation texts).
fn rules() -> Vec<(String, String, Vec<String>)> {
    let y: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(rules_path()).unwrap()).unwrap();
    let mut out = Vec::new();
    for g in y["groups"].as_sequence().expect("groups") {
        for r in g["rules"].as_sequence().expect("rules") {
            let name = r["record"].as_str().or_else(|| r["alert"].as_str()).expect("record or alert").to_string();
            let expr = r["expr"].as_str().expect("expr").to_string();
            let texts = ["labels", "annotations"]
                .iter()
                .filter_map(|k| r[*k].as_mapping())
                .flat_map(|m| m.values().filter_map(|v| v.as_str().map(str::to_string)))
                .collect();
            out.push((name, expr, texts));
        }
    }
    out
}

fn recorded_names() -> BTreeMap<String, String> {
    rules().into_iter().filter(|(n, _, _)| n.contains(':')).map(|(n, e, _)| (n, e)).collect()
}

/// Every panel, rows' nested panels included.
fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        out.push(p);
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner);
        }
    }
    out
}

/// (panel title, expr, legend) of every query in the dashboard.
fn panel_queries(d: &Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for p in panels(d) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_else(|| panic!("a target of {} has no expr", p["title"]));
            out.push((
                p["title"].as_str().unwrap_or("").into(),
                expr.into(),
                t["legendFormat"].as_str().unwrap_or("").into(),
            ));
        }
    }
    out
}

/// The template variables' queries: `label_values(SELECTOR, LABEL)`.
fn variable_queries(d: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for v in d["templating"]["list"].as_array().expect("templating") {
        if v["type"] != "query" {
            continue;
        }
        let q = v["definition"].as_str().expect("definition");
        let inner = q.strip_prefix("label_values(").and_then(|r| r.strip_suffix(')')).expect(q);
        let (sel, label) = inner.rsplit_once(',').expect(q);
        out.push((sel.trim().to_string(), label.trim().to_string()));
    }
    out
}

/// Grafana's variables as a query sent straight to Prometheus sees them.
fn expand(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m").replace("$instance", ".*").replace("$gpu", ".*")
}

/// Metric family -> label names seen on its samples, from an exposition.
fn exposed(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            out.entry(rest.split(' ').next().unwrap().to_string()).or_default();
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = out.entry(line[..end].to_string()).or_default();
        if line[end..].starts_with('{') {
            // name="value", values quoted with \-escapes.
            let mut chars = line[end + 1..].chars();
            let mut key = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '}' => break,
                    '=' => {
                        labels.insert(std::mem::take(&mut key));
                        assert_eq!(chars.next(), Some('"'), "{line}");
                        while let Some(c) = chars.next() {
                            match c {
                                '\\' => {
                                    chars.next();
                                }
                                '"' => break,
                                _ => {}
                            }
                        }
                    }
                    ',' | ' ' => {}
                    c => key.push(c),
                }
            }
        }
    }
    out
}

/// Metric names and label names a PromQL expression refers to.
fn promql_refs(expr: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut metrics, mut labels) = (BTreeSet::new(), BTreeSet::new());
    let b = expr.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let (mut i, mut in_braces, mut label_list) = (0, false, false);
    while i < b.len() {
        let c = b[i];
        if c == b'"' || c == b'\'' {
            i += 1;
            while i < b.len() && b[i] != c {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == b'$' || c.is_ascii_digit() {
            // A Grafana variable, a number or a duration.
            i += 1;
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
        } else if ident(c) {
            let s = i;
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
            let word = &expr[s..i];
            let next = expr[i..].trim_start();
            if in_braces || label_list {
                labels.insert(word.to_string());
            } else if matches!(word, "by" | "without" | "on" | "ignoring" | "group_left" | "group_right")
                && next.starts_with('(')
            {
                label_list = true;
            } else if word.contains("gpumem") {
                metrics.insert(word.to_string());
            }
        } else {
            match c {
                b'{' => in_braces = true,
                b'}' => in_braces = false,
                b')' => label_list = false,
                _ => {}
            }
            i += 1;
        }
    }
    (metrics, labels)
}

/// `{{label}}` in a legend, `$labels.label` in an annotation.
fn template_labels(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for part in text.split("{{").skip(1) {
        let name = part.split("}}").next().unwrap_or("").trim();
        if name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !name.is_empty() {
            out.insert(name.to_string());
        }
    }
    for part in text.split("$labels.").skip(1) {
        out.insert(part.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect());
    }
    out
}

/// What the dashboard and rules use that `exposition` lacks, one line each.
fn missing(exposition: &str) -> Vec<String> {
    let families = exposed(exposition);
    let recorded = recorded_names();
    let all_labels: BTreeSet<String> =
        families.values().flatten().cloned().chain(TARGET_LABELS.iter().map(|s| s.to_string())).collect();
    // The raw metrics behind a name, through recording rules.
    let raw = |m: &str| -> BTreeSet<String> {
        match recorded.get(m) {
            Some(e) => promql_refs(e).0,
            None => BTreeSet::from([m.to_string()]),
        }
    };
    let mut problems = Vec::new();
    let mut check = |place: &str, expr: &str, texts: &[String]| {
        let (metrics, labels) = promql_refs(expr);
        let mut allowed: BTreeSet<String> = TARGET_LABELS.iter().map(|s| s.to_string()).collect();
        for m in &metrics {
            if m.contains(':') && !recorded.contains_key(m) {
                problems.push(format!("{place}: recorded series {m} is not recorded by the rules"));
            }
            for r in raw(m) {
                match families.get(&r) {
                    Some(l) => allowed.extend(l.iter().cloned()),
                    None => problems.push(format!("{place}: metric {r} is not in serve's output")),
                }
            }
        }
        for l in labels {
            if !allowed.contains(&l) {
                problems.push(format!("{place}: label {l} is not on {metrics:?} in serve's output"));
            }
        }
        for t in texts {
            for l in template_labels(t) {
                if !all_labels.contains(&l) {
                    problems.push(format!("{place}: template label {l} is not in serve's output"));
                }
            }
        }
    };
    let d = dashboard();
    for (title, expr, legend) in panel_queries(&d) {
        check(&format!("panel {title:?}"), &expr, &[legend]);
    }
    for (sel, label) in variable_queries(&d) {
        check(&format!("variable label_values({sel}, {label})"), &format!("{sel} by ({label})"), &[]);
    }
    for (name, expr, texts) in rules() {
        check(&format!("rule {name}"), &expr, &texts);
    }
    problems
}

fn demo_exposition() -> String {
    let (mut child, addr) = start_serve("100");
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        let (head, body) = http_get(&addr, "/metrics");
        if head.starts_with("HTTP/1.1 200") && body.contains("gpumem_torch_step_end_allocated_bytes{") {
            break body;
        }
        assert!(Instant::now() < deadline, "no step ends from the demo in 20 s:\n{head}\n{body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = child.kill();
    let _ = child.wait();
    body
}

#[test]
fn dashboard_and_rules_use_only_what_serve_exposes() {
    let d = dashboard();
    let queries = panel_queries(&d);
    assert!(queries.len() >= 15, "{} queries", queries.len());
    // What the issue asks the dashboard to show, each by its metric.
    let all: String = queries.iter().map(|q| q.1.as_str()).collect::<Vec<_>>().join("\n");
    for m in [
        "gpumem_gpu_memory_used_bytes",
        "gpumem_gpu_memory_total_bytes",
        "gpumem_torch_allocated_bytes",
        "gpumem_torch_reserved_bytes",
        "gpumem_torch_allocated_peak_bytes",
        "gpumem_torch_reserved_peak_bytes",
        "gpumem_torch_peak_ratio",
        "gpumem_torch_external_fragmentation_ratio",
        "gpumem_torch_num_alloc_retries_total",
        "gpumem_torch_num_ooms_total",
        "gpumem_alerts_active",
        "topk(10, gpumem_torch_reserved_unallocated_bytes)",
        "gpumem_process_outside_allocator_bytes",
        "max by (instance, torch_job, rank) (gpumem_torch_allocated_peak_bytes",
    ] {
        assert!(all.contains(m), "no panel shows {m}");
    }
    let vars: Vec<String> = variable_queries(&d).into_iter().map(|v| v.1).collect();
    assert_eq!(vars, ["instance", "gpu"]);
    let alerts: BTreeSet<String> = rules().into_iter().map(|r| r.0).filter(|n| !n.contains(':')).collect();
    for a in [
        "GpuMemoryNearlyFull",
        "GpuMemoryLeakAcrossSteps",
        "GpuMemoryFragmentedAtPeak",
        "GpuOutOfMemory",
        "GpuJobRanksImbalanced",
    ] {
        assert!(alerts.contains(a), "no alert {a}: {alerts:?}");
    }

    let text = demo_exposition();
    let problems = missing(&text);
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // The check sees a rename, of a metric and of a label.
    let renamed = text
        .replace("gpumem_torch_reserved_bytes{", "gpumem_torch_reserved_now_bytes{")
        .replace("gpumem_torch_reserved_bytes ", "gpumem_torch_reserved_now_bytes ");
    let p = missing(&renamed);
    assert!(p.iter().any(|l| l.contains("metric gpumem_torch_reserved_bytes is not in serve's output")), "{p:?}");
    let relabelled = text.replace(",pid=", ",process=");
    let p = missing(&relabelled);
    assert!(p.iter().any(|l| l.contains("label pid")), "{p:?}");
    assert!(p.iter().any(|l| l.starts_with("rule GpuMemoryFragmentedAtPeak")), "{p:?}");
}

#[test]
fn promql_references_are_read_as_prometheus_reads_them() {
    let (m, l) = promql_refs(
        r#"sum by (instance, kind) (rate(gpumem_x_total{instance=~"$instance",gpu!="a,b}"}[$__rate_interval] offset 5m)) > 0.9 and on (pid) gpumem:y:ratio"#,
    );
    assert_eq!(m, BTreeSet::from(["gpumem_x_total".to_string(), "gpumem:y:ratio".to_string()]));
    assert_eq!(l, ["gpu", "instance", "kind", "pid"].iter().map(|s| s.to_string()).collect());
    let e = exposed("# TYPE a gauge\na{x=\"1,\\\"}\",y=\"\"} 1\nb 2\nc{} 3\n");
    assert_eq!(e["a"], BTreeSet::from(["x".to_string(), "y".to_string()]));
    assert!(e["b"].is_empty() && e["c"].is_empty());
    assert_eq!(
        template_labels("{{instance}} GPU {{ gpu }} on {{ $labels.pid }}"),
        BTreeSet::from(["gpu".to_string(), "instance".to_string(), "pid".to_string()])
    );
}

/// `name` on PATH, or None (then the caller skips unless CI requires it).
fn tool(name: &str) -> Option<PathBuf> {
    let found =
        std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|p| p.is_file()));
    if found.is_none() {
        assert!(
            std::env::var_os("GPUMEM_TOP_REQUIRE_PROMETHEUS").is_none(),
            "{name} is not on PATH (Debian: apt-get install prometheus)"
        );
        eprintln!("skipped: {name} is not on PATH (Debian: apt-get install prometheus)");
    }
    found
}

fn tmpdir(tag: &str) -> common::TmpDir {
    common::TmpDir::new(&format!("cluster-{tag}"))
}

#[test]
fn promtool_checks_the_rules_and_their_unit_tests_pass() {
    let Some(promtool) = tool("promtool") else { return };
    let dir = root().join("assets/prometheus");
    let check = Command::new(&promtool).args(["check", "rules"]).arg(rules_path()).output().unwrap();
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{out}{}", String::from_utf8_lossy(&check.stderr));
    assert!(out.contains(&format!("SUCCESS: {} rules found", rules().len())), "{out}");
    let test = Command::new(&promtool)
        .current_dir(&dir)
        .args(["test", "rules", "gpumem-top.rules.test.yml"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&test.stdout);
    assert!(test.status.success(), "{out}{}", String::from_utf8_lossy(&test.stderr));

    // Every alert has a unit test where it fires and one where it does not.
    let tests: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(dir.join("gpumem-top.rules.test.yml")).unwrap()).unwrap();
    let (mut fired, mut silent) = (BTreeSet::new(), BTreeSet::new());
    for t in tests["tests"].as_sequence().unwrap() {
        for a in t["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = a["alertname"].as_str().unwrap().to_string();
            match a["exp_alerts"].as_sequence().map(|s| s.len()) {
                Some(0) | None => silent.insert(name),
                Some(_) => fired.insert(name),
            };
        }
    }
    for (name, _, _) in rules().into_iter().filter(|r| !r.0.contains(':')) {
        assert!(fired.contains(&name) && silent.contains(&name), "{name}: fired {fired:?}, silent {silent:?}");
    }
}

struct Killed(Vec<Child>);

impl Drop for Killed {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `GET /api/v1/query?query=Q` on Prometheus at `addr`: the result vector.
fn query(addr: &str, q: &str) -> Vec<Value> {
    let enc: String = q
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let (head, body) = http_get(addr, &format!("/api/v1/query?query={enc}"));
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{q}: {e}\n{head}\n{body}"));
    assert_eq!(v["status"], "success", "{q}: {body}");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

fn instances(result: &[Value]) -> BTreeSet<String> {
    result.iter().filter_map(|s| s["metric"]["instance"].as_str().map(str::to_string)).collect()
}

#[test]
fn a_real_prometheus_scrapes_two_nodes_and_every_panel_answers_for_both() {
    let Some(prometheus) = tool("prometheus") else { return };
    let dir = tmpdir("prom");
    let (a, addr_a) = start_serve("500");
    let (b, addr_b) = start_serve("500");
    let mut procs = Killed(vec![a, b]);
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: gpumem-top\n    static_configs:\n      - targets: ['{addr_a}', '{addr_b}']\n",
        rules_path().display()
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let web = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    procs.0.push(
        Command::new(prometheus)
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let log = || std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
    let both = BTreeSet::from([addr_a.clone(), addr_b.clone()]);

    // Two scrapes of each node, and the rules evaluated over them.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = std::net::TcpStream::connect(&web).is_ok()
            && query(&web, "count_over_time(up[1m]) >= 3 and up == 1").len() == 2
            && instances(&query(&web, "gpumem:gpu_memory_used:ratio")) == both;
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "Prometheus did not scrape both nodes in 60 s:\n{}", log());
        std::thread::sleep(Duration::from_millis(250));
    }

    let d = dashboard();
    let mut asked = 0;
    for (title, expr, _) in panel_queries(&d) {
        let q = expand(&expr);
        let got = instances(&query(&web, &q));
        assert_eq!(got, both, "panel {title:?}: {q} answered for {got:?}\n{}", log());
        asked += 1;
    }
    for (sel, label) in variable_queries(&d) {
        let q = expand(&sel);
        let r = query(&web, &q);
        assert_eq!(instances(&r), both, "variable {label}: {q}");
        assert!(r.iter().all(|s| s["metric"][&label].is_string()), "variable {label}: {q} has no {label} label");
    }
    // Every recording rule answers for both nodes too (the alerts' inputs).
    for (name, _, _) in rules().into_iter().filter(|r| r.0.contains(':')) {
        assert_eq!(instances(&query(&web, &name)), both, "recording rule {name}\n{}", log());
    }
    // The demo is healthy by the rules' judgements: nothing fires.
    let firing = query(&web, r#"ALERTS{alertstate="firing"}"#);
    assert!(firing.is_empty(), "{firing:?}");
    assert!(asked >= 15);
    drop(procs);
    let _ = std::fs::remove_dir_all(Path::new(&dir));
}
