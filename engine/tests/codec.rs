//! The GPU codec decoder against the FP64 reference, and its streaming promise: chunks of
//! any size, with carried state, give the whole utterance's samples bit for bit.

mod common;

use common::*;
use drama_checkpoint::Checkpoint;
use drama_engine::codec::{CodecDecoder, CodecWeights};
use drama_fixtures::{CODEC_REFERENCE_CHECKPOINTS, Preset};
use drama_reference::codec::decode;
use drama_reference::ops::Rounding;
use drama_reference::rel_l2;
use rand_core::Rng;

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

/// Whether two PCM streams hold the same samples, bit for bit.
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Decodes `codes` from a reset decoder in pieces of the given lengths, in order, and
/// asserts their PCM is `whole`'s, bit for bit (`label` names the case).
fn assert_streams_exactly(decoder: &mut CodecDecoder, codes: &[u32], whole: &[f32], pieces: &[usize], label: &str) {
    decoder.reset();
    let mut streamed = Vec::new();
    let mut start = 0;
    for &n in pieces {
        streamed.extend(decoder.decode(&codes[start..start + n]).unwrap());
        start += n;
    }
    assert!(
        same_bits(&streamed, whole),
        "{label}: chunks {pieces:?} differ from the whole decode"
    );
}

/// PCM rel-L2 against the contract-rounding reference of `codes` and five random
/// utterances of as many codes; each within a BF16 flip's reach (5e-2).
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
            random_codes(rng, checkpoint, codes.len())
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

/// A fresh checkpoint of the tiny preset with `change` applied (its fixture kept alive
/// alongside) and a decoder over it.
fn codec_of(rng: &mut rand_chacha::ChaCha8Rng, change: fn(&mut Preset)) -> (Fixture, Checkpoint, CodecDecoder) {
    let mut preset = Preset::by_name("tiny").expect("tiny preset");
    change(&mut preset);
    let fixture = Fixture::generated(&preset, rng.next_u64());
    let checkpoint = fixture.open();
    let decoder = CodecDecoder::new(CodecWeights::upload(shared_gpu(), &checkpoint).unwrap());
    (fixture, checkpoint, decoder)
}

/// A fresh tiny checkpoint and a decoder over it.
fn tiny_codec(rng: &mut rand_chacha::ChaCha8Rng) -> (Fixture, Checkpoint, CodecDecoder) {
    codec_of(rng, |_| {})
}

/// The decoder of the tiny preset with `change` applied against the FP64 reference on
/// utterances of `length` codes (at least 5), and streamed in chunks of several sizes
/// against its whole decode, bit for bit.
fn matches_reference_and_streams_exactly(label: &str, change: fn(&mut Preset), length: usize) {
    let mut rng = rng(label);
    let (_fixture, checkpoint, mut decoder) = codec_of(&mut rng, change);
    let codes = random_codes(&mut rng, &checkpoint, length);
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
    // checkpoint misses the count, a fresh one must meet it, up to
    // CODEC_REFERENCE_CHECKPOINTS.
    let mut clean = vec![clean_count(&reference_errors(
        &checkpoint,
        &mut decoder,
        &codes,
        &mut rng,
    ))];
    while clean.last() < Some(&4) && clean.len() < CODEC_REFERENCE_CHECKPOINTS {
        eprintln!("codec: clean utterances {clean:?} of 6; a fresh checkpoint");
        let (_fixture, fresh, mut fresh_decoder) = codec_of(&mut rng, change);
        let codes = random_codes(&mut rng, &fresh, length);
        clean.push(clean_count(&reference_errors(
            &fresh,
            &mut fresh_decoder,
            &codes,
            &mut rng,
        )));
    }
    assert!(
        clean.last() >= Some(&4),
        "{} fresh checkpoints: only {clean:?} of 6 utterances match the reference to f32 precision",
        clean.len()
    );
    for pieces in [vec![1usize; length], vec![3, 1, length - 4], vec![length - 1, 1]] {
        assert_streams_exactly(&mut decoder, &codes, &whole, &pieces, label);
    }
    decoder.reset();
    assert_eq!(decoder.decode(&codes).unwrap(), whole, "a reset decoder repeats itself");
    let bad = checkpoint.config.speech.audio_codes;
    let err = decoder.decode(&[bad as u32]).unwrap_err().to_string();
    assert!(err.contains(&format!("code {bad}")), "{err}");
}

