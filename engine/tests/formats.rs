//! The output formats, read back by decoders that are not drama's: symphonia for WAV, MP3 and
//! FLAC, the ogg crate's reader with libopus's decoder for Opus. Lossless formats must give
//! back the WAV's 16-bit codes exactly; lossy ones the same length and time alignment within
//! a signal-to-noise bound. A stream pushed in random pieces must be the whole file's bytes.

use std::io::Cursor;

use drama_engine::audio::{AudioError, AudioFormat, SampleFormat, encode_samples};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;
use rand_core::Rng;
use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::DecoderOptions;
use symphonia::core::formats::FormatOptions;
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;

const RATE: u32 = 24_000;

fn rng(label: &str) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(label.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }))
}

fn uniform(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// Speech-like test audio: voiced stretches (a random pitch's harmonics under a slow
/// envelope) with a little noise, a few hundred ms of each, `len` samples.
fn speech_like(rng: &mut ChaCha8Rng, len: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let stretch = (RATE as f64 * (0.15 + 0.3 * uniform(rng))) as usize;
        let pitch = 90.0 + 160.0 * uniform(rng);
        let gains: Vec<f64> = (1..=12).map(|h| uniform(rng) / h as f64).collect();
        for i in 0..stretch.min(len - out.len()) {
            let t = i as f64 / RATE as f64;
            let envelope = (std::f64::consts::PI * i as f64 / stretch as f64).sin();
            let voiced: f64 = gains
                .iter()
                .enumerate()
                .map(|(h, g)| g * (2.0 * std::f64::consts::PI * pitch * (h + 1) as f64 * t).sin())
                .sum();
            out.push((0.3 * envelope * voiced + 0.01 * (uniform(rng) - 0.5)) as f32);
        }
    }
    out
}

/// The 16-bit codes the WAV of `samples` holds.
fn codes(samples: &[f32]) -> Vec<i16> {
    encode_samples(samples, SampleFormat::Pcm16)
        .chunks_exact(2)
        .map(|pair| i16::from_le_bytes([pair[0], pair[1]]))
        .collect()
}

/// `samples` pushed in random pieces (some empty), then finished.
fn streamed(format: AudioFormat, samples: &[f32], rng: &mut ChaCha8Rng) -> Vec<u8> {
    let mut encoder = format.encoder(RATE).unwrap();
    let mut bytes = Vec::new();
    let mut start = 0;
    while start < samples.len() {
        let piece = (rng.next_u32() % 7000) as usize;
        let stop = (start + piece).min(samples.len());
        bytes.extend(encoder.push(&samples[start..stop]).unwrap());
        start = stop;
    }
    bytes.extend(encoder.finish().unwrap());
    bytes
}

