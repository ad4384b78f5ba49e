//! `drama graph` and `drama trace` through the real binary on a generated checkpoint.

use std::path::Path;

use drama_tests::drama_text;

fn tensors(path: &Path) -> std::collections::BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(name, info)| {
            let offsets = info["data_offsets"].as_array().unwrap();
            let (a, b) = (
                offsets[0].as_u64().unwrap() as usize,
                offsets[1].as_u64().unwrap() as usize,
            );
            let shape = info["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            (
                name.clone(),
                (
                    info["dtype"].as_str().unwrap().to_string(),
                    shape,
                    bytes[8 + n + a..8 + n + b].to_vec(),
                ),
            )
        })
        .collect()
}

/// `drama trace --checkpoint checkpoint ARGS --out out`: exit code, stdout, stderr.
fn run_trace(checkpoint: &str, args: &[&str], out: &Path) -> (Option<i32>, String, String) {
    let mut all = vec!["trace", "--checkpoint", checkpoint];
    all.extend(args);
    all.extend(["--out", out.to_str().unwrap()]);
    drama_text(&all)
}

#[test]
fn graph_dumps_text_json_and_dot() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("tiny");
    drama_fixtures::write_preset("tiny", 3, &ckpt).unwrap();
    let c = ckpt.to_str().unwrap();
    let (code, text, err) = drama_text(&["graph", "--checkpoint", c, "--lanes", "2"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        text.contains("layers.1.router")
            && text.contains("Gathered(Nvfp4, Narrow)")
            && text.contains("kernel launches per step"),
        "{text}"
    );
    // The plain graph: each SwiGLU and MoE combine a node of its own, no linear pair.
    let (code, plain, err) = drama_text(&["graph", "--checkpoint", c, "--stage", "plain"]);
    assert_eq!(code, Some(0), "{err}");
    // A node's label and op name, from its line of the text dump.
    let ops = |dump: &str| -> Vec<(String, String)> {
        dump.lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                (fields.len() > 3 && fields[0].parse::<usize>().is_ok())
                    .then(|| (fields[1].to_string(), fields[2].to_string()))
            })
            .collect()
    };
    let plain_ops = ops(&plain);
    assert!(plain.starts_with("decode step, plain"), "{plain}");
    for (label, op) in [("layers.1.hidden", "moe_combine"), ("layers.0.mlp.act", "swiglu")] {
        assert!(plain_ops.contains(&(label.into(), op.into())), "{plain}");
    }
    assert!(!plain_ops.iter().any(|(_, op)| op == "linear_pair"), "{plain}");
    let scheduled_ops = ops(&text);
    assert!(
        scheduled_ops.contains(&("layers.1.hidden".into(), "moe_combine_norm".into()))
            && !scheduled_ops.iter().any(|(_, op)| op == "moe_combine"),
        "{text}"
    );
    let (code, json, _) = drama_text(&["graph", "--checkpoint", c, "--format", "json"]);
    assert_eq!(code, Some(0));
    let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(parsed["nodes"][0]["op"], "embed");
    let (code, dot, _) = drama_text(&["graph", "--checkpoint", c, "--format", "dot"]);
    assert_eq!(code, Some(0));
    assert!(dot.starts_with("digraph drama {") && dot.contains("->"));
    let huge = u64::MAX.to_string();
    for (flag, value, names) in [
        ("--lanes", "0", "--lanes must be in 1..=4096"),
        ("--lanes", huge.as_str(), "--lanes must be in 1..=4096"),
        ("--capacity", "0", "--capacity must be in 1..="),
        ("--capacity", huge.as_str(), "(max_position_embeddings)"),
    ] {
        let (code, _, err) = drama_text(&["graph", "--checkpoint", c, flag, value]);
        assert_eq!(code, Some(1), "{flag} {value}: {err}");
        assert!(err.contains(names), "{err}");
    }
}

#[test]
fn trace_paired_equals_separate_and_refuses_bad_codes() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("tiny");
    drama_fixtures::write_preset("tiny", 4, &ckpt).unwrap();
    let c = ckpt.to_str().unwrap();
    let paired = dir.path().join("paired.safetensors");
    let separate = dir.path().join("separate.safetensors");
    for (lanes, out) in [("paired", &paired), ("separate", &separate)] {
        let args = [
            "--text-ids",
            "5,17,42",
            "--codes",
            "12,7,30",
            "--gamma",
            "1.5",
            "--lanes",
            lanes,
        ];
        let (code, _, err) = run_trace(c, &args, out);
        assert_eq!(code, Some(0), "{lanes}: {err}");
    }
    let (a, b) = (tensors(&paired), tensors(&separate));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (name, tensor) in &a {
        assert_eq!(tensor, &b[name], "{name} differs between paired and separate");
    }
    // T = 1 + codes rows of C + 2 logits; hidden states for all S = P + text + T positions.
    assert_eq!(a["levels.mixed"].1, vec![4, 66]);
    assert_eq!(a["levels.mixed"].0, "I32");
    assert_eq!(a["layers.2.hidden"].1, vec![4 + 3 + 4, 64]);
    assert_eq!(a["layers.1.router.ids"].0, "I32");
    assert!(!a.contains_key("layers.0.router.ids"), "layer 0 is dense");
    // The codec's decoding of the 3 codes: 12 samples per code in the tiny preset.
    assert_eq!(a["pcm"].1, vec![3 * 12]);
    let (code, _, err) = run_trace(c, &["--text-ids", "5", "--codes", "64"], &dir.path().join("x"));
    assert_eq!(code, Some(1));
    assert!(err.contains("code 64"), "{err}");
    // More positions than the model holds: named by what the user gave.
    let many = vec!["5"; 4100].join(",");
    let (code, _, err) = run_trace(c, &["--text-ids", &many], &dir.path().join("y"));
    assert_eq!(code, Some(1));
    assert!(
        err.contains("4100 text tokens and 0 codes make 4105 positions"),
        "{err}"
    );
}

