// NVFP4 weights: a unit is one 16-weight block, two words of nibbles (column 8w + i in
// nibble i of word w, one 8-byte load) and one E4M3 block scale (byte row * K/16 + block of
// `scales`).
//
// Decoding places each nibble's bits into an f16: magnitude bits (e1 e0 m) at bits 11..9
// (exponent field e, top mantissa bit m, an f16 subnormal when e = 0) and the sign at bit
// 15, so the f16 holds the E2M1 value times 2^-14 exactly and `unpack2x16float` converts
// two nibbles at once. The 2^14 is folded into the block scale (a power of two: exact).
alias Unit = vec2<u32>;
const UNIT: u32 = 16u;
// Threads per thread row: four thread rows (eight weight rows) per workgroup. (32 threads
// per row, with the tail of each row's blocks loaded in one batch, measured faster alone
// but slower in the H200 decode step: 3.97 ms against 3.87 ms for one lane, 12.6 against
// 11.1 ms for 8.)
const LANES: u32 = 16u;

// Nibbles j and j + 4 of `word` as E2M1 values times 2^-14.
fn e2m1_pair(word: u32, j: u32) -> vec2<f32> {
    let t = word >> (4u * j);
    return unpack2x16float(((t & 0x00070007u) << 9u) | ((t & 0x00080008u) << 12u));
}

// A word's eight weights: columns 0..3 and 4..7.
fn e2m1_word(word: u32) -> array<vec4<f32>, 2> {
    let a = e2m1_pair(word, 0u);
    let b = e2m1_pair(word, 1u);
    let c = e2m1_pair(word, 2u);
    let d = e2m1_pair(word, 3u);
    return array<vec4<f32>, 2>(vec4<f32>(a.x, b.x, c.x, d.x), vec4<f32>(a.y, b.y, c.y, d.y));
}

fn decode_unit(u: Unit) -> array<vec4<f32>, 4> {
    let lo = e2m1_word(u.x);
    let hi = e2m1_word(u.y);
    return array<vec4<f32>, 4>(lo[0], lo[1], hi[0], hi[1]);
}

// The word of `scales` holding unit k's E4M3 block scale (four per word).
fn scale_word(row: u32, k: u32) -> u32 {
    let block = row * (p.in_features / 16u) + k;
    return scales[block / 4u];
}

// The block scale from its word, times the 2^14 the nibble decoding leaves out.
fn scale_of(word: u32, row: u32, k: u32) -> f32 {
    let block = row * (p.in_features / 16u) + k;
    return 16384.0 * e4m3((word >> ((block % 4u) * 8u)) & 0xffu);
}
