//! `drama synth`: text to an audio file (WAV, MP3, Opus, FLAC or raw PCM, by the output's
//! extension), or a WAV on standard output.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use drama_engine::audio::AudioFormat;
use drama_engine::audio::wav::write_wav_f32;
use drama_engine::batch::synthesize;
use drama_engine::error::EngineError;
use drama_engine::guidance::check_gamma;
use drama_engine::sampling::SamplingParams;
use drama_engine::session::Engine;
use drama_engine::synth::{GuidanceMode, SpeechSettings, Stop, SynthesisRequest};
use drama_engine::text::TextFrontEnd;
use indicatif::{ProgressBar, ProgressStyle};

use crate::checkpoint_arg::CheckpointArg;
use crate::gpu_arg::GpuArg;
use crate::output;
use crate::voice_arg::load_voice;

/// Sample formats of an output WAV.
#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// 16-bit integer PCM.
    Pcm16,
    /// 32-bit float.
    F32,
}

/// Guidance lane modes.
#[derive(Clone, Copy, ValueEnum)]
enum Guidance {
    Paired,
    Separate,
}

/// Arguments of `drama synth`.
#[derive(Args)]
pub struct SynthArgs {
    /// The text to speak.
    #[arg(long, conflicts_with = "text_file", required_unless_present = "text_file")]
    text: Option<String>,
    /// A UTF-8 file holding the text to speak.
    #[arg(long)]
    text_file: Option<PathBuf>,
    /// Reference voice: a WAV recording or a voice file from `drama voice` (.safetensors).
    #[arg(long)]
    voice: Option<PathBuf>,
    #[command(flatten)]
    checkpoint: CheckpointArg,
    #[command(flatten)]
    gpu: GpuArg,
    /// Output path: its extension picks the format (.wav, .mp3, .opus or .ogg, .flac, .pcm;
    /// none: WAV), or `-` for a WAV on standard output.
    #[arg(short = 'o', long = "out")]
    out: PathBuf,
    /// Sample format of a WAV output (other formats hold 16-bit samples).
    #[arg(long, value_enum, default_value = "pcm16")]
    format: Format,
    /// Guidance scale (1 disables guidance); the recipe's is 1.5.
    #[arg(long, default_value_t = 1.5)]
    gamma: f32,
    /// Run the guidance lanes batched (paired) or as two forwards (separate): same output bits.
    #[arg(long, value_enum, default_value = "paired")]
    guidance: Guidance,
    /// Sampling temperature (0: always the most likely token).
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    /// Sample among the k most likely tokens only (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Nucleus sampling threshold (1: off).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Seed of the random stream (default: random, printed so the run can be repeated).
    #[arg(long)]
    seed: Option<u64>,
    /// Audio tokens per text segment at most (default: the checkpoint's max_audio_tokens).
    #[arg(long)]
    max_audio_tokens: Option<usize>,
}

/// The terminal's progress line: audio tokens decoded, seconds of audio and the real-time
/// factor so far.
fn progress_line(samples: usize, samples_per_token: usize, rate: u32, elapsed: std::time::Duration) -> String {
    let audio = samples as f64 / f64::from(rate);
    let factor = if audio > 0.0 {
        format!("{:.2}", elapsed.as_secs_f64() / audio)
    } else {
        "-".to_string()
    };
    format!(
        "{} audio tokens, {audio:.2} s of audio, real-time factor {factor}",
        samples / samples_per_token.max(1)
    )
}

/// The file format `-o` asks for: by its extension; WAV for standard output or a name
/// without one.
fn output_format(out: &Path) -> Result<AudioFormat> {
    if out.as_os_str() == "-" || out.extension().is_none() {
        return Ok(AudioFormat::Wav);
    }
    AudioFormat::for_path(out).with_context(|| {
        format!(
            "cannot write {}: drama synth writes .wav, .mp3, .opus (or .ogg), .flac or .pcm",
            out.display()
        )
    })
}

fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}

