//! The benchmark suite's own measurements on the test device: what a launch costs alone,
//! decode steps whose eight lanes are four requests (guidance pairs with texts of their own)
//! rather than one prompt eight times over, and the text part.

use std::sync::Arc;

use drama_bench::{BenchOptions, BenchPart, Roofline, bench_text, decode_step, launch_cost, text};
use drama_checkpoint::{Checkpoint, LayerMlp, Provenance};
use drama_engine::gpu::{Gpu, GpuOptions};
use drama_engine::session::Engine;
use drama_engine::test_support::rng;
use drama_engine::text::TextFrontEnd;
use rand_core::Rng;

/// The test device (lavapipe in CI).
fn device() -> Arc<Gpu> {
    Arc::new(Gpu::new(&GpuOptions::default()).expect("a GPU (install mesa-vulkan-drivers for lavapipe)"))
}

/// An engine on a tiny checkpoint of fresh random weights (seeded by `label`), and the
/// directory that holds it.
fn tiny_engine(label: &str) -> (tempfile::TempDir, Engine) {
    let dir = tempfile::tempdir().unwrap();
    drama_fixtures::write_preset("tiny", rng(label).next_u64(), dir.path()).unwrap();
    let checkpoint = Checkpoint::open(dir.path(), Provenance::Local(dir.path().to_path_buf())).unwrap();
    (dir, Engine::load(device(), checkpoint).unwrap())
}

/// Options that measure only `part`, `repeats` times, decode steps of `lanes` at context 12.
fn options(part: BenchPart, repeats: usize, lanes: Vec<usize>) -> BenchOptions {
    BenchOptions {
        repeats,
        context: 12,
        lanes,
        more_contexts: Vec::new(),
        more_codec_chunks: Vec::new(),
        prefill_rows: 0,
        synthesis_tokens: 0,
        rotation_bytes: 0,
        parts: vec![part],
    }
}

/// Both chains report a positive, finite time per launch over the chain's launches.
#[test]
fn launch_cost_times_both_chains() {
    let cost = launch_cost(&device(), 2).unwrap();
    assert_eq!(cost.launches, 256);
    for us in [cost.dependent_us, cost.independent_us] {
        assert!(us.is_finite() && us > 0.0, "{cost:?}");
    }
}

/// Eight lanes of four requests choose more experts than one lane (identical lanes choose
/// the same ones, which is what the bench measured before), and the launch floor is the
/// step's waiting launches times the dependent launch cost: all but the shared expert's down
/// projections, which run beside the launch before them on a Vulkan device.
#[test]
fn eight_lanes_are_four_requests() {
    let (_dir, engine) = tiny_engine("bench lanes");
    let options = options(BenchPart::Decode, 1, drama_bench::DEFAULT_STEP_LANES.to_vec());
    let roofline = Roofline {
        bytes: 1,
        workgroups: 1,
        ms: 1.0,
        gb_per_s: 1.0,
    };
    let launch = launch_cost(&engine.gpu, 1).unwrap();
    let c = &engine.checkpoint.config;
    let kv_bytes = |lanes: usize| {
        (lanes * options.context * c.num_key_value_heads * c.head_dim * 4 * 2 * c.num_hidden_layers) as u64
    };
    let one = decode_step(&engine, "single", 1, &options, &roofline, &launch).unwrap();
    let eight = decode_step(&engine, "lanes-8", 8, &options, &roofline, &launch).unwrap();
    assert!(
        eight.bytes - kv_bytes(8) > one.bytes - kv_bytes(1),
        "eight lanes read {} weight bytes, one lane {}",
        eight.bytes - kv_bytes(8),
        one.bytes - kv_bytes(1)
    );
    let moe_layers = engine
        .checkpoint
        .layers
        .iter()
        .filter(|l| matches!(l, LayerMlp::Moe(_)))
        .count();
    let beside = if c.shared_expert_intermediate_size > 0 {
        moe_layers
    } else {
        0
    };
    assert!(engine.gpu.caps.concurrent_launches, "lavapipe is a Vulkan device");
    assert_eq!(eight.dispatches - eight.waiting_dispatches, beside);
    let floor = eight.waiting_dispatches as f64 * launch.dependent_us * 1e-3;
    assert!(
        (eight.launch_floor_ms - floor).abs() <= 1e-9 * floor,
        "{} vs {floor}",
        eight.launch_floor_ms
    );
    assert!(eight.ratio_to_floors.is_finite() && eight.ratio_to_floors > 0.0);
}

/// The text part times the segments the front end makes of each text: its counts are the
/// front end's own, growing with the text, each time positive.
#[test]
fn text_part_segments_as_the_front_end_does() {
    let (_dir, engine) = tiny_engine("bench text");
    let options = options(BenchPart::Text, 2, Vec::new());
    let results = text(&engine, &options).unwrap();
    let front = TextFrontEnd::new(&engine.checkpoint);
    let cap = engine.checkpoint.config.speech.max_audio_tokens;
    assert_eq!(
        results.iter().map(|r| r.sentences).collect::<Vec<_>>(),
        [1, 10, 100, 1000]
    );
    for r in &results {
        let text = bench_text(r.sentences);
        assert_eq!(r.characters, text.len());
        assert_eq!(r.segments, front.segments_for(&text, cap).unwrap().len(), "{r:?}");
        assert!(r.ms.is_finite() && r.ms > 0.0, "{r:?}");
    }
    assert!(results[3].segments > results[0].segments, "{results:?}");
}
