// NVFP4 weights: a unit is one 16-weight block, two words of nibbles (column 8w + i in
// nibble i of word w) and one E4M3 block scale (byte row * K/16 + block of `scales`).
// Decoded straight into the dot product: no per-block array, so nothing spills.
const UNIT: u32 = 16u;
// Threads per weight row: four weight rows per workgroup, 16 threads each: 16-weight units give each thread several blocks.
const LANES: u32 = 16u;

fn nibbles_dot(word: u32, x_base: u32) -> f32 {
    var s = 0.0;
    for (var i = 0u; i < 8u; i++) {
        s += e2m1_x2((word >> (4u * i)) & 0xfu) * x[x_base + i];
    }
    return s;
}

fn unit_dot(row: u32, k: u32, x_base: u32) -> f32 {
    let block = row * (p.in_features / 16u) + k;
    let lo = w[block * 2u];
    let hi = w[block * 2u + 1u];
    let scale = 0.5 * e4m3((scales[block / 4u] >> ((block % 4u) * 8u)) & 0xffu);
    return (nibbles_dot(lo, x_base) + nibbles_dot(hi, x_base + 8u)) * scale;
}