/// `trace --voice` takes a WAV recording as `synth` does: the same tensors as the voice file
/// `drama voice` makes from it, others than the default prefix's; another kind of file is
/// refused naming the kinds it takes.
#[test]
fn trace_takes_a_recording_or_its_voice_file() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("tiny");
    drama_fixtures::write_preset("tiny", 9, &ckpt).unwrap();
    let c = ckpt.to_str().unwrap();
    let recording = dir.path().join("ref.wav");
    let samples: Vec<f32> = (0..9000).map(|i| 0.3 * (i as f32 * 0.021).sin()).collect();
    std::fs::write(
        &recording,
        drama_engine::audio::write_wav_pcm16(&samples, 16000).unwrap(),
    )
    .unwrap();
    let voice = dir.path().join("voice.safetensors");
    let (code, _, err) = drama_text(&[
        "voice",
        "--checkpoint",
        c,
        "--wav",
        recording.to_str().unwrap(),
        "-o",
        voice.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let trace = |voice: Option<&Path>, out: &str| {
        let out = dir.path().join(out);
        let mut args = vec!["--text-ids", "5,17", "--codes", "3,9"];
        if let Some(voice) = voice {
            args.extend(["--voice", voice.to_str().unwrap()]);
        }
        let (code, _, err) = run_trace(c, &args, &out);
        assert_eq!(code, Some(0), "{err}");
        tensors(&out)
    };
    let from_recording = trace(Some(&recording), "r.safetensors");
    assert_eq!(from_recording, trace(Some(&voice), "v.safetensors"));
    assert_ne!(from_recording, trace(None, "d.safetensors"), "the voice must matter");
    let text = dir.path().join("voice.txt");
    std::fs::write(&text, b"not a voice").unwrap();
    let args = ["--text-ids", "5", "--voice", text.to_str().unwrap()];
    let (code, _, err) = run_trace(c, &args, &dir.path().join("t.safetensors"));
    assert_eq!(code, Some(1));
    assert!(
        err.contains("expected a .wav recording or a .safetensors voice file"),
        "{err}"
    );
}

/// Asking for a backend this machine lacks fails naming it; nothing falls back.
#[cfg(not(target_vendor = "apple"))]
#[test]
fn a_missing_backend_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("tiny");
    drama_fixtures::write_preset("tiny", 5, &ckpt).unwrap();
    let out = dir.path().join("t.safetensors");
    let (code, _, err) = drama_text(&[
        "trace",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--text-ids",
        "1",
        "--codes",
        "2",
        "--backend",
        "metal",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("no Metal adapter") && err.contains("no other backend is tried"),
        "{err}"
    );
    assert!(!out.exists());
}

/// `drama graph` opens no GPU: `--backend` names the API whose step it prints. Where wgpu
/// runs every launch after the one before (Metal), routing's launch computes the shared
/// expert's down projection; on Vulkan the projection runs beside the routed gate/up. An
/// unknown API is refused by name.
#[test]
fn graph_prints_the_step_each_backend_runs() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("tiny");
    drama_fixtures::write_preset("tiny", 6, &ckpt).unwrap();
    let graph = |backend: &str| drama_text(&["graph", "--checkpoint", ckpt.to_str().unwrap(), "--backend", backend]);
    let (code, metal, err) = graph("metal");
    assert_eq!(code, Some(0), "{err}");
    assert!(
        metal.contains("RouteLinear") && metal.contains("; 0 beside the launch before them)"),
        "{metal}"
    );
    let (code, vulkan, err) = graph("vulkan");
    assert_eq!(code, Some(0), "{err}");
    assert!(
        vulkan.contains("shared_expert.down") && vulkan.contains("beside the launch before\n"),
        "{vulkan}"
    );
    assert!(!vulkan.contains("RouteLinear"), "{vulkan}");
    let (code, _, err) = graph("cuda");
    assert_eq!(code, Some(2));
    assert!(err.contains("unknown backend \"cuda\""), "{err}");
}
