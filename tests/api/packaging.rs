//! What a package of fencelock ships beside the binary, made by the binary from its own
//! command line: the completion scripts (`fencelock completions SHELL`) and the manual pages
//! (`fencelock man`). Each holds every subcommand `fencelock --help` lists, so neither can
//! fall behind the parser.

use std::process::Command;

use crate::helpers::assert_succeeded;
use crate::process::run;

/// The subcommands `fencelock ARGS --help` lists, `help` aside.
fn subcommands(args: &[&str]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<&str> = args.iter().copied().chain(["--help"]).collect();
    let help = assert_succeeded(&run(dir.path(), &args), "--help");
    let listed: Vec<String> = help
        .lines()
        .skip_while(|line| *line != "Commands:")
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect();
    assert!(!listed.is_empty(), "no subcommands in:\n{help}");
    listed
}

fn fencelock(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    assert_succeeded(&run(dir.path(), args), &format!("fencelock {args:?}"))
}

#[test]
fn completions_name_every_subcommand_and_setting() {
    let top = subcommands(&[]);
    for must in ["lock", "check", "completions", "man"] {
        assert!(top.iter().any(|s| s == must), "{must} not in {top:?}");
    }
    for shell in ["bash", "zsh", "fish"] {
        let script = fencelock(&["completions", shell]);
        for name in &top {
            assert!(script.contains(name.as_str()), "{shell}: no {name}");
        }
        for flag in ["max-ttl-seconds", "grace-seconds", "wait-seconds"] {
            assert!(script.contains(flag), "{shell}: no --{flag}");
        }
        assert!(
            !script.contains("lock-sentinel"),
            "{shell}: a hidden command"
        );
    }
    let refused = run(
        tempfile::tempdir().unwrap().path(),
        &["completions", "tcsh"],
    );
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
}

/// The bash script, loaded into bash, completes a subcommand and a flag of `fencelock lock`.
#[test]
fn bash_completes_from_the_script() {
    let script = fencelock(&["completions", "bash"]);
    let complete = |words: &str| {
        let program = format!(
            "{script}\nCOMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             _fencelock fencelock \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
             printf '%s\\n' \"${{COMPREPLY[@]}}\""
        );
        let output = Command::new("bash")
            .args(["--norc", "-c", &program])
            .output()
            .unwrap();
        assert_succeeded(&output, words)
    };
    let replies = complete("fencelock co");
    let replies: Vec<&str> = replies.lines().collect();
    assert_eq!(replies, ["completions"]);
    let replies = complete("fencelock lock --gr");
    assert_eq!(replies.trim(), "--grace-seconds");
}

#[test]
fn the_manual_page_lists_every_subcommand() {
    let page = fencelock(&["man"]);
    assert!(page.contains(".TH fencelock 1"), "{page}");
    for name in subcommands(&[]) {
        assert!(
            page.contains(&format!("fencelock\\-{}(1)", name.replace('-', "\\-"))),
            "no {name} in the SUBCOMMANDS section"
        );
    }
    assert!(page.contains("\\-\\-max\\-ttl\\-seconds"), "{page}");
    assert!(!page.contains("sentinel"), "a hidden command: {page}");
}

/// `fencelock man --dir DIR` writes a page for each command and each of its subcommands,
/// and groff reads each without a warning.
#[test]
fn man_dir_writes_a_page_per_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("man1");
    std::fs::create_dir(&out).unwrap();
    fencelock(&["man", "--dir", out.to_str().unwrap()]);
    let mut expected = vec!["fencelock.1".to_owned()];
    for name in subcommands(&[]) {
        expected.push(format!("fencelock-{name}.1"));
        if ["guard", "token"].contains(&name.as_str()) {
            for sub in subcommands(&[&name]) {
                expected.push(format!("fencelock-{name}-{sub}.1"));
            }
        }
    }
    expected.sort();
    let mut written: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    written.sort();
    assert_eq!(written, expected);
    let lock = std::fs::read_to_string(out.join("fencelock-lock.1")).unwrap();
    assert!(lock.contains("\\-\\-grace\\-seconds"), "{lock}");
    for page in &written {
        let output = Command::new("groff")
            .args(["-man", "-ww", "-z"])
            .arg(out.join(page))
            .output()
            .expect("groff, to read the manual pages");
        assert!(
            output.status.success() && output.stderr.is_empty(),
            "{page}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
