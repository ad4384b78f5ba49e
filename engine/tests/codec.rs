//! The GPU codec decoder against the FP64 reference, and its streaming promise: chunks of
//! any size, with carried state, give the whole utterance's samples bit for bit.

mod common;

use common::*;
use drama_engine::checkpoint::Checkpoint;
use drama_engine::codec::{CodecDecoder, CodecWeights};
use drama_engine::reference::codec::decode;
use drama_engine::reference::ops::Rounding;
use rand_core::Rng;

fn rel_l2(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(&g, &w)| (f64::from(g) - w).powi(2)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den).sqrt()
}

/// `n` random codes of the checkpoint's codebook.
fn random_codes(rng: &mut rand_chacha::ChaCha8Rng, checkpoint: &Checkpoint, n: usize) -> Vec<u32> {
    (0..n)
        .map(|_| rng.next_u32() % checkpoint.config.speech.audio_codes as u32)
        .collect()
}

/// Utterances matching the reference to f32 precision.
fn clean_count(errors: &[f64]) -> usize {
    errors.iter().filter(|&&e| e <= 1e-6).count()
}

/// PCM rel-L2 against the contract-rounding reference of `codes` and five random
/// utterances; each within a BF16 flip's reach (5e-2).
fn reference_errors(
    checkpoint: &Checkpoint,
    decoder: &mut CodecDecoder,
    codes: &[u32],
    rng: &mut rand_chacha::ChaCha8Rng,
) -> Vec<f64> {
    let mut errors = Vec::new();
    for n in 0..6 {
        let utterance = if n == 0 {
            codes.to_vec()
        } else {
            random_codes(rng, checkpoint, 17)
        };
        decoder.reset();
        let pcm = decoder.decode(&utterance).unwrap();
        let contract = decode(checkpoint, &utterance, Rounding::Contract);
        let exact = decode(checkpoint, &utterance, Rounding::Exact);
        let err = rel_l2(&pcm, &contract);
        eprintln!(
            "codec utterance {n}: PCM rel-L2 vs contract-rounding reference {err:.2e}, vs pure FP64 {:.2e}",
            rel_l2(&pcm, &exact)
        );
        errors.push(err);
    }
    assert!(
        errors.iter().all(|&e| e <= 5e-2),
        "an utterance is beyond a rounding flip's reach: {errors:?}"
    );
    errors
}

/// A fresh tiny checkpoint (its fixture kept alive alongside) and a decoder over it.
fn tiny_codec(rng: &mut rand_chacha::ChaCha8Rng) -> (Fixture, Checkpoint, CodecDecoder) {
    let fixture = Fixture::preset("tiny", rng.next_u64());
    let checkpoint = fixture.open();
    let decoder = CodecDecoder::new(CodecWeights::upload(shared_gpu(), &checkpoint).unwrap());
    (fixture, checkpoint, decoder)
}

