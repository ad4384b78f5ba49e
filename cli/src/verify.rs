//! `drama verify`: validate a checkpoint and print the report (text or JSON), or with
//! `--all` every deviation it has, grouped by kind.

use std::path::Path;

use anyhow::{Result, bail};
use clap::Args;
use drama_checkpoint::{Checkpoint, CheckpointError};
use serde::Serialize;

use crate::checkpoint_arg::CheckpointArg;

/// Examples shown of each kind of deviation.
const EXAMPLES_PER_KIND: usize = 5;

/// Arguments of `drama verify`.
#[derive(Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    checkpoint: CheckpointArg,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Report every deviation from the contract and the engine's limits, grouped by kind,
    /// instead of stopping at the first.
    #[arg(long)]
    all: bool,
}

/// One kind of deviation: how many, and the first few.
#[derive(Serialize)]
struct KindReport {
    kind: &'static str,
    count: usize,
    examples: Vec<String>,
}

/// Every deviation of a checkpoint, grouped by kind in the order each kind first appears.
#[derive(Serialize)]
struct DeviationReport {
    ok: bool,
    deviations: usize,
    kinds: Vec<KindReport>,
}

fn group(deviations: &[CheckpointError]) -> DeviationReport {
    let mut kinds: Vec<KindReport> = Vec::new();
    for deviation in deviations {
        let kind = deviation.kind();
        let at = match kinds.iter().position(|k| k.kind == kind) {
            Some(at) => at,
            None => {
                kinds.push(KindReport {
                    kind,
                    count: 0,
                    examples: Vec::new(),
                });
                kinds.len() - 1
            }
        };
        let report = &mut kinds[at];
        report.count += 1;
        if report.examples.len() < EXAMPLES_PER_KIND {
            report.examples.push(deviation.to_string());
        }
    }
    DeviationReport {
        ok: deviations.is_empty(),
        deviations: deviations.len(),
        kinds,
    }
}

fn render(report: &DeviationReport, dir: &Path) -> String {
    let mut text = format!(
        "{}: {} deviation(s) of {} kind(s)\n",
        dir.display(),
        report.deviations,
        report.kinds.len()
    );
    for kind in &report.kinds {
        text.push_str(&format!("\n{} ({})\n", kind.kind, kind.count));
        for example in &kind.examples {
            text.push_str(&format!("  {example}\n"));
        }
        if kind.count > kind.examples.len() {
            text.push_str(&format!("  ... and {} more\n", kind.count - kind.examples.len()));
        }
    }
    text
}

/// Runs `drama verify`.
pub fn run(args: VerifyArgs) -> Result<()> {
    if args.all {
        let dir = args.checkpoint.dir()?;
        let deviations = Checkpoint::deviations(&dir);
        if !deviations.is_empty() {
            let report = group(&deviations);
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&report)?)?;
            } else {
                out!("{}", render(&report, &dir))?;
            }
            bail!(
                "checkpoint {} refused: {} deviation(s), listed above",
                dir.display(),
                deviations.len()
            );
        }
    }
    let checkpoint = args.checkpoint.open()?;
    let report = checkpoint.report();
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        out!("{}", report.render_text())?;
    }
    Ok(())
}
