//! The engine's limits (`docs/contract.md` §11), walked from just inside to just outside:
//! inside, `drama verify` accepts the checkpoint and `drama synth` speaks with it; outside,
//! both refuse it with the same words, naming the key or module, the value and the limit.

use std::path::Path;

use drama_fixtures::Preset;
use drama_tests::drama_text;

/// A change to the tiny preset's architecture, and what its refusal must say (None: inside).
type Case = (&'static str, fn(&mut Preset), Option<&'static str>);

const CASES: [Case; 6] = [
    // Any even head_dim (the contract refuses odd ones): 6 pads each cached head to 8, and
    // six heads of it make the attention output projection read 36 columns.
    (
        "head_dim 6, 6 heads",
        |p| {
            p.config.head_dim = 6;
            p.config.num_attention_heads = 6;
        },
        None,
    ),
    ("head_dim 1024", |p| p.config.head_dim = 1024, None),
    (
        "head_dim 1026",
        |p| p.config.head_dim = 1026,
        Some("config.json key `head_dim` is 1026; this engine runs up to 1024"),
    ),
    // A dense layer's and a shared expert's down projections (BF16, excluded from
    // quantization) run at any input width (`Kernel::LinearRagged`).
    ("dense width 98", |p| p.config.intermediate_size = 98, None),
    (
        "shared width 52",
        |p| p.config.shared_expert_intermediate_size = 52,
        None,
    ),
    // (The other BF16 linears read the hidden width, which NVFP4 and FP8 experts already
    // hold to a multiple of 16; `checkpoint::limits`' unit test walks that limit.)
    ("dense width 100", |p| p.config.intermediate_size = 100, None),
];

// The voice tower runs at any width (20 or 100 mels, widths that are no multiple of 8 or
// of 4).
const TOWER_CASES: [Case; 4] = [
    (
        "n_mels 20, tower widths 36 and 52",
        |p| {
            p.config.voice_tower.n_mels = 20;
            p.config.voice_tower.dim = 36;
            p.config.voice_tower.ffn = 52;
        },
        None,
    ),
    (
        "n_mels 100",
        |p| {
            p.config.voice_tower.n_fft = 400;
            p.config.voice_tower.n_mels = 100;
        },
        None,
    ),
    ("tower dim 34", |p| p.config.voice_tower.dim = 34, None),
    (
        "tower dim 33, ffn 19",
        |p| {
            p.config.voice_tower.dim = 33;
            p.config.voice_tower.ffn = 19;
        },
        None,
    ),
];

fn walk(cases: &[Case]) {
    let dir = tempfile::tempdir().unwrap();
    // A reference voice (half a second), so the voice tower runs too.
    let voice = dir.path().join("voice.wav");
    let samples: Vec<f32> = (0..8000).map(|i| 0.3 * (i as f32 * 0.05).sin()).collect();
    std::fs::write(&voice, drama_engine::audio::write_wav_pcm16(&samples, 16000).unwrap()).unwrap();
    for (index, (label, change, refusal)) in cases.iter().enumerate() {
        let mut preset = Preset::by_name("tiny").unwrap();
        change(&mut preset);
        let checkpoint = dir.path().join(format!("case{index}"));
        drama_fixtures::generate(&preset, 5)
            .unwrap()
            .write(&checkpoint)
            .unwrap();
        let checkpoint = checkpoint.to_str().unwrap();
        let out = dir.path().join(format!("case{index}.wav"));
        let verify = drama_text(&["verify", "--checkpoint", checkpoint]);
        let synth = drama_text(&[
            "synth",
            "--checkpoint",
            checkpoint,
            "--text",
            "Hello.",
            "--voice",
            voice.to_str().unwrap(),
            "--seed",
            "1",
            "--max-audio-tokens",
            "4",
            "-o",
            out.to_str().unwrap(),
        ]);
        match refusal {
            None => {
                assert_eq!(verify.0, Some(0), "{label}: verify refused: {}", verify.2);
                assert_eq!(synth.0, Some(0), "{label}: synth refused: {}", synth.2);
                assert!(Path::new(&out).exists(), "{label}");
            }
            Some(words) => {
                for (command, (code, _, err)) in [("verify", &verify), ("synth", &synth)] {
                    assert_eq!(*code, Some(1), "{label}: {command} accepted it: {err}");
                    assert!(err.contains(words), "{label}: {command}: {err}");
                }
                assert!(!Path::new(&out).exists(), "{label}");
            }
        }
    }
}

#[test]
fn backbone_limits_hold_from_just_inside_to_just_outside() {
    walk(&CASES);
}

#[test]
fn the_voice_tower_runs_any_width() {
    walk(&TOWER_CASES);
}