#[test]
fn codec_matches_reference_and_streams_exactly() {
    let mut rng = rng("codec");
    let (_fixture, checkpoint, mut decoder) = tiny_codec(&mut rng);
    let codes = random_codes(&mut rng, &checkpoint, 17);
    let hop = checkpoint.config.codec.samples_per_code();

    decoder.reset();
    let whole = decoder.decode(&codes).unwrap();
    assert_eq!(whole.len(), codes.len() * hop);
    assert!(whole.iter().all(|s| s.is_finite() && s.abs() <= 1.0));

    // Against the contract-rounding reference. Two correct implementations may round a
    // value to the other BF16 neighbour when f32 arithmetic (a sum, a division, sin, tanh)
    // lands within an f32 ulp of a rounding boundary; such a flip (2^-8 of one value) then
    // spreads through the causal stack. So: four of six utterances at least must match to
    // f32 precision (no flip), and every utterance, flipped or not, within a flip's reach.
    // How often flips happen depends on the checkpoint's values and on the platform's f32
    // arithmetic (WGSL allows a division 2.5 ulps, and fused multiply-adds): when a
    // checkpoint misses the count, a second fresh checkpoint must meet it.
    let errors = reference_errors(&checkpoint, &mut decoder, &codes, &mut rng);
    if clean_count(&errors) < 4 {
        eprintln!(
            "codec: only {} clean utterances; a second fresh checkpoint",
            clean_count(&errors)
        );
        let (_second_fixture, second, mut decoder) = tiny_codec(&mut rng);
        let codes = random_codes(&mut rng, &second, 17);
        let again = reference_errors(&second, &mut decoder, &codes, &mut rng);
        assert!(
            clean_count(&again) >= 4,
            "two fresh checkpoints: only {} and {} of 6 utterances match the reference to f32 precision: {errors:?}, {again:?}",
            clean_count(&errors),
            clean_count(&again)
        );
    }
    for chunks in [vec![1usize; 17], vec![3, 1, 5, 8], vec![16, 1]] {
        decoder.reset();
        let mut streamed = Vec::new();
        let mut start = 0;
        for n in chunks.iter().copied() {
            streamed.extend(decoder.decode(&codes[start..start + n]).unwrap());
            start += n;
        }
        let same = streamed.iter().zip(&whole).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same && streamed.len() == whole.len(),
            "chunks {chunks:?} differ from the whole decode"
        );
    }
    decoder.reset();
    assert_eq!(decoder.decode(&codes).unwrap(), whole, "a reset decoder repeats itself");
    let err = decoder.decode(&[64]).unwrap_err().to_string();
    assert!(err.contains("code 64"), "{err}");
}

/// An input longer than one chunk program takes (64 codes) runs as several programs and
/// gives the samples of the same codes streamed eight at a time, bit for bit.
#[test]
fn codec_long_input_equals_its_chunks() {
    let mut rng = rng("codec long");
    let (_fixture, checkpoint, mut decoder) = tiny_codec(&mut rng);
    let codes = random_codes(&mut rng, &checkpoint, 150);
    let whole = decoder.decode(&codes).unwrap();
    assert_eq!(whole.len(), codes.len() * checkpoint.config.codec.samples_per_code());
    decoder.reset();
    let streamed: Vec<f32> = codes.chunks(8).flat_map(|c| decoder.decode(c).unwrap()).collect();
    assert!(
        streamed.len() == whole.len() && streamed.iter().zip(&whole).all(|(a, b)| a.to_bits() == b.to_bits()),
        "150 codes at once differ from chunks of 8"
    );
}

/// The benchmark's timed chunk runs the whole chunk program: a positive GPU time and, one
/// launch per pass, every launch the decoder's architecture implies (the input convolution
/// and each history-carrying convolution with its history shift and copy; per upsampling
/// stage a snake, the transposed convolution and per residual unit snake, dilated
/// convolution, snake, 1x1 convolution, add; the output snake, convolution and tanh), and
/// codes outside the codebook refused by name.
#[test]
fn timed_codec_chunk_runs_every_launch() {
    let mut rng = rng("codec timed");
    let (_fixture, checkpoint, mut decoder) = tiny_codec(&mut rng);
    let c = &checkpoint.config.codec;
    let (time, launches) = decoder.timed_chunk(&random_codes(&mut rng, &checkpoint, 8)).unwrap();
    assert!(time.as_nanos() > 0);
    let with_history = 3;
    let per_unit = 1 + with_history + 1 + 1 + 1;
    let expected = with_history
        + c.upsample_rates.len() * (1 + with_history + c.residual_dilations.len() * per_unit)
        + 1
        + with_history
        + 1;
    assert_eq!(launches, expected);
    if shared_gpu().caps.timestamps {
        let profile = decoder.profiled_chunk(&random_codes(&mut rng, &checkpoint, 8)).unwrap();
        assert_eq!(profile.len(), expected, "{profile:?}");
    }
    let bad = checkpoint.config.speech.audio_codes as u32;
    let err = decoder.timed_chunk(&[bad]).unwrap_err().to_string();
    assert!(err.contains("audio_codes"), "{err}");
}
