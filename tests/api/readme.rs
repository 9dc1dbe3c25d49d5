//! The documentation, checked against the code: the `curl` examples of `README.md` and
//! `docs/api.md`, played in order against a fresh server as a new user would paste them; the
//! code blocks, which must be copies of compiled or applied sources; the `cargo` commands,
//! which may name only what the workspace has; the links; and the lists of settings and
//! metrics in `docs/operations.md`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::helpers::{StoreKind, TestApp, curl};

/// The lease server's port in the documentation's commands.
const LEASE_PORT: u16 = 8080;

/// The longest `README.md` may be: a front page, with the depth in `docs/`.
const README_MAX_LINES: usize = 250;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The pages this test keeps honest: `README.md`, `CONTRIBUTING.md` and every page under
/// `docs/`.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md"), root().join("CONTRIBUTING.md")];
    pages.extend(files_under(&root().join("docs"), "md"));
    pages
}

/// Every file under `dir` (recursively) whose name ends with `.{ext}`, sorted.
fn files_under(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == ext) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

fn name(page: &Path) -> String {
    page.strip_prefix(root()).unwrap().display().to_string()
}

/// The fenced code blocks of `markdown` whose info string's first word is `lang` (`rust`
/// also matches `rust,no_run`).
fn blocks(markdown: &str, lang: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    let mut fenced = false;
    for line in markdown.lines() {
        if let Some(info) = line.trim_start().strip_prefix("```") {
            if fenced {
                blocks.extend(current.take());
            } else if info.split(',').next().unwrap().trim() == lang {
                current = Some(String::new());
            }
            fenced = !fenced;
        } else if let Some(block) = &mut current {
            block.push_str(line);
            block.push('\n');
        }
    }
    blocks
}

/// Plays the lease server's commands of `page` in order against a fresh SQLite server.
async fn play(page: &str, at_least: usize) {
    let markdown = read(&root().join(page));
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    curl::play(page, &markdown, LEASE_PORT, &app.address, at_least).await;
}

/// The front page's examples and the API reference's, each page's on a server of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_and_api_reference_examples_work_on_a_fresh_server() {
    for (page, at_least) in [("README.md", 5), ("docs/api.md", 12)] {
        play(page, at_least).await;
    }
}

#[test]
fn readme_is_a_front_page() {
    let lines = read(&root().join("README.md")).lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines; move depth into docs/"
    );
}

/// Rust in the pages is a copy of the library's README, which is doc-tested as the crate's
/// documentation, so it compiles.
#[test]
fn rust_blocks_are_copies_of_the_doc_tested_library_readme() {
    let library = read(&root().join("fencelock/README.md"));
    let mut copies = 0;
    for page in pages() {
        for block in blocks(&read(&page), "rust") {
            assert!(
                library.contains(&block),
                "a rust block of {} is not in fencelock/README.md:\n{block}",
                name(&page)
            );
            if page.ends_with("README.md") {
                copies += 1;
            }
        }
    }
    assert!(copies >= 1, "README.md shows the guard as a rust block");
}

/// SQL in the pages is a copy of what the library runs (its SQL files, its sources, or the
/// examples of its documentation comments) or the migrations apply.
#[test]
fn sql_blocks_are_copies_of_the_sources() {
    let mut sources = files_under(&root().join("fencelock/src"), "rs");
    sources.extend(files_under(&root().join("fencelock/src"), "sql"));
    sources.extend(files_under(&root().join("migrations"), "sql"));
    let mut sources: Vec<String> = sources.iter().map(|p| read(p)).collect();
    let doc_comments: Vec<String> = sources.iter().map(|s| doc_comments(s)).collect();
    sources.extend(doc_comments);
    let seen = each_in_pages(
        |markdown| blocks(markdown, "sql"),
        |page, block| {
            let block = block.trim_end();
            assert!(
                sources.iter().any(|source| source.contains(block)),
                "an sql block of {} is in neither fencelock/src nor migrations/:\n{block}",
                name(page)
            );
        },
    );
    assert!(seen >= 2, "docs/guard.md shows the guard's SQL");
}

/// Runs `check` on every item that `find` finds in a page of the documentation, with the
/// page; returns how many there were.
fn each_in_pages<T>(find: impl Fn(&str) -> Vec<T>, mut check: impl FnMut(&Path, T)) -> usize {
    let mut checked = 0;
    for page in pages() {
        for item in find(&read(&page)) {
            check(&page, item);
            checked += 1;
        }
    }
    checked
}

/// The documentation comments of Rust `source`, without their `//!` or `///` (and the one
/// space after it), a line each.
fn doc_comments(source: &str) -> String {
    source
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let text = line
                .strip_prefix("//!")
                .or_else(|| line.strip_prefix("///"))?;
            Some(format!("{}\n", text.strip_prefix(' ').unwrap_or(text)))
        })
        .collect()
}

