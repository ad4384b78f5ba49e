//! `drama bench`: the benchmark suite, written as JSON (and summarised on stderr).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use drama_bench::{BenchOptions, BenchPart, DEFAULT_STEP_LANES, KernelShare, SynthesisResult, run as run_bench};
use drama_engine::session::Engine;

use crate::checkpoint_arg::CheckpointArg;
use crate::gpu_arg::{GpuArg, NumericsArg};
use crate::output;

/// Arguments of `drama bench`.
#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    checkpoint: CheckpointArg,
    #[command(flatten)]
    gpu: GpuArg,
    /// Compile the kernels as written, or as Metal's default fast math may compile them
    /// (`fast-math-emulation`: what it would cost or save, timed on another GPU).
    #[arg(long, value_enum, default_value = "as-written")]
    numerics: NumericsArg,
    /// JSON output file.
    #[arg(short = 'o', long = "out")]
    out: PathBuf,
    /// Timed repeats per measurement.
    #[arg(long, default_value_t = 20)]
    repeats: usize,
    /// KV context of the timed decode steps.
    #[arg(long, default_value_t = 256)]
    context: usize,
    /// Lanes of the decode steps timed at --context (comma-separated) [default: 1,2,4,8].
    #[arg(long, value_delimiter = ',')]
    lanes: Vec<usize>,
    /// More contexts at which a guidance pair's decode step is timed (comma-separated).
    #[arg(long, value_delimiter = ',')]
    more_contexts: Vec<usize>,
    /// More chunk sizes, in codes, at which the codec is timed alone (comma-separated).
    #[arg(long, value_delimiter = ',')]
    more_codec_chunks: Vec<usize>,
    /// Prompt rows of the prefill measurement.
    #[arg(long, default_value_t = 256)]
    prefill_rows: usize,
    /// Audio tokens of the synthesis measurement (50 per second of audio at the bench shape).
    #[arg(long, default_value_t = 500)]
    synthesis_tokens: usize,
    /// Bytes of weight copies each linear measurement rotates over.
    #[arg(long, default_value_t = 512 << 20)]
    rotation_bytes: u64,
    /// Measure only these parts (comma-separated) besides the roofline and the launch cost,
    /// which every run measures; all parts when absent.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Part>,
}

/// The parts of the suite `--only` can name.
#[derive(Clone, Copy, ValueEnum)]
enum Part {
    Kernels,
    Decode,
    Prefill,
    Synthesis,
    TokenLoop,
    Codec,
    Text,
}

impl From<Part> for BenchPart {
    fn from(part: Part) -> Self {
        match part {
            Part::Kernels => BenchPart::Kernels,
            Part::Decode => BenchPart::Decode,
            Part::Prefill => BenchPart::Prefill,
            Part::Synthesis => BenchPart::Synthesis,
            Part::TokenLoop => BenchPart::TokenLoop,
            Part::Codec => BenchPart::Codec,
            Part::Text => BenchPart::Text,
        }
    }
}

