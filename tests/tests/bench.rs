//! `drama bench` through the real binary on a generated checkpoint: `--only` measures the
//! parts it names (besides the roofline and the launch cost) and writes nothing else, and
//! the kernels part times every NVFP4 size in both kernels that run NVFP4 weights.

use drama_engine::test_support::rng;
use drama_tests::drama_text;
use rand_core::Rng;

/// A tiny checkpoint from a fresh seed in a new folder: (folder, checkpoint, seed).
fn tiny(label: &str) -> (tempfile::TempDir, std::path::PathBuf, u64) {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("tiny");
    let seed = rng(label).next_u64();
    drama_fixtures::write_preset("tiny", seed, &checkpoint).unwrap();
    (dir, checkpoint, seed)
}

/// Runs `drama bench --checkpoint CHECKPOINT --only PART --repeats 1 ARGS --out OUT`.
fn bench_part(part: &str, checkpoint: &std::path::Path, out: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let mut all = vec!["bench", "--checkpoint", checkpoint.to_str().unwrap()];
    all.extend(["--only", part, "--repeats", "1"]);
    all.extend_from_slice(args);
    all.extend(["--out", out.to_str().unwrap()]);
    let (code, _, err) = drama_text(&all);
    (code, err)
}

#[test]
fn bench_only_writes_the_parts_it_names() {
    let (dir, checkpoint, seed) = tiny("bench --only");
    let out = dir.path().join("bench.json");
    let context = 4 + (seed % 12) as usize;
    let (code, err) = bench_part("decode", &checkpoint, &out, &["--context", &context.to_string()]);
    assert_eq!(code, Some(0), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let mut keys: Vec<&str> = report.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["decode", "launch", "machine", "options", "roofline"], "{report}");
    assert_eq!(report["options"]["parts"], serde_json::json!(["decode"]));
    let steps = report["decode"].as_array().unwrap();
    let lanes: Vec<u64> = steps.iter().map(|s| s["lanes"].as_u64().unwrap()).collect();
    assert_eq!(lanes, [1, 2, 4, 8]);
    for step in steps {
        assert_eq!(step["context"].as_u64(), Some(context as u64), "{step}");
        let ms = step["gpu_ms"].as_f64().unwrap();
        assert!(ms.is_finite() && ms > 0.0, "{step}");
    }
    assert!(!err.contains("prefill") && !err.contains("synthesis"), "{err}");
}

