//! `drama graph`: the compiled step graph of a checkpoint, as text, JSON or DOT.

use anyhow::Result;
use clap::{Args, ValueEnum};
use drama_engine::session::MAX_LANES;
use drama_engine::spec::{CheckpointNames, model_spec};
use drama_graph::drama3::{StepShape, build, plain};
use drama_graph::dump::dump;
use drama_graph::plan::plan;

use crate::checkpoint_arg::CheckpointArg;
use crate::gpu_arg::GpuArg;

/// Dump formats.
#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
    Dot,
}

/// Which graph to show.
#[derive(Clone, Copy, PartialEq, ValueEnum)]
enum Stage {
    /// What the model computes, each op in its plainest form.
    Plain,
    /// After the passes: what the engine runs.
    Scheduled,
}

/// Arguments of `drama graph`.
#[derive(Args)]
pub struct GraphArgs {
    #[command(flatten)]
    checkpoint: CheckpointArg,
    /// The step as this API runs it (no GPU is opened): where launches run beside one
    /// another, some work gets launches of its own.
    #[command(flatten)]
    gpu: GpuArg,
    /// Lanes decoded together (one token row each).
    #[arg(long, default_value_t = 1)]
    lanes: usize,
    /// Positions per lane the KV caches hold (default: max_position_embeddings).
    #[arg(long)]
    capacity: Option<usize>,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// The plain graph (what the model computes) or the scheduled one (what runs).
    #[arg(long, value_enum, default_value = "scheduled")]
    stage: Stage,
}

/// Runs `drama graph`.
pub fn run(args: GraphArgs) -> Result<()> {
    anyhow::ensure!(
        (1..=MAX_LANES).contains(&args.lanes),
        "--lanes must be in 1..={MAX_LANES}"
    );
    let checkpoint = args.checkpoint.open()?;
    let c = &checkpoint.config;
    let capacity = args.capacity.unwrap_or(c.max_position_embeddings);
    anyhow::ensure!(
        (1..=c.max_position_embeddings).contains(&capacity),
        "--capacity must be in 1..={} (max_position_embeddings)",
        c.max_position_embeddings
    );
    let shape = StepShape {
        rows: args.lanes,
        lanes: args.lanes,
        capacity,
        prefix_rows: args.lanes * c.speech.voice_prefix_len,
        trace: false,
        concurrent_launches: args.gpu.backend().runs_launches_concurrently(),
        device_barriers: args.gpu.backend().has_device_barriers(),
    };
    let spec = model_spec(&checkpoint);
    let graph = match args.stage {
        Stage::Plain => plain(&spec, &CheckpointNames, shape)?,
        Stage::Scheduled => build(&spec, &CheckpointNames, shape)?,
    };
    let planned = plan(&graph);
    let dumped = dump(&graph, &planned);
    match args.format {
        Format::Json => outln!("{}", dumped.json())?,
        Format::Dot => out!("{}", dumped.dot())?,
        Format::Text => {
            let stage = match args.stage {
                Stage::Plain => "plain (what the model computes)",
                Stage::Scheduled => "scheduled (what runs)",
            };
            outln!(
                "decode step, {stage}: {} lane(s), KV capacity {} positions, {}",
                args.lanes,
                shape.capacity,
                checkpoint.provenance
            )?;
            out!("{}", dumped.text())?;
            outln!("weights by format:")?;
            for (kind, totals) in checkpoint.report().totals {
                outln!(
                    "  {kind:<34} {:>14} parameters {:>14} bytes",
                    totals.parameters,
                    totals.bytes
                )?;
            }
        }
    }
    Ok(())
}