/// Runs `drama bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    let checkpoint = args.checkpoint.open()?;
    let options = BenchOptions {
        repeats: args.repeats,
        context: args.context,
        lanes: if args.lanes.is_empty() {
            DEFAULT_STEP_LANES.to_vec()
        } else {
            args.lanes.clone()
        },
        more_contexts: args.more_contexts.clone(),
        more_codec_chunks: args.more_codec_chunks.clone(),
        prefill_rows: args.prefill_rows,
        synthesis_tokens: args.synthesis_tokens,
        rotation_bytes: args.rotation_bytes,
        parts: if args.only.is_empty() {
            BenchPart::ALL.to_vec()
        } else {
            args.only.iter().map(|&part| part.into()).collect()
        },
    };
    options.check(&checkpoint.config)?;
    // The output's folder is made once the options hold (results go under bench/results/).
    if let Some(parent) = args.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    output::check(&args.out)?;
    let engine = Engine::load(args.gpu.open_with(args.numerics.into())?, checkpoint)?;
    let report = run_bench(
        &engine,
        &options,
        env!("DRAMA_WGPU_VERSION"),
        env!("DRAMA_COMMIT"),
        &mut |stage| eprintln!("bench: {stage}"),
    )?;
    output::write(&args.out, serde_json::to_string_pretty(&report)?.as_bytes())?;
    eprintln!("roofline {:.0} GB/s", report.roofline.gb_per_s);
    eprintln!(
        "launch alone: {:.2} us in a chain of dependent launches, {:.2} us of independent ones",
        report.launch.dependent_us, report.launch.independent_us
    );
    for k in report.kernels.iter().flatten() {
        eprintln!(
            "linear {:<13} {:<9} {:>6}x{:<6} lanes {}: {:>9.1} us {:>7.0} GB/s ({:.0}% of roofline; streaming its bytes alone: {:.1} us); launches overlapped: {:.2} us ({:.0}%; streaming: {:.2} us)",
            format!("{:?}", k.kernel),
            k.format,
            k.rows,
            k.cols,
            k.lanes,
            k.us,
            k.gb_per_s,
            100.0 * k.fraction_of_roofline,
            k.stream_us,
            k.overlapped_us,
            100.0 * k.overlapped_fraction_of_roofline,
            k.overlapped_stream_us
        );
    }
    let steps = report.decode.as_deref().unwrap_or_default();
    for s in steps {
        eprintln!(
            "decode {:<8} {} lane(s): {:.3} ms GPU, {:.3} ms wall, floor {:.3} ms ({:.2}x), {} launches, {} waiting (alone {:.3} ms; {:.2}x both floors), compiled in {:.1} ms",
            s.label,
            s.lanes,
            s.gpu_ms,
            s.wall_ms,
            s.floor_ms,
            s.ratio_to_floor,
            s.dispatches,
            s.waiting_dispatches,
            s.launch_floor_ms,
            s.ratio_to_floors,
            s.compile_ms
        );
        if let Some(m) = &s.moe_layer {
            eprintln!(
                "  MoE layer {} alone: {:.1} us GPU, floor {:.1} us ({:.2}x), {} launches",
                m.layer, m.gpu_us, m.floor_us, m.ratio_to_floor, m.dispatches
            );
        }
    }
    for s in steps {
        print_profile(&s.label, &s.profile);
    }
    if let Some(prefill) = &report.prefill {
        eprintln!("prefill {} rows: {:.2} ms", prefill.rows, prefill.gpu_ms);
        print_profile("prefill", &prefill.profile);
    }
    if let Some(y) = &report.synthesis {
        print_synthesis(y);
    }
    for t in report.token_loop.iter().flatten() {
        eprintln!(
            "token loop, {} lanes ({} jobs): {:.3} ms per token, the GPU busy {:.3} ms (step {:.3}, draws {:.3}, codec {:.3}): {:.3}x",
            t.lanes, t.jobs, t.token_ms, t.busy_ms, t.step_gpu_ms, t.draw_gpu_ms, t.codec_gpu_ms, t.token_over_busy
        );
        if let Some(l) = &t.in_loop {
            eprintln!(
                "  in the loop: a step's submission {:.3} ms on the GPU (step and draws {:.3}, codec {:.3}), {:.3} ms between two",
                l.span_ms, l.step_ms, l.codec_ms, l.gap_ms
            );
        }
    }
    for c in report.codec.iter().chain(report.more_codec_chunks.iter().flatten()) {
        eprintln!(
            "codec chunk of {} codes ({} samples): {:.3} ms GPU ({:.4} ms a code), {} launches",
            c.codes,
            c.samples,
            c.gpu_ms,
            c.gpu_ms / c.codes as f64,
            c.dispatches
        );
        print_profile("codec", &c.profile);
    }
    for t in report.text.iter().flatten() {
        eprintln!(
            "text of {} sentences ({} characters): {} segments in {:.2} ms; the service's first step waits {:.2} ms",
            t.sentences, t.characters, t.segments, t.ms, t.first_ms
        );
    }
    outln!("wrote {}", args.out.display())?;
    Ok(())
}

/// The synthesis measurement and its per-token host costs.
fn print_synthesis(y: &SynthesisResult) {
    eprintln!(
        "synthesis: {} tokens, {:.2} s audio, {:.2} s wall (steps {:.2} s, codec {:.2} s, {} chunks in parts), RTF {:.3}, first audio {:.3} s, {:.1} tokens/s",
        y.tokens,
        y.audio_s,
        y.wall_s,
        y.forward_s,
        y.codec_s,
        y.codec_chunks_in_parts,
        y.real_time_factor,
        y.first_audio_s,
        y.tokens_per_s
    );
    let per_token = |seconds: f64| seconds / y.tokens.max(1) as f64 * 1e6;
    eprintln!(
        "  steps per token: inputs {:.0} us, submit {:.0} us, record the next step {:.0} us, wait for the tokens of the step before {:.0} us",
        per_token(y.inputs_s),
        per_token(y.submit_s),
        per_token(y.record_s),
        per_token(y.wait_s)
    );
}

/// The eight kernel kinds that took the most of a profiled run.
fn print_profile(label: &str, profile: &[KernelShare]) {
    let total: f64 = profile.iter().map(|k| k.total_us).sum();
    for k in profile.iter().take(8) {
        eprintln!(
            "  {:<8} {:<22} {:>4} launches {:>9.1} us ({:.0}% of the profiled run)",
            label,
            k.kernel,
            k.launches,
            k.total_us,
            100.0 * k.total_us / total.max(1e-9)
        );
    }
}
