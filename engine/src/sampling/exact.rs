//! The sampling definition of `docs/contract.md` §6.2 in integers only, so that every
//! platform, the host and the GPU (`sample.wgsl`) pick the same token: logits, temperature
//! and top-p become fixed-point integers by bit arithmetic, weights come from two tables of
//! e^-x, sums are exact, and the random number is Philox4x32-10 of (seed, draw index).
//! Nothing depends on float evaluation order, fast math or a platform's `exp`.

/// Logits are integers in units of 2^-16 ([`fixed`]).
pub const LOGIT_SHIFT: u32 = 16;
/// The temperature is an integer in units of 2^-10.
pub const TEMPERATURE_SHIFT: u32 = 10;
/// top_p is an integer in units of 2^-24 (1 is `1 << 24`).
pub const TOP_P_SHIFT: u32 = 24;
/// The guidance scale is an integer in units of 2^-16.
pub const GAMMA_SHIFT: u32 = 16;
/// Fixed-point values saturate at plus or minus this.
pub const FIXED_LIMIT: i32 = 1 << 30;
/// A weight's exponent x (e^-x in units of 2^-16) at or past this gives weight 0.
pub const EXPONENT_LIMIT: u32 = 1 << 21;
/// Entries of the table of e^(-a/16) (x's high bits, `x >> 12`).
pub const COARSE_ENTRIES: usize = 512;
/// Entries of the table of e^(-b/2^16) (x's low bits, `x & 4095`).
pub const FINE_ENTRIES: usize = 4096;

/// `floor(value * 2^shift)` of an f32's bits, saturated at [`FIXED_LIMIT`] (infinities too),
/// computed from the sign, exponent and mantissa alone. NaN is the caller's to refuse.
pub fn fixed(bits: u32, shift: u32) -> i32 {
    let negative = bits >> 31 == 1;
    let exponent = (bits >> 23) & 0xFF;
    let fraction = bits & 0x7F_FFFF;
    if exponent == 0xFF {
        return if negative { -FIXED_LIMIT } else { FIXED_LIMIT };
    }
    // value * 2^shift = mantissa * 2^scale.
    let mantissa = if exponent == 0 { fraction } else { fraction | 0x80_0000 };
    let scale = exponent.max(1) as i32 - 150 + shift as i32;
    let (whole, inexact) = if scale >= 7 {
        // A normal mantissa is at least 2^23: past the limit.
        (FIXED_LIMIT as u32, false)
    } else if scale >= 0 {
        ((mantissa << scale).min(FIXED_LIMIT as u32), false)
    } else if scale <= -32 {
        (0, mantissa != 0)
    } else {
        let drop = (-scale) as u32;
        (mantissa >> drop, mantissa & ((1 << drop) - 1) != 0)
    };
    let magnitude = whole.min(FIXED_LIMIT as u32) as i32;
    if negative {
        // floor of a negative value: the magnitude rounded up.
        -(magnitude + i32::from(inexact)).min(FIXED_LIMIT)
    } else {
        magnitude
    }
}

/// The two tables of e^-x: `coarse[a]` = round(2^31 e^(-a/16)) and `fine[b]` =
/// round(2^31 e^(-b/65536)), each computed in f64 by the pure-Rust `libm` and rounded to
/// the nearest integer. A weight is their product's bits 38 and up ([`weight`]).
#[derive(Debug)]
pub struct ExpTables {
    /// e^(-a/16), a in 0..512.
    pub coarse: Vec<u32>,
    /// e^(-b/65536), b in 0..4096.
    pub fine: Vec<u32>,
}

impl ExpTables {
    /// The tables, computed once per process.
    pub fn get() -> &'static ExpTables {
        static TABLES: std::sync::OnceLock<ExpTables> = std::sync::OnceLock::new();
        TABLES.get_or_init(ExpTables::new)
    }

    /// The tables (the same on every platform).
    pub fn new() -> ExpTables {
        let table = |entries: usize, step: f64| -> Vec<u32> {
            (0..entries)
                .map(|i| libm::round(2f64.powi(31) * libm::exp(-(i as f64) * step)) as u32)
                .collect()
        };
        ExpTables {
            coarse: table(COARSE_ENTRIES, 1.0 / 16.0),
            fine: table(FINE_ENTRIES, 1.0 / 65536.0),
        }
    }
}

