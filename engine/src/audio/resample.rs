//! Sample-rate conversion of a whole mono signal.
//!
//! The converter is rubato's windowed-sinc resampler (`Async::new_sinc` at a fixed ratio): a
//! 256-tap sinc with a squared Blackman-Harris window, the cutoff rubato derives for that
//! filter (scaled down to the output's Nyquist when downsampling, so it also anti-aliases),
//! 256 precomputed sub-sample phases and cubic interpolation between them. This is rubato's
//! high-quality setting. Rubato's FFT resampler is also band-limited, but its output sits a
//! fraction of a sample off for rate pairs such as 44100 -> 16000 (0.18 output samples,
//! measured), while the sinc resampler's offset can be corrected.
//!
//! It runs in f64 over the whole signal at once and the tail is flushed with silence, so no
//! samples are lost. The output is aligned with the input: output sample n is the signal at
//! input position n * from / to (rubato's own delay trimming is in whole output samples and
//! leaves up to one sample of lead, so the signal is padded in front instead, see
//! [`resample`]), up to the 1/256 input sample that rubato's sinc table step adds. The same
//! input on the same machine always gives the same output.

use rubato::audioadapter_buffers::direct::InterleavedSlice;
use rubato::{Async, FixedAsync, Resampler, SincInterpolationParameters, SincInterpolationType, WindowFunction};

use super::AudioError;

/// The largest ratio between the two rates, either way. Beyond it the 256-tap filter no longer
/// suppresses aliasing well.
pub const MAX_RATIO: u32 = 256;

/// The highest rate accepted on either side (2^20 Hz, above every common audio rate). It bounds
/// the alignment padding, which is below twice the input rate.
pub const MAX_RATE: u32 = 1 << 20;

/// Taps of the sinc filter (a multiple of 8, so rubato uses it as is).
const SINC_LEN: u64 = 256;

/// Frames the resampler takes per internal step.
const CHUNK: usize = 1024;

/// Converts mono `samples` from `from` Hz to `to` Hz. The output has round(len * to / from)
/// samples (halves rounded up), and output sample n is the band-limited signal at input
/// position n * from / to. `from == to` returns the input unchanged. Zero rates, rates above
/// [`MAX_RATE`] and rates more than [`MAX_RATIO`] apart are refused.
pub fn resample(samples: &[f32], from: u32, to: u32) -> Result<Vec<f32>, AudioError> {
    let refuse = |problem: String| AudioError::Rates { from, to, problem };
    if from == 0 || to == 0 {
        return Err(refuse("sample rates must be positive".into()));
    }
    if from == to {
        return Ok(samples.to_vec());
    }
    if from.max(to) > MAX_RATE {
        return Err(refuse(format!("rates above {MAX_RATE} Hz are not supported")));
    }
    if from.max(to) > from.min(to) * MAX_RATIO {
        return Err(refuse(format!("the rates are more than {MAX_RATIO} times apart")));
    }
    let out_len = output_len(samples.len(), from, to);
    if samples.is_empty() {
        return Ok(Vec::new());
    }
    let parameters = SincInterpolationParameters {
        sinc_len: SINC_LEN as usize,
        f_cutoff: None,
        oversampling_factor: 256,
        interpolation: SincInterpolationType::Cubic,
        window: WindowFunction::BlackmanHarris2,
    };
    let ratio = f64::from(to) / f64::from(from);
    let mut resampler = Async::<f64>::new_sinc(ratio, 1.0, &parameters, CHUNK, 1, FixedAsync::Input)
        .map_err(|e| AudioError::Resampler(e.to_string()))?;

    // Rubato's m-th output (before it trims `output_delay()` frames) lies at input position
    // (m + 1) * from / to - SINC_LEN / 2. With `pad` zeros in front, the input's first sample
    // is at position `pad`, so output `first - 1` is exactly aligned with it when
    // first = (SINC_LEN / 2 + pad) * to / from is a whole number: `pad` is chosen for that.
    let divisor = gcd(from, to);
    let (from_step, to_step) = (u64::from(from / divisor), u64::from(to / divisor));
    let mut pad = (from_step - SINC_LEN / 2 % from_step) % from_step;
    let mut first = (SINC_LEN / 2 + pad) / from_step * to_step;
    let trimmed = resampler.output_delay() as u64;
    if first <= trimmed {
        pad += from_step;
        first += to_step;
    }
    let skip = (first - 1 - trimmed) as usize;

    let mut input = vec![0.0f64; pad as usize];
    input.extend(samples.iter().map(|&x| f64::from(x)));
    let adapter = InterleavedSlice::new(&input, 1, input.len()).expect("one channel of input.len() frames");
    let output = resampler
        .process_all(&adapter, input.len(), None)
        .map_err(|e| AudioError::Resampler(e.to_string()))?
        .take_data();
    let mut output: Vec<f32> = output.into_iter().skip(skip).take(out_len).map(|x| x as f32).collect();
    output.resize(out_len, 0.0);
    Ok(output)
}

