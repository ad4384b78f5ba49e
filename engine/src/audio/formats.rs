//! The file formats speech is written in (`drama synth -o`, the service's `response_format`),
//! each through an encoder that takes the speech as it is made: the bytes every call returns,
//! in order, are the whole file, so a streamed response and a whole one are the same bytes
//! but for the header fields a stream cannot know (a WAV's sizes, a FLAC's length and MD5).
//!
//! - WAV: 16-bit PCM; streamed with the sizes unknown (0xFFFFFFFF), as a whole file with
//!   them filled in ([`crate::audio::write_wav_pcm16`]).
//! - PCM: the WAV's samples with no header.
//! - MP3: LAME (through `mp3lame-encoder`), 64 kb/s constant bit rate, no Xing/LAME tag
//!   (it would have to be written back at the start, which a stream cannot do).
//! - Opus: libopus (through `opus`) in Ogg (RFC 7845), 20 ms frames at 48 kb/s, one page
//!   per frame so that each is sent as soon as it is encoded.
//! - FLAC: `flacenc`, 16-bit, blocks of [`FLAC_BLOCK`] samples. Streamed, the header leaves
//!   the total length and the MD5 of the samples unknown (zero), as streamed FLAC does; the
//!   whole file has them (readers such as libsndfile need the length).
//!
//! All are lossless in their 16-bit samples but MP3 and Opus; the samples are the WAV's
//! (the rounding rule of [`crate::audio::write_wav_pcm16`]).

use std::path::Path;

use super::AudioError;
use super::wav::{SampleFormat, encode_samples, pcm16, streaming_wav_header};

/// Samples per FLAC block: the FLAC reference encoder's default.
pub const FLAC_BLOCK: usize = 4096;

/// MP3's bit rate: speech in mono at 24 kHz is clear at 64 kb/s.
const MP3_BITRATE: mp3lame_encoder::Bitrate = mp3lame_encoder::Bitrate::Kbps64;

/// Opus's bit rate in bits per second: transparent for mono speech.
const OPUS_BITRATE: i32 = 48_000;

/// The Ogg stream's serial number. One logical stream per file needs no random serial, and a
/// fixed one keeps repeated requests byte-identical.
const OGG_SERIAL: u32 = 0x6472_616d;

/// The sample rates MP3 takes (MPEG-1, MPEG-2 and MPEG-2.5 layer III).
const MP3_RATES: [u32; 9] = [8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000];

/// The sample rates Opus takes.
const OPUS_RATES: [u32; 5] = [8000, 12000, 16000, 24000, 48000];

/// A file format speech can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AudioFormat {
    /// WAV, 16-bit PCM.
    Wav,
    /// Raw 16-bit little-endian PCM.
    Pcm,
    /// MP3.
    Mp3,
    /// Opus in Ogg.
    Opus,
    /// FLAC.
    Flac,
}

impl AudioFormat {
    /// Every format, in the order the docs list them.
    pub const ALL: [AudioFormat; 5] = [
        AudioFormat::Wav,
        AudioFormat::Pcm,
        AudioFormat::Mp3,
        AudioFormat::Opus,
        AudioFormat::Flac,
    ];

    /// Its name, as `response_format` gives it.
    pub fn name(self) -> &'static str {
        match self {
            AudioFormat::Wav => "wav",
            AudioFormat::Pcm => "pcm",
            AudioFormat::Mp3 => "mp3",
            AudioFormat::Opus => "opus",
            AudioFormat::Flac => "flac",
        }
    }

    /// The format named `name`.
    pub fn from_name(name: &str) -> Option<AudioFormat> {
        AudioFormat::ALL.into_iter().find(|format| format.name() == name)
    }

    /// The format a file name's extension asks for (`.wav`, `.pcm`, `.mp3`, `.opus` or
    /// `.ogg`, `.flac`; any case).
    pub fn for_path(path: &Path) -> Option<AudioFormat> {
        let extension = path.extension()?.to_str()?.to_ascii_lowercase();
        match extension.as_str() {
            "ogg" => Some(AudioFormat::Opus),
            other => AudioFormat::from_name(other),
        }
    }

    /// The media type of its bytes.
    pub fn media_type(self) -> &'static str {
        match self {
            AudioFormat::Wav => "audio/wav",
            AudioFormat::Pcm => "audio/pcm",
            AudioFormat::Mp3 => "audio/mpeg",
            AudioFormat::Opus => "audio/ogg; codecs=opus",
            AudioFormat::Flac => "audio/flac",
        }
    }

    /// An encoder of mono speech at `sample_rate`, or why this format cannot hold it.
    pub fn encoder(self, sample_rate: u32) -> Result<Box<dyn AudioEncoder>, AudioError> {
        Ok(match self {
            AudioFormat::Wav => Box::new(Uncompressed {
                header: streaming_wav_header(sample_rate, SampleFormat::Pcm16)?,
            }),
            AudioFormat::Pcm => Box::new(Uncompressed { header: Vec::new() }),
            AudioFormat::Mp3 => Box::new(Mp3::new(sample_rate)?),
            AudioFormat::Opus => Box::new(OggOpus::new(sample_rate)?),
            AudioFormat::Flac => Box::new(Flac::new(sample_rate)?),
        })
    }

    /// The whole file of `samples` at `sample_rate`: the bytes a stream of them would be,
    /// except that a WAV's sizes and a FLAC's length and MD5 are filled in.
    pub fn encode_whole(self, samples: &[f32], sample_rate: u32) -> Result<Vec<u8>, AudioError> {
        match self {
            AudioFormat::Wav => return super::write_wav_pcm16(samples, sample_rate),
            AudioFormat::Flac => {
                let mut flac = Flac::new(sample_rate)?;
                let mut bytes = flac.push(samples)?;
                bytes.extend(flac.finish()?);
                let header = flac.complete_header()?;
                bytes[..header.len()].copy_from_slice(&header);
                return Ok(bytes);
            }
            _ => {}
        }
        let mut encoder = self.encoder(sample_rate)?;
        let mut bytes = encoder.push(samples)?;
        bytes.extend(encoder.finish()?);
        Ok(bytes)
    }
}