/// A TOML block parses, and a `fencelock` dependency in it names only features the library
/// has.
#[test]
fn toml_blocks_parse_and_name_only_library_features() {
    let manifest: toml::Table =
        toml::from_str(&read(&root().join("fencelock/Cargo.toml"))).unwrap();
    let features: BTreeSet<&str> = manifest["features"]
        .as_table()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut dependencies = 0;
    for page in pages() {
        for block in blocks(&read(&page), "toml") {
            let table: toml::Table = toml::from_str(&block)
                .unwrap_or_else(|e| panic!("a toml block of {}: {e}\n{block}", name(&page)));
            let dependency = table
                .get("dependencies")
                .and_then(|d| d.get("fencelock"))
                .or_else(|| table.get("fencelock"));
            let Some(dependency) = dependency else {
                continue;
            };
            dependencies += 1;
            assert!(
                dependency.get("path").is_some(),
                "{}: the library is not on crates.io, so it is a path dependency: {block}",
                name(&page)
            );
            for feature in dependency
                .get("features")
                .and_then(|f| f.as_array())
                .into_iter()
                .flatten()
            {
                let feature = feature.as_str().unwrap();
                assert!(
                    features.contains(feature),
                    "{}: fencelock has no feature {feature:?} ({features:?})",
                    name(&page)
                );
            }
        }
    }
    assert!(
        dependencies >= 1,
        "README.md shows how to depend on the library"
    );
}

/// A package of the workspace, as `cargo metadata` describes it: its name and its targets
/// by kind.
struct Package {
    name: String,
    root: bool,
    targets: Vec<(String, String)>,
}

fn workspace() -> Vec<Package> {
    let output = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let root_manifest = root().join("Cargo.toml");
    metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|package| Package {
            name: package["name"].as_str().unwrap().to_owned(),
            root: Path::new(package["manifest_path"].as_str().unwrap()) == root_manifest,
            targets: package["targets"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|target| {
                    let name = target["name"].as_str().unwrap().to_owned();
                    target["kind"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(move |kind| (kind.as_str().unwrap().to_owned(), name.clone()))
                })
                .collect(),
        })
        .collect()
}

/// The `cargo` commands of a page: the lines of its shell blocks that run cargo (after any
/// `NAME=value` words), and its inline code spans that start with `cargo `.
fn cargo_commands(markdown: &str) -> Vec<String> {
    let mut commands = Vec::new();
    for block in ["sh", "bash", "shell"]
        .iter()
        .flat_map(|lang| blocks(markdown, lang))
    {
        for line in block.lines() {
            let words: Vec<&str> = line
                .split_whitespace()
                .skip_while(|w| w.contains('=') && !w.starts_with('-'))
                .collect();
            if words.first() == Some(&"cargo") {
                commands.push(words.join(" "));
            }
        }
    }
    for paragraph in prose(markdown) {
        for span in code_spans(&paragraph).0 {
            if span.starts_with("cargo ") {
                commands.push(span);
            }
        }
    }
    commands
}

/// The paragraphs of `markdown` outside its fenced blocks, each as one line.
fn prose(markdown: &str) -> Vec<String> {
    let mut paragraphs = vec![String::new()];
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            paragraphs.push(String::new());
        } else if fenced || line.trim().is_empty() {
            paragraphs.push(String::new());
        } else {
            let paragraph = paragraphs.last_mut().unwrap();
            paragraph.push_str(line.trim());
            paragraph.push(' ');
        }
    }
    paragraphs.retain(|p| !p.is_empty());
    paragraphs
}

/// The inline code spans of `text` (a run of backticks up to the next run of as many), and
/// the text without them.
fn code_spans(text: &str) -> (Vec<String>, String) {
    let mut spans = Vec::new();
    let mut rest = String::new();
    let mut remaining = text;
    while let Some(start) = remaining.find('`') {
        rest.push_str(&remaining[..start]);
        let run = remaining[start..].len() - remaining[start..].trim_start_matches('`').len();
        let after = &remaining[start + run..];
        let ticks = "`".repeat(run);
        let close = (0..after.len())
            .filter(|&i| after.is_char_boundary(i) && after[i..].starts_with(&ticks))
            .find(|&i| !after[i + run..].starts_with('`'));
        match close {
            Some(end) => {
                spans.push(after[..end].trim().to_owned());
                remaining = &after[end + run..];
            }
            None => {
                rest.push_str(&remaining[start..]);
                remaining = "";
            }
        }
    }
    rest.push_str(remaining);
    (spans, rest)
}

