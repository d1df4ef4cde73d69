//! The curated mutants are data (`tests/mutants/NNN.patch`, run by
//! `scripts/mutation-check.sh`); this file holds them to their form and keeps
//! `docs/mutants.md` in step with them:
//!
//! - every patch has its three header lines (`# where:`, `# mutant:`, `# suite:`),
//!   a suite the runner knows, and a diff of files that exist;
//! - every patch still applies to today's code (`git apply --check`): a mutant whose
//!   code changed under it is stale, and is found here, not at the next run of the
//!   check (`bash scripts/mutation-check.sh --refresh` rewrites the ones that only
//!   moved; the rest are ported by hand);
//! - the catalogue in `docs/mutants.md`, between its two markers, is the table these
//!   headers render to. `TASKSTAGE_BLESS=1 cargo test --test mutants_doc` writes it.

use std::path::{Path, PathBuf};
use std::process::Command;

const BEGIN: &str = "<!-- mutants: begin (rendered from tests/mutants by tests/mutants_doc.rs) -->";
const END: &str = "<!-- mutants: end -->";

/// One mutant's header.
#[derive(Debug)]
struct Mutant {
    number: u32,
    path: PathBuf,
    place: String,
    what: String,
    suite: String,
    files: Vec<String>,
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn header<'a>(text: &'a str, field: &str) -> Option<&'a str> {
    let prefix = format!("# {field}: ");
    text.lines()
        .take_while(|line| !line.starts_with("diff --git "))
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .map(str::trim)
        .filter(|value| !value.is_empty())
}

/// Reads every patch, failing with the file's name on the first one out of form.
fn mutants() -> Vec<Mutant> {
    let dir = root().join("tests/mutants");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("tests/mutants is readable") {
        let path = entry.expect("a directory entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let number = name
            .strip_suffix(".patch")
            .filter(|n| n.len() == 3 && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u32>().ok());
        let Some(number) = number else {
            panic!("{}: not a mutant (NNN.patch)", path.display());
        };
        let text = std::fs::read_to_string(&path).expect("a patch is UTF-8 text");
        let field = |field: &str| {
            let value = header(&text, field)
                .unwrap_or_else(|| panic!("{}: no '# {field}:' line", path.display()));
            assert!(
                !value.contains('|'),
                "{}: '# {field}:' holds a '|', which would break the table",
                path.display()
            );
            value.to_owned()
        };
        let files: Vec<String> = text
            .lines()
            .filter_map(|line| line.strip_prefix("+++ b/"))
            .map(str::to_owned)
            .collect();
        found.push(Mutant {
            number,
            place: field("where"),
            what: field("mutant"),
            suite: field("suite"),
            files,
            path,
        });
    }
    found.sort_by_key(|m| m.number);
    found
}

/// The test target a suite names, if any (`--test NAME`), as the runner reads it.
fn test_target(suite: &str) -> Option<&str> {
    let mut words = suite.split_whitespace();
    words.find(|w| *w == "--test").and_then(|_| words.next())
}

/// The features a suite asks for (`--features A,B`).
fn features(suite: &str) -> Vec<&str> {
    let mut words = suite.split_whitespace();
    words
        .find(|w| *w == "--features")
        .and_then(|_| words.next())
        .map(|list| list.split(',').collect())
        .unwrap_or_default()
}

/// The top module a `--lib` suite's filter starts with, if it names one
/// (`--lib table::tests` names `table`; `--lib decide` a module or a test alike).
fn lib_module(suite: &str) -> Option<&str> {
    let mut words = suite.split_whitespace();
    words
        .find(|w| *w == "--lib")
        .and_then(|_| words.next())
        .filter(|filter| filter.contains("::"))
        .and_then(|filter| filter.split("::").next())
}

/// The directory of the package a suite names (`-p NAME`; the core when it names
/// none), relative to the workspace root, or `None` for a package the workspace does
/// not have.
fn package_dir(suite: &str) -> Option<&'static str> {
    let mut words = suite.split_whitespace();
    match words.find(|w| *w == "-p").and_then(|_| words.next()) {
        None | Some("taskstage") => Some(""),
        Some("taskstage-cluster") => Some("crates/cluster/"),
        Some("taskstage-http") => Some("crates/http/"),
        Some("taskstage-cli") => Some("crates/cli/"),
        Some("taskstage-harness") => Some("crates/harness/"),
        Some("taskstage-examples") => Some("examples/"),
        Some(_) => None,
    }
}

