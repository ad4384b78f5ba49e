//! WAV in and out: reading the formats `docs/contract.md` §7 accepts, downmixing, and writing
//! whole files or a streamed file whose length is not known in advance.

use std::borrow::Cow;
use std::io::{Cursor, Read};

use super::AudioError;

/// Decoded WAV audio.
#[derive(Debug, Clone, PartialEq)]
pub struct Pcm {
    /// Frames per second.
    pub sample_rate: u32,
    /// Samples per frame.
    pub channels: u16,
    /// Number of frames (`samples.len() / channels`).
    pub frames: usize,
    /// Interleaved samples; integers are divided by 2^(bits-1) into [-1, 1) (the largest 32-bit
    /// values round to 1.0 in f32), floats are kept as stored.
    pub samples: Vec<f32>,
}

/// Sample encoding of a written WAV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleFormat {
    /// 16-bit signed integer PCM (see [`write_wav_pcm16`] for the rounding rule).
    Pcm16,
    /// 32-bit IEEE float.
    F32,
}

impl SampleFormat {
    fn bytes(self) -> usize {
        match self {
            SampleFormat::Pcm16 => 2,
            SampleFormat::F32 => 4,
        }
    }

    fn spec(self, sample_rate: u32) -> hound::WavSpec {
        let (bits_per_sample, sample_format) = match self {
            SampleFormat::Pcm16 => (16, hound::SampleFormat::Int),
            SampleFormat::F32 => (32, hound::SampleFormat::Float),
        };
        hound::WavSpec {
            channels: 1,
            sample_rate,
            bits_per_sample,
            sample_format,
        }
    }
}

/// Reads a WAV file: PCM 16/24/32-bit integer or 32-bit IEEE float, any rate and channel count.
///
/// Anything else (8-bit, 64-bit float, compressed formats), a zero sample rate, an empty data
/// chunk, non-finite float samples and malformed or truncated files are refused.
pub fn read_wav(bytes: &[u8]) -> Result<Pcm, AudioError> {
    decode_wav(bytes, None)
}

/// [`read_wav`] of a reference recording: one whose data chunk declares more than
/// `max_seconds` is refused before its samples are decoded (a two-hour recording would
/// otherwise take gigabytes first).
pub fn read_reference_wav(bytes: &[u8], max_seconds: u32) -> Result<Pcm, AudioError> {
    decode_wav(bytes, Some(max_seconds))
}

fn decode_wav(bytes: &[u8], max_seconds: Option<u32>) -> Result<Pcm, AudioError> {
    let (head, data) = with_streamed_sizes_resolved(bytes);
    let reader = match hound::WavReader::new(Cursor::new(head).chain(data)) {
        Ok(reader) => reader,
        Err(e) => return Err(explain_refusal(bytes, e)),
    };
    let spec = reader.spec();
    let float = spec.sample_format == hound::SampleFormat::Float;
    check_encoding(float, spec.bits_per_sample)?;
    if spec.sample_rate == 0 {
        return Err(AudioError::ZeroSampleRate);
    }
    if let Some(max) = max_seconds {
        let seconds = f64::from(reader.duration()) / f64::from(spec.sample_rate);
        if seconds > f64::from(max) {
            return Err(AudioError::ReferenceTooLong { seconds, max });
        }
    }
    let declared = reader.len();
    let unreadable = |e: hound::Error| AudioError::Malformed(format!("data chunk of {declared} samples: {e}"));
    let samples: Vec<f32> = if float {
        let samples = reader
            .into_samples::<f32>()
            .collect::<Result<Vec<_>, _>>()
            .map_err(unreadable)?;
        if let Some((index, &value)) = samples.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(AudioError::NonFinite { index, value });
        }
        samples
    } else {
        let scale = 1.0 / f64::from(1u32 << (spec.bits_per_sample - 1));
        let ints = reader
            .into_samples::<i32>()
            .collect::<Result<Vec<_>, _>>()
            .map_err(unreadable)?;
        ints.into_iter().map(|s| (f64::from(s) * scale) as f32).collect()
    };
    if samples.is_empty() {
        return Err(AudioError::Empty);
    }
    Ok(Pcm {
        sample_rate: spec.sample_rate,
        channels: spec.channels,
        frames: samples.len() / usize::from(spec.channels),
        samples,
    })
}

