//! The reference-voice audio front end of `docs/contract.md` §7, and the output formats.
//!
//! - [`wav`]: reading WAV (PCM 16/24/32-bit integer, 32-bit float), downmixing, writing
//!   whole and streamed WAV.
//! - [`formats`]: speech written as WAV, PCM, MP3, Opus or FLAC, whole or as it is made.
//! - [`resample`]: sample-rate conversion to the voice tower's rate.
//! - [`mel`]: the contract's log-mel spectrogram.

pub mod formats;
pub mod mel;
pub mod resample;
pub mod wav;

pub use formats::{AudioEncoder, AudioFormat};
pub use mel::{Mel, log_mel, mel_filters};
pub use resample::resample;
pub use wav::{
    Pcm, SampleFormat, downmix, encode_samples, read_reference_wav, read_wav, streaming_wav_header, write_wav_f32,
    write_wav_pcm16,
};

/// Why audio was refused. Every message names what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum AudioError {
    /// The bytes are not a readable WAV file.
    #[error("WAV: {0}")]
    Malformed(String),
    /// The WAV's sample encoding is not one the contract accepts.
    #[error("WAV: {bits}-bit {kind} samples are not supported (16, 24, 32-bit integer or 32-bit float)")]
    UnsupportedSamples {
        /// `"integer"` or `"float"`.
        kind: &'static str,
        /// Bits per sample declared by the file.
        bits: u16,
    },
    /// The WAV's format tag is neither PCM integer nor IEEE float.
    #[error("WAV: format tag 0x{0:04x} is not supported (PCM integer or IEEE float only)")]
    UnsupportedEncoding(u16),
    /// The WAV declares a sample rate of zero.
    #[error("WAV: the sample rate is 0 Hz")]
    ZeroSampleRate,
    /// The WAV's data chunk holds no samples.
    #[error("WAV: the data chunk holds no samples")]
    Empty,
    /// A float sample is NaN or infinite.
    #[error("WAV: sample {index} is not finite ({value})")]
    NonFinite {
        /// Index of the sample in the interleaved data.
        index: usize,
        /// The value read.
        value: f32,
    },
    /// A WAV cannot be written at this sample rate (the byte rate must fit 32 bits).
    #[error("WAV: cannot write a sample rate of {rate} Hz (1 to {max} Hz for this sample format)")]
    WriteRate {
        /// The requested rate.
        rate: u32,
        /// The largest rate the format can declare.
        max: u32,
    },
    /// Too many samples for one WAV file (the RIFF sizes are 32-bit).
    #[error("WAV: {samples} samples do not fit in one WAV file (at most {max} for this sample format)")]
    TooLong {
        /// Samples given.
        samples: usize,
        /// The most one file can hold.
        max: usize,
    },
    /// A resampling rate is zero or the two rates are too far apart.
    #[error("resample {from} Hz -> {to} Hz: {problem}")]
    Rates {
        /// Input rate.
        from: u32,
        /// Output rate.
        to: u32,
        /// What is wrong with them.
        problem: String,
    },
    /// A reference recording longer than a voice is made from.
    #[error("a reference recording of {seconds:.1} s is longer than the {max} s a voice is made from")]
    ReferenceTooLong {
        /// The recording's length.
        seconds: f64,
        /// The longest accepted, in seconds.
        max: u32,
    },
    /// The resampler refused to run.
    #[error("resample: {0}")]
    Resampler(String),
    /// The audio is shorter than one analysis frame.
    #[error("audio too short: {samples} samples, fewer than one frame of n_fft = {n_fft}")]
    TooShort {
        /// Samples given.
        samples: usize,
        /// Frame length.
        n_fft: usize,
    },
    /// An output format cannot hold speech at this sample rate.
    #[error("{format} cannot hold audio at {rate} Hz (it takes {rates:?} Hz); choose wav, pcm or flac")]
    FormatRate {
        /// The format's name.
        format: &'static str,
        /// The speech's rate.
        rate: u32,
        /// The rates the format takes.
        rates: &'static [u32],
    },
    /// An output encoder failed.
    #[error("encoding {format}: {reason}")]
    Encode {
        /// The format's name.
        format: &'static str,
        /// What the encoder reported.
        reason: String,
    },
    /// The voice tower's analysis parameters cannot produce a spectrogram.
    #[error("voice_tower.{key}: {problem}")]
    Config {
        /// The config key at fault.
        key: &'static str,
        /// What is wrong with it.
        problem: String,
    },
}