#[test]
fn codec_matches_reference_and_streams_exactly() {
    matches_reference_and_streams_exactly("codec", |_| {}, 17);
}

/// Wide channels and a fast upsampling: convolutions over 518 and 520 input channels (64
/// threads per output channel; 518 outputs of the input convolution, so the last thread's
/// set of four channels is partial) and an upsampling rate of 9 (five pairs of phases, the
/// last partial), which the tiny preset never reaches. Short utterances (5 codes): each
/// BF16 rounding may flip, and these layers round thousands of values per code.
#[test]
fn a_wide_codec_matches_reference_and_streams_exactly() {
    matches_reference_and_streams_exactly(
        "codec wide",
        |p| {
            p.config.codec.codebook_dim = 520;
            p.config.codec.channels = vec![518, 4];
            p.config.codec.upsample_rates = vec![9];
            p.config.codec.residual_dilations = vec![1];
        },
        5,
    );
}

/// Convolutions of kernel size 1 (which the contract allows: an odd positive size) carry no
/// history; the transposed convolutions between them still do, and each must get its own.
#[test]
fn a_codec_of_kernel_size_one_matches_reference_and_streams_exactly() {
    matches_reference_and_streams_exactly("codec kernel 1", |p| p.config.codec.kernel_size = 1, 17);
}

/// Codec architectures drawn at random each run (kernel sizes 1 to 7, one to three stages of
/// rates 1 to 6, channel counts from 1, one to three dilations): each within a BF16 flip's
/// reach of the reference, and streamed in chunks of 1, 4 + 5 and 8 + 1 codes equal to its
/// whole decode, bit for bit.
#[test]
fn random_codec_architectures_match_reference_and_stream_exactly() {
    let mut rng = rng("codec random architectures");
    for _ in 0..3 {
        let mut preset = Preset::by_name("tiny").expect("tiny preset");
        let mut draw = |low: u32, high: u32| (low + rng.next_u32() % (high - low + 1)) as usize;
        let stages = draw(1, 3);
        let codec = &mut preset.config.codec;
        codec.kernel_size = 2 * draw(0, 3) + 1;
        codec.codebook_dim = draw(1, 24);
        codec.upsample_rates = (0..stages).map(|_| draw(1, 6)).collect();
        codec.channels = (0..=stages).map(|_| draw(1, 40)).collect();
        codec.residual_dilations = (0..draw(1, 3)).map(|_| draw(1, 5)).collect();
        let label = format!("{codec:?}");
        let fixture = Fixture::generated(&preset, rng.next_u64());
        let checkpoint = fixture.open();
        let mut decoder = CodecDecoder::new(CodecWeights::upload(shared_gpu(), &checkpoint).unwrap());
        let codes = random_codes(&mut rng, &checkpoint, 9);
        let whole = decoder.decode(&codes).unwrap();
        let want = decode(&checkpoint, &codes, Rounding::Contract);
        let err = rel_l2(&whole, &want);
        assert!(err <= 5e-2, "{label}: PCM rel-L2 {err:.2e} against the reference");
        for pieces in [vec![1usize; 9], vec![4, 5], vec![8, 1]] {
            assert_streams_exactly(&mut decoder, &codes, &whole, &pieces, &label);
        }
    }
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
    let eights: Vec<usize> = codes.chunks(8).map(<[u32]>::len).collect();
    assert_streams_exactly(&mut decoder, &codes, &whole, &eights, "150 codes at once");
}

