//! `drama trace`: a teacher-forced run written as F32 tensors.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, ValueEnum};
use drama_engine::session::Engine;
use drama_engine::trace::{LaneMode, TraceRequest, trace};

use crate::checkpoint_arg::CheckpointArg;
use crate::gpu_arg::GpuArg;
use crate::output;
use crate::voice_arg::load_voice;

/// Guidance lane modes.
#[derive(Clone, Copy, ValueEnum)]
enum Lanes {
    Paired,
    Separate,
}

/// Arguments of `drama trace`.
#[derive(Args)]
pub struct TraceArgs {
    #[command(flatten)]
    checkpoint: CheckpointArg,
    #[command(flatten)]
    gpu: GpuArg,
    /// Text token ids, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    text_ids: Vec<u32>,
    /// Audio codes after audio_bos, comma-separated.
    #[arg(long, value_delimiter = ',')]
    codes: Vec<u32>,
    /// Reference voice: a WAV recording or a voice file from `drama voice` (.safetensors);
    /// default: the checkpoint's default prefix.
    #[arg(long)]
    voice: Option<PathBuf>,
    /// Guidance scale; 1 traces the cond lane alone.
    #[arg(long, default_value_t = 1.0)]
    gamma: f32,
    /// Run the guidance lanes in one batched forward (paired) or two (separate).
    #[arg(long, value_enum, default_value = "paired")]
    lanes: Lanes,
    /// Output file: the traced tensors in safetensors format.
    #[arg(short = 'o', long = "out")]
    out: PathBuf,
}

/// Runs `drama trace`.
pub fn run(args: TraceArgs) -> Result<()> {
    output::check(&args.out)?;
    let checkpoint = args.checkpoint.open()?;
    let gpu = args.gpu.open()?;
    let prefix = match &args.voice {
        Some(path) => Some(load_voice(path, &checkpoint, &gpu)?),
        None => None,
    };
    let engine = Engine::load(gpu, checkpoint)?;
    let request = TraceRequest {
        text: &args.text_ids,
        codes: &args.codes,
        prefix: prefix.as_deref(),
        gamma: args.gamma,
        lanes: match args.lanes {
            Lanes::Paired => LaneMode::Paired,
            Lanes::Separate => LaneMode::Separate,
        },
    };
    let traced = trace(&engine, &request)?;
    output::write(&args.out, &traced.to_safetensors()?)?;
    outln!("wrote {} tensors to {}", traced.tensors.len(), args.out.display())?;
    Ok(())
}