#[test]
fn every_mutant_is_in_form_and_names_a_suite_that_exists() {
    let all = mutants();
    assert!(all.len() >= 190, "only {} mutants found", all.len());
    for m in &all {
        assert!(
            !m.files.is_empty(),
            "{}: the patch changes no file",
            m.path.display()
        );
        for file in &m.files {
            assert!(
                !file.starts_with("tests/mutants/"),
                "{}: changes a mutant ({file}): the diff was taken with the patch itself changed",
                m.path.display()
            );
            assert!(
                root().join(file).is_file(),
                "{}: changes {file}, which does not exist",
                m.path.display()
            );
        }
        let known = m.suite.starts_with("loom ")
            || ["--lib", "--test", "--all-features", "--features", "-p "]
                .iter()
                .any(|start| m.suite.starts_with(start));
        assert!(
            known,
            "{}: a suite the runner does not know: {}",
            m.path.display(),
            m.suite
        );
        let Some(package) = package_dir(&m.suite) else {
            panic!(
                "{}: a package the workspace does not have: {}",
                m.path.display(),
                m.suite
            );
        };
        for feature in features(&m.suite) {
            let manifest = std::fs::read_to_string(root().join(package).join("Cargo.toml"))
                .expect("the package's manifest reads");
            let declared = manifest
                .split("[features]")
                .nth(1)
                .map(|section| section.split("\n[").next().unwrap_or_default())
                .is_some_and(|section| {
                    section
                        .lines()
                        .any(|line| line.trim_start().starts_with(&format!("{feature} =")))
                });
            assert!(
                declared,
                "{}: its suite asks for feature {feature}, which {package}Cargo.toml does not declare",
                m.path.display()
            );
        }
        if let Some(module) = lib_module(&m.suite) {
            let file = format!("{package}src/{module}.rs");
            let dir = format!("{package}src/{module}/mod.rs");
            assert!(
                root().join(&file).is_file() || root().join(&dir).is_file(),
                "{}: its suite filters --lib {module}::, and neither {file} nor {dir} exists",
                m.path.display()
            );
        }
        if let Some(target) = test_target(&m.suite) {
            let file = format!("{package}tests/{target}.rs");
            assert!(
                root().join(&file).is_file(),
                "{}: its suite names --test {target}, and {file} does not exist",
                m.path.display()
            );
        }
    }
}

#[test]
fn every_mutant_still_applies_to_todays_code() {
    let mut stale = Vec::new();
    for m in mutants() {
        let out = Command::new("git")
            .current_dir(root())
            .args(["apply", "--check"])
            .arg(&m.path)
            .output()
            .expect("git runs (the mutants are checked against the checkout)");
        if !out.status.success() {
            stale.push(format!(
                "{}: {}",
                m.number,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "stale mutants (their code changed under them; `bash scripts/mutation-check.sh \
         --refresh` rewrites the ones that only moved):\n{}",
        stale.join("\n")
    );
}

fn render(all: &[Mutant]) -> String {
    let mut table = String::from("| # | where | mutant | the suite that must catch it |\n");
    table.push_str("|---|---|---|---|\n");
    for m in all {
        table.push_str(&format!(
            "| {} | {} | {} | `{}` |\n",
            m.number, m.place, m.what, m.suite
        ));
    }
    table
}

#[test]
fn the_catalogue_in_the_docs_is_the_one_the_patches_render_to() {
    let path = root().join("docs/mutants.md");
    let doc = std::fs::read_to_string(&path).expect("docs/mutants.md is readable");
    let (Some(begin), Some(end)) = (doc.find(BEGIN), doc.find(END)) else {
        panic!("docs/mutants.md lacks the markers {BEGIN} and {END}");
    };
    assert!(begin < end, "docs/mutants.md: the end marker comes first");
    let body_at = begin + BEGIN.len();
    let want = format!("\n{}", render(&mutants()));
    if std::env::var_os("TASKSTAGE_BLESS").is_some() {
        let blessed = format!("{}{}{}", &doc[..body_at], want, &doc[end..]);
        std::fs::write(&path, blessed).expect("docs/mutants.md is writable");
        return;
    }
    let have = &doc[body_at..end];
    assert!(
        have == want,
        "docs/mutants.md's catalogue is stale; `TASKSTAGE_BLESS=1 cargo test --test \
         mutants_doc` writes it from tests/mutants"
    );
}

#[test]
fn a_header_is_read_only_before_the_diff() {
    let text = "# where: a\n# suite: --lib\ndiff --git a/x b/x\n+# mutant: inside\n";
    assert_eq!(header(text, "where"), Some("a"));
    assert_eq!(
        header(text, "mutant"),
        None,
        "a line of the diff is no header"
    );
    assert_eq!(
        test_target("--all-features --test cluster_promises capacity"),
        Some("cluster_promises")
    );
    assert_eq!(test_target("--all-features --lib cluster::fence"), None);
}
