// FP8 E4M3 weights with one F32 scale per 128x128 tile (`scales` holds the f32 bits,
// [ceil(N/128), ceil(K/128)] per expert); a unit is 16 weights (four words).
const UNIT: u32 = 16u;
// Threads per weight row: one weight row per workgroup.
const LANES: u32 = 64u;

fn unit_dot(row: u32, k: u32, x_base: u32) -> f32 {
    let base = (row * p.in_features + k * 16u) / 4u;
    var s = 0.0;
    for (var j = 0u; j < 4u; j++) {
        let word = w[base + j];
        for (var b = 0u; b < 4u; b++) {
            s += e4m3((word >> (8u * b)) & 0xffu) * x[x_base + j * 4u + b];
        }
    }
    let tiles_per_row = (p.in_features + 127u) / 128u;
    let tile_rows_per_expert = (p.out_features + 127u) / 128u;
    let expert = row / p.out_features;
    let r = row % p.out_features;
    let tile = (expert * tile_rows_per_expert + r / 128u) * tiles_per_row + (k * 16u) / 128u;
    return s * bitcast<f32>(scales[tile]);
}
