//! The binary's argument handling. (Also makes `cargo test` build `target/*/drama`, which
//! the end-to-end tests in `tests/` run.)

use std::process::Command;

#[test]
fn help_lists_every_command() {
    let out = Command::new(env!("CARGO_BIN_EXE_drama"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for command in ["verify", "fixture"] {
        assert!(text.contains(command), "--help lacks {command}:\n{text}");
    }
}

#[test]
fn unknown_command_fails_with_a_message() {
    let out = Command::new(env!("CARGO_BIN_EXE_drama"))
        .arg("synthesise")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("synthesise"));
}