/// Encodes mono speech as it is made. [`AudioEncoder::push`] returns the bytes complete so
/// far (the file's header with the first call), [`AudioEncoder::finish`] the rest; together,
/// in order, they are the file.
pub trait AudioEncoder: Send {
    /// Encodes `samples` (in [-1, 1]) after those pushed before.
    fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, AudioError>;
    /// Ends the file: what the encoder still holds, and any closing bytes.
    fn finish(&mut self) -> Result<Vec<u8>, AudioError>;
}

/// The samples of `samples` as 16-bit codes.
fn codes(samples: &[f32]) -> Vec<i16> {
    samples.iter().map(|&x| pcm16(x)).collect()
}

fn encode_error(format: AudioFormat, reason: impl std::fmt::Display) -> AudioError {
    AudioError::Encode {
        format: format.name(),
        reason: reason.to_string(),
    }
}

/// The rate check of the formats that take only some rates.
fn check_rate(format: AudioFormat, rate: u32, rates: &'static [u32]) -> Result<(), AudioError> {
    if rates.contains(&rate) {
        return Ok(());
    }
    Err(AudioError::FormatRate {
        format: format.name(),
        rate,
        rates,
    })
}

/// WAV (streamed, sizes unknown) and PCM: a header, then the samples.
struct Uncompressed {
    /// Bytes not yet returned: the header until the first call.
    header: Vec<u8>,
}

impl AudioEncoder for Uncompressed {
    fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, AudioError> {
        let mut bytes = std::mem::take(&mut self.header);
        bytes.extend(encode_samples(samples, SampleFormat::Pcm16));
        Ok(bytes)
    }

    fn finish(&mut self) -> Result<Vec<u8>, AudioError> {
        Ok(std::mem::take(&mut self.header))
    }
}

/// MP3 through LAME.
struct Mp3 {
    lame: mp3lame_encoder::Encoder,
}

impl Mp3 {
    fn new(sample_rate: u32) -> Result<Mp3, AudioError> {
        use mp3lame_encoder::{Builder, Mode, Quality};
        check_rate(AudioFormat::Mp3, sample_rate, &MP3_RATES)?;
        let fail = |e: mp3lame_encoder::BuildError| encode_error(AudioFormat::Mp3, e);
        let mut builder = Builder::new().ok_or_else(|| encode_error(AudioFormat::Mp3, "LAME did not start"))?;
        builder.set_num_channels(1).map_err(fail)?;
        builder.set_sample_rate(sample_rate).map_err(fail)?;
        builder
            .set_output_sample_rate(std::num::NonZeroU32::new(sample_rate))
            .map_err(fail)?;
        builder.set_mode(Mode::Mono).map_err(fail)?;
        builder.set_brate(MP3_BITRATE).map_err(fail)?;
        builder.set_quality(Quality::Good).map_err(fail)?;
        builder.set_to_write_vbr_tag(false).map_err(fail)?;
        Ok(Mp3 {
            lame: builder.build().map_err(fail)?,
        })
    }
}

impl AudioEncoder for Mp3 {
    fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, AudioError> {
        let codes = codes(samples);
        // LAME writes into the vector's spare room and reads a room of zero as unbounded:
        // the room it may need is reserved first.
        let mut bytes = Vec::with_capacity(mp3lame_encoder::max_required_buffer_size(codes.len()));
        self.lame
            .encode_to_vec(mp3lame_encoder::MonoPcm(&codes), &mut bytes)
            .map_err(|e| encode_error(AudioFormat::Mp3, e))?;
        Ok(bytes)
    }

