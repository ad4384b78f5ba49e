//! `drama qualify`: the receipt a user produces on their own GPU, OS or checkpoint. It
//! checks that drama is right here (kernels and generated tiny checkpoints against the
//! in-binary FP64 reference, the exactness promises, the given checkpoint end to end
//! through a real `drama serve`) and measures how fast it is; every check is reported with
//! its figure and its limit, and the run fails when any check does.

mod exact;
mod given;
mod kernels;
mod long;
mod model;
mod receipt;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use drama_bench::{BenchOptions, BenchPart};
use drama_checkpoint::{Checkpoint, Provenance};
use drama_engine::session::Engine;

use crate::checkpoint_arg::CheckpointArg;
use crate::gpu_arg::{GpuArg, NumericsArg};
use crate::output;
use receipt::{BenchFigures, Build, Check, Platform, RECEIPT_SCHEMA, Receipt};

/// The seed of every random input (a receipt is reproducible).
const SEED: u64 = 0x5EED_D4A3;

/// The presets whose traces are checked: softmax routing over compact routers (tiny),
/// grouped sigmoid (tiny-sigmoid), FP8 experts (tiny-fp8), and the widths of the engine's
/// limits with a full-width router (awkward). `--quick` checks the first.
const PRESETS: [&str; 4] = ["tiny", "tiny-sigmoid", "tiny-fp8", "awkward"];

/// Arguments of `drama qualify`.
#[derive(Args)]
pub struct QualifyArgs {
    /// A checkpoint to check end to end besides the generated ones: a directory, or
    /// `pinned`. Without it those checks are skipped (and the receipt says so).
    #[arg(long)]
    checkpoint: Option<String>,
    #[command(flatten)]
    gpu: GpuArg,
    /// Also write the receipt as JSON to this file.
    #[arg(short = 'o', long = "out")]
    out: Option<PathBuf>,
    /// One preset instead of four and shorter measurements.
    #[arg(long)]
    quick: bool,
    /// Compile the kernels as written, or as Metal's default fast math may compile them
    /// (`fast-math-emulation`: to see on another GPU that the checks survive it). The
    /// `drama serve` processes of the checkpoint checks compile them as written.
    #[arg(long, value_enum, default_value = "as-written")]
    numerics: NumericsArg,
    /// Corrupts the GPU result of the named check before it is compared, to show that the
    /// check can fail (tests); repeatable.
    #[arg(long, hide = true)]
    plant: Vec<String>,
}

/// Deliberate defects in named checks' GPU results (`--plant`).
pub struct Plant(Vec<String>);

impl Plant {
    /// Whether `check` is a planted one.
    fn planted(&self, check: &str) -> bool {
        self.0.iter().any(|planted| planted == check)
    }

    /// Moves the first value of `values` by far more than any tolerance when `check` is a
    /// planted one.
    pub fn corrupt(&self, check: &str, values: &mut [f32]) {
        if self.planted(check)
            && let Some(first) = values.first_mut()
        {
            *first = *first * 1.5 + 0.25;
        }
    }

    /// The same for bytes.
    pub fn corrupt_bytes(&self, check: &str, bytes: &mut [u8]) {
        if self.planted(check)
            && let Some(first) = bytes.first_mut()
        {
            *first ^= 0x5A;
        }
    }
}

/// Runs `drama qualify`.
pub fn run(args: QualifyArgs) -> Result<()> {
    let started = Instant::now();
    if let Some(out) = &args.out {
        output::check(out)?;
    }
    let plant = Plant(args.plant.clone());
    let given = args
        .checkpoint
        .as_ref()
        .map(|c| CheckpointArg::named(c.clone()).open())
        .transpose()?;
    let gpu = args.gpu.open_with(args.numerics.into())?;
    // Generated checkpoints and the servers' data, removed when the run ends.
    let scratch = tempfile::Builder::new()
        .prefix("drama-qualify-")
        .tempdir()
        .context("creating a temporary folder")?;
    let progress = |what: &str| eprintln!("qualify: {what}");

    progress("kernels");
    let mut checks = kernels::checks(&gpu, SEED, &plant);
    let presets = if args.quick { &PRESETS[..1] } else { &PRESETS[..] };
    for preset in presets {
        progress(&format!("model {preset}"));
        checks.extend(model::checks(&gpu, preset, SEED, scratch.path(), &plant));
    }
    progress("exactness");
    let tiny = generated(&gpu, "tiny", SEED, &scratch.path().join("exact"))?;
    let fresh = |seed: u64| generated(&gpu, "tiny", seed, &scratch.path().join(format!("exact-{seed}")));
    checks.extend(exact::checks(&tiny, &fresh, SEED, &plant));
    progress("a long context");
    checks.extend(long::checks(&tiny, SEED, &plant));

    let label = given.as_ref().map(Checkpoint::public_label);
    let bench_engine = match given {
        Some(checkpoint) => {
            progress("the given checkpoint");
            let engine = Engine::load(gpu.clone(), checkpoint)?;
            let mut serve_args = vec!["--checkpoint".to_string(), args.checkpoint.clone().unwrap_or_default()];
            serve_args.extend(["--backend".to_string(), args.gpu.backend().name().to_string()]);
            checks.extend(given::checks(&engine, SEED, &serve_args, scratch.path(), &plant));
            engine
        }
        None => {
            for name in [
                "given.same-seed",
                "given.voice-a-b-a",
                "given.serve-stream-whole",
                "given.serve-after-cancel",
            ] {
                checks.push(Check::skipped(name, "no --checkpoint given"));
            }
            tiny
        }
    };
    progress("bench");
    let bench = bench(&bench_engine, args.quick)?;

    let mut receipt = Receipt {
        schema: RECEIPT_SCHEMA,
        build: Build {
            version: env!("CARGO_PKG_VERSION"),
            commit: env!("DRAMA_COMMIT"),
            wgpu: env!("DRAMA_WGPU_VERSION"),
            profile: if cfg!(debug_assertions) { "debug" } else { "release" },
        },
        platform: Platform {
            os: os_version(),
            arch: std::env::consts::ARCH,
            capabilities: gpu.caps.clone(),
        },
        checkpoint: label,
        quick: args.quick,
        checks,
        bench,
        passed: 0,
        failed: 0,
        skipped: 0,
        total_s: started.elapsed().as_secs_f64(),
    };
    receipt.count();
    out!("{}", receipt.summary())?;
    if let Some(out) = &args.out {
        output::write(out, serde_json::to_string_pretty(&receipt)?.as_bytes())?;
    }
    if receipt.failed > 0 {
        let failed: Vec<&str> = receipt
            .checks
            .iter()
            .filter(|c| c.status == receipt::Status::Fail)
            .map(|c| c.name.as_str())
            .collect();
        bail!("{} check(s) failed: {}", failed.len(), failed.join(", "));
    }
    Ok(())
}