impl Default for ExpTables {
    fn default() -> Self {
        ExpTables::new()
    }
}

/// The weight of a candidate `gap` units of 2^-16 below the best at temperature `tau`
/// (units of 2^-10, at least 1): about 2^24 e^(-gap / (2^16 T)), exactly
/// `(coarse[x >> 12] * fine[x & 4095]) >> 38` with x = floor(gap * 2^10 / tau), and 0
/// from x = 2^21 (e^-32) on.
pub fn weight(tables: &ExpTables, gap: u32, tau: u32) -> u32 {
    let quotient = gap / tau;
    if quotient >= EXPONENT_LIMIT >> TEMPERATURE_SHIFT {
        return 0;
    }
    let x = (quotient << TEMPERATURE_SHIFT) + (((gap % tau) << TEMPERATURE_SHIFT) / tau);
    if x >= EXPONENT_LIMIT {
        return 0;
    }
    let product = u64::from(tables.coarse[(x >> 12) as usize]) * u64::from(tables.fine[(x & 4095) as usize]);
    (product >> 38) as u32
}

/// Philox4x32-10 (Salmon et al., SC'11; Random123's reference): the four words of block
/// `counter` under `key`.
pub fn philox4x32(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    const M0: u64 = 0xD251_1F53;
    const M1: u64 = 0xCD9E_8D57;
    const W0: u32 = 0x9E37_79B9;
    const W1: u32 = 0xBB67_AE85;
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let p0 = M0 * u64::from(c[0]);
        let p1 = M1 * u64::from(c[2]);
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ c[3] ^ k[1],
            p0 as u32,
        ];
    }
    c
}

