//! The contract's log-mel spectrogram (`docs/contract.md` §7), computed in f64.
//!
//! Frames are not centred: frame f covers samples [f*hop, f*hop + n_fft), and there are
//! 1 + floor((N - n_fft)/hop) of them. Each frame is weighted by the periodic Hann window
//! 0.5 - 0.5*cos(2*pi*n/n_fft), its power |X_k|^2 (k = 0..=n_fft/2, unnormalised DFT) is
//! projected on `n_mels` triangular filters, and each value is ln(max(m, 1e-5)).
//!
//! The filters use the HTK mel scale mel(f) = 2595*log10(1 + f/700): n_mels + 2 edge points
//! spaced evenly in mel from 0 Hz to f_max; filter j rises linearly in Hz from edge j to a peak
//! of 1 at edge j+1 and falls to 0 at edge j+2 (no area normalisation), and is evaluated at the
//! bin frequencies k*sample_rate/n_fft.

use realfft::RealFftPlanner;

use super::AudioError;
use drama_checkpoint::config::VoiceTowerConfig;

/// Mel energies below this floor are clamped before the logarithm.
pub const MEL_FLOOR: f64 = 1e-5;

/// A log-mel spectrogram.
#[derive(Debug, Clone, PartialEq)]
pub struct Mel {
    /// Number of frames.
    pub frames: usize,
    /// Mel bands per frame.
    pub n_mels: usize,
    /// Log-mel values, `[frames, n_mels]` row-major.
    pub values: Vec<f32>,
}

/// The log-mel spectrogram of mono `samples` at `config.sample_rate`. Audio shorter than one
/// frame (`n_fft` samples) and analysis parameters that cannot work are refused.
pub fn log_mel(samples: &[f32], config: &VoiceTowerConfig) -> Result<Mel, AudioError> {
    check_config(config)?;
    let (n_fft, hop, n_mels) = (config.n_fft, config.hop, config.n_mels);
    if samples.len() < n_fft {
        return Err(AudioError::TooShort {
            samples: samples.len(),
            n_fft,
        });
    }
    let frames = 1 + (samples.len() - n_fft) / hop;
    let bins = n_fft / 2 + 1;
    let filters = mel_filters(config);
    let window: Vec<f64> = (0..n_fft)
        .map(|n| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / n_fft as f64).cos())
        .collect();
    let fft = RealFftPlanner::<f64>::new().plan_fft_forward(n_fft);
    let (mut frame, mut spectrum, mut scratch) = (fft.make_input_vec(), fft.make_output_vec(), fft.make_scratch_vec());
    let mut power = vec![0.0f64; bins];
    let mut values = Vec::with_capacity(frames * n_mels);
    for start in (0..frames).map(|f| f * hop) {
        for ((x, &s), &w) in frame.iter_mut().zip(&samples[start..start + n_fft]).zip(&window) {
            *x = f64::from(s) * w;
        }
        fft.process_with_scratch(&mut frame, &mut spectrum, &mut scratch)
            .expect("buffers made by the plan");
        for (p, x) in power.iter_mut().zip(&spectrum) {
            *p = x.norm_sqr();
        }
        for filter in filters.chunks_exact(bins) {
            let m: f64 = filter.iter().zip(&power).map(|(w, p)| w * p).sum();
            values.push(m.max(MEL_FLOOR).ln() as f32);
        }
    }
    Ok(Mel { frames, n_mels, values })
}

/// The mel filter bank, `[n_mels, n_fft/2 + 1]` row-major, as defined in the module docs.
/// Meaningful for configurations [`log_mel`] accepts.
pub fn mel_filters(config: &VoiceTowerConfig) -> Vec<f64> {
    let hz_to_mel = |f: f64| 2595.0 * (1.0 + f / 700.0).log10();
    let mel_to_hz = |m: f64| 700.0 * (10f64.powf(m / 2595.0) - 1.0);
    let top = hz_to_mel(config.f_max);
    let steps = (config.n_mels + 1) as f64;
    let edges: Vec<f64> = (0..config.n_mels + 2)
        .map(|i| mel_to_hz(top * i as f64 / steps))
        .collect();
    let bin_hz: Vec<f64> = (0..config.n_fft / 2 + 1)
        .map(|k| k as f64 * f64::from(config.sample_rate) / config.n_fft as f64)
        .collect();
    edges
        .windows(3)
        .flat_map(|e| {
            bin_hz.iter().map(move |&f| {
                let rising = (f - e[0]) / (e[1] - e[0]);
                let falling = (e[2] - f) / (e[2] - e[1]);
                rising.min(falling).max(0.0)
            })
        })
        .collect()
}