/// A streamed WAV ([`streaming_wav_header`]: RIFF and data sizes 0xFFFFFFFF, the data
/// running to the end of the file) with the sizes it would have had written whole: the data
/// up to the last whole frame. Any other file is returned as it is. (So a saved stream from
/// `drama serve` reads back, as a reference voice say, like the whole file.) Returned as
/// the file up to its data, the sizes written there, and the data, read after it: only the
/// chunks before the data are copied, never the samples.
fn with_streamed_sizes_resolved(bytes: &[u8]) -> (Cow<'_, [u8]>, &[u8]) {
    let whole = (Cow::Borrowed(bytes), &bytes[..0]);
    let word = |at: usize| -> Option<u32> { Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?)) };
    if bytes.get(0..4) != Some(b"RIFF") || bytes.get(8..12) != Some(b"WAVE") {
        return whole;
    }
    let mut block_align = None;
    let mut at = 12;
    while let (Some(id), Some(size)) = (bytes.get(at..at + 4), word(at + 4)) {
        let body = at + 8;
        if id == b"fmt " {
            block_align = bytes
                .get(body + 12..body + 14)
                .map(|b| usize::from(u16::from_le_bytes([b[0], b[1]])));
        }
        if id == b"data" {
            let rest = bytes.len() - body;
            return match block_align {
                // (A file past 4 GiB is no stream of ours: hound judges it as it is.)
                Some(align) if align > 0 && size == u32::MAX && bytes.len() - 8 <= u32::MAX as usize => {
                    let data = rest - rest % align;
                    let mut head = bytes[..body].to_vec();
                    head[4..8].copy_from_slice(&((body + data - 8) as u32).to_le_bytes());
                    head[at + 4..body].copy_from_slice(&(data as u32).to_le_bytes());
                    (Cow::Owned(head), &bytes[body..body + data])
                }
                _ => whole,
            };
        }
        // Chunks are padded to even sizes.
        at = body.saturating_add(size as usize).saturating_add(size as usize % 2);
    }
    whole
}

/// Mono mix: the mean over channels of each frame (accumulated in f64). A `Pcm` with zero
/// channels gives no samples.
pub fn downmix(pcm: &Pcm) -> Vec<f32> {
    let channels = usize::from(pcm.channels);
    if channels == 0 {
        return Vec::new();
    }
    pcm.samples
        .chunks_exact(channels)
        .map(|frame| (frame.iter().map(|&s| f64::from(s)).sum::<f64>() / channels as f64) as f32)
        .collect()
}

/// A whole mono 16-bit PCM WAV file.
///
/// Each sample becomes `round(clamp(x, -1, 1) * 32767)`, the product taken exactly (in f64) and
/// rounded half away from zero; NaN becomes 0. So 1.0 -> 32767, -1.0 -> -32767, 0.5 -> 16384.
pub fn write_wav_pcm16(samples: &[f32], sample_rate: u32) -> Result<Vec<u8>, AudioError> {
    write_whole(samples, sample_rate, SampleFormat::Pcm16)
}

/// A whole mono 32-bit float WAV file; samples are stored bit for bit.
pub fn write_wav_f32(samples: &[f32], sample_rate: u32) -> Result<Vec<u8>, AudioError> {
    write_whole(samples, sample_rate, SampleFormat::F32)
}

