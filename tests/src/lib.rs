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

/// A WAV of a sine at `pitch` radians per sample, 0.4 loud: a reference recording.
pub fn sine_wav(rate: u32, seconds: f32, pitch: f32) -> Vec<u8> {
    let n = (rate as f32 * seconds) as usize;
    let samples: Vec<f32> = (0..n).map(|i| 0.4 * (i as f32 * pitch).sin()).collect();
    drama_engine::audio::write_wav_pcm16(&samples, rate).expect("a WAV")
}

pub mod fake_hub;
pub mod server;
