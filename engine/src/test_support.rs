//! Fresh random test inputs, shared by the unit and integration tests: a clock-seeded
//! stream whose seed is printed and can be replayed with DRAMA_TEST_SEED.

use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

/// A fresh random stream whose seed comes from DRAMA_TEST_SEED or the clock and is printed.
pub fn rng(test: &str) -> ChaCha8Rng {
    let seed = std::env::var("DRAMA_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("{test}: DRAMA_TEST_SEED={seed}");
    ChaCha8Rng::seed_from_u64(seed)
}

/// Uniform in [-scale, scale).
pub fn uniform(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| ((rng.next_u32() >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * scale)
        .collect()
}