/// Refuses analysis parameters that cannot produce a spectrogram (the checkpoint validation
/// rules, restated here because a config can be built by hand).
fn check_config(config: &VoiceTowerConfig) -> Result<(), AudioError> {
    let bad = |key, problem: String| Err(AudioError::Config { key, problem });
    if config.sample_rate == 0 {
        return bad("sample_rate", "must be positive".into());
    }
    if config.n_fft < 2 || !config.n_fft.is_multiple_of(2) {
        return bad("n_fft", format!("{} is not an even length of at least 2", config.n_fft));
    }
    if config.hop == 0 {
        return bad("hop", "must be positive".into());
    }
    if config.n_mels == 0 {
        return bad("n_mels", "must be positive".into());
    }
    let nyquist = f64::from(config.sample_rate) / 2.0;
    if !(config.f_max.is_finite() && config.f_max > 0.0 && config.f_max <= nyquist) {
        return bad("f_max", format!("{} is not in (0, sample_rate/2]", config.f_max));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{rng, uniform};
    use std::f64::consts::PI;

    fn config(sample_rate: u32, n_fft: usize, hop: usize, n_mels: usize, f_max: f64) -> VoiceTowerConfig {
        VoiceTowerConfig {
            sample_rate,
            n_fft,
            hop,
            n_mels,
            f_max,
            dim: 8,
            ffn: 16,
            blocks: 1,
        }
    }

    /// The filter bank straight from the definition, one weight at a time, with explicit
    /// branches for the rising and falling edges.
    fn reference_filters(c: &VoiceTowerConfig) -> Vec<Vec<f64>> {
        let mel_max = 2595.0 * (1.0 + c.f_max / 700.0).log10();
        let point_hz = |i: usize| {
            let mel = i as f64 * mel_max / (c.n_mels as f64 + 1.0);
            700.0 * (10f64.powf(mel / 2595.0) - 1.0)
        };
        (0..c.n_mels)
            .map(|j| {
                let (lo, mid, hi) = (point_hz(j), point_hz(j + 1), point_hz(j + 2));
                (0..=c.n_fft / 2)
                    .map(|k| {
                        let f = (k as f64) * (c.sample_rate as f64) / (c.n_fft as f64);
                        if f <= lo || f >= hi {
                            0.0
                        } else if f <= mid {
                            (f - lo) / (mid - lo)
                        } else {
                            (hi - f) / (hi - mid)
                        }
                    })
                    .collect()
            })
            .collect()
    }

    /// log-mel by a naive O(n^2) DFT in f64.
    fn reference_log_mel(x: &[f32], c: &VoiceTowerConfig) -> Vec<Vec<f64>> {
        let filters = reference_filters(c);
        let n = c.n_fft;
        let mut out = Vec::new();
        let mut start = 0;
        while start + n <= x.len() {
            let windowed: Vec<f64> = (0..n)
                .map(|i| f64::from(x[start + i]) * (0.5 - 0.5 * (2.0 * PI * i as f64 / n as f64).cos()))
                .collect();
            let power: Vec<f64> = (0..=n / 2)
                .map(|k| {
                    let (mut re, mut im) = (0.0, 0.0);
                    for (i, &v) in windowed.iter().enumerate() {
                        let angle = 2.0 * PI * ((k * i) % n) as f64 / n as f64;
                        re += v * angle.cos();
                        im -= v * angle.sin();
                    }
                    re * re + im * im
                })
                .collect();
            out.push(
                filters
                    .iter()
                    .map(|w| w.iter().zip(&power).map(|(a, b)| a * b).sum::<f64>().max(1e-5).ln())
                    .collect(),
            );
            start += c.hop;
        }
        out
    }

    fn max_error(mel: &Mel, reference: &[Vec<f64>]) -> f64 {
        assert_eq!(mel.frames, reference.len());
        let mut worst = 0.0f64;
        for (f, row) in reference.iter().enumerate() {
            assert_eq!(row.len(), mel.n_mels);
            for (j, &want) in row.iter().enumerate() {
                worst = worst.max((f64::from(mel.values[f * mel.n_mels + j]) - want).abs());
            }
        }
        worst
    }

    #[test]
    fn filters_match_the_definition() {
        for c in [config(16000, 400, 160, 80, 8000.0), config(22050, 512, 128, 40, 7600.0)] {
            let reference = reference_filters(&c);
            let filters = mel_filters(&c);
            let bins = c.n_fft / 2 + 1;
            assert_eq!(filters.len(), c.n_mels * bins);
            for (j, row) in reference.iter().enumerate() {
                for (k, &w) in row.iter().enumerate() {
                    assert!((filters[j * bins + k] - w).abs() < 1e-12, "filter {j} bin {k}");
                }
            }
        }
    }

    #[test]
    fn log_mel_matches_a_naive_dft_on_random_audio() {
        let mut rng = rng("log_mel_matches_a_naive_dft");
        for (c, len, scale) in [
            (config(16000, 400, 160, 80, 8000.0), 2000, 1.0),
            (config(22050, 512, 128, 40, 7600.0), 1500, 0.01),
            (config(16000, 64, 64, 8, 4000.0), 64 * 5 + 63, 0.5),
        ] {
            let x = uniform(&mut rng, len, scale);
            let mel = log_mel(&x, &c).unwrap();
            assert_eq!(mel.n_mels, c.n_mels);
            assert_eq!(mel.values.len(), mel.frames * mel.n_mels);
            let err = max_error(&mel, &reference_log_mel(&x, &c));
            eprintln!("n_fft {}: {} frames, max |error| {err:e}", c.n_fft, mel.frames);
            assert!(err < 1e-4, "max error {err}");
        }
    }

    #[test]
    fn sine_peaks_in_the_band_centred_nearest_its_frequency() {
        let c = config(16000, 400, 160, 80, 8000.0);
        let freq = 1000.0;
        let x: Vec<f32> = (0..4000)
            .map(|n| (2.0 * PI * freq * n as f64 / 16000.0).sin() as f32)
            .collect();
        let mel = log_mel(&x, &c).unwrap();
        assert!(max_error(&mel, &reference_log_mel(&x, &c)) < 1e-4);
        let to_mel = |f: f64| 2595.0 * (1.0 + f / 700.0).log10();
        let step = to_mel(c.f_max) / (c.n_mels as f64 + 1.0);
        let expected = (0..c.n_mels)
            .min_by(|&a, &b| {
                let da = (step * (a + 1) as f64 - to_mel(freq)).abs();
                let db = (step * (b + 1) as f64 - to_mel(freq)).abs();
                da.total_cmp(&db)
            })
            .unwrap();
        for row in mel.values.chunks_exact(c.n_mels) {
            let peak = (0..c.n_mels).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
            assert_eq!(peak, expected);
        }
    }

    #[test]
    fn frame_count_edges() {
        let c = config(16000, 400, 160, 80, 8000.0);
        let frames = |len: usize| log_mel(&vec![0.1; len], &c).map(|m| m.frames);
        assert_eq!(frames(400).unwrap(), 1);
        assert_eq!(frames(559).unwrap(), 1);
        assert_eq!(frames(560).unwrap(), 2);
        assert_eq!(frames(400 + 160 * 7 + 159).unwrap(), 8);
        let e = frames(399).unwrap_err().to_string();
        assert_eq!(e, "audio too short: 399 samples, fewer than one frame of n_fft = 400");
        assert!(log_mel(&[], &c).unwrap_err().to_string().contains("0 samples"));
    }

    #[test]
    fn silence_is_the_floor() {
        let c = config(16000, 400, 160, 80, 8000.0);
        let mel = log_mel(&[0.0; 1000], &c).unwrap();
        assert!(mel.values.iter().all(|&v| v == (1e-5f64).ln() as f32));
    }

    #[test]
    fn refuses_unusable_parameters() {
        let e = |c: VoiceTowerConfig| log_mel(&[0.0; 1000], &c).unwrap_err().to_string();
        assert_eq!(
            e(config(16000, 400, 0, 80, 8000.0)),
            "voice_tower.hop: must be positive"
        );
        assert!(e(config(16000, 401, 160, 80, 8000.0)).starts_with("voice_tower.n_fft"));
        assert!(e(config(16000, 400, 160, 0, 8000.0)).starts_with("voice_tower.n_mels"));
        assert!(e(config(16000, 400, 160, 80, 9000.0)).starts_with("voice_tower.f_max"));
        assert!(e(config(0, 400, 160, 80, 8000.0)).starts_with("voice_tower.sample_rate"));
    }
}
