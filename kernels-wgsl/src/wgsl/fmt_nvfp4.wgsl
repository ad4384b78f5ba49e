// NVFP4 weights: a unit is one 16-weight block, two words of nibbles (column 8w + i in
// nibble i of word w) and one E4M3 block scale (byte row * K/16 + block of `scales`).
const UNIT: u32 = 16u;

struct Unit {
    v: array<f32, 16>,
    scale: f32,
}

fn load_unit(row: u32, k: u32) -> Unit {
    let blocks = p.in_features / 16u;
    let word = (row * blocks + k) * 2u;
    let lo = w[word];
    let hi = w[word + 1u];
    var u: Unit;
    for (var i = 0u; i < 8u; i++) {
        u.v[i] = e2m1_x2((lo >> (4u * i)) & 0xfu);
        u.v[i + 8u] = e2m1_x2((hi >> (4u * i)) & 0xfu);
    }
    let byte = row * blocks + k;
    u.scale = 0.5 * e4m3((scales[byte / 4u] >> ((byte % 4u) * 8u)) & 0xffu);
    return u;
}
