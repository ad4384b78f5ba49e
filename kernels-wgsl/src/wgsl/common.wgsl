// Shared number-format helpers, prepended to every kernel that decodes weights or rounds.

// Round an f32 to the nearest BF16 value (ties to even); infinities and NaN pass through.
fn round_bf16(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7f800000u) == 0x7f800000u) {
        return x;
    }
    return bitcast<f32>((b + 0x7fffu + ((b >> 16u) & 1u)) & 0xffff0000u);
}

// The BF16 value in the low (half 0) or high (half 1) 16 bits of a word.
fn bf16_half(word: u32, half: u32) -> f32 {
    return select(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u), half == 1u);
}

