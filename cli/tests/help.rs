//! The binary's argument handling: one grammar across commands. (Also makes `cargo test`
//! build `target/*/drama`, which the end-to-end tests in `tests/` run.)

use std::process::{Command, Output};

/// Every command, in the order `drama --help` lists them.
const COMMANDS: [&str; 10] = [
    "synth", "serve", "voice", "verify", "fetch", "fixture", "graph", "bench", "trace", "qualify",
];

/// The commands that write a file.
const WRITERS: [&str; 6] = ["synth", "voice", "fixture", "bench", "trace", "qualify"];

fn drama(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_drama")).args(args).output().unwrap()
}

/// The names under "Commands:" in a help text.
fn listed_commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|&name| name != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn help_lists_every_command() {
    let out = drama(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(listed_commands(&text), COMMANDS, "{text}");
    for command in COMMANDS {
        let out = drama(&[command, "--help"]);
        assert!(out.status.success(), "drama {command} --help failed");
    }
}

#[test]
fn every_command_that_writes_a_file_takes_o_and_out() {
    for command in COMMANDS {
        let help = String::from_utf8(drama(&[command, "--help"]).stdout).unwrap();
        let takes_out = help.contains("-o, --out <OUT>");
        assert_eq!(takes_out, WRITERS.contains(&command), "drama {command} --help:\n{help}");
    }
}

#[test]
fn the_gl_backend_is_refused_with_its_reason() {
    let out = drama(&["graph", "--backend", "gl"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the gl backend is not supported") && err.contains("16 storage buffers"),
        "{err}"
    );
    let out = drama(&["graph", "--backend", "opengl"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("(auto, metal, vulkan, dx12)"));
}

#[test]
fn unknown_command_fails_with_a_message() {
    let out = drama(&["synthesise"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("synthesise"));
}
