// Shared number-format helpers, prepended to every kernel that decodes weights or rounds.

// Round an f32 to the nearest BF16 value (ties to even); infinities and NaN pass through.
fn round_bf16(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7f800000u) == 0x7f800000u) {
        return x;
    }
    return bitcast<f32>((b + 0x7fffu + ((b >> 16u) & 1u)) & 0xffff0000u);
}

// `round_bf16` of each component.
fn round_bf16_4(v: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(round_bf16(v.x), round_bf16(v.y), round_bf16(v.z), round_bf16(v.w));
}

// The BF16 value in the low (half 0) or high (half 1) 16 bits of a word.
fn bf16_half(word: u32, half: u32) -> f32 {
    return select(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u), half == 1u);
}

// The two BF16 values of a word: the low half first.
fn bf16_pair(u: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(u << 16u), bitcast<f32>(u & 0xffff0000u));
}

// Two BF16 values (f32s holding BF16 values: their low 16 bits are zero) in one word, the
// first in the low half: the inverse of `bf16_pair`.
fn bf16_word(v: vec2<f32>) -> u32 {
    return (bitcast<u32>(v.x) >> 16u) | (bitcast<u32>(v.y) & 0xffff0000u);
}

// Floats a head of `head_dim` takes in the KV caches and attention's scratch: whole vec4s
// (the host's `head_stride`); the padding stays zero.
fn head_stride(head_dim: u32) -> u32 {
    return (head_dim + 3u) / 4u * 4u;
}
