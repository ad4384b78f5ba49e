//! Shared pieces of the GPU op tests: one device per test binary, fresh random inputs with
//! a printed seed, poisoned outputs, and error measurement against the FP64 reference.

#![allow(dead_code)]

use std::sync::{Arc, OnceLock};

use drama_checkpoint::numerics::round_to_bf16;
use drama_engine::gpu::{Gpu, GpuOptions};
use drama_kernels::Numerics;
use rand_chacha::ChaCha8Rng;

/// The options every test device is opened with: the defaults, with the kernels compiled
/// as Metal's fast math may compile them when `DRAMA_NUMERICS=fast-math-emulation` (CI runs
/// the op, model, codec and tower tests both ways).
pub fn options() -> GpuOptions {
    let numerics = match std::env::var("DRAMA_NUMERICS").as_deref() {
        Ok("fast-math-emulation") => Numerics::FastMathEmulation,
        Ok("as-written") | Err(_) => Numerics::AsWritten,
        Ok(other) => panic!("DRAMA_NUMERICS={other}: expected as-written or fast-math-emulation"),
    };
    GpuOptions {
        numerics,
        ..GpuOptions::default()
    }
}

/// The test device (lavapipe in CI), opened once per test binary.
pub fn shared_gpu() -> Arc<Gpu> {
    static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| {
        let gpu = Gpu::new(&options()).expect("a GPU (install mesa-vulkan-drivers for lavapipe)");
        eprintln!(
            "device: {} ({}, {}), kernels {:?}",
            gpu.caps.adapter, gpu.caps.backend, gpu.caps.driver, gpu.caps.numerics
        );
        Arc::new(gpu)
    })
    .clone()
}

/// The test device, borrowed.
pub fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
    GPU.get_or_init(shared_gpu).as_ref()
}

pub use drama_engine::test_support::{rng, uniform};

/// A generated checkpoint in a temporary directory (removed when dropped).
pub struct Fixture {
    _dir: tempfile::TempDir,
    /// The checkpoint directory.
    pub path: std::path::PathBuf,
}

impl Fixture {
    /// A named preset with `seed`.
    pub fn preset(name: &str, seed: u64) -> Fixture {
        let preset = drama_fixtures::Preset::by_name(name).expect("a fixture preset");
        Fixture::generated(&preset, seed)
    }

    /// Any preset (perhaps altered) with `seed`.
    pub fn generated(preset: &drama_fixtures::Preset, seed: u64) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(preset.name);
        drama_fixtures::generate(preset, seed).unwrap().write(&path).unwrap();
        Fixture { _dir: dir, path }
    }

    /// The checkpoint, opened and validated.
    pub fn open(&self) -> drama_checkpoint::Checkpoint {
        drama_checkpoint::Checkpoint::open(&self.path, drama_checkpoint::Provenance::Local(self.path.clone())).unwrap()
    }
}

/// Uniform values rounded to BF16 (what every linear input is).
pub fn bf16_values(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    uniform(rng, n, scale).into_iter().map(round_to_bf16).collect()
}

/// BF16 values packed two per u32 word (as little-endian bytes).
pub fn pack_bf16(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&v| drama_checkpoint::numerics::f32_to_bf16_bits(v).to_le_bytes())
        .collect()
}

/// f32 values as bytes.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(values).to_vec()
}

/// u32 values as bytes.
pub fn u32_bytes(values: &[u32]) -> Vec<u8> {
    bytemuck::cast_slice(values).to_vec()
}

/// An output buffer filled with NaN bit patterns, so unwritten elements are caught.
pub fn poisoned(gpu: &Gpu, label: &str, floats: usize) -> wgpu::Buffer {
    gpu.buffer_with(label, &vec![0xFF; floats * 4])
}

/// Runs dispatches in one compute pass and one submit.
pub fn run(gpu: &Gpu, dispatches: &[drama_engine::gpu::Dispatch]) {
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        for d in dispatches {
            d.record(&mut pass);
        }
    }
    gpu.submit_commands([encoder.finish()]);
}

/// One kernel launch with its resources.
pub fn dispatch(
    gpu: &Gpu,
    kernel: drama_kernels::Kernel,
    buffers: &[&wgpu::Buffer],
    workgroups: [u32; 3],
) -> drama_engine::gpu::Dispatch {
    drama_engine::gpu::Dispatch {
        kernel,
        pipeline: gpu.pipeline(kernel).unwrap(),
        bind_group: gpu.bind_group(kernel, buffers).unwrap(),
        workgroups,
        indirect: None,
    }
}

/// The distance between `v` and the next BF16 value away from zero.
pub fn bf16_ulp(v: f64) -> f64 {
    let bits = (v.abs() as f32).to_bits() & 0x7f80_0000;
    f64::from(f32::from_bits(bits)) * 2f64.powi(-7)
}

/// Worst error of `got` against `want` relative to per-element scales; panics past `tol`.
/// Returns the worst ratio error / (tol * scale) so tests can report how close they came.
pub fn check(label: &str, got: &[f32], want: &[f64], scale: &[f64], tol: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{label}: length");
    let mut worst = 0.0f64;
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        assert!(
            g.is_finite(),
            "{label}: element {i} is {g} (unwritten or overflow); want {w}"
        );
        let bound = tol * s.max(f64::MIN_POSITIVE);
        let err = (f64::from(g) - w).abs();
        assert!(
            err <= bound,
            "{label}: element {i}: got {g}, want {w}, error {err:e} > bound {bound:e}"
        );
        worst = worst.max(err / bound);
    }
    eprintln!("{label}: worst error {:.3} of tolerance {tol:e}", worst);
    worst
}

/// The bit patterns of `v`, for comparisons that must be exact (NaN poison included).
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Asserts `got` is `want` bit for bit (NaN poison included), naming how many values differ
/// and the first.
pub fn assert_same_bits(got: &[f32], want: &[f32], label: &str) {
    assert_eq!(got.len(), want.len(), "{label}: lengths");
    let differing: Vec<usize> = (0..got.len())
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .collect();
    if let Some(&first) = differing.first() {
        panic!(
            "{label}: {} of {} values differ, the first at {first}: {:e} against {:e}",
            differing.len(),
            got.len(),
            got[first],
            want[first]
        );
    }
}