/// The random word of a request's draw `index`: the first word of Philox4x32-10 with
/// counter (index low, index high, 0, 0) and key (seed low, seed high).
pub fn draw(seed: u64, index: u64) -> u32 {
    philox4x32(
        [index as u32, (index >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    )[0]
}

/// The settings of one draw, as integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExactSettings {
    /// floor(T * 2^10); 0 picks the best.
    pub tau: u32,
    /// Keep the k best levels' candidates (0: all).
    pub top_k: u32,
    /// floor(p * 2^24), 1 << 24 for p = 1.
    pub top_p: u32,
    /// The random word ([`draw`]).
    pub random: u32,
}

/// The levels of a row of logits, `fix(z, 16)` each; `None` when a logit is NaN.
pub fn levels(logits: &[f32]) -> Option<Vec<i32>> {
    logits
        .iter()
        .map(|l| (!l.is_nan()).then(|| fixed(l.to_bits(), LOGIT_SHIFT)))
        .collect()
}

/// The guidance mix of one candidate's levels (§6.1): `uncond + floor((cond - uncond) *
/// gamma / 2^16)` with `gamma` in units of 2^-16, saturated at plus or minus 2^30.
pub fn mixed_level(cond: i32, uncond: i32, gamma: u32) -> i32 {
    let difference = i64::from(cond) - i64::from(uncond);
    let mixed = i64::from(uncond) + ((difference * i64::from(gamma)) >> GAMMA_SHIFT);
    mixed.clamp(-i64::from(FIXED_LIMIT), i64::from(FIXED_LIMIT)) as i32
}

/// The levels a guided draw samples from: the cond and uncond rows' levels mixed at
/// `gamma` (units of 2^-16); `None` when a logit of either row is NaN.
pub fn guided_levels(cond: &[f32], uncond: &[f32], gamma: u32) -> Option<Vec<i32>> {
    let (cond, uncond) = (levels(cond)?, levels(uncond)?);
    Some(
        cond.iter()
            .zip(&uncond)
            .map(|(&c, &u)| mixed_level(c, u, gamma))
            .collect(),
    )
}

/// The token picked among the candidates' `levels` (never `forbidden`): the contract's
/// §6.2 in integers. `None` when every id is forbidden.
pub fn choose(tables: &ExpTables, levels: &[i32], forbidden: usize, settings: &ExactSettings) -> Option<usize> {
    let candidates = || (0..levels.len()).filter(move |&id| id != forbidden);
    let best = candidates().map(|id| levels[id]).max()?;
    if settings.tau == 0 {
        return candidates().find(|&id| levels[id] == best);
    }
    let weights: Vec<u64> = levels
        .iter()
        .map(|&level| u64::from(weight(tables, best.abs_diff(level), settings.tau)))
        .collect();
    let mut lowest = i32::MIN;
    let count = candidates().count();
    if settings.top_k > 0 && (settings.top_k as usize) < count {
        let mut sorted: Vec<i32> = candidates().map(|id| levels[id]).collect();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        lowest = sorted[settings.top_k as usize - 1];
    }
    let mass = |floor: i32| -> u64 {
        candidates()
            .filter(|&id| levels[id] >= floor)
            .map(|id| weights[id])
            .sum()
    };
    if settings.top_p < 1 << TOP_P_SHIFT {
        // The kept candidates' (level, weight), best level first; the weight at or above a
        // level is the running sum at that level's last candidate.
        let mut kept: Vec<(i32, u64)> = candidates()
            .filter(|&id| levels[id] >= lowest)
            .map(|id| (levels[id], weights[id]))
            .collect();
        kept.sort_unstable_by_key(|&(level, _)| std::cmp::Reverse(level));
        let total: u64 = kept.iter().map(|&(_, weight)| weight).sum();
        let threshold = (u128::from(total) * u128::from(settings.top_p)).div_ceil(1 << TOP_P_SHIFT) as u64;
        let mut running = 0;
        for (i, &(level, weight)) in kept.iter().enumerate() {
            running += weight;
            let level_ends = kept.get(i + 1).is_none_or(|next| next.0 != level);
            if level_ends && running >= threshold {
                lowest = level;
                break;
            }
        }
    }
    let total = mass(lowest);
    let target = ((u128::from(settings.random) * u128::from(total)) >> 32) as u64;
    let mut running = 0;
    let mut last = None;
    for id in candidates().filter(|&id| levels[id] >= lowest) {
        running += weights[id];
        last = Some(id);
        if target < running {
            return Some(id);
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::Rng;

    /// Random123's known answers for Philox4x32-10.
    #[test]
    fn philox_gives_random123s_known_answers() {
        assert_eq!(
            philox4x32([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    /// `fixed` is floor(v * 2^shift), saturated, for every kind of f32 (checked in f64,
    /// where the product is exact).
    #[test]
    fn fixed_point_is_the_floor_of_the_scaled_value() {
        let mut rng = crate::test_support::rng("sampling fixed point");
        let limit = f64::from(FIXED_LIMIT);
        let mut values: Vec<f32> = (0..20_000)
            .map(|i| match i % 3 {
                0 => f32::from_bits(rng.next_u32()),
                1 => (rng.next_u32() as i32) as f32 / 2f32.powi(22),
                _ => (rng.next_u32() % 2000) as f32 / 64.0 - 15.0,
            })
            .filter(|v| !v.is_nan())
            .collect();
        values.extend([0.0, -0.0, f32::MIN_POSITIVE, -f32::MIN_POSITIVE, 1e-45, -1e-45]);
        values.extend([f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN, 16384.0, -16384.0]);
        for shift in [LOGIT_SHIFT, TEMPERATURE_SHIFT, TOP_P_SHIFT] {
            for &v in &values {
                let want = (f64::from(v) * 2f64.powi(shift as i32)).floor().clamp(-limit, limit);
                assert_eq!(f64::from(fixed(v.to_bits(), shift)), want, "{v} << {shift}");
            }
        }
    }

    /// A weight is 2^24 e^-x to a few parts in 2^24, and 0 from e^-32 on.
    #[test]
    fn weights_follow_the_exponential() {
        let tables = ExpTables::new();
        for (gap, tau) in [
            (0u32, 1024u32),
            (1, 1024),
            (65536, 1024),
            (65536 * 7, 3000),
            (123_456, 17),
            (1 << 31, 10240),
        ] {
            let x = f64::from(gap) * 1024.0 / f64::from(tau) / 65536.0;
            let want = 2f64.powi(24) * (-x).exp();
            let got = f64::from(weight(&tables, gap, tau));
            if x >= 32.0 {
                assert_eq!(got, 0.0, "gap {gap} tau {tau}");
            } else {
                assert!(
                    (got - want).abs() <= 2.0 + want * 1e-4,
                    "gap {gap} tau {tau}: {got} vs {want}"
                );
            }
        }
        assert_eq!(weight(&tables, 0, 1), 1 << 24);
    }

    /// The token of a row of logits, as the engine samples an unguided row.
    fn pick(tables: &ExpTables, logits: &[f32], forbidden: usize, settings: &ExactSettings) -> Option<usize> {
        choose(tables, &levels(logits)?, forbidden, settings)
    }

    /// The mix is the exact floor of u + (c - u) G / 2^16, saturated, for levels of every
    /// size (checked in i128), and at gamma 1.5 it is the float mix to a level.
    #[test]
    fn guidance_mixes_levels_exactly() {
        let mut rng = crate::test_support::rng("guidance mix");
        let limit = i128::from(FIXED_LIMIT);
        let mut level = || match rng.next_u32() % 3 {
            0 => (rng.next_u32() % (2 * FIXED_LIMIT as u32 + 1)) as i32 - FIXED_LIMIT,
            1 => (rng.next_u32() % 2_000_001) as i32 - 1_000_000,
            _ => [FIXED_LIMIT, -FIXED_LIMIT, 0, 1, -1][rng.next_u32() as usize % 5],
        };
        for _ in 0..100_000 {
            let (c, u) = (level(), level());
            for gamma in [0, 1, 65536, 98304, 655360, 12345] {
                let product = (i128::from(c) - i128::from(u)) * i128::from(gamma);
                let want = (i128::from(u) + product.div_euclid(65536)).clamp(-limit, limit);
                assert_eq!(i128::from(mixed_level(c, u, gamma)), want, "c {c} u {u} gamma {gamma}");
            }
        }
        let (cond, uncond) = ([2.5f32, -1.25, 0.0], [0.5f32, 1.0, -3.0]);
        let mixed = guided_levels(&cond, &uncond, 3 << 15).unwrap();
        let float: Vec<i32> = cond
            .iter()
            .zip(&uncond)
            .map(|(&c, &u)| fixed((u + 1.5 * (c - u)).to_bits(), LOGIT_SHIFT))
            .collect();
        assert_eq!(mixed, float);
        assert_eq!(guided_levels(&cond, &[0.0, f32::NAN, 1.0], 3 << 15), None);
    }

    fn settings(tau: u32, top_k: u32, top_p: u32, random: u32) -> ExactSettings {
        ExactSettings {
            tau,
            top_k,
            top_p,
            random,
        }
    }

    /// Greedy picks the lowest id of the best level, never the forbidden one; a NaN refuses.
    #[test]
    fn greedy_picks_the_first_best_and_nan_refuses() {
        let tables = ExpTables::new();
        let greedy = settings(0, 0, 1 << 24, 7);
        assert_eq!(pick(&tables, &[1.0, 5.0, 5.0, 9.0], 3, &greedy), Some(1));
        // Within 2^-16 of each other, two logits are one level: the lower id wins.
        assert_eq!(pick(&tables, &[0.0, 2.000_001, 2.0], 9, &greedy), Some(1));
        assert_eq!(pick(&tables, &[2.0, f32::NAN], 9, &greedy), None);
    }

    /// Frequencies follow the softmax; top-k keeps the k best levels (ties at the edge
    /// included), top-p the fewest best levels reaching p.
    #[test]
    fn frequencies_follow_softmax_and_cuts_keep_the_best_levels() {
        let tables = ExpTables::new();
        let logits = [0.0f32, 1.0, 2.0, -1.0];
        let draws = 20_000u64;
        let mut seen = [0usize; 4];
        for index in 0..draws {
            let s = settings(1 << 10, 0, 1 << 24, draw(11, index));
            seen[pick(&tables, &logits, 99, &s).unwrap()] += 1;
        }
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        for (id, &l) in logits.iter().enumerate() {
            let expected = f64::from(l).exp() / z;
            let frequency = seen[id] as f64 / draws as f64;
            assert!(
                (frequency - expected).abs() < 0.01,
                "token {id}: {frequency} vs {expected}"
            );
        }
        let tied = [3.0f32, 2.9, 2.9, -5.0];
        for index in 0..500 {
            let random = draw(3, index);
            assert!(pick(&tables, &tied, 99, &settings(1 << 10, 2, 1 << 24, random)).unwrap() < 3);
            assert_eq!(
                pick(&tables, &tied, 99, &settings(1 << 10, 1, 1 << 24, random)),
                Some(0)
            );
            assert_eq!(
                pick(&tables, &tied, 99, &settings(1 << 10, 0, 1 << 22, random)),
                Some(0)
            );
        }
    }
}
