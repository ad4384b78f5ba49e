//! The engine's E2M1 and E4M3FN decoders against tables made once by ml_dtypes (an
//! independent implementation): `fixtures/golden/make_tables.py`.

use drama_checkpoint::numerics::{e2m1_to_f32, e4m3_to_f32};
use serde_json::Value;

fn table(name: &str) -> Value {
    let path = format!("{}/../fixtures/golden/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Parses a golden value: "nan" or a decimal that is exact in f64.
fn golden_value(v: &Value) -> f64 {
    match v.as_str().unwrap() {
        "nan" => f64::NAN,
        text => text.parse().unwrap(),
    }
}

fn same(ours: f32, golden: f64) -> bool {
    if golden.is_nan() {
        ours.is_nan()
    } else {
        f64::from(ours) == golden && ours.is_sign_negative() == golden.is_sign_negative()
    }
}

#[test]
fn e2m1_decoder_matches_ml_dtypes_for_all_16_codes() {
    let t = table("e2m1.json");
    let decode = t["decode"].as_array().unwrap();
    assert_eq!(decode.len(), 16);
    for (code, golden) in decode.iter().enumerate() {
        let golden = golden_value(golden);
        assert!(same(e2m1_to_f32(code as u8), golden), "code {code}: {golden}");
        // Only the low nibble is read: the high nibble of a packed byte must not leak in.
        assert!(
            same(e2m1_to_f32(code as u8 | 0xA0), golden),
            "code {code} with high bits"
        );
    }
}

#[test]
fn e4m3_decoder_matches_ml_dtypes_for_all_256_bytes() {
    let t = table("e4m3fn.json");
    let decode = t["decode"].as_array().unwrap();
    assert_eq!(decode.len(), 256);
    let mut nans = 0;
    for (bits, golden) in decode.iter().enumerate() {
        let golden = golden_value(golden);
        nans += usize::from(golden.is_nan());
        assert!(same(e4m3_to_f32(bits as u8), golden), "byte {bits:#04x}: {golden}");
    }
    assert_eq!(nans, 2, "exactly 0x7F and 0xFF are NaN");
}