/// Decodes with symphonia: the sample rate, channels and samples.
fn symphonia_decode(bytes: Vec<u8>, extension: &str) -> (u32, usize, Vec<i16>) {
    let source = MediaSourceStream::new(Box::new(Cursor::new(bytes)), Default::default());
    let mut hint = Hint::new();
    hint.with_extension(extension);
    let probed = symphonia::default::get_probe()
        .format(&hint, source, &FormatOptions::default(), &MetadataOptions::default())
        .expect("symphonia recognises the file");
    let mut reader = probed.format;
    let track = reader.default_track().expect("a track").clone();
    let mut decoder = symphonia::default::get_codecs()
        .make(&track.codec_params, &DecoderOptions::default())
        .expect("a decoder");
    let mut samples = Vec::new();
    let mut channels = 0;
    loop {
        let packet = match reader.next_packet() {
            Ok(packet) => packet,
            Err(symphonia::core::errors::Error::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => panic!("reading {extension}: {e}"),
        };
        let decoded = decoder
            .decode(&packet)
            .unwrap_or_else(|e| panic!("decoding {extension}: {e}"));
        channels = decoded.spec().channels.count();
        let mut buffer = SampleBuffer::<i16>::new(decoded.capacity() as u64, *decoded.spec());
        buffer.copy_interleaved_ref(decoded);
        samples.extend_from_slice(buffer.samples());
    }
    (track.codec_params.sample_rate.expect("a rate"), channels, samples)
}

/// Decodes Ogg Opus with the ogg crate's reader and libopus: the samples at `RATE` after the
/// header's pre-skip, cut at the last page's granule position (RFC 7845 §4).
fn opus_decode(bytes: Vec<u8>) -> Vec<i16> {
    let mut reader = ogg::PacketReader::new(Cursor::new(bytes));
    let head = reader.read_packet_expected().expect("OpusHead");
    assert_eq!(&head.data[..8], b"OpusHead");
    assert_eq!(head.data[9], 1, "one channel");
    let pre_skip = u16::from_le_bytes([head.data[10], head.data[11]]) as usize;
    let tags = reader.read_packet_expected().expect("OpusTags");
    assert_eq!(&tags.data[..8], b"OpusTags");
    let mut decoder = opus::Decoder::new(RATE, opus::Channels::Mono).unwrap();
    let (mut samples, mut end) = (Vec::new(), None);
    while let Some(packet) = reader.read_packet().expect("an Ogg page") {
        let mut frame = vec![0i16; 5760];
        let n = decoder.decode(&packet.data, &mut frame, false).unwrap();
        samples.extend_from_slice(&frame[..n]);
        if packet.last_in_stream() {
            end = Some(packet.absgp_page() as usize);
        }
    }
    let step = 48_000 / RATE as usize;
    let end = end.expect("the stream ends") / step;
    assert!(
        end <= samples.len(),
        "the end position {end} is past the {} decoded samples",
        samples.len()
    );
    samples.truncate(end);
    samples.split_off(pre_skip / step)
}

/// Signal-to-noise ratio in dB of `got` against `want`, `got` shifted by `lag` samples.
fn snr_db(want: &[i16], got: &[i16], lag: usize) -> f64 {
    let (mut signal, mut noise) = (0.0f64, 0.0f64);
    for (i, &w) in want.iter().enumerate() {
        let g = got.get(i + lag).copied().unwrap_or(0);
        signal += f64::from(w).powi(2);
        noise += (f64::from(w) - f64::from(g)).powi(2);
    }
    10.0 * (signal / noise.max(1e-9)).log10()
}

/// The lag in `0..max_lag` at which `got` matches `want` best, and the SNR there.
fn best_alignment(want: &[i16], got: &[i16], max_lag: usize) -> (usize, f64) {
    (0..max_lag)
        .map(|lag| (lag, snr_db(want, got, lag)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap()
}

#[test]
fn streamed_pieces_are_the_whole_file() {
    let mut rng = rng("streamed pieces are the whole file");
    let samples = speech_like(&mut rng, 3 * RATE as usize + 1234);
    for format in AudioFormat::ALL {
        let whole = format.encode_whole(&samples, RATE).unwrap();
        let streamed = streamed(format, &samples, &mut rng);
        if format == AudioFormat::Wav {
            // The whole file's RIFF and data sizes are known; the stream's are 0xFFFFFFFF.
            assert_eq!(streamed.len(), whole.len());
            assert_eq!(&streamed[4..8], &u32::MAX.to_le_bytes());
            assert_eq!((&streamed[8..40], &streamed[44..]), (&whole[8..40], &whole[44..]));
        } else if format == AudioFormat::Flac {
            // STREAMINFO's 36-bit length (from the low half of byte 21) and MD5 (bytes 26 to
            // 42): unknown in the stream, filled in the whole file.
            assert_eq!(streamed.len(), whole.len());
            assert!(streamed[..21] == whole[..21] && streamed[21] >> 4 == whole[21] >> 4);
            assert!(streamed[42..] == whole[42..], "flac: the frames differ");
            assert_eq!(&streamed[21..26], &[streamed[21] & 0xF0, 0, 0, 0, 0]);
            assert_eq!(&streamed[26..42], &[0; 16], "a streamed FLAC's MD5 is unknown");
            let length = u64::from_be_bytes(whole[18..26].try_into().unwrap()) & ((1 << 36) - 1);
            assert_eq!(length, samples.len() as u64);
            use md5::Digest;
            let digest = md5::Md5::digest(encode_samples(&samples, SampleFormat::Pcm16));
            assert_eq!(&whole[26..42], digest.as_slice());
        } else {
            assert!(streamed == whole, "{}: the stream is not the whole file", format.name());
        }
    }
}

#[test]
fn lossless_formats_give_back_the_wav_codes() {
    let mut rng = rng("lossless formats give back the wav codes");
    for len in [1, 4095, 4096, 4097, RATE as usize * 2 + 777] {
        let samples = speech_like(&mut rng, len);
        let want = codes(&samples);
        let flac = AudioFormat::Flac.encode_whole(&samples, RATE).unwrap();
        assert_eq!(&flac[..4], b"fLaC");
        assert_eq!(
            symphonia_decode(flac, "flac"),
            (RATE, 1, want.clone()),
            "flac, {len} samples"
        );
        let wav = AudioFormat::Wav.encode_whole(&samples, RATE).unwrap();
        assert_eq!(
            symphonia_decode(wav, "wav"),
            (RATE, 1, want.clone()),
            "wav, {len} samples"
        );
        let pcm = AudioFormat::Pcm.encode_whole(&samples, RATE).unwrap();
        assert_eq!(pcm, encode_samples(&samples, SampleFormat::Pcm16));
    }
}

#[test]
fn mp3_decodes_to_the_speech_within_its_bound() {
    let mut rng = rng("mp3 decodes to the speech");
    let samples = speech_like(&mut rng, 2 * RATE as usize + 999);
    let want = codes(&samples);
    let (rate, channels, got) = symphonia_decode(AudioFormat::Mp3.encode_whole(&samples, RATE).unwrap(), "mp3");
    assert_eq!((rate, channels), (RATE, 1));
    // LAME's and the decoder's delays put the speech about 1105 samples in; whole 576-sample
    // frames follow it.
    let (lag, snr) = best_alignment(&want, &got, 2400);
    eprintln!(
        "mp3: lag {lag} samples, SNR {snr:.1} dB, {} samples for {}",
        got.len(),
        want.len()
    );
    assert!((1000..1300).contains(&lag), "lag {lag}");
    assert!(
        got.len() >= want.len() + lag && got.len() <= want.len() + lag + 2 * 576,
        "{} samples",
        got.len()
    );
    assert!(snr > 15.0, "SNR {snr:.1} dB");
}

#[test]
fn opus_decodes_to_the_speech_within_its_bound() {
    let mut rng = rng("opus decodes to the speech");
    for len in [1, 480, 2 * RATE as usize + 999] {
        let samples = speech_like(&mut rng, len);
        let want = codes(&samples);
        let got = opus_decode(AudioFormat::Opus.encode_whole(&samples, RATE).unwrap());
        // The pre-skip and the end position make the decoded length exactly the input's.
        assert_eq!(got.len(), want.len(), "{len} samples");
        if len > RATE as usize {
            let (lag, snr) = best_alignment(&want, &got, 48);
            eprintln!("opus: lag {lag} samples, SNR {snr:.1} dB");
            assert_eq!(lag, 0, "the pre-skip aligns the speech");
            assert!(snr > 10.0, "SNR {snr:.1} dB");
        }
    }
}

#[test]
fn formats_refuse_rates_they_cannot_hold() {
    for (format, rate) in [(AudioFormat::Mp3, 22_000), (AudioFormat::Opus, 44_100)] {
        match format.encoder(rate) {
            Err(e @ AudioError::FormatRate { .. }) => {
                let message = e.to_string();
                assert!(
                    message.starts_with(&format!("{} cannot hold audio at {rate} Hz", format.name())),
                    "{message}"
                );
            }
            Err(e) => panic!("{}: {e}", format.name()),
            Ok(_) => panic!("{} took {rate} Hz", format.name()),
        }
    }
    assert!(AudioFormat::Flac.encoder(44_100).is_ok());
}

#[test]
fn names_and_extensions() {
    for format in AudioFormat::ALL {
        assert_eq!(AudioFormat::from_name(format.name()), Some(format));
        let path = format!("out.{}", format.name().to_uppercase());
        assert_eq!(AudioFormat::for_path(std::path::Path::new(&path)), Some(format));
    }
    assert_eq!(
        AudioFormat::for_path(std::path::Path::new("a.ogg")),
        Some(AudioFormat::Opus)
    );
    assert_eq!(AudioFormat::for_path(std::path::Path::new("a.aac")), None);
    assert_eq!(AudioFormat::from_name("aac"), None);
}