/// Runs `drama synth`.
pub fn run(args: SynthArgs) -> Result<()> {
    let text = match (&args.text, &args.text_file) {
        (Some(text), _) => text.clone(),
        (None, Some(path)) => std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
        (None, None) => bail!("give --text or --text-file"),
    };
    let to_stdout = args.out.as_os_str() == "-";
    if !to_stdout {
        output::check(&args.out)?;
        output::check_not_an_input(
            &args.out,
            &[
                ("--text-file", args.text_file.as_deref()),
                ("--voice", args.voice.as_deref()),
            ],
        )?;
    }
    let file_format = output_format(&args.out)?;
    if file_format != AudioFormat::Wav && matches!(args.format, Format::F32) {
        bail!(
            "--format f32 is a WAV sample format; {} holds 16-bit samples",
            file_format.name()
        );
    }
    check_gamma(args.gamma)?;
    let seed = args.seed.unwrap_or_else(random_seed);
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed,
    };
    sampling.validate()?;
    let opening = Instant::now();
    let checkpoint = args.checkpoint.open()?;
    let opened = opening.elapsed();
    let config = checkpoint.config.clone();
    // The format must hold the codec's rate before any speech is made.
    file_format.encoder(config.codec.sample_rate)?;
    let max_audio_tokens = args.max_audio_tokens.unwrap_or(config.speech.max_audio_tokens);
    anyhow::ensure!(max_audio_tokens >= 1, "--max-audio-tokens must be at least 1");
    let settings = SpeechSettings {
        // The voice is read once the GPU is open (a recording is encoded on it).
        prefix: None,
        gamma: args.gamma,
        guidance: match args.guidance {
            Guidance::Paired => GuidanceMode::Paired,
            Guidance::Separate => GuidanceMode::Separate,
        },
        sampling,
        max_audio_tokens,
    };
    let mut request = SynthesisRequest::for_text(&TextFrontEnd::new(&checkpoint), &text, settings).map_err(|e| {
        let flag = match (&e, args.max_audio_tokens) {
            (EngineError::NoRoomForText { .. }, Some(_)) => " (set by --max-audio-tokens)",
            (EngineError::NoRoomForText { .. }, None) => " (the checkpoint's; lower it with --max-audio-tokens)",
            _ => "",
        };
        anyhow::anyhow!("{e}{flag}")
    })?;
    eprintln!(
        "seed: {seed}  checkpoint: {}  segments: {}",
        checkpoint.provenance,
        request.segments.len()
    );
    let loading = Instant::now();
    let gpu = args.gpu.open()?;
    let prefix = match &args.voice {
        Some(path) => Some(load_voice(path, &checkpoint, &gpu)?),
        None => None,
    };
    let engine = Engine::load(gpu, checkpoint)?;
    eprintln!(
        "checkpoint opened and verified in {:.2} s, on the GPU with its pipelines in {:.2} s",
        opened.as_secs_f64(),
        loading.elapsed().as_secs_f64()
    );
    let segment_count = request.segments.len();
    request.prefix = prefix;
    let progress = if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new_spinner();
        bar.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("valid template"));
        bar.set_message("waiting for the first audio");
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        bar
    } else {
        ProgressBar::hidden()
    };
    let rate = config.codec.sample_rate;
    let samples_per_token: usize = config.codec.upsample_rates.iter().product();
    let started = Instant::now();
    let mut pcm: Vec<f32> = Vec::new();
    let stats = synthesize(&engine, &request, &mut |chunk| {
        pcm.extend_from_slice(chunk);
        if !progress.is_hidden() {
            progress.set_message(progress_line(pcm.len(), samples_per_token, rate, started.elapsed()));
        }
        true
    })?;
    progress.finish_and_clear();
    debug_assert_eq!(stats.stop, Stop::Finished);
    let bytes = match args.format {
        Format::Pcm16 => file_format.encode_whole(&pcm, rate)?,
        Format::F32 => write_wav_f32(&pcm, rate)?,
    };
    if to_stdout {
        output::stdout(&bytes)?;
    } else {
        output::write(&args.out, &bytes)?;
    }
    let audio = stats.audio_seconds();
    let wall = stats.wall.as_secs_f64();
    eprintln!(
        "audio {audio:.2} s, wall {wall:.2} s, real-time factor {}, {:.1} tokens/s, first audio after {}",
        if audio > 0.0 {
            format!("{:.2}", wall / audio)
        } else {
            "- (no audio)".to_string()
        },
        stats.tokens as f64 / wall.max(1e-9),
        stats
            .first_audio
            .map_or("-".to_string(), |d| format!("{:.2} s", d.as_secs_f64())),
    );
    if stats.samples == 0 {
        eprintln!(
            "warning: no audio: every segment sampled audio_eos (the end of speech) as its first token, \
             so the WAV holds no samples (another --seed, a lower --temperature or another --voice may speak)"
        );
    }
    if stats.capped_segments > 0 {
        eprintln!(
            "warning: {} of {segment_count} segment(s) reached the cap of {max_audio_tokens} audio tokens before \
             audio_eos: their speech may stop before their text does (raise --max-audio-tokens)",
            stats.capped_segments
        );
    }
    Ok(())
}
