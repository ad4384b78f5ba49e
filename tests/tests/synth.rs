//! `drama synth` and `drama voice` through the real binary on a generated checkpoint.

use std::path::{Path, PathBuf};

use drama_engine::audio::{read_wav, write_wav_pcm16};
use drama_tests::{drama, drama_text};

struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    checkpoint: String,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let ckpt = root.join("tiny");
    drama_fixtures::write_preset("tiny", 21, &ckpt).unwrap();
    Setup {
        checkpoint: ckpt.to_str().unwrap().to_string(),
        root,
        _dir: dir,
    }
}

fn synth(s: &Setup, out: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let mut args = vec![
        "synth",
        "--checkpoint",
        &s.checkpoint,
        "--text",
        "Hello there. Another sentence.",
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (code, _, err) = drama_text(&args);
    (code, err)
}

fn sine_wav(path: &Path, rate: u32, seconds: f32) {
    let n = (rate as f32 * seconds) as usize;
    let samples: Vec<f32> = (0..n)
        .map(|i| 0.3 * (i as f32 * 0.07).sin() + 0.1 * (i as f32 * 0.31).sin())
        .collect();
    std::fs::write(path, write_wav_pcm16(&samples, rate).unwrap()).unwrap();
}

#[test]
fn synth_writes_a_whole_number_of_hops_and_repeats_with_the_seed() {
    let s = setup();
    let a = s.root.join("a.wav");
    let (code, err) = synth(&s, &a, &["--seed", "7"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("seed: 7") && err.contains("real-time factor"), "{err}");
    let pcm = read_wav(&std::fs::read(&a).unwrap()).unwrap();
    assert_eq!(pcm.sample_rate, 24000);
    assert!(
        pcm.frames > 0 && pcm.frames.is_multiple_of(12),
        "{} samples is not a whole number of 12-sample hops",
        pcm.frames
    );
    assert!(pcm.samples.iter().all(|v| v.is_finite()));
    let b = s.root.join("b.wav");
    assert_eq!(synth(&s, &b, &["--seed", "7"]).0, Some(0));
    assert_eq!(
        std::fs::read(&a).unwrap(),
        std::fs::read(&b).unwrap(),
        "same seed, different bytes"
    );
    let c = s.root.join("c.wav");
    assert_eq!(synth(&s, &c, &["--seed", "7", "--guidance", "separate"]).0, Some(0));
    assert_eq!(
        std::fs::read(&a).unwrap(),
        std::fs::read(&c).unwrap(),
        "paired and separate differ"
    );
    let d = s.root.join("d.wav");
    assert_eq!(synth(&s, &d, &["--seed", "8"]).0, Some(0));
    assert_ne!(
        std::fs::read(&a).unwrap(),
        std::fs::read(&d).unwrap(),
        "the seed must matter"
    );
    // f32 output and standard output.
    let f = s.root.join("f.wav");
    assert_eq!(synth(&s, &f, &["--seed", "7", "--format", "f32"]).0, Some(0));
    assert_eq!(read_wav(&std::fs::read(&f).unwrap()).unwrap().frames, pcm.frames);
    let out = drama(&[
        "synth",
        "--checkpoint",
        &s.checkpoint,
        "--text",
        "Hello there. Another sentence.",
        "--seed",
        "7",
        "-o",
        "-",
    ]);
    assert!(out.status.success());
    assert_eq!(
        out.stdout,
        std::fs::read(&a).unwrap(),
        "-o - writes the same WAV to stdout"
    );
}

/// The output's extension picks its format; each file opens as its format does, and the
/// same seed writes the same bytes.
#[test]
fn the_output_extension_picks_the_format() {
    let s = setup();
    let wav = s.root.join("a.wav");
    assert_eq!(synth(&s, &wav, &["--seed", "9"]).0, Some(0));
    let wav = std::fs::read(&wav).unwrap();
    let pcm = s.root.join("a.pcm");
    assert_eq!(synth(&s, &pcm, &["--seed", "9"]).0, Some(0));
    let data = wav.windows(4).position(|w| w == b"data").unwrap() + 8;
    assert_eq!(
        std::fs::read(&pcm).unwrap(),
        &wav[data..],
        "raw PCM is the WAV's samples"
    );
    for (name, opens) in [
        ("a.mp3", &[0xFFu8][..]),
        ("a.opus", b"OggS"),
        ("b.OGG", b"OggS"),
        ("a.flac", b"fLaC"),
    ] {
        let out = s.root.join(name);
        let (code, err) = synth(&s, &out, &["--seed", "9"]);
        assert_eq!(code, Some(0), "{name}: {err}");
        let bytes = std::fs::read(&out).unwrap();
        assert!(
            bytes.starts_with(opens),
            "{name} opens with {:02x?}",
            &bytes[..bytes.len().min(8)]
        );
        let again = s.root.join(format!("again-{name}"));
        assert_eq!(synth(&s, &again, &["--seed", "9"]).0, Some(0));
        assert_eq!(std::fs::read(&again).unwrap(), bytes, "{name}: the seed repeats");
    }
}

#[test]
fn a_voice_file_made_from_a_wav_sounds_like_the_wav() {
    let s = setup();
    let reference = s.root.join("ref.wav");
    sine_wav(&reference, 22050, 0.4);
    let voice = s.root.join("voice.safetensors");
    let (code, _, err) = drama_text(&[
        "voice",
        "--checkpoint",
        &s.checkpoint,
        "--wav",
        reference.to_str().unwrap(),
        "-o",
        voice.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let from_wav = s.root.join("w.wav");
    let from_file = s.root.join("v.wav");
    let default = s.root.join("d.wav");
    assert_eq!(
        synth(&s, &from_wav, &["--seed", "3", "--voice", reference.to_str().unwrap()]).0,
        Some(0)
    );
    assert_eq!(
        synth(&s, &from_file, &["--seed", "3", "--voice", voice.to_str().unwrap()]).0,
        Some(0)
    );
    assert_eq!(synth(&s, &default, &["--seed", "3"]).0, Some(0));
    assert_eq!(std::fs::read(&from_wav).unwrap(), std::fs::read(&from_file).unwrap());
    assert_ne!(
        std::fs::read(&from_wav).unwrap(),
        std::fs::read(&default).unwrap(),
        "the voice must matter"
    );
}

#[test]
fn synth_refusals_name_the_problem() {
    let s = setup();
    let out = s.root.join("x.wav");
    let (code, err) = {
        let (c, _, e) = drama_text(&[
            "synth",
            "--checkpoint",
            &s.checkpoint,
            "--text",
            "   ",
            "-o",
            out.to_str().unwrap(),
        ]);
        (c, e)
    };
    assert_eq!(code, Some(1));
    assert!(err.contains("empty"), "{err}");
    let garbage = s.root.join("garbage.wav");
    std::fs::write(&garbage, b"RIFF1234WAVEnonsense").unwrap();
    let (code, err) = synth(&s, &out, &["--voice", garbage.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    assert!(err.contains("garbage.wav") && err.contains("WAV"), "{err}");
    let short = s.root.join("short.wav");
    sine_wav(&short, 16000, 0.002);
    let (code, err) = synth(&s, &out, &["--voice", short.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    assert!(err.contains("short.wav") && err.contains("n_fft"), "{err}");
    // A voice made for another checkpoint.
    let other = s.root.join("other");
    drama_fixtures::write_preset("tiny", 22, &other).unwrap();
    let reference = s.root.join("ref.wav");
    sine_wav(&reference, 16000, 0.3);
    let voice = s.root.join("other.safetensors");
    let (code, _, err) = drama_text(&[
        "voice",
        "--checkpoint",
        other.to_str().unwrap(),
        "--wav",
        reference.to_str().unwrap(),
        "-o",
        voice.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = synth(&s, &out, &["--voice", voice.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    assert!(err.contains("made for checkpoint"), "{err}");
    assert!(!out.exists(), "a refused request wrote output");
    let (code, err) = synth(&s, &out, &["--top-p", "0"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("top_p"), "{err}");
    // A token cap past any context (the sum with the prompt must not wrap around).
    let huge = u64::MAX.to_string();
    let (code, err) = synth(&s, &out, &["--max-audio-tokens", &huge]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("--max-audio-tokens") && err.contains("no room for text"),
        "{err}"
    );
    assert!(!out.exists(), "a refused request wrote output");
    // Outputs that cannot be written, and bad settings, are refused before the checkpoint
    // is loaded (its summary line never comes), not after the synthesis.
    let nowhere = s.root.join("no-such-folder").join("x.wav");
    let mislabelled = s.root.join("x.aac");
    let flac = s.root.join("x.flac");
    for (out, extra, names) in [
        (nowhere.as_path(), &[][..], "the folder"),
        (
            mislabelled.as_path(),
            &[][..],
            "x.aac: drama synth writes .wav, .mp3, .opus (or .ogg), .flac or .pcm",
        ),
        (
            flac.as_path(),
            &["--format", "f32"][..],
            "--format f32 is a WAV sample format; flac holds 16-bit samples",
        ),
        (s.root.as_path(), &[][..], "it is a folder"),
        (out.as_path(), &["--gamma", "inf"][..], "gamma inf must be in (0, 10]"),
        (
            out.as_path(),
            &["--gamma", "1e30"][..],
            "gamma 1000000000000000000000000000000 must be in (0, 10]",
        ),
        (out.as_path(), &["--gamma", "0"][..], "gamma 0 must be in (0, 10]"),
        (out.as_path(), &["--temperature", "NaN"][..], "temperature NaN"),
        (
            out.as_path(),
            &["--temperature", "11"][..],
            "temperature 11 must be in [0, 10]",
        ),
    ] {
        let (code, err) = synth(&s, out, extra);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains(names), "{err}");
        assert!(!err.contains("checkpoint opened"), "refused only after loading: {err}");
    }
    // `drama voice` refuses a folder, and a name other than .safetensors, under which
    // `--voice` would not read the file back as a voice; both before any work.
    let voice_wav = s.root.join("voice.wav");
    let unnamed = s.root.join("voice");
    let refused = "drama voice writes a voice file, whose name must end in .safetensors";
    for (target, names) in [
        (s.root.as_path(), "it is a folder".to_string()),
        (voice_wav.as_path(), format!("voice.wav: {refused}")),
        (unnamed.as_path(), format!("voice: {refused}")),
    ] {
        let (code, _, err) = drama_text(&[
            "voice",
            "--checkpoint",
            &s.checkpoint,
            "--wav",
            "ref.wav",
            "-o",
            target.to_str().unwrap(),
        ]);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains(&names), "{err}");
    }
    assert!(!voice_wav.exists() && !unnamed.exists());
    assert!(!nowhere.parent().unwrap().exists() && !out.exists() && !mislabelled.exists());
    // An output that is one of the command's inputs is refused, naming the flag, and the
    // input is left as it was.
    let script = s.root.join("script");
    std::fs::write(&script, "Hello there.").unwrap();
    let script_path = script.to_str().unwrap();
    let (code, _, err) = drama_text(&[
        "synth",
        "--checkpoint",
        &s.checkpoint,
        "--text-file",
        script_path,
        "-o",
        script_path,
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("it is the --text-file this command reads"), "{err}");
    let reference_voice = s.root.join("reference");
    sine_wav(&reference_voice, 16000, 0.3);
    let (code, err) = synth(&s, &reference_voice, &["--voice", reference_voice.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("it is the --voice this command reads"), "{err}");
    let named_voice = s.root.join("named.safetensors");
    std::fs::copy(&reference_voice, &named_voice).unwrap();
    let (code, _, err) = drama_text(&[
        "voice",
        "--checkpoint",
        &s.checkpoint,
        "--wav",
        named_voice.to_str().unwrap(),
        "-o",
        named_voice.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("it is the --wav this command reads"), "{err}");
    assert_eq!(std::fs::read_to_string(&script).unwrap(), "Hello there.");
    // Not a refusal: speech cut at the token cap is written, with a warning naming the cap.
    let capped = s.root.join("capped.wav");
    // Seeded: an unseeded run samples audio_eos within two tokens about once in 80.
    let (code, err) = synth(&s, &capped, &["--max-audio-tokens", "2", "--seed", "7"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("segment(s) reached the cap of 2 audio tokens before audio_eos"),
        "{err}"
    );
    assert!(capped.exists());
    assert_eq!(
        std::fs::read(&named_voice).unwrap(),
        std::fs::read(&reference_voice).unwrap()
    );
}

/// A command whose standard output is closed before it prints (`drama verify | true`) ends
/// quietly with success instead of panicking on the broken pipe.
#[test]
fn a_closed_standard_output_is_no_panic() {
    let s = setup();
    for args in [
        &["verify", "--checkpoint", &s.checkpoint][..],
        &["graph", "--checkpoint", &s.checkpoint, "--format", "json"][..],
    ] {
        let mut child = std::process::Command::new(drama_tests::drama_binary())
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let output = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// The demo (`scripts/demo.sh`: the built-in checkpoint, seed 1) is safe to hear: its peak
/// stays below -20 dBFS, and it speaks (the default checkpoint's full-scale noise, and an
/// empty file, are what this guards against).
#[test]
fn the_demo_is_quiet_and_not_empty() {
    const TEXT: &str = "Hello from drama, the Drama 3 engine.";
    let script = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/demo.sh")).unwrap();
    assert!(
        script.contains(&format!("synth --seed 1 --text \"${{1:-{TEXT}}}\"")),
        "scripts/demo.sh no longer runs what this test checks:\n{script}"
    );
    let cache = tempfile::tempdir().unwrap();
    let out = cache.path().join("hello.wav");
    let run = std::process::Command::new(drama_tests::drama_binary())
        .args(["synth", "--seed", "1", "--text", TEXT, "-o", out.to_str().unwrap()])
        .env("XDG_CACHE_HOME", cache.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{err}");
    assert!(err.contains("generating the demo checkpoint"), "{err}");
    let pcm = read_wav(&std::fs::read(&out).unwrap()).unwrap();
    assert!(
        pcm.frames as f32 > 0.5 * pcm.sample_rate as f32,
        "{} frames",
        pcm.frames
    );
    let peak = pcm.samples.iter().fold(0f32, |m, s| m.max(s.abs()));
    let rms = (pcm.samples.iter().map(|s| s * s).sum::<f32>() / pcm.samples.len() as f32).sqrt();
    let dbfs = |v: f32| 20.0 * v.log10();
    eprintln!("demo: peak {:.1} dBFS, RMS {:.1} dBFS", dbfs(peak), dbfs(rms));
    assert!(dbfs(peak) < -20.0 && rms > 0.0, "peak {peak}, RMS {rms}");
}

/// An utterance whose every segment samples audio_eos first is written (a WAV without
/// samples) and says why, instead of reporting a real-time factor of an empty file.
#[test]
fn an_utterance_without_audio_says_why() {
    let s = setup();
    let out = s.root.join("empty.wav");
    // One sentence, one segment: seed 45 samples audio_eos first on this checkpoint (found by
    // trying seeds in order; seeds 0 to 44 speak).
    let (code, _, err) = drama_text(&[
        "synth",
        "--checkpoint",
        &s.checkpoint,
        "--text",
        "Hello there, another sentence.",
        "-o",
        out.to_str().unwrap(),
        "--seed",
        "45",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("real-time factor - (no audio)")
            && err
                .contains("warning: no audio: every segment sampled audio_eos (the end of speech) as its first token"),
        "{err}"
    );
    // A WAV whose data chunk, its last, is empty.
    let wav = std::fs::read(&out).unwrap();
    let data = wav.windows(4).position(|w| w == b"data").expect("a data chunk");
    assert_eq!(&wav[data + 4..], &[0, 0, 0, 0]);
}

/// The awkward preset (20 mel bands, tower and codec widths that are no multiple of 8,
/// head_dim 40, three query heads per key/value head, five layers) goes end to end: verify
/// accepts it, synth speaks with a reference voice, and paired guidance gives separate's
/// bytes.
#[test]
fn the_awkward_preset_runs_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("awkward");
    drama_fixtures::write_preset("awkward", 8, &checkpoint).unwrap();
    let checkpoint = checkpoint.to_str().unwrap();
    let (code, _, err) = drama_text(&["verify", "--checkpoint", checkpoint]);
    assert_eq!(code, Some(0), "{err}");
    let reference = dir.path().join("ref.wav");
    sine_wav(&reference, 16000, 0.5);
    let outputs: Vec<Vec<u8>> = ["paired", "separate"]
        .iter()
        .map(|guidance| {
            let out = dir.path().join(format!("{guidance}.wav"));
            let (code, _, err) = drama_text(&[
                "synth",
                "--checkpoint",
                checkpoint,
                "--text",
                "Odd widths. Still speech.",
                "--voice",
                reference.to_str().unwrap(),
                "--seed",
                "4",
                "--guidance",
                guidance,
                "-o",
                out.to_str().unwrap(),
            ]);
            assert_eq!(code, Some(0), "{err}");
            std::fs::read(&out).unwrap()
        })
        .collect();
    assert!(outputs[0].len() > 44, "no audio");
    assert_eq!(outputs[0], outputs[1], "paired and separate differ");
}
