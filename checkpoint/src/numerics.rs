//! Scalar number formats of the contract, decoded exactly as `docs/contract.md` §4 defines them.
//!
//! These decoders are the engine's single source of truth on the CPU side (load-time scale
//! validation and the FP64 reference); the golden tables in `fixtures/golden/` (made by
//! `ml_dtypes`, an independent implementation) check them.

/// The 16 E2M1 (FP4) values, indexed by the 4-bit code; bit 3 is the sign.
pub const E2M1_VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Decodes a 4-bit E2M1 code (only the low 4 bits of `code` are read).
pub fn e2m1_to_f32(code: u8) -> f32 {
    E2M1_VALUES[usize::from(code & 0x0F)]
}

/// Largest finite E4M3FN value.
pub const E4M3_MAX: f32 = 448.0;

/// Whether an E4M3FN byte encodes NaN (0x7F and 0xFF; the format has no infinities).
pub fn e4m3_is_nan(bits: u8) -> bool {
    bits & 0x7F == 0x7F
}

/// Decodes an E4M3FN byte: bias 7, subnormals `m * 2^-9`, NaN at 0x7F/0xFF.
pub fn e4m3_to_f32(bits: u8) -> f32 {
    if e4m3_is_nan(bits) {
        return f32::NAN;
    }
    let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
    let exponent = i32::from((bits >> 3) & 0x0F);
    let mantissa = f32::from(bits & 0x07);
    let magnitude = if exponent == 0 {
        mantissa * (2.0f32).powi(-9)
    } else {
        (1.0 + mantissa / 8.0) * (2.0f32).powi(exponent - 7)
    };
    sign * magnitude
}

/// Decodes a BF16 value given as its raw bits.
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Rounds an FP32 value to BF16 with round-to-nearest-even (NaN stays NaN), returning bits.
pub fn f32_to_bf16_bits(value: f32) -> u16 {
    half::bf16::from_f32(value).to_bits()
}

/// Rounds an FP32 value to the nearest BF16 value (round-to-nearest-even).
pub fn round_to_bf16(value: f32) -> f32 {
    bf16_to_f32(f32_to_bf16_bits(value))
}

/// Little-endian BF16 or F32 tensor bytes as f32 values (exact); `None` for another dtype.
pub fn float_values(bytes: &[u8], dtype: safetensors::Dtype) -> Option<Vec<f32>> {
    match dtype {
        safetensors::Dtype::BF16 => Some(
            bytes
                .chunks_exact(2)
                .map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        safetensors::Dtype::F32 => Some(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_landmarks() {
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0xB8), -1.0);
        assert!(e4m3_to_f32(0x7F).is_nan() && e4m3_to_f32(0xFF).is_nan());
        assert!(e4m3_to_f32(0x80) == 0.0 && e4m3_to_f32(0x80).is_sign_negative());
    }

    #[test]
    fn bf16_rounds_half_to_even() {
        // 1 + 2^-8 lies exactly between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
        assert_eq!(round_to_bf16(1.0 + 2f32.powi(-8)), 1.0);
        // 1 + 3*2^-8 lies between 1 + 2^-7 (odd) and 1 + 2^-6 (even): goes up.
        assert_eq!(round_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
        assert!(round_to_bf16(f32::NAN).is_nan());
    }
}