    fn finish(&mut self) -> Result<Vec<u8>, AudioError> {
        let mut bytes = Vec::with_capacity(mp3lame_encoder::max_required_buffer_size(0));
        self.lame
            .flush_to_vec::<mp3lame_encoder::FlushGap>(&mut bytes)
            .map_err(|e| encode_error(AudioFormat::Mp3, e))?;
        Ok(bytes)
    }
}

/// Opus frames in Ogg pages (RFC 7845).
struct OggOpus {
    opus: opus::Encoder,
    pages: ogg::PacketWriter<'static, Vec<u8>>,
    /// Samples per 20 ms frame at the input rate.
    frame: usize,
    /// 48 kHz samples per input sample (Ogg Opus counts time at 48 kHz).
    granule_step: u64,
    /// The encoder's lookahead at the input rate: the stream's pre-skip.
    lookahead: usize,
    /// Samples pushed and not yet encoded (less than a frame).
    pending: Vec<i16>,
    /// Input samples pushed in all.
    pushed: u64,
    /// Frames encoded so far.
    frames: u64,
}

impl OggOpus {
    fn new(sample_rate: u32) -> Result<OggOpus, AudioError> {
        check_rate(AudioFormat::Opus, sample_rate, &OPUS_RATES)?;
        let fail = |e: opus::Error| encode_error(AudioFormat::Opus, e);
        let mut opus = opus::Encoder::new(sample_rate, opus::Channels::Mono, opus::Application::Audio).map_err(fail)?;
        opus.set_bitrate(opus::Bitrate::Bits(OPUS_BITRATE)).map_err(fail)?;
        let lookahead = usize::try_from(opus.get_lookahead().map_err(fail)?)
            .map_err(|_| encode_error(AudioFormat::Opus, "a negative lookahead"))?;
        let granule_step = u64::from(48_000 / sample_rate);
        let pre_skip = u16::try_from(lookahead as u64 * granule_step)
            .map_err(|_| encode_error(AudioFormat::Opus, "a lookahead past 16 bits"))?;
        let mut pages = ogg::PacketWriter::new(Vec::new());
        let write = |pages: &mut ogg::PacketWriter<'static, Vec<u8>>, packet: Vec<u8>| {
            pages
                .write_packet(packet, OGG_SERIAL, ogg::PacketWriteEndInfo::EndPage, 0)
                .map_err(|e| encode_error(AudioFormat::Opus, e))
        };
        write(&mut pages, opus_head(pre_skip, sample_rate))?;
        write(&mut pages, opus_tags())?;
        Ok(OggOpus {
            opus,
            pages,
            frame: sample_rate as usize / 50,
            granule_step,
            lookahead,
            pending: Vec::new(),
            pushed: 0,
            frames: 0,
        })
    }

    /// Encodes every whole frame pending; the last with `end`, which also ends the stream.
    fn encode_frames(&mut self, end: bool) -> Result<Vec<u8>, AudioError> {
        let fail = |e: opus::Error| encode_error(AudioFormat::Opus, e);
        let whole = self.pending.len() / self.frame;
        let mut packet = vec![0u8; 4000];
        for index in 0..whole {
            let frame = &self.pending[index * self.frame..(index + 1) * self.frame];
            let length = self.opus.encode(frame, &mut packet).map_err(fail)?;
            self.frames += 1;
            let last = end && index + 1 == whole;
            // The last page's granule position is the end of the real audio (after the
            // pre-skip), which trims the padding of the last frame (RFC 7845 §4.4).
            let (position, info) = if last {
                let end = (self.lookahead as u64 + self.pushed) * self.granule_step;
                (end, ogg::PacketWriteEndInfo::EndStream)
            } else {
                let position = self.frames * self.frame as u64 * self.granule_step;
                (position, ogg::PacketWriteEndInfo::EndPage)
            };
            self.pages
                .write_packet(packet[..length].to_vec(), OGG_SERIAL, info, position)
                .map_err(|e| encode_error(AudioFormat::Opus, e))?;
        }
        self.pending.drain(..whole * self.frame);
        Ok(std::mem::take(self.pages.inner_mut()))
    }
}

impl AudioEncoder for OggOpus {
    fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, AudioError> {
        self.pending.extend(codes(samples));
        self.pushed += samples.len() as u64;
        self.encode_frames(false)
    }

    fn finish(&mut self) -> Result<Vec<u8>, AudioError> {
        // Silence after the end, so that the lookahead's worth of real audio the encoder
        // still holds comes out, then up to a whole frame.
        let total = self.pending.len() + self.lookahead;
        let padded = total.div_ceil(self.frame).max(1) * self.frame;
        self.pending.resize(padded, 0);
        self.encode_frames(true)
    }
}