/// Every `-p`, `--bin` and `--test` of the pages' cargo commands names a package or target
/// the workspace has, so that a command shown cannot have gone stale with a move or rename.
#[test]
fn cargo_commands_name_what_the_workspace_has() {
    let workspace = workspace();
    let checked = each_in_pages(cargo_commands, |page, command| {
        let words: Vec<&str> = command
            .split_whitespace()
            .take_while(|w| !["--", "#", "&&", "|"].contains(w))
            .collect();
        let mut packages = Vec::new();
        let mut targets = Vec::new();
        for pair in words.windows(2) {
            match pair[0] {
                "-p" | "--package" => packages.push(pair[1]),
                "--bin" => targets.push(("bin", pair[1])),
                "--test" => targets.push(("test", pair[1])),
                _ => {}
            }
        }
        for package in &packages {
            assert!(
                workspace.iter().any(|p| p.name == *package),
                "{}: `{command}`: no package {package} in the workspace",
                name(page)
            );
        }
        let selected: Vec<&Package> = if packages.is_empty() {
            workspace.iter().filter(|p| p.root).collect()
        } else {
            workspace
                .iter()
                .filter(|p| packages.contains(&p.name.as_str()))
                .collect()
        };
        for (kind, target) in targets {
            assert!(
                selected
                    .iter()
                    .any(|p| p.targets.contains(&(kind.to_owned(), target.to_owned()))),
                "{}: `{command}`: no {kind} target {target} in {packages:?} (the root package if none)",
                name(page)
            );
        }
    });
    assert!(checked >= 10, "{checked} cargo commands");
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut anchors = BTreeSet::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            anchors.insert(anchor(line.trim_start_matches('#')));
        }
    }
    anchors
}

/// The relative link targets of `markdown`'s prose (not its code): `](target)` and
/// `src="target"`, without web addresses.
fn links(markdown: &str) -> Vec<String> {
    let mut links = Vec::new();
    for paragraph in prose(markdown) {
        let text = code_spans(&paragraph).1;
        for (open, close) in [("](", ')'), ("src=\"", '"')] {
            for piece in text.split(open).skip(1) {
                let target = piece.split(close).next().unwrap();
                if !target.contains("://") && !target.starts_with("mailto:") && !target.is_empty() {
                    links.push(target.to_owned());
                }
            }
        }
    }
    links
}

/// Every relative link of the pages leads to a file that exists, and every `#anchor` to a
/// heading of its page.
#[test]
fn links_lead_to_files_and_headings_that_exist() {
    let checked = each_in_pages(links, |page, link| {
        let (file, fragment) = match link.split_once('#') {
            Some((file, fragment)) => (file, Some(fragment)),
            None => (link.as_str(), None),
        };
        let target = if file.is_empty() {
            page.to_path_buf()
        } else {
            page.parent().unwrap().join(file)
        };
        assert!(
            target.exists(),
            "{}: the link {link} leads nowhere",
            name(page)
        );
        if let Some(fragment) = fragment {
            assert!(
                anchors(&read(&target)).contains(fragment),
                "{}: the link {link}: no heading #{fragment} in {}",
                name(page),
                target.display()
            );
        }
    });
    assert!(checked >= 50, "{checked} links");
}

/// The front page leads to every page of `docs/`.
#[test]
fn readme_links_every_docs_page() {
    let readme = read(&root().join("README.md"));
    let linked: BTreeSet<PathBuf> = links(&readme)
        .iter()
        .map(|link| root().join(link.split('#').next().unwrap()))
        .collect();
    for page in files_under(&root().join("docs"), "md") {
        assert!(
            linked.contains(&page),
            "README.md does not link {}",
            name(&page)
        );
    }
}

/// `docs/operations.md` has a row in its tables for every setting `fencelock --help` shows and
/// every metric family the library defines.
#[test]
fn operations_lists_every_setting_and_metric() {
    let operations = read(&root().join("docs/operations.md"));
    let dir = tempfile::tempdir().unwrap();
    let output = crate::process::command(None, dir.path())
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    let flags: BTreeSet<&str> = help
        .lines()
        .filter(|line| line.trim_start().starts_with('-'))
        .flat_map(|line| line.split(|c: char| c.is_whitespace() || c == ','))
        .filter(|word| word.starts_with("--") && !["--help", "--version"].contains(word))
        .collect();
    assert!(flags.len() >= 19, "{flags:?} in\n{help}");
    assert_rows(&operations, "settings", flags);
    let metrics = read(&root().join("fencelock/src/metrics.rs"));
    // The rows of the `families!` table: `NAME: "fencelock_..." [labels],`.
    let families: BTreeSet<&str> = metrics
        .lines()
        .map(str::trim)
        .filter_map(|line| {
            let (name, rest) = line.split_once(": \"")?;
            let (family, labels) = rest.split_once('"')?;
            (name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
                && family.starts_with("fencelock_")
                && labels.starts_with(" ["))
            .then_some(family)
        })
        .collect();
    assert!(families.len() >= 15, "{families:?}");
    assert_rows(&operations, "metrics", families);
}

/// Every one of `names` has a row of its own (`| `name` |`) in the `table` table of
/// `docs/operations.md` (its text, `operations`).
fn assert_rows(operations: &str, table: &str, names: BTreeSet<&str>) {
    for name in names {
        assert!(
            operations.contains(&format!("\n| `{name}` |")),
            "the {table} table of docs/operations.md has no row for {name}"
        );
    }
}
