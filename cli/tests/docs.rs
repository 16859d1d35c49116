//! Every long flag of every command, as `--help` lists it, is documented in `docs/cli.md` or
//! `docs/operator-guide.md` (where the README's CLI reference and settings tables moved).
#![allow(missing_docs, clippy::unwrap_used)]

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_outbox-lanes");
const DOCS: [(&str, &str); 2] = [
    ("docs/cli.md", include_str!("../../docs/cli.md")),
    (
        "docs/operator-guide.md",
        include_str!("../../docs/operator-guide.md"),
    ),
];

fn help(command: &[String]) -> String {
    let out = Command::new(BIN)
        .args(command)
        .arg("--help")
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "{command:?} --help: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands a help text lists under `Commands:`, without `help`.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// The long flags a help text lists as options (`  -x, --name <V>` or `      --name`).
fn long_flags(help: &str) -> Vec<String> {
    help.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l.split_once(", ").map_or(l, |(short, rest)| {
                if short.starts_with('-') && short.len() == 2 {
                    rest
                } else {
                    l
                }
            });
            let flag = l.strip_prefix("--")?.split([' ', '=', '<']).next()?;
            (!flag.is_empty()).then(|| format!("--{flag}"))
        })
        .filter(|f| f != "--help" && f != "--version")
        .collect()
}

#[test]
fn every_flag_of_every_command_is_documented() {
    let mut queue = vec![Vec::<String>::new()];
    let (mut commands, mut flags) = (0, 0);
    let mut undocumented = Vec::new();
    while let Some(command) = queue.pop() {
        let text = help(&command);
        commands += 1;
        for flag in long_flags(&text) {
            flags += 1;
            if !DOCS.iter().any(|(_, doc)| doc.contains(flag.as_str())) {
                undocumented.push(format!("{} {flag}", command.join(" ")));
            }
        }
        for sub in subcommands(&text) {
            let mut next = command.clone();
            next.push(sub);
            queue.push(next);
        }
    }
    // The walk reached the commands and their flags (a parser that found none would pass).
    assert!(
        commands >= 20 && flags >= 100,
        "{commands} commands, {flags} flags"
    );
    assert!(
        undocumented.is_empty(),
        "flags in --help but in neither {} nor {}: {undocumented:#?}",
        DOCS[0].0,
        DOCS[1].0
    );
}
