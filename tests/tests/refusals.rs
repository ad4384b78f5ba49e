//! One refusal test per malformed checkpoint variant: the real `drama verify` must exit
//! non-zero and name the tensor, key or file at fault, and the library must refuse with the
//! same message.

use drama_engine::checkpoint::{Checkpoint, Provenance};
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