/// A fresh checkpoint of `preset` from `seed` in `dir`, loaded.
fn generated(gpu: &std::sync::Arc<drama_engine::gpu::Gpu>, preset: &str, seed: u64, dir: &Path) -> Result<Engine> {
    drama_fixtures::write_preset(preset, seed, dir).with_context(|| format!("generating {preset}"))?;
    let checkpoint = Checkpoint::open(dir, Provenance::Local(dir.to_path_buf()))?;
    Ok(Engine::load(gpu.clone(), checkpoint)?)
}

/// Decode steps at 1, 2, 4 and 8 lanes (1, 2 and 8 with `quick`), a prefill and a guided
/// synthesis on `engine`.
fn bench(engine: &Engine, quick: bool) -> Result<BenchFigures> {
    let max_positions = engine.checkpoint.config.max_position_embeddings;
    let options = BenchOptions {
        repeats: if quick { 3 } else { 7 },
        context: (max_positions / 2).min(256),
        lanes: if quick {
            vec![1, 2, 8]
        } else {
            drama_bench::DEFAULT_STEP_LANES.to_vec()
        },
        more_contexts: Vec::new(),
        more_codec_chunks: Vec::new(),
        prefill_rows: (max_positions / 2).min(if quick { 128 } else { 256 }),
        synthesis_tokens: (max_positions / 4).min(if quick { 32 } else { 200 }),
        rotation_bytes: 0,
        parts: vec![BenchPart::Decode, BenchPart::Prefill, BenchPart::Synthesis],
    };
    let report = drama_bench::run(
        engine,
        &options,
        env!("DRAMA_WGPU_VERSION"),
        env!("DRAMA_COMMIT"),
        &mut |_| {},
    )?;
    Ok(BenchFigures {
        checkpoint: engine.checkpoint.public_label(),
        decode_step_ms: report.decode.iter().flatten().map(|s| (s.lanes, s.wall_ms)).collect(),
        decode_step_gpu_ms: report.decode.iter().flatten().map(|s| (s.lanes, s.gpu_ms)).collect(),
        context: options.context,
        prefill_ms: report.prefill.map(|p| p.gpu_ms),
        prefill_rows: options.prefill_rows,
        real_time_factor: report.synthesis.as_ref().map(|s| s.real_time_factor),
        first_audio_s: report.synthesis.as_ref().map(|s| s.first_audio_s),
        peak_resident_mib: peak_resident_mib(),
    })
}

/// The process's peak resident set, from `getrusage` (KiB on Linux, bytes on macOS).
fn peak_resident_mib() -> Option<f64> {
    // SAFETY: getrusage writes one plain struct that we own.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return None;
    }
    let max = usage.ru_maxrss as f64;
    Some(if cfg!(target_os = "macos") {
        max / (1 << 20) as f64
    } else {
        max / 1024.0
    })
}

/// The operating system and its release (`uname -sr`; on macOS the product version too).
fn os_version() -> String {
    let run = |program: &str, args: &[&str]| {
        std::process::Command::new(program)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let kernel = run("uname", &["-sr"]).unwrap_or_else(|| std::env::consts::OS.to_string());
    match run("sw_vers", &["-productVersion"]) {
        Some(macos) => format!("macOS {macos} ({kernel})"),
        None => kernel,
    }
}