/// The identification header of an Ogg Opus stream (RFC 7845 §5.1): one channel, no gain,
/// channel mapping family 0.
fn opus_head(pre_skip: u16, input_rate: u32) -> Vec<u8> {
    let mut head = b"OpusHead".to_vec();
    head.extend([1, 1]);
    head.extend(pre_skip.to_le_bytes());
    head.extend(input_rate.to_le_bytes());
    head.extend(0i16.to_le_bytes());
    head.push(0);
    head
}

/// The comment header of an Ogg Opus stream (RFC 7845 §5.2): the vendor, no comments.
fn opus_tags() -> Vec<u8> {
    let vendor = concat!("drama ", env!("CARGO_PKG_VERSION"));
    let mut tags = b"OpusTags".to_vec();
    tags.extend((vendor.len() as u32).to_le_bytes());
    tags.extend(vendor.as_bytes());
    tags.extend(0u32.to_le_bytes());
    tags
}

/// FLAC frames of [`FLAC_BLOCK`] samples after a stream header of unknown length.
struct Flac {
    config: flacenc::error::Verified<flacenc::config::Encoder>,
    info: flacenc::component::StreamInfo,
    /// The stream header until the first call.
    header: Vec<u8>,
    /// Samples pushed and not yet encoded (less than a block).
    pending: Vec<i32>,
    /// Frames written so far.
    frames: usize,
    /// The MD5 of the samples so far (16-bit little-endian, as FLAC defines it).
    digest: md5::Md5,
    /// Samples pushed in all.
    total: usize,
}

/// A FLAC encoder's error, as drama reports it.
fn flac_error(e: impl std::fmt::Debug) -> AudioError {
    encode_error(AudioFormat::Flac, format!("{e:?}"))
}

/// `fLaC` and the STREAMINFO block of `info`: a stream's header.
fn flac_header(info: flacenc::component::StreamInfo) -> Result<Vec<u8>, AudioError> {
    use flacenc::component::BitRepr;
    let mut sink = flacenc::bitsink::ByteSink::new();
    flacenc::component::Stream::with_stream_info(info)
        .write(&mut sink)
        .map_err(flac_error)?;
    Ok(sink.into_inner())
}

impl Flac {
    fn new(sample_rate: u32) -> Result<Flac, AudioError> {
        use flacenc::error::Verify;
        let config = flacenc::config::Encoder::default()
            .into_verified()
            .map_err(|(_, e)| flac_error(e))?;
        let mut info = flacenc::component::StreamInfo::new(sample_rate as usize, 1, 16).map_err(flac_error)?;
        info.set_block_sizes(FLAC_BLOCK, FLAC_BLOCK).map_err(flac_error)?;
        Ok(Flac {
            config,
            header: flac_header(info.clone())?,
            info,
            pending: Vec::new(),
            frames: 0,
            digest: md5::Md5::default(),
            total: 0,
        })
    }

    /// The stream header with the length and MD5 of everything pushed: the same length as
    /// the one the stream began with.
    fn complete_header(&self) -> Result<Vec<u8>, AudioError> {
        use md5::Digest;
        let mut info = self.info.clone();
        info.set_total_samples(self.total);
        info.set_md5_digest(&self.digest.clone().finalize().into());
        flac_header(info)
    }

    /// Encodes the pending samples in blocks; with `end`, the shorter last block too.
    fn encode_blocks(&mut self, end: bool) -> Result<Vec<u8>, AudioError> {
        use flacenc::component::BitRepr;
        use flacenc::source::Fill;
        let mut sink = flacenc::bitsink::ByteSink::new();
        let mut block = flacenc::source::FrameBuf::with_size(1, FLAC_BLOCK).map_err(flac_error)?;
        let mut start = 0;
        while self.pending.len() - start >= FLAC_BLOCK || (end && start < self.pending.len()) {
            let stop = (start + FLAC_BLOCK).min(self.pending.len());
            block.fill_interleaved(&self.pending[start..stop]).map_err(flac_error)?;
            let frame =
                flacenc::encode_fixed_size_frame(&self.config, &block, self.frames, &self.info).map_err(flac_error)?;
            frame.write(&mut sink).map_err(flac_error)?;
            self.frames += 1;
            start = stop;
        }
        self.pending.drain(..start);
        let mut bytes = std::mem::take(&mut self.header);
        bytes.extend(sink.into_inner());
        Ok(bytes)
    }
}

impl AudioEncoder for Flac {
    fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, AudioError> {
        use md5::Digest;
        let codes = codes(samples);
        for code in &codes {
            self.digest.update(code.to_le_bytes());
        }
        self.total += codes.len();
        self.pending.extend(codes.into_iter().map(i32::from));
        self.encode_blocks(false)
    }

    fn finish(&mut self) -> Result<Vec<u8>, AudioError> {
        self.encode_blocks(true)
    }
}