/// The header of a mono WAV of unknown length, for streaming: the same bytes as the header of
/// the whole file [`write_wav_pcm16`] / [`write_wav_f32`] would write, except that the RIFF and
/// data chunk sizes are 0xFFFFFFFF. Follow it with [`encode_samples`] of each chunk.
pub fn streaming_wav_header(sample_rate: u32, format: SampleFormat) -> Result<Vec<u8>, AudioError> {
    let mut header = write_whole(&[], sample_rate, format)?;
    let data_size = header.len() - 4;
    header[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    header[data_size..].copy_from_slice(&u32::MAX.to_le_bytes());
    Ok(header)
}

/// The data chunk bytes (little-endian) of `samples` in `format`, exactly as the whole-file
/// writers store them.
pub fn encode_samples(samples: &[f32], format: SampleFormat) -> Vec<u8> {
    match format {
        SampleFormat::Pcm16 => samples.iter().flat_map(|&x| pcm16(x).to_le_bytes()).collect(),
        SampleFormat::F32 => samples.iter().flat_map(|&x| x.to_le_bytes()).collect(),
    }
}

/// The 16-bit code of one sample (the rule documented on [`write_wav_pcm16`]).
pub(crate) fn pcm16(x: f32) -> i16 {
    if x.is_nan() {
        return 0;
    }
    (f64::from(x.clamp(-1.0, 1.0)) * 32767.0).round() as i16
}

/// Writes a whole mono file with hound, after checking that its 32-bit size fields can hold it.
fn write_whole(samples: &[f32], sample_rate: u32, format: SampleFormat) -> Result<Vec<u8>, AudioError> {
    let bytes = format.bytes();
    let max_rate = u32::MAX / bytes as u32;
    if sample_rate == 0 || sample_rate > max_rate {
        return Err(AudioError::WriteRate {
            rate: sample_rate,
            max: max_rate,
        });
    }
    // The RIFF size counts everything after its own field: at most 60 header bytes plus the data.
    let max_samples = (u32::MAX as usize - 60) / bytes;
    if samples.len() > max_samples {
        return Err(AudioError::TooLong {
            samples: samples.len(),
            max: max_samples,
        });
    }
    let mut out = Cursor::new(Vec::with_capacity(68 + samples.len() * bytes));
    hound_write(&mut out, samples, format.spec(sample_rate), format)
        .expect("hound writes mono 16-bit integer and 32-bit float WAV to memory");
    Ok(out.into_inner())
}

/// Streams `samples` through hound's writer into `out`.
fn hound_write(
    out: &mut Cursor<Vec<u8>>,
    samples: &[f32],
    spec: hound::WavSpec,
    format: SampleFormat,
) -> hound::Result<()> {
    let mut writer = hound::WavWriter::new(out, spec)?;
    match format {
        SampleFormat::Pcm16 => samples.iter().try_for_each(|&x| writer.write_sample(pcm16(x)))?,
        SampleFormat::F32 => samples.iter().try_for_each(|&x| writer.write_sample(x))?,
    }
    writer.finalize()
}

/// Refuses a sample encoding the contract does not accept.
fn check_encoding(float: bool, bits: u16) -> Result<(), AudioError> {
    match (float, bits) {
        (false, 16 | 24 | 32) | (true, 32) => Ok(()),
        (false, _) => Err(AudioError::UnsupportedSamples { kind: "integer", bits }),
        (true, _) => Err(AudioError::UnsupportedSamples { kind: "float", bits }),
    }
}

/// Turns hound's refusal of a header into the most specific message: when the fmt chunk
/// declares an encoding the contract does not accept, that is the reason given.
fn explain_refusal(bytes: &[u8], error: hound::Error) -> AudioError {
    let declared = declared_encoding(bytes).map(|(tag, bits)| match tag {
        WAVE_FORMAT_PCM => check_encoding(false, bits),
        WAVE_FORMAT_IEEE_FLOAT => check_encoding(true, bits),
        other => Err(AudioError::UnsupportedEncoding(other)),
    });
    match declared {
        Some(Err(refusal)) => refusal,
        _ => AudioError::Malformed(match error {
            hound::Error::IoError(e) => format!("the header is truncated ({e})"),
            other => other.to_string(),
        }),
    }
}

const WAVE_FORMAT_PCM: u16 = 1;
const WAVE_FORMAT_IEEE_FLOAT: u16 = 3;
const WAVE_FORMAT_EXTENSIBLE: u16 = 0xFFFE;

/// The format tag and bits per sample of the first fmt chunk, resolving WAVE_FORMAT_EXTENSIBLE
/// to its sub-format; `None` when no fmt chunk can be found.
fn declared_encoding(bytes: &[u8]) -> Option<(u16, u16)> {
    let u16_at = |b: &[u8], at: usize| Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?));
    if bytes.get(0..4)? != b"RIFF" || bytes.get(8..12)? != b"WAVE" {
        return None;
    }
    let mut at = 12;
    loop {
        let id = bytes.get(at..at + 4)?;
        let len = u32::from_le_bytes(bytes.get(at + 4..at + 8)?.try_into().ok()?) as usize;
        let body = bytes.get(at + 8..)?;
        if id == b"fmt " {
            let (tag, bits) = (u16_at(body, 0)?, u16_at(body, 14)?);
            if tag != WAVE_FORMAT_EXTENSIBLE {
                return Some((tag, bits));
            }
            let valid_bits = u16_at(body, 18)?;
            return Some((u16_at(body, 24)?, if valid_bits > 0 { valid_bits } else { bits }));
        }
        at = at.checked_add(8 + len + len % 2)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{rng, uniform};
    use rand_core::Rng;

    /// A canonical 44-byte-header WAV written by hand, for headers hound refuses to write.
    fn handmade(tag: u16, channels: u16, rate: u32, bits: u16, data: &[u8]) -> Vec<u8> {
        let block = channels * bits / 8;
        let mut w = Vec::new();
        w.extend_from_slice(b"RIFF");
        w.extend_from_slice(&(36 + data.len() as u32).to_le_bytes());
        w.extend_from_slice(b"WAVEfmt ");
        w.extend_from_slice(&16u32.to_le_bytes());
        w.extend_from_slice(&tag.to_le_bytes());
        w.extend_from_slice(&channels.to_le_bytes());
        w.extend_from_slice(&rate.to_le_bytes());
        w.extend_from_slice(&(rate * u32::from(block)).to_le_bytes());
        w.extend_from_slice(&block.to_le_bytes());
        w.extend_from_slice(&bits.to_le_bytes());
        w.extend_from_slice(b"data");
        w.extend_from_slice(&(data.len() as u32).to_le_bytes());
        w.extend_from_slice(data);
        w
    }

    /// Writes interleaved samples with hound.
    fn hound_wav<S: hound::Sample + Copy>(spec: hound::WavSpec, samples: &[S]) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        let mut writer = hound::WavWriter::new(&mut out, spec).unwrap();
        for &s in samples {
            writer.write_sample(s).unwrap();
        }
        writer.finalize().unwrap();
        out.into_inner()
    }

    fn spec(channels: u16, rate: u32, bits: u16, float: bool) -> hound::WavSpec {
        hound::WavSpec {
            channels,
            sample_rate: rate,
            bits_per_sample: bits,
            sample_format: if float {
                hound::SampleFormat::Float
            } else {
                hound::SampleFormat::Int
            },
        }
    }

    /// The body of the data chunk, found by walking the chunks.
    fn data_chunk(file: &[u8]) -> &[u8] {
        let mut at = 12;
        loop {
            let len = u32::from_le_bytes(file[at + 4..at + 8].try_into().unwrap()) as usize;
            if &file[at..at + 4] == b"data" {
                return &file[at + 8..at + 8 + len];
            }
            at += 8 + len;
        }
    }

    fn refusal(bytes: &[u8]) -> String {
        read_wav(bytes).expect_err("must be refused").to_string()
    }

    #[test]
    fn integer_formats_round_trip_scaled_by_two_to_bits_minus_one() {
        let mut rng = rng("integer_formats_round_trip");
        for bits in [16u16, 24, 32] {
            for channels in [1u16, 2, 3] {
                let frames = 37;
                let half = 1i64 << (bits - 1);
                let mut ints: Vec<i32> = (0..frames * usize::from(channels))
                    .map(|_| (i64::from(rng.next_u32()) % (2 * half) - half) as i32)
                    .collect();
                ints[0] = (-half) as i32;
                ints[1] = (half - 1) as i32;
                let rate = 8000 + rng.next_u32() % 40000;
                let pcm = read_wav(&hound_wav(spec(channels, rate, bits, false), &ints)).unwrap();
                assert_eq!((pcm.sample_rate, pcm.channels, pcm.frames), (rate, channels, frames));
                for (&got, &int) in pcm.samples.iter().zip(&ints) {
                    let want = (int as f64 / half as f64) as f32;
                    assert_eq!(got, want, "{bits}-bit, {channels} ch: {int}");
                }
                assert_eq!(pcm.samples[0], -1.0);
                assert!(pcm.samples[1] <= 1.0 && (bits == 32 || pcm.samples[1] < 1.0));
                check_downmix(&pcm);
            }
        }
    }

    #[test]
    fn float_format_round_trips_bit_for_bit() {
        let mut rng = rng("float_format_round_trips");
        for channels in [1u16, 2, 3] {
            let values = uniform(&mut rng, 41 * usize::from(channels), 1.5);
            let pcm = read_wav(&hound_wav(spec(channels, 22050, 32, true), &values)).unwrap();
            assert_eq!((pcm.sample_rate, pcm.channels, pcm.frames), (22050, channels, 41));
            assert_eq!(pcm.samples, values);
            check_downmix(&pcm);
        }
    }

    fn check_downmix(pcm: &Pcm) {
        let c = usize::from(pcm.channels);
        let mono = downmix(pcm);
        assert_eq!(mono.len(), pcm.frames);
        for (f, &m) in mono.iter().enumerate() {
            let mut sum = 0.0f64;
            for ch in 0..c {
                sum += f64::from(pcm.samples[f * c + ch]);
            }
            assert!((f64::from(m) - sum / c as f64).abs() <= 1e-7, "frame {f}");
        }
        if c == 1 {
            assert_eq!(mono, pcm.samples);
        }
    }

    #[test]
    fn refuses_8_bit_with_the_reason() {
        let bytes = hound_wav(spec(1, 16000, 8, false), &[1i8, -3, 5]);
        assert_eq!(
            refusal(&bytes),
            "WAV: 8-bit integer samples are not supported (16, 24, 32-bit integer or 32-bit float)"
        );
    }

    #[test]
    fn refuses_64_bit_float_with_the_reason() {
        let bytes = handmade(3, 1, 16000, 64, &[0u8; 16]);
        assert_eq!(
            refusal(&bytes),
            "WAV: 64-bit float samples are not supported (16, 24, 32-bit integer or 32-bit float)"
        );
    }

    #[test]
    fn refuses_other_encodings_and_bad_headers() {
        assert!(refusal(&handmade(7, 1, 8000, 8, &[0u8; 4])).contains("format tag 0x0007"));
        assert!(refusal(&handmade(1, 1, 8000, 12, &[0u8; 4])).contains("12-bit integer"));
        assert!(refusal(&handmade(1, 0, 8000, 16, &[0u8; 4])).contains("zero channels"));
        assert_eq!(
            refusal(&handmade(1, 1, 0, 16, &[0u8; 4])),
            "WAV: the sample rate is 0 Hz"
        );
        assert_eq!(
            refusal(&handmade(1, 2, 8000, 16, &[])),
            "WAV: the data chunk holds no samples"
        );
    }

    #[test]
    fn refuses_garbage_truncation_and_non_finite_samples() {
        assert!(refusal(b"this is not a wav file at all").contains("no RIFF tag"));
        assert!(refusal(b"").starts_with("WAV: the header is truncated"));
        assert!(refusal(b"RIFF\x10\0\0\0WAVEfmt ").starts_with("WAV: the header is truncated"));
        let whole = hound_wav(spec(1, 16000, 16, false), &[1i16, 2, 3, 4]);
        let cut = refusal(&whole[..whole.len() - 3]);
        assert!(cut.starts_with("WAV: data chunk of 4 samples"), "{cut}");
        let nan = hound_wav(spec(1, 16000, 32, true), &[0.0f32, f32::NAN]);
        assert_eq!(refusal(&nan), "WAV: sample 1 is not finite (NaN)");
    }

    /// A reference recording is refused by the length its data chunk declares, before its
    /// samples are decoded: a header declaring two hours over a few bytes is too long, not
    /// truncated; one declaring the limit exactly is decoded (and found truncated).
    #[test]
    fn a_reference_is_refused_by_its_declared_length_before_decoding() {
        let declaring = |seconds: u32| {
            let mut bytes = handmade(1, 2, 8000, 16, &[1, 0, 2, 0, 3, 0, 4, 0]);
            let data_bytes = seconds * 8000 * 4;
            bytes[40..44].copy_from_slice(&data_bytes.to_le_bytes());
            bytes
        };
        let refused = |bytes: &[u8]| read_reference_wav(bytes, 60).expect_err("refused").to_string();
        assert_eq!(
            refused(&declaring(7200)),
            "a reference recording of 7200.0 s is longer than the 60 s a voice is made from"
        );
        assert!(refused(&declaring(60)).starts_with("WAV: data chunk of 960000 samples"));
        let whole = handmade(1, 2, 8000, 16, &[1, 0, 2, 0, 3, 0, 4, 0]);
        assert_eq!(read_reference_wav(&whole, 60).unwrap(), read_wav(&whole).unwrap());
    }

    #[test]
    fn pcm16_clamps_scales_and_rounds_half_away_from_zero() {
        let x = [
            0.0,
            1.0,
            -1.0,
            0.5,
            -0.5,
            2.0,
            -7.0,
            f32::NAN,
            1.0 / 32767.0,
            1.4 / 32767.0,
        ];
        let file = write_wav_pcm16(&x, 24000).unwrap();
        let codes: Vec<i16> = data_chunk(&file)
            .chunks_exact(2)
            .map(|b| i16::from_le_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(codes, [0, 32767, -32767, 16384, -16384, 32767, -32767, 0, 1, 1]);
        let pcm = read_wav(&file).unwrap();
        assert_eq!((pcm.sample_rate, pcm.channels, pcm.frames), (24000, 1, x.len()));
        assert_eq!(pcm.samples[3], 16384.0 / 32768.0);
    }

    #[test]
    fn f32_writer_round_trips_bit_for_bit() {
        let x = uniform(&mut rng("f32_writer_round_trips"), 300, 1.0);
        let pcm = read_wav(&write_wav_f32(&x, 48000).unwrap()).unwrap();
        assert_eq!((pcm.sample_rate, pcm.frames), (48000, 300));
        assert_eq!(pcm.samples, x);
    }

    #[test]
    fn streamed_equals_whole_except_the_unknown_sizes() {
        let x = uniform(&mut rng("streamed_equals_whole"), 501, 1.2);
        for format in [SampleFormat::Pcm16, SampleFormat::F32] {
            let whole = match format {
                SampleFormat::Pcm16 => write_wav_pcm16(&x, 16000).unwrap(),
                SampleFormat::F32 => write_wav_f32(&x, 16000).unwrap(),
            };
            assert_eq!(encode_samples(&x, format), data_chunk(&whole), "{format:?}");
            let header = streaming_wav_header(16000, format).unwrap();
            assert_eq!(header.len(), if format == SampleFormat::Pcm16 { 44 } else { 68 });
            let mut streamed = header.clone();
            for chunk in x.chunks(97) {
                streamed.extend(encode_samples(chunk, format));
            }
            assert_eq!(streamed.len(), whole.len());
            let n = header.len();
            assert_eq!(&streamed[4..8], [0xFF; 4]);
            assert_eq!(&streamed[n - 4..n], [0xFF; 4]);
            assert_eq!(&streamed[..4], &whole[..4]);
            assert_eq!(&streamed[8..n - 4], &whole[8..n - 4]);
            assert_eq!(&streamed[n..], &whole[n..]);
            // A saved stream reads back as the whole file, a frame cut short at its end
            // (a stream stopped mid-sample) left out.
            assert_eq!(read_wav(&streamed).unwrap(), read_wav(&whole).unwrap(), "{format:?}");
            streamed.push(0x12);
            let mut shorter = read_wav(&whole).unwrap();
            assert_eq!(read_wav(&streamed).unwrap(), shorter, "{format:?}");
            streamed.truncate(streamed.len() - 1 - format.bytes());
            shorter.samples.pop();
            shorter.frames -= 1;
            assert_eq!(read_wav(&streamed).unwrap(), shorter, "{format:?}");
        }
    }

    #[test]
    fn writers_refuse_rates_and_lengths_wav_cannot_declare() {
        let e = write_wav_f32(&[0.0], 0).unwrap_err().to_string();
        assert!(e.contains("sample rate of 0 Hz"), "{e}");
        assert!(streaming_wav_header(u32::MAX, SampleFormat::Pcm16).is_err());
        assert!(write_wav_pcm16(&[0.0], u32::MAX / 2).is_ok());
    }
}