/// Chunks submitted in parts (as the batcher spreads them over its steps) give the whole
/// decode's samples bit for bit: with another stream's chunks decoded between the parts,
/// with as many parts as launches and more, with the parts left to `finish` or to the next
/// chunk, and with a spread dropped by a reset. A chunk of `parts` parts has parts left
/// until its `parts`-th submission; no codes submit nothing.
#[test]
fn codec_chunks_in_parts_equal_the_whole_decode() {
    let mut rng = rng("codec parts");
    let (_fixture, checkpoint, mut decoder) = tiny_codec(&mut rng);
    let mut other = CodecDecoder::new(CodecWeights::upload(shared_gpu(), &checkpoint).unwrap());
    let codes = random_codes(&mut rng, &checkpoint, 24);
    let other_codes = random_codes(&mut rng, &checkpoint, 24);
    let whole = decoder.decode(&codes).unwrap();
    let other_whole = other.decode(&other_codes).unwrap();
    let (_, launches) = decoder.timed_chunk(&codes[..8]).unwrap();
    for parts in [2, 3, 7, launches, launches + 5] {
        decoder.reset();
        other.reset();
        let mut streamed = Vec::new();
        let mut other_streamed = Vec::new();
        // The other stream decodes one code between each two parts, while it has codes.
        let mut other_left = other_codes.as_slice();
        for chunk in codes.chunks(8) {
            decoder.submit_in_parts(chunk, parts).unwrap();
            let mut submitted = 1;
            while decoder.parts_left() {
                if let Some((first, rest)) = other_left.split_first() {
                    other_streamed.extend(other.decode(&[*first]).unwrap());
                    other_left = rest;
                }
                decoder.submit_next_part();
                submitted += 1;
            }
            assert_eq!(submitted, parts.min(launches), "{parts} parts of {launches} launches");
            streamed.extend(decoder.finish().unwrap());
        }
        other_streamed.extend(other.decode(other_left).unwrap());
        assert!(
            same_bits(&streamed, &whole),
            "{parts} parts differ from the whole decode"
        );
        assert!(
            same_bits(&other_streamed, &other_whole),
            "the stream between the parts changed"
        );
    }
    // Parts left to `finish`, and to the next chunk (which submits them before its own).
    decoder.reset();
    decoder.submit_in_parts(&codes[..8], 5).unwrap();
    decoder.submit_next_part();
    let mut streamed = decoder.finish().unwrap();
    decoder.submit_in_parts(&codes[8..16], 5).unwrap();
    decoder.submit_in_parts(&codes[16..], 5).unwrap();
    streamed.extend(decoder.finish().unwrap());
    assert!(
        same_bits(&streamed, &whole),
        "parts left to finish or the next chunk differ"
    );
    // No codes: nothing submitted, nothing to read.
    decoder.submit_in_parts(&[], 3).unwrap();
    assert!(!decoder.parts_left());
    assert!(decoder.finish().unwrap().is_empty());
    // A reset drops a spread chunk: the next utterance starts from zero histories.
    decoder.reset();
    decoder.submit_in_parts(&other_codes[..8], 4).unwrap();
    decoder.reset();
    assert!(!decoder.parts_left());
    assert!(
        same_bits(&decoder.decode(&codes).unwrap(), &whole),
        "a reset after parts"
    );
}

