//! The GPU voice tower against the FP64 reference on fresh random log-mel frames.

mod common;

use common::*;
use drama_engine::tower::VoiceTower;
use drama_reference::ops::Rounding;
use drama_reference::rel_l2;
use drama_reference::tower::encode;
use rand_core::Rng;

#[test]
fn tower_matches_reference() {
    tower_case("tiny");
}

/// 20 mel bands and tower widths 34 and 51: every linear of the tower reads a width that is
/// no multiple of 8 (`Kernel::LinearRagged`), and its norms rows no multiple of 4
/// (`Kernel::RmsNormAny`).
#[test]
fn tower_at_odd_widths_matches_reference() {
    tower_case("awkward");
}

fn tower_case(preset: &str) {
    let mut rng = rng(&format!("tower {preset}"));
    let fixture = Fixture::preset(preset, rng.next_u64());
    let checkpoint = fixture.open();
    let n_mels = checkpoint.config.voice_tower.n_mels;
    let mut errors = Vec::new();
    for frames in [1usize, 13] {
        // Log-mel values: ln of powers, between ln(1e-5) and a few units.
        let mel: Vec<f32> = uniform(&mut rng, frames * n_mels, 6.5)
            .iter()
            .map(|v| v - 4.5)
            .collect();
        let tower = VoiceTower::new(shared_gpu(), &checkpoint).unwrap();
        let got = tower.encode(&mel, frames).unwrap();
        // A tower encodes the same frames to the same bits every time, as a fresh one does.
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        assert_eq!(
            bits(&tower.encode(&mel, frames).unwrap()),
            bits(&got),
            "a second encode differs"
        );
        let fresh = VoiceTower::new(shared_gpu(), &checkpoint).unwrap();
        assert_eq!(
            bits(&fresh.encode(&mel, frames).unwrap()),
            bits(&got),
            "a fresh tower differs"
        );
        let mel64: Vec<f64> = mel.iter().map(|&v| f64::from(v)).collect();
        let want = encode(&checkpoint, &mel64, frames, Rounding::Contract);
        assert_eq!(got.len(), want.len());
        let err = rel_l2(&got, &want);
        eprintln!("tower ({frames} frames): prefix rel-L2 {err:.2e}");
        // Within a BF16 flip's reach always (two implementations may round one value to the
        // other neighbour, and the flip spreads through the blocks)...
        assert!(err <= 5e-3, "tower rel-L2 {err}");
        errors.push(err);
        let refusal = tower.encode(&mel[..n_mels - 1], 1).unwrap_err().to_string();
        assert!(refusal.contains("mel values"), "{refusal}");
    }
    // ...and at f32 precision where none happened: on lavapipe and in the fast-math
    // emulation both encodes match the contract-rounding reference exactly.
    assert!(
        errors.iter().any(|&e| e <= 1e-6),
        "{preset}: no encode matches the reference to f32 precision: {errors:?}"
    );
}
