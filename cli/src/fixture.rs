//! `drama fixture`: write a generated checkpoint.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

/// Arguments of `drama fixture`.
#[derive(Args)]
pub struct FixtureArgs {
    /// Preset: tiny, tiny-sigmoid, tiny-fp8, awkward, demo or bench (about 9.2 GB).
    #[arg(long)]
    preset: String,
    /// New (or empty) directory to write into.
    #[arg(short = 'o', long = "out")]
    out: PathBuf,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// Runs `drama fixture`.
pub fn run(args: FixtureArgs) -> Result<()> {
    drama_fixtures::write_preset(&args.preset, args.seed, &args.out)
        .with_context(|| format!("generating preset {} into {}", args.preset, args.out.display()))?;
    outln!(
        "wrote preset {} (seed {}) to {}",
        args.preset,
        args.seed,
        args.out.display()
    )?;
    Ok(())
}
