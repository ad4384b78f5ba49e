// NVFP4 weights: a unit is one 16-weight block, two words of nibbles (column 8w + i in
// nibble i of word w, one 8-byte load) and one E4M3 block scale (byte row * K/16 + block of
// `scales`).
//
// Decoding places each nibble's bits into an f16: magnitude bits (e1 e0 m) at bits 11..9
// (exponent field e, top mantissa bit m, an f16 subnormal when e = 0) and the sign at bit
// 15, so the f16 holds the E2M1 value times 2^-14 exactly and `unpack2x16float` converts
// two nibbles at once. The 2^14 is folded into the block scale (a power of two: exact). The
// block scale is decoded the same way (see `scale_of`). Every pair and scale is masked
// straight out of its word (fewer instructions than a shift per pair and an E4M3 scale
// decoded with a branch and a select; measured faster in decode steps), the same bits.
alias Unit = vec2<u32>;
const UNIT: u32 = 16u;
// Threads per thread row (WG / LANES thread rows, two weight rows each, per workgroup). (32 threads
// per row, with the tail of each row's blocks loaded in one batch, measured faster alone
// but slower in decode steps of one and eight lanes.)
const LANES: u32 = 16u;

// A word's eight weights: columns 0..3 and 4..7. Nibbles j and j + 4 land in the two f16
// halves of pair j: each pair masks its magnitude bits and its sign bits straight out of the
// word and shifts them into place (nibble 3's sign already sits at bit 15).
fn e2m1_word(word: u32) -> array<vec4<f32>, 2> {
    let a = unpack2x16float(((word & 0x00070007u) << 9u) | ((word & 0x00080008u) << 12u));
    let b = unpack2x16float(((word & 0x00700070u) << 5u) | ((word & 0x00800080u) << 8u));
    let c = unpack2x16float(((word & 0x07000700u) << 1u) | ((word & 0x08000800u) << 4u));
    let d = unpack2x16float(((word & 0x70007000u) >> 3u) | (word & 0x80008000u));
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

// The block scale from its word, times the 2^14 the nibble decoding leaves out. The E4M3
// byte becomes an f16 the same way (exponent and mantissa at bits 13..7: the E4M3 value
// times 2^-8, subnormals included), so the factor is that f16 times 2^22. Its sign bit is
// never set and it is never NaN: the loader refuses negative and NaN block scales.
fn scale_of(word: u32, row: u32, k: u32) -> f32 {
    let block = row * (p.in_features / 16u) + k;
    let byte = word >> ((block % 4u) * 8u);
    return 4194304.0 * unpack2x16float((byte & 0x7fu) << 7u).x;
}
