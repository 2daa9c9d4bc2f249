//! What the code and README cite exists in this repository: no path outside
//! it, every `docs/FILE.md §SECTION` a comment names is a heading there, and
//! every `docs/…` file the README names is present.

use crate::common;

use std::path::Path;

fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs" || x == "py" || x == "sh") {
            out.push((p.display().to_string(), std::fs::read_to_string(&p).unwrap()));
        }
    }
}

/// Every Markdown file under `dir`, with its text.
fn markdown(dir: &Path, out: &mut Vec<(String, String)>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            markdown(&p, out);
        } else if p.extension().is_some_and(|x| x == "md") {
            out.push((p.display().to_string(), std::fs::read_to_string(&p).unwrap()));
        }
    }
}

/// The headings of a Markdown file, without their `#`s.
fn headings(md: &str) -> Vec<String> {
    md.lines().filter_map(|l| l.strip_prefix('#')).map(|h| h.trim_start_matches('#').trim().to_string()).collect()
}

/// Does `cite` (the text after `§`, up to the end of the line) name one of
/// `heads`? A numbered section by its number ("6.1" for "6.1 Best fit"), a
/// named one by its whole heading.
fn names_a_heading(cite: &str, heads: &[String]) -> bool {
    heads.iter().any(|h| {
        let first = h.split_whitespace().next().unwrap_or("").trim_end_matches('.');
        if first.chars().next().is_some_and(|c| c.is_ascii_digit()) {
            let n = cite.split(|c: char| !(c.is_ascii_digit() || c == '.')).next().unwrap_or("").trim_end_matches('.');
            n == first
        } else {
            cite.starts_with(h.as_str())
        }
    })
}

/// Every `docs/FILE.md §…` in `text`: (file, the cited text).
fn citations(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        for (i, _) in line.match_indices("docs/") {
            let rest = &line[i..];
            let Some((file, after)) = rest.split_once(".md") else { continue };
            let Some(cite) = after.strip_prefix(" §") else { continue };
            // "§5–§11": each end of a range.
            for part in cite.split("–§") {
                out.push((format!("{file}.md"), part.to_string()));
            }
        }
    }
    out
}

#[test]
fn every_section_the_code_cites_exists_in_docs() {
    let root = common::root();
    let mut files = Vec::new();
    for d in ["src", "tests", "benches", "assets"] {
        sources(&root.join(d), &mut files);
    }
    let mut cited = 0;
    let mut missing = Vec::new();
    // This file's own examples are not citations.
    files.retain(|(p, _)| !p.ends_with("tests/it/docs.rs"));
    for (path, text) in &files {
        for (doc, cite) in citations(text) {
            cited += 1;
            let md = std::fs::read_to_string(root.join(&doc)).unwrap_or_default();
            if !names_a_heading(&cite, &headings(&md)) {
                missing.push(format!("{path}: {doc} §{cite}"));
            }
        }
        // A bare "§N" must say which document it means.
        for (i, _) in text.match_indices('§') {
            let before = &text[..i];
            let line_start = before.rfind('\n').map_or(0, |n| n + 1);
            if !before[line_start..].contains("docs/") && !text[line_start..i].contains("–") {
                missing.push(format!("{path}: a § without its document: {}", &text[line_start..i + 2]));
            }
        }
    }
    assert!(cited >= 20, "{cited} citations");
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn nothing_points_outside_the_repository() {
    let root = common::root();
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    files.push(("README.md".into(), std::fs::read_to_string(root.join("README.md")).unwrap()));
    markdown(&root.join("docs"), &mut files);
    for tool in [".ci/run", "tools/gpu-bundle.sh"] {
        files.push((tool.into(), std::fs::read_to_string(root.join(tool)).unwrap()));
    }
    for (path, text) in files {
        assert!(!text.contains("../shared"), "{path} points at ../shared");
    }
    // Every docs/ file, fixture, script and asset the README and the manual
    // name is in the repository (their examples and claims rest on them;
    // #37 item 22).
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap()
        + &std::fs::read_to_string(root.join("docs/user/guide.md")).unwrap();
    let mut named = 0;
    for prefix in ["docs/", "tests/fixtures/", "benches/", "measurements/", "assets/"] {
        for (i, _) in readme.match_indices(prefix) {
            // Part of a longer path ("x/docs/") is not a path of ours.
            if readme[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '/' || c == '_') {
                continue;
            }
            let name: String =
                readme[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || "/._-".contains(*c)).collect();
            let name = name.trim_end_matches('.');
            // A glob or a placeholder in a command line is not a file.
            if name.ends_with('/') || name.contains("rank*") {
                continue;
            }
            named += 1;
            assert!(root.join(name).exists(), "README names {name}, which is not in the repository");
        }
    }
    assert!(named > 20, "only {named} paths found in the README");
}

#[test]
fn the_citation_reader_matches_numbers_and_names() {
    let heads = headings("# T\n## 6. malloc\n### 6.1 Best fit\n## Private pools\n");
    assert!(names_a_heading("6.1): best fit", &heads));
    assert!(names_a_heading("6", &heads));
    assert!(!names_a_heading("6.2", &heads));
    assert!(names_a_heading("Private pools).", &heads));
    assert!(!names_a_heading("Pools", &heads));
    assert_eq!(
        citations("x (docs/a.md §5–§11) and docs/b.md §Private pools."),
        [
            ("docs/a.md".to_string(), "5".to_string()),
            ("docs/a.md".into(), "11) and docs/b.md §Private pools.".into()),
            ("docs/b.md".into(), "Private pools.".into())
        ]
    );
}
