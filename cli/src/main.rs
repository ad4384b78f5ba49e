//! `drama`: the command-line front end of the Drama 3 engine.

/// `print!` through [`output::stdout`]: an error, never a panic, when the reader has gone.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::stdout(format!($($arg)*).as_bytes())
    };
}

/// `println!` likewise.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::stdout(format!("{}\n", format_args!($($arg)*)).as_bytes())
    };
}

mod bench;
mod checkpoint_arg;
mod fetch;
mod fixture;
mod gpu_arg;
mod graph;
mod output;
mod qualify;
mod serve;
mod synth;
mod trace;
mod verify;
mod voice;
mod voice_arg;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Drama 3 speech synthesis on the GPU (wgpu: Metal, Vulkan, DX12).
#[derive(Parser)]
#[command(name = "drama", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Synthesize speech from text into a WAV file.
    Synth(synth::SynthArgs),
    /// Serve speech over HTTP (OpenAI-compatible /v1/audio/speech, voices, metrics).
    Serve(serve::ServeArgs),
    /// Encode a reference recording into a reusable voice file.
    Voice(voice::VoiceArgs),
    /// Validate a checkpoint without touching a GPU and print what it holds.
    Verify(verify::VerifyArgs),
    /// Download the pinned checkpoint into a new directory and verify it.
    Fetch(fetch::FetchArgs),
    /// Generate a deterministic checkpoint in the contract layout (random weights).
    Fixture(fixture::FixtureArgs),
    /// Print the compiled step graph: ops, shapes, dtypes, formats, kernels, buffers.
    Graph(graph::GraphArgs),
    /// Measure kernels, decode steps, prefill and synthesis; write JSON.
    Bench(bench::BenchArgs),
    /// Teacher-forced run: logits, hidden states and router choices as F32 tensors.
    Trace(trace::TraceArgs),
    /// Check that drama is right and how fast it is on this GPU; print and write a receipt.
    Qualify(qualify::QualifyArgs),
}

/// Turns off Mesa's Vulkan device-selection layer unless the user set it up. wgpu asks for
/// every window-system extension the driver offers, and with Wayland's among them the layer
/// connects to the desktop session to find the default GPU: on a machine without one it
/// prints `error: XDG_RUNTIME_DIR is invalid...` twice, though nothing failed. The engine
/// picks its adapter itself (`drama_engine::gpu::Gpu::new`), so the layer has nothing to do.
fn quiet_vulkan_device_selection() {
    const LAYER_OFF: &str = "NODEVICE_SELECT";
    if cfg!(target_os = "linux") && std::env::var_os(LAYER_OFF).is_none() {
        // SAFETY: called first thing in `main`, before any other thread exists, so nothing
        // reads the environment while it changes.
        unsafe { std::env::set_var(LAYER_OFF, "1") };
    }
}

fn main() -> ExitCode {
    quiet_vulkan_device_selection();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Synth(args) => synth::run(args),
        Command::Voice(args) => voice::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Verify(args) => verify::run(args),
        Command::Fetch(args) => fetch::run(args),
        Command::Fixture(args) => fixture::run(args),
        Command::Graph(args) => graph::run(args),
        Command::Trace(args) => trace::run(args),
        Command::Qualify(args) => qualify::run(args),
        Command::Bench(args) => bench::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // Whoever reads the output stopped reading: nothing went wrong here.
        Err(error) if error.is::<output::ReaderGone>() => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
