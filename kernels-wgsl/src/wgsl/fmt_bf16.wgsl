// BF16 weights, two per word; a unit is four words (8 weights, one 16-byte load). Needs an
// input width that is a multiple of 8.
alias Unit = vec4<u32>;
const UNIT: u32 = 8u;
// Threads per thread row (WG / LANES thread rows, two weight rows each, per workgroup).
const LANES: u32 = 32u;

fn decode_unit(u: Unit) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(
        vec4<f32>(bf16_pair(u.x), bf16_pair(u.y)),
        vec4<f32>(bf16_pair(u.z), bf16_pair(u.w)),
    );
}

// BF16 has no scales.
fn scale_word(row: u32, k: u32) -> u32 {
    return 0u;
}

// BF16 has no scales.
fn scale_of(word: u32, row: u32, k: u32) -> f32 {
    return 1.0;
}
