//! `drama voice`: encode a reference recording once into a reusable voice file.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use drama_engine::tower::VoiceTower;
use drama_engine::voice::{prefix_from_wav, voice_file_bytes};

use crate::checkpoint_arg::CheckpointArg;
use crate::gpu_arg::GpuArg;
use crate::output;
use crate::voice_arg::VOICE_FILE_EXTENSION;

/// Arguments of `drama voice`.
#[derive(Args)]
pub struct VoiceArgs {
    #[command(flatten)]
    checkpoint: CheckpointArg,
    #[command(flatten)]
    gpu: GpuArg,
    /// Reference recording (WAV: 16/24/32-bit integer or 32-bit float, any rate and channels).
    #[arg(long)]
    wav: PathBuf,
    /// Output voice file (its name must end in .safetensors).
    #[arg(short = 'o', long = "out")]
    out: PathBuf,
}

/// Runs `drama voice`.
pub fn run(args: VoiceArgs) -> Result<()> {
    output::check(&args.out)?;
    output::check_not_an_input(&args.out, &[("--wav", Some(args.wav.as_path()))])?;
    output::check_extension(
        &args.out,
        VOICE_FILE_EXTENSION,
        false,
        "drama voice writes a voice file, whose name must end in .safetensors: that is how `drama synth --voice` tells it from a recording",
    )?;
    let checkpoint = args.checkpoint.open()?;
    let bytes = std::fs::read(&args.wav).with_context(|| format!("reading {}", args.wav.display()))?;
    let tower = VoiceTower::new(args.gpu.open()?, &checkpoint)?;
    let prefix = prefix_from_wav(&bytes, &tower).with_context(|| format!("voice {}", args.wav.display()))?;
    output::write(&args.out, &voice_file_bytes(&prefix, &checkpoint)?)?;
    outln!("wrote voice for {} to {}", checkpoint.provenance, args.out.display())?;
    Ok(())
}