/// `--lanes` and `--more-contexts` choose the decode steps timed: each lane count at
/// `--context`, then a guidance pair at each further context.
#[test]
fn bench_times_the_lanes_and_contexts_it_is_given() {
    let (dir, checkpoint, seed) = tiny("bench --lanes");
    let out = dir.path().join("bench.json");
    let (context, longer) = (4 + (seed % 8) as usize, 20 + (seed % 16) as usize);
    let (context_arg, longer_arg) = (context.to_string(), longer.to_string());
    let args = [
        "--context",
        &context_arg,
        "--lanes",
        "3,1,6",
        "--more-contexts",
        &longer_arg,
    ];
    let (code, err) = bench_part("decode", &checkpoint, &out, &args);
    assert_eq!(code, Some(0), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let steps: Vec<(String, u64, u64)> = report["decode"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let label = s["label"].as_str().unwrap().to_string();
            (label, s["lanes"].as_u64().unwrap(), s["context"].as_u64().unwrap())
        })
        .collect();
    let (context, longer) = (context as u64, longer as u64);
    assert_eq!(
        steps,
        [
            ("lanes-3".to_string(), 3, context),
            ("single".to_string(), 1, context),
            ("lanes-6".to_string(), 6, context),
            ("pair".to_string(), 2, longer),
        ]
    );
    let (code, err) = bench_part("decode", &checkpoint, &out, &["--lanes", "0"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("at least one lane"), "{err}");
}

#[test]
fn bench_times_each_nvfp4_size_in_the_dense_and_the_routed_expert_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("tiny");
    drama_fixtures::write_preset("tiny", rng("bench kernels").next_u64(), &checkpoint).unwrap();
    let out = dir.path().join("bench.json");
    let (code, _, err) = drama_text(&[
        "bench",
        "--checkpoint",
        checkpoint.to_str().unwrap(),
        "--only",
        "kernels",
        "--repeats",
        "1",
        "--rotation-bytes",
        "65536",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let kernels = report["kernels"].as_array().unwrap();
    let cases = |kernel: &str, format: &str| -> Vec<(u64, u64, u64)> {
        let mut cases: Vec<(u64, u64, u64)> = kernels
            .iter()
            .filter(|k| k["kernel"] == kernel && k["format"] == format)
            .map(|k| {
                (
                    k["rows"].as_u64().unwrap(),
                    k["cols"].as_u64().unwrap(),
                    k["lanes"].as_u64().unwrap(),
                )
            })
            .collect();
        cases.sort_unstable();
        cases
    };
    let dense = cases("dense", "Nvfp4");
    assert!(
        !dense.is_empty() && dense.iter().any(|&(.., lanes)| lanes == 2),
        "{report}"
    );
    assert_eq!(cases("routed_expert", "Nvfp4"), dense, "{report}");
    assert!(!cases("dense", "Bf16").is_empty(), "{report}");
    assert!(cases("routed_expert", "Bf16").is_empty(), "{report}");
    for k in kernels {
        for field in ["us", "stream_us", "overlapped_us", "overlapped_stream_us"] {
            let us = k[field].as_f64().unwrap();
            assert!(us.is_finite() && us > 0.0, "{field}: {k}");
        }
    }
}

/// `--more-codec-chunks` times a chunk of each size it names besides synthesis's own, each
/// decoding its codes' samples.
#[test]
fn bench_times_the_codec_chunks_it_is_given() {
    let (dir, checkpoint, seed) = tiny("bench --more-codec-chunks");
    let out = dir.path().join("bench.json");
    let sizes = [1 + (seed % 5) as usize, 20 + (seed % 40) as usize];
    let sizes_arg = format!("{},{}", sizes[0], sizes[1]);
    let (code, err) = bench_part("codec", &checkpoint, &out, &["--more-codec-chunks", &sizes_arg]);
    assert_eq!(code, Some(0), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let config =
        drama_checkpoint::Checkpoint::open(&checkpoint, drama_checkpoint::Provenance::Local(checkpoint.clone()))
            .unwrap()
            .config;
    let samples_per_code = config.codec.samples_per_code() as u64;
    let chunk = |c: &serde_json::Value| -> (u64, u64) {
        let ms = c["gpu_ms"].as_f64().unwrap();
        assert!(ms.is_finite() && ms > 0.0, "{c}");
        (c["codes"].as_u64().unwrap(), c["samples"].as_u64().unwrap())
    };
    assert_eq!(report["machine"]["adapter"]["numerics"], "AsWritten");
    let synthesis_chunk = drama_engine::synth::CODEC_CHUNK as u64;
    assert_eq!(
        chunk(&report["codec"]),
        (synthesis_chunk, synthesis_chunk * samples_per_code)
    );
    let more: Vec<(u64, u64)> = report["more_codec_chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(chunk)
        .collect();
    let expected: Vec<(u64, u64)> = sizes.iter().map(|&n| (n as u64, n as u64 * samples_per_code)).collect();
    assert_eq!(more, expected, "{report}");
    let most = config.speech.max_audio_tokens;
    for refused in [0, most + 1] {
        let refused_arg = format!("{},{refused}", sizes[0]);
        let (code, err) = bench_part("codec", &checkpoint, &out, &["--more-codec-chunks", &refused_arg]);
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains(&format!("codec chunks of {refused} codes")) && err.contains(&format!("1..={most}")),
            "{err}"
        );
        assert!(!err.contains("bench: roofline"), "refused only after starting: {err}");
    }
}

/// `--numerics fast-math-emulation` times the kernels compiled as Metal's fast math may
/// compile them, and the report says so.
#[test]
fn bench_compiles_the_kernels_as_numerics_asks() {
    let (dir, checkpoint, _) = tiny("bench --numerics");
    let out = dir.path().join("bench.json");
    let (code, err) = bench_part("codec", &checkpoint, &out, &["--numerics", "fast-math-emulation"]);
    assert_eq!(code, Some(0), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(
        report["machine"]["adapter"]["numerics"], "FastMathEmulation",
        "{report}"
    );
    let ms = report["codec"]["gpu_ms"].as_f64().unwrap();
    assert!(ms.is_finite() && ms > 0.0, "{report}");
}

#[test]
fn bench_refuses_a_part_it_does_not_know() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bench.json");
    let (code, _, err) = drama_text(&[
        "bench",
        "--checkpoint",
        "unused",
        "--only",
        "decode,roofs",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("'roofs'") && err.contains("--only"), "{err}");
    assert!(!out.exists());
}

#[test]
fn bench_refuses_parts_past_the_context_before_loading() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("tiny");
    drama_fixtures::write_preset("tiny", 3, &checkpoint).unwrap();
    // In a folder that does not exist yet: a refused run does not make it.
    let out = dir.path().join("results").join("bench.json");
    let huge = u64::MAX.to_string();
    for (part, flags, names) in [
        (
            "decode",
            ["--context", huge.as_str()],
            "decode steps at context 18446744073709551615",
        ),
        (
            "decode",
            ["--repeats", huge.as_str()],
            "with 18446744073709551615 repeats",
        ),
        ("decode", ["--repeats", "0"], "repeats must be at least 1"),
        ("prefill", ["--prefill-rows", "0"], "prefill rows 0 must be in 1..="),
        (
            "prefill",
            ["--prefill-rows", huge.as_str()],
            "prefill rows 18446744073709551615",
        ),
        (
            "synthesis",
            ["--synthesis-tokens", "0"],
            "synthesis tokens 0 must be in 1..=",
        ),
        (
            "synthesis",
            ["--synthesis-tokens", huge.as_str()],
            "synthesis tokens 18446744073709551615",
        ),
    ] {
        let mut args = vec!["bench", "--checkpoint", checkpoint.to_str().unwrap(), "--only", part];
        args.extend(flags);
        args.extend(["--out", out.to_str().unwrap()]);
        let (code, _, err) = drama_text(&args);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains(names), "{err}");
        assert!(!err.contains("bench: roofline"), "refused only after starting: {err}");
        assert!(
            !out.parent().unwrap().exists(),
            "{part} {flags:?}: the output's folder was made"
        );
    }
}
