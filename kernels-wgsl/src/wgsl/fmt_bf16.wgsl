// BF16 weights, two per word; a unit is one word (2 weights). Needs an even input width.
const UNIT: u32 = 2u;
// Threads per weight row: one weight row per workgroup: a unit is small, so every thread of the workgroup shares the row.
const LANES: u32 = 64u;

fn unit_dot(row: u32, k: u32, x_base: u32) -> f32 {
    let word = w[row * (p.in_features / 2u) + k];
    return bf16_half(word, 0u) * x[x_base] + bf16_half(word, 1u) * x[x_base + 1u];
}
