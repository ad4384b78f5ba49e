//! One refusal test per malformed checkpoint variant: the real `drama verify` must exit
//! non-zero and name the tensor, key or file at fault, and the library must refuse with the
//! same message.

use drama_checkpoint::{Checkpoint, Provenance};
use drama_fixtures::malformed::{Defect, catalogue};
use drama_tests::drama_text;

fn check(name: &str) {
    let defects = catalogue();
    let defect: &Defect = defects.iter().find(|d| d.name == name).expect("defect in catalogue");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    defect.write(7, &path).unwrap();

    let error = match Checkpoint::open(&path, Provenance::Local(path.clone())) {
        Ok(_) => panic!("{name}: the malformed checkpoint was accepted"),
        Err(e) => e.to_string(),
    };
    // `drama verify --all` meets the same problem first.
    let deviations = Checkpoint::deviations(&path);
    assert_eq!(
        deviations.first().map(ToString::to_string).as_deref(),
        Some(error.as_str()),
        "{name}: the first of every deviation is not the one open refuses"
    );
    for needle in defect.expect {
        assert!(
            error.contains(needle),
            "{name}: error does not name {needle:?}: {error}"
        );
    }
    let (code, stdout, stderr) = drama_text(&["verify", "--checkpoint", path.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{name}: exit code; stdout: {stdout}");
    assert!(
        stderr.contains(&error),
        "{name}: CLI message {stderr:?} lacks {error:?}"
    );
    assert!(
        stdout.is_empty(),
        "{name}: a refused checkpoint printed a report: {stdout}"
    );
}

macro_rules! refusal_tests {
    ($($test:ident => $name:literal,)*) => {
        $(#[test] fn $test() { check($name); })*

        #[test]
        fn every_catalogue_entry_has_a_test() {
            let tested = [$($name),*];
            for defect in catalogue() {
                assert!(tested.contains(&defect.name), "no refusal test for {}", defect.name);
            }
            assert_eq!(tested.len(), catalogue().len());
        }
    };
}

refusal_tests! {
    config_missing_key => "config-missing-key",
    config_missing_nested_key => "config-missing-nested-key",
    config_wrong_type => "config-wrong-type",
    config_heads_not_divisible => "config-heads-not-divisible",
    config_audio_vocab => "config-audio-vocab",
    config_pruned_softmax => "config-pruned-softmax",
    config_absurd_layer_count => "config-absurd-layer-count",
    config_absurd_upsample_rate => "config-absurd-upsample-rate",
    config_absurd_samples_per_code => "config-absurd-samples-per-code",
    config_absurd_expert_groups => "config-absurd-expert-groups",
    config_too_many_routed_experts => "config-too-many-routed-experts",
    config_too_many_expert_groups => "config-too-many-expert-groups",
    config_absurd_mel_bands => "config-absurd-mel-bands",
    config_absurd_mel_frame_rate => "config-absurd-mel-frame-rate",
    config_default_cap_fills_the_context => "config-default-cap-fills-the-context",
    config_eps_underflows_f32 => "config-eps-underflows-f32",
    config_absurd_sample_rate => "config-absurd-sample-rate",
    config_model_type => "config-model-type",
    config_topk_unreachable => "config-topk-unreachable",
    config_topk_unreachable_groups => "config-topk-unreachable-groups",
    quant_config_missing => "quant-config-missing",
    quant_config_exclude_mismatch => "quant-config-exclude-mismatch",
    quant_config_kv_cache => "quant-config-kv-cache",
    quant_config_sources_disagree => "quant-config-sources-disagree",
    quant_config_unknown_method => "quant-config-unknown-method",
    kept_ids_unsorted => "kept-ids-unsorted",
    kept_ids_duplicate => "kept-ids-duplicate",
    kept_ids_out_of_range => "kept-ids-out-of-range",
    kept_ids_too_many => "kept-ids-too-many",
    kept_ids_wrong_dtype => "kept-ids-wrong-dtype",
    kept_ids_missing => "kept-ids-missing",
    expert_missing => "expert-missing",
    expert_not_kept => "expert-not-kept",
    router_rows => "router-rows",
    router_bias_on_softmax => "router-bias-on-softmax",
    router_bias_width => "router-bias-width",
    block_scale_nan => "block-scale-nan",
    block_scale_negative => "block-scale-negative",
    tensor_scale_zero => "tensor-scale-zero",
    tensor_scale_infinite => "tensor-scale-infinite",
    global_scale_negative => "global-scale-negative",
    scales_swizzled_1d => "scales-swizzled-1d",
    packed_weight_shape => "packed-weight-shape",
    two_scale_conventions => "two-scale-conventions",
    fp8_scale_grid => "fp8-scale-grid",
    fp8_weight_nan => "fp8-weight-nan",
    wrong_dtype => "wrong-dtype",
    missing_tensor => "missing-tensor",
    unexpected_tensor => "unexpected-tensor",
    bias_missing => "bias-missing",
    bias_on_o_proj => "bias-on-o-proj",
    bf16_nan => "bf16-nan",
    voice_tower_quantized => "voice-tower-quantized",
    codec_kernel_shape => "codec-kernel-shape",
    manifest_missing => "manifest-missing",
    tokenizer_garbled => "tokenizer-garbled",
    tokenizer_past_text_vocab => "tokenizer-past-text-vocab",
    file_missing => "file-missing",
    byte_modified => "byte-modified",
    bytes_modified_in_two_files => "bytes-modified-in-two-files",
    extra_weight_file => "extra-weight-file",
    manifest_garbled => "manifest-garbled",
    index_wrong_shard => "index-wrong-shard",
}

/// `drama verify --all` lists every deviation of a checkpoint with several, grouped by kind
/// with a count each, as text and as JSON; plain `drama verify` stops at the first.
#[test]
fn verify_all_lists_every_deviation_by_kind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deviant");
    let mut draft = drama_fixtures::generate(&drama_fixtures::Preset::by_name("tiny").unwrap(), 3).unwrap();
    // Two missing tensors.
    for name in [
        "model.layers.1.input_layernorm.weight",
        "model.layers.2.post_attention_layernorm.weight",
    ] {
        draft.tensors.remove(name).unwrap();
    }
    // A tensor no rule names.
    draft.tensors.insert(
        "model.extra.weight".into(),
        drama_fixtures::Tensor::bf16(vec![2], &[1.0, 2.0]),
    );
    // A misshapen one.
    draft.tensors.insert(
        "model.norm.weight".into(),
        drama_fixtures::Tensor::bf16(vec![65], &[1.0; 65]),
    );
    // An NVFP4 expert stored as BF16, which the quantization config does not allow.
    let expert = "model.layers.1.mlp.experts.0.gate_proj";
    for suffix in ["weight_scale", "weight_scale_2", "input_scale"] {
        draft.tensors.remove(&format!("{expert}.{suffix}"));
    }
    draft.tensors.insert(
        format!("{expert}.weight"),
        drama_fixtures::Tensor::bf16(vec![32, 64], &[0.5; 32 * 64]),
    );
    // A NaN block scale (E4M3 0x7F) in another expert.
    let scales = draft
        .tensors
        .get_mut("model.layers.1.mlp.experts.1.up_proj.weight_scale")
        .unwrap();
    scales.data[3] = 0x7F;
    draft.write(&path).unwrap();
    // A file changed after its digest was taken.
    let config = path.join("config.json");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push('\n');
    std::fs::write(&config, text).unwrap();

    let checkpoint = path.to_str().unwrap();
    let (code, _, first) = drama_text(&["verify", "--checkpoint", checkpoint]);
    assert_eq!(code, Some(1));
    assert!(first.contains("config.json: SHA-256"), "{first}");
    let (code, text, err) = drama_text(&["verify", "--checkpoint", checkpoint, "--all"]);
    eprintln!("{text}");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("7 deviation(s), listed above"), "{err}");
    for line in [
        "7 deviation(s) of 6 kind(s)",
        "modified file (1)",
        "missing tensor (2)",
        "  missing tensor model.layers.1.input_layernorm.weight",
        "  missing tensor model.layers.2.post_attention_layernorm.weight",
        "unexpected tensor (1)",
        "  unexpected tensor model.extra.weight: no rule of the contract names it",
        "misshapen tensor (1)",
        "  tensor model.norm.weight: expected BF16 [64], found BF16 [65]",
        "format disagrees with the quantization config (1)",
        "  linear model.layers.1.mlp.experts.0.gate_proj: the quantization config expects NVFP4",
        "bad values (1)",
        "  tensor model.layers.1.mlp.experts.1.up_proj.weight_scale:",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    let (code, json, _) = drama_text(&["verify", "--checkpoint", checkpoint, "--all", "--json"]);
    assert_eq!(code, Some(1));
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(report["deviations"], 7);
    let counts: Vec<(String, u64)> = report["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["kind"].as_str().unwrap().to_string(), k["count"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        counts,
        [
            ("modified file".to_string(), 1),
            ("missing tensor".to_string(), 2),
            ("format disagrees with the quantization config".to_string(), 1),
            ("bad values".to_string(), 1),
            ("misshapen tensor".to_string(), 1),
            ("unexpected tensor".to_string(), 1),
        ]
    );
}
