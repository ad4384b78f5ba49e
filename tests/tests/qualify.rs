//! `drama qualify`: a quick run on this machine's GPU passes and writes a receipt of the
//! documented shape (every check with its figure and limit, no paths); a planted wrong
//! GPU result makes it fail, naming the check.

use drama_tests::drama_text;
use serde_json::Value;

/// The checks a quick run without a checkpoint makes, in order.
const QUICK_CHECKS: [&str; 23] = [
    "kernel.linear.bf16",
    "kernel.linear.bf16-ragged",
    "kernel.linear.nvfp4-modelopt",
    "kernel.linear.nvfp4-compressed-tensors",
    "kernel.linear.fp8-block",
    "model.tiny.logits",
    "model.tiny.f32-precision",
    "model.tiny.hidden",
    "model.tiny.routes",
    "exact.paired-separate",
    "exact.codec-chunked",
    "exact.batched-solo",
    "exact.voice-file",
    "exact.same-seed",
    "exact.sampler",
    "reference.codec",
    "reference.voice-tower",
    "reference.long-context",
    "exact.long-context-steps",
    "given.same-seed",
    "given.voice-a-b-a",
    "given.serve-stream-whole",
    "given.serve-after-cancel",
];

#[test]
fn a_quick_run_passes_and_writes_a_receipt_without_paths() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("receipt.json");
    let (code, stdout, stderr) =
        drama_text(&["qualify", "--quick", "--backend", "vulkan", "-o", out.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("19 passed, 0 failed, 4 skipped"), "{stdout}");
    let text = std::fs::read_to_string(&out).unwrap();
    let receipt: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(receipt["schema"], 1);
    assert_eq!(receipt["quick"], true);
    assert_eq!(receipt["checkpoint"], Value::Null);
    for key in ["version", "commit", "wgpu", "profile"] {
        assert!(receipt["build"][key].is_string(), "build.{key}: {text}");
    }
    let caps = &receipt["platform"]["capabilities"];
    for key in ["backend", "adapter", "driver", "compiler_math"] {
        assert!(caps[key].is_string(), "capabilities.{key}: {text}");
    }
    assert_eq!(caps["backend"], "Vulkan");
    // The receipt lists the adapter's matrix units (lavapipe of Mesa 22 has none), and so
    // does the summary's first line.
    assert!(
        stdout
            .lines()
            .next()
            .is_some_and(|line| line.contains(", matrix units: ")),
        "{stdout}"
    );
    for unit in caps["matrix_units"]
        .as_array()
        .unwrap_or_else(|| panic!("matrix_units: {text}"))
    {
        for key in ["m", "n", "k"] {
            assert!(unit[key].as_u64().is_some_and(|size| size == 8 || size == 16), "{unit}");
        }
        for key in ["inputs", "accumulator"] {
            assert!(unit[key].is_string(), "{unit}");
        }
    }
    assert!(receipt["platform"]["os"].is_string());
    let checks = receipt["checks"].as_array().unwrap();
    let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, QUICK_CHECKS);
    for check in checks {
        let status = check["status"].as_str().unwrap();
        match status {
            "pass" => {
                let (figure, limit) = (check["figure"].as_f64().unwrap(), check["limit"].as_f64().unwrap());
                assert!(figure <= limit, "{check}");
            }
            "skipped" => assert_eq!(check["detail"], "no --checkpoint given", "{check}"),
            _ => panic!("{check}"),
        }
    }
    for key in ["decode_step_ms", "decode_step_gpu_ms"] {
        let steps = receipt["bench"][key].as_array().unwrap();
        let lanes: Vec<u64> = steps.iter().map(|s| s[0].as_u64().unwrap()).collect();
        assert_eq!(lanes, [1, 2, 8], "{key}");
        assert!(steps.iter().all(|s| s[1].as_f64().unwrap() > 0.0), "{key}");
    }
    for key in ["prefill_ms", "real_time_factor", "first_audio_s", "peak_resident_mib"] {
        assert!(receipt["bench"][key].as_f64().unwrap() > 0.0, "bench.{key}: {text}");
    }
    assert_eq!(
        receipt["passed"].as_u64().unwrap() + receipt["skipped"].as_u64().unwrap(),
        checks.len() as u64
    );
    // No paths: not the receipt's folder, not the temporary folder, not the home folder.
    let temp = std::env::temp_dir();
    for path in [dir.path(), temp.as_path()] {
        assert!(!text.contains(path.to_str().unwrap()), "{text}");
    }
    if let Some(home) = std::env::var_os("HOME").filter(|h| h.len() > 1) {
        assert!(!text.contains(home.to_str().unwrap()), "{text}");
    }
}

/// Wrong results in a kernel check, in exactness checks, in a reference check that may try
/// fresh checkpoints and in both checks of one long utterance each fail the run, which
/// names each of them (on stdout's lines and in the error), with the other checks still
/// run and passing.
#[test]
fn planted_wrong_results_fail_naming_their_checks() {
    let planted = [
        "kernel.linear.nvfp4-modelopt",
        "exact.voice-file",
        "exact.sampler",
        "reference.codec",
        "reference.long-context",
        "exact.long-context-steps",
    ];
    let mut args = vec!["qualify", "--quick"];
    for check in planted {
        args.extend(["--plant", check]);
    }
    let (code, stdout, stderr) = drama_text(&args);
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    for check in planted {
        let line = stdout
            .lines()
            .find(|l| l.contains(check))
            .unwrap_or_else(|| panic!("{check}: {stdout}"));
        assert!(line.starts_with("FAIL"), "{line}");
    }
    let passed = QUICK_CHECKS.len() - 4 - planted.len();
    let counts = format!("{passed} passed, {} failed, 4 skipped", planted.len());
    assert!(stdout.contains(&counts), "{stdout}");
    let named = format!("{} check(s) failed: {}", planted.len(), planted.join(", "));
    assert!(stderr.contains(&named), "{stderr}");
}
