// FP8 E4M3 weights with one F32 scale per 128x128 tile (`scales` holds the f32 bits,
// [ceil(N/128), ceil(K/128)] per expert); a unit is 16 weights (four words, one 16-byte
// load).
//
// Decoding places each byte's exponent and mantissa at f16 bits 13..7 and its sign at bit
// 15: the f16 holds the E4M3 value times 2^-8 exactly (E4M3 subnormals become f16
// subnormals), and `unpack2x16float` converts two bytes at once. The 2^8 is folded into the
// tile scale (a power of two: exact).
alias Unit = vec4<u32>;
const UNIT: u32 = 16u;
// Threads per thread row (WG / LANES thread rows, two weight rows each, per workgroup).
const LANES: u32 = 32u;

// Bytes j and j + 2 of `word` as E4M3 values times 2^-8.
fn e4m3_pair(word: u32, j: u32) -> vec2<f32> {
    let t = word >> (8u * j);
    return unpack2x16float(((t & 0x007f007fu) << 7u) | ((t & 0x00800080u) << 8u));
}

fn e4m3_word(word: u32) -> vec4<f32> {
    let a = e4m3_pair(word, 0u);
    let b = e4m3_pair(word, 1u);
    return vec4<f32>(a.x, b.x, a.y, b.y);
}

fn decode_unit(u: Unit) -> array<vec4<f32>, 4> {
    return array<vec4<f32>, 4>(e4m3_word(u.x), e4m3_word(u.y), e4m3_word(u.z), e4m3_word(u.w));
}

// The F32 scale of the 128x128 tile holding unit k of `row` (its bits).
fn scale_word(row: u32, k: u32) -> u32 {
    let tiles_per_row = (p.in_features + 127u) / 128u;
    let tile_rows_per_expert = (p.out_features + 127u) / 128u;
    let expert = row / p.out_features;
    let r = row % p.out_features;
    let tile = (expert * tile_rows_per_expert + r / 128u) * tiles_per_row + (k * 16u) / 128u;
    return scales[tile];
}

// The tile scale, times the 2^8 the byte decoding leaves out.
fn scale_of(word: u32, row: u32, k: u32) -> f32 {
    return 256.0 * bitcast<f32>(word);
}