/// Parts only encoded and handed to the caller (as the batcher puts them in its step's
/// submission) give the whole decode's samples bit for bit, with two streams' parts in one
/// submission behind a copy that stands for the step; a chunk read before its submission
/// is reported, and a chunk of more codes than one program, are refused by name.
#[test]
fn codec_parts_in_a_shared_submission_equal_the_whole_decode() {
    let mut rng = rng("codec shared submission");
    let (_fixture, checkpoint, mut decoder) = tiny_codec(&mut rng);
    let gpu = shared_gpu();
    let mut other = CodecDecoder::new(CodecWeights::upload(gpu.clone(), &checkpoint).unwrap());
    let codes = random_codes(&mut rng, &checkpoint, 24);
    let other_codes = random_codes(&mut rng, &checkpoint, 24);
    let whole = decoder.decode(&codes).unwrap();
    let other_whole = other.decode(&other_codes).unwrap();
    decoder.reset();
    other.reset();
    let scratch = gpu.buffer("step stand-in", 1 << 16);
    let (mut streamed, mut other_streamed) = (Vec::new(), Vec::new());
    for (chunk, other_chunk) in codes.chunks(8).zip(other_codes.chunks(8)) {
        // The first stream gives two parts to each submission, the other one.
        decoder.encode_in_parts(chunk, 6).unwrap();
        decoder.encode_next_part();
        other.encode_in_parts(other_chunk, 5).unwrap();
        loop {
            let mut step = gpu.device.create_command_encoder(&Default::default());
            step.clear_buffer(&scratch, 0, None);
            let commands: Vec<_> = std::iter::once(step.finish())
                .chain(decoder.take_encoded())
                .chain(other.take_encoded())
                .collect();
            let submission = gpu.submit_commands(commands);
            decoder.submitted(&submission);
            other.submitted(&submission);
            if !decoder.parts_left() && !other.parts_left() {
                break;
            }
            decoder.encode_next_part();
            decoder.encode_next_part();
            other.encode_next_part();
        }
        streamed.extend(decoder.finish().unwrap());
        other_streamed.extend(other.finish().unwrap());
    }
    assert!(same_bits(&streamed, &whole), "parts in shared submissions differ");
    assert!(
        same_bits(&other_streamed, &other_whole),
        "the other stream's parts in shared submissions differ"
    );

    decoder.reset();
    decoder.encode_in_parts(&codes[..8], 1).unwrap();
    let taken = decoder.take_encoded();
    assert_eq!(taken.len(), 1, "one part, one command buffer");
    let error = decoder.finish().unwrap_err().to_string();
    assert!(
        error.contains("read before the submission that carries it was reported"),
        "{error}"
    );
    let long = random_codes(&mut rng, &checkpoint, 65);
    let error = decoder.encode_in_parts(&long, 3).unwrap_err().to_string();
    assert!(error.contains("a chunk of 65 codes is more than the"), "{error}");
}

/// The benchmark's timed chunk runs the whole chunk program: a positive GPU time and, one
/// launch per pass, every launch the decoder's architecture implies (the input convolution;
/// per upsampling stage a snake, the transposed convolution and per residual unit a snake,
/// the dilated convolution with the second snake, the 1x1 convolution with the residual
/// add; the output snake and the output convolution with tanh; after each convolution that
/// carries history its shift into the history's other buffer, whatever the chunk's length),
/// and codes outside the codebook refused by name.
#[test]
fn timed_codec_chunk_runs_every_launch() {
    let mut rng = rng("codec timed");
    let (_fixture, checkpoint, mut decoder) = tiny_codec(&mut rng);
    let c = &checkpoint.config.codec;
    let codes = 8;
    let (time, launches) = decoder
        .timed_chunk(&random_codes(&mut rng, &checkpoint, codes))
        .unwrap();
    assert!(time.as_nanos() > 0);
    // Each convolution that carries history is followed by its shift.
    let with_shift = 2;
    // The input convolution, which also writes the first stage's snake.
    let mut expected = with_shift;
    for _ in &c.upsample_rates {
        // The transposed convolution, which also writes the snake after it; each residual
        // unit's two convolutions (the 1x1 one, which carries no history, writing the snake
        // after the unit too).
        expected += with_shift + c.residual_dilations.len() * (with_shift + 1);
    }
    // The output convolution.
    expected += with_shift;
    assert_eq!(launches, expected);
    if shared_gpu().caps.timestamps {
        let profile = decoder
            .profiled_chunk(&random_codes(&mut rng, &checkpoint, codes))
            .unwrap();
        assert_eq!(profile.len(), expected, "{profile:?}");
    }
    let bad = checkpoint.config.speech.audio_codes as u32;
    let err = decoder.timed_chunk(&[bad]).unwrap_err().to_string();
    assert!(err.contains("audio_codes"), "{err}");
}
