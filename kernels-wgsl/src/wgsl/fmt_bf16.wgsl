// BF16 weights, two per word; a unit is one word (2 weights). Needs an even input width.
const UNIT: u32 = 2u;

struct Unit {
    v: array<f32, 2>,
    scale: f32,
}

fn load_unit(row: u32, k: u32) -> Unit {
    let word = w[row * (p.in_features / 2u) + k];
    return Unit(array<f32, 2>(bf16_half(word, 0u), bf16_half(word, 1u)), 1.0);
}
