// Small FP32 element-wise kernels between the big ones. One thread per output element,
// dispatched 2-D when a dimension would pass 65535 workgroups.

const WG: u32 = 64u;

struct Params {
    count: u32,        // output elements
    width: u32,        // row width
    k: u32,            // embed: first row of the text table's segment; mean_rows: rows averaged
    flags: u32,        // ELEMENTWISE_* bits (flags.rs)
    row_end: u32,      // embed: one past the last row of the text table's segment
    audio_begin: u32,  // embed: first row of the audio table's segment
    audio_end: u32,    // embed: one past the last row of the audio table's segment
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read> c: array<f32>;
@group(0) @binding(4) var<storage, read> d: array<f32>;
@group(0) @binding(5) var<storage, read> words: array<u32>;
@group(0) @binding(6) var<storage, read> row_table: array<u32>;
@group(0) @binding(7) var<storage, read> row_index: array<u32>;
@group(0) @binding(8) var<storage, read_write> out: array<f32>;

fn element(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

fn maybe_round(v: f32) -> f32 {
    return select(v, round_bf16(v), (p.flags & ELEMENTWISE_ROUND) != 0u);
}

// out = silu(gate) * up, from rows of a = [gate | up], each half `width` wide.
@compute @workgroup_size(64)
fn swiglu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = element(gid, nwg);
    if (i >= p.count) {
        return;
    }
    let gate = (i / p.width) * 2u * p.width + i % p.width;
    let g = a[gate];
    out[i] = maybe_round(g / (1.0 + exp(-g)) * a[gate + p.width]);
}

// BF16 values (f32 storage) two to a word, the lower index in the low half: the input of a
// many-row step's linears (`x_packed` in linear.wgsl), half the bytes and loads.
// The values are BF16 already, so dropping the low halves is exact. `p.count` is words.
@group(0) @binding(8) var<storage, read_write> out_words: array<u32>;

@compute @workgroup_size(64)
fn pack_bf16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = element(gid, nwg);
    if (i >= p.count) {
        return;
    }
    out_words[i] = bf16_word(vec2<f32>(a[2u * i], a[2u * i + 1u]));
}

// out = a + b (the voice tower's residual connections).
@compute @workgroup_size(64)
fn add(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = element(gid, nwg);
    if (i >= p.count) {
        return;
    }
    out[i] = maybe_round(a[i] + b[i]);
}

// `embed`'s view of bindings 2 and 5: a segment of the audio and of the text table, BF16
// two to a word.
@group(0) @binding(2) var<storage, read> audio_words: array<u32>;

// The step's input rows from their tables, all in one launch (row r from table
// row_table[r], row row_index[r]): the rows of the text and audio tables' segments this
// launch binds, and with flag 1 the voice-prefix rows (F32, `a`). Tables larger than a
// storage binding take a launch per segment; every other table's rows are written by the
// first. (Three launches, the prefixes and each table's in its own, each waiting for the
// one before since they write the same buffer: two more waiting launches per step.)
@compute @workgroup_size(64)
fn embed(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = element(gid, nwg);
    if (i >= p.count) {
        return;
    }
    let r = i / p.width;
    let column = i % p.width;
    let index = row_index[r];
    let table = row_table[r];
    if (table == ROW_PREFIX && (p.flags & ELEMENTWISE_PREFIX_ROWS) != 0u) {
        out[i] = a[index * p.width + column];
    } else if (table == ROW_TEXT && index >= p.k && index < p.row_end) {
        let e = (index - p.k) * p.width + column;
        out[i] = bf16_half(words[e / 2u], e & 1u);
    } else if (table == ROW_AUDIO && index >= p.audio_begin && index < p.audio_end) {
        let e = (index - p.audio_begin) * p.width + column;
        out[i] = bf16_half(audio_words[e / 2u], e & 1u);
    }
}

// erf(x) to about 1.5e-7 absolute (Abramowitz & Stegun 7.1.26), since WGSL has no erf.
fn erf_approx(x: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.3275911 * abs(x));
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    let y = 1.0 - poly * exp(-x * x);
    return select(-y, y, x >= 0.0);
}

// out = gelu(a) = 0.5 a (1 + erf(a / sqrt(2))); flag 1 rounds to BF16.
@compute @workgroup_size(64)
fn gelu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = element(gid, nwg);
    if (i >= p.count) {
        return;
    }
    let v = a[i];
    out[i] = maybe_round(0.5 * v * (1.0 + erf_approx(v * 0.70710678118654752)));
}

// out[c] = mean over the `k` rows of a[row, c] (row width `width`), summed in row order;
// flag 1 rounds to BF16.
@compute @workgroup_size(64)
fn mean_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let c = element(gid, nwg);
    if (c >= p.count) {
        return;
    }
    var sum = 0.0;
    for (var r = 0u; r < p.k; r++) {
        sum += a[r * p.width + c];
    }
    out[c] = maybe_round(sum / f32(p.k));
}
