//! Helpers shared by the end-to-end tests: locating the real `drama` binary and running it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Path of the `drama` binary that `cargo test` built for this workspace.
pub fn drama_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/drama
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
    let binary = profile_dir.join(format!("drama{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.is_file(),
        "{} is missing: run the tests with `cargo test --workspace` so the binary is built",
        binary.display()
    );
    binary
}

/// Runs `drama` with `args` and returns its output.
pub fn drama(args: &[&str]) -> Output {
    Command::new(drama_binary()).args(args).output().expect("drama runs")
}

/// Runs `drama` and returns (exit code, stdout, stderr) as text.
pub fn drama_text(args: &[&str]) -> (Option<i32>, String, String) {
    let out = drama(args);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub mod fake_hub;
pub mod server;