/// round(len * to / from) with halves rounded up, in exact integer arithmetic.
fn output_len(len: usize, from: u32, to: u32) -> usize {
    let scaled = len as u128 * u128::from(to) + u128::from(from) / 2;
    (scaled / u128::from(from)) as usize
}

/// Greatest common divisor of two positive numbers.
fn gcd(mut a: u32, mut b: u32) -> u32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{rng, uniform};
    use std::f64::consts::PI;

    fn sine(freq: f64, rate: u32, len: usize) -> Vec<f32> {
        (0..len)
            .map(|n| (2.0 * PI * freq * n as f64 / f64::from(rate)).sin() as f32)
            .collect()
    }

    /// Positions (in samples, linearly interpolated) where the signal crosses zero upwards.
    fn upward_crossings(x: &[f32]) -> Vec<f64> {
        (1..x.len())
            .filter(|&i| x[i - 1] < 0.0 && x[i] >= 0.0)
            .map(|i| {
                let (a, b) = (f64::from(x[i - 1]), f64::from(x[i]));
                (i - 1) as f64 + a / (a - b)
            })
            .collect()
    }

    #[test]
    fn sine_keeps_its_frequency_and_the_length_rule() {
        let input = sine(440.0, 44100, 44100);
        let output = resample(&input, 44100, 16000).unwrap();
        assert_eq!(output.len(), 16000);
        // Away from the edges (where the signal starts and stops abruptly).
        let crossings = upward_crossings(&output[200..15800]);
        let cycles = (crossings.len() - 1) as f64;
        let freq = cycles * 16000.0 / (crossings[crossings.len() - 1] - crossings[0]);
        eprintln!("measured {freq} Hz from {} upward zero crossings", crossings.len());
        assert!((freq - 440.0).abs() < 0.01, "{freq} Hz");
    }

    #[test]
    fn output_is_the_same_sine_sampled_at_the_new_rate_without_delay() {
        for (from, to) in [
            (44100, 16000),
            (32000, 16000),
            (48000, 16000),
            (22050, 16000),
            (16000, 48000),
            (8000, 16000),
            (16000, 16001),
        ] {
            let output = resample(&sine(440.0, from, from as usize), from, to).unwrap();
            let ideal = sine(440.0, to, to as usize);
            assert_eq!(output.len(), ideal.len());
            // Skip the edges, where the abrupt start and end ring through the filter.
            let edge = to as usize / 16;
            let err = (edge..ideal.len() - edge)
                .map(|n| (output[n] - ideal[n]).abs())
                .fold(0.0f32, f32::max);
            // A time offset of d input samples moves a 440 Hz sine by up to 2*pi*440*d/from.
            // Rubato's sinc table puts the output 1/256 of an input sample off (the table
            // step); anything beyond 1/128 is a misalignment.
            let limit = 2.0 * std::f32::consts::PI * 440.0 / from as f32 / 128.0;
            eprintln!("{from} -> {to}: max deviation from the ideal sine {err:e} (limit {limit:e})");
            assert!(err < limit, "{from} -> {to}: {err}");
        }
    }

    #[test]
    fn output_length_is_rounded_len_times_ratio() {
        let mut rng = rng("output_length_is_rounded");
        for (len, from, to) in [
            (1usize, 44100u32, 16000u32),
            (1001, 44100, 16000),
            (3, 2, 1),
            (5, 4, 2),
            (7, 16000, 48000),
            (12345, 22050, 16000),
            (999, 8000, 16000),
        ] {
            let x = uniform(&mut rng, len, 0.5);
            let exact = len as f64 * f64::from(to) / f64::from(from);
            let want = (exact + 0.5).floor() as usize;
            assert_eq!(resample(&x, from, to).unwrap().len(), want, "{len} {from}->{to}");
        }
        assert_eq!(resample(&[], 44100, 16000).unwrap(), Vec::<f32>::new());
    }

    #[test]
    fn identity_is_exact_and_resampling_is_deterministic() {
        let x = uniform(&mut rng("identity_is_exact"), 4001, 1.0);
        assert_eq!(resample(&x, 16000, 16000).unwrap(), x);
        let a = resample(&x, 48000, 16000).unwrap();
        let b = resample(&x, 48000, 16000).unwrap();
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn refuses_zero_and_far_apart_rates() {
        let e = resample(&[0.0; 10], 0, 16000).unwrap_err().to_string();
        assert_eq!(e, "resample 0 Hz -> 16000 Hz: sample rates must be positive");
        let e = resample(&[0.0; 10], 1, 16000).unwrap_err().to_string();
        assert!(e.contains("more than 256 times apart"), "{e}");
        assert!(resample(&[0.0; 10], 256 * 4000, 4000).is_ok());
        let e = resample(&[0.0; 10], 2_000_000, 16000).unwrap_err().to_string();
        assert!(e.contains("rates above 1048576 Hz"), "{e}");
        assert_eq!(resample(&[0.25; 3], 2_000_000, 2_000_000).unwrap(), [0.25; 3]);
    }
}
