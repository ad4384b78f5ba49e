//! `drama verify`: validate a checkpoint and print the report (text or JSON).

use anyhow::Result;
use clap::Args;

use crate::checkpoint_arg::CheckpointArg;

/// Arguments of `drama verify`.
#[derive(Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    checkpoint: CheckpointArg,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `drama verify`.
pub fn run(args: VerifyArgs) -> Result<()> {
    let checkpoint = args.checkpoint.open()?;
    let report = checkpoint.report();
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        out!("{}", report.render_text())?;
    }
    Ok(())
}
