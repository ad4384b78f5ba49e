// RMSNorm in FP32: y = x * 1/sqrt(mean(x^2) + eps) * w, one 256-invocation workgroup per
// row reading vec4s (the width a multiple of 4, as the backbone's is); `rms_norm_any` reads
// rows of any width (the voice tower's) element by element. With flag 1 the output is
// rounded to BF16 (when every consumer is a linear, which rounds its input anyway: rounding
// once here keeps the linears free of it), and with flag 4 as well written as BF16 pairs
// (when every consumer is a linear reading pairs: no packing launch between).
//
// `combine_rms_norm` first combines a MoE layer into the residual stream, then norms the
// result for the next layer (or the final norm): h = residual + sum_j weight_j * routed_j
// (+ sigmoid(gate logit) * shared with flag 2, a layer with a shared expert), the K routed
// experts summed in the router's order (ascending original id), written to `h`; y =
// rmsnorm(h). The combine waits for every expert of the layer, routed and shared, so no
// linear's epilogue can do it once the shared expert's down projection runs beside
// routing; here it costs no launch of its own.
const WG: u32 = 256u;

struct Params {
    width: u32,
    flags: u32,         // NORM_* bits (flags.rs)
    eps: f32,
    k: u32,             // combine: routed experts per token
    gate_stride: u32,   // combine: floats per `gate_logits` row, the shared gate's logit last
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> weight: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read_write> y: array<vec4<f32>>;
// The combine's inputs and the residual stream it writes.
@group(0) @binding(4) var<storage, read> routed_out: array<vec4<f32>>;  // [rows * k, width]
@group(0) @binding(5) var<storage, read> routed_weights: array<f32>;    // [rows, k]
@group(0) @binding(6) var<storage, read> gate_logits: array<f32>;       // [rows, gate_stride]
@group(0) @binding(7) var<storage, read> shared_out: array<vec4<f32>>;  // [rows, width]
@group(0) @binding(8) var<storage, read_write> h: array<vec4<f32>>;     // [rows, width]
// The output as BF16 pairs (flag 4), which the linears of steps of many rows read.
@group(0) @binding(12) var<storage, read_write> y_pairs: array<vec2<u32>>;

// The weights as f32s.
fn weight_vec(i: u32) -> vec4<f32> {
    let wv = weight[i];
    return vec4<f32>(bf16_half(wv.x, 0u), bf16_half(wv.x, 1u), bf16_half(wv.y, 0u), bf16_half(wv.y, 1u));
}

// x * inv * w, rounded to BF16 with flag 1.
fn normed(v: vec4<f32>, inv: f32, w: vec4<f32>) -> vec4<f32> {
    var n = v * inv * w;
    if ((p.flags & NORM_ROUND) != 0u) {
        n = round_bf16_4(n);
    }
    return n;
}

// The sum of squares of an invocation's first two vec4 columns (t and t + WG), those inside
// the row.
fn first_squares(t: u32, columns: u32, v0: vec4<f32>, v1: vec4<f32>) -> f32 {
    var sum = 0.0;
    if (t < columns) {
        sum += dot(v0, v0);
    }
    if (t + WG < columns) {
        sum += dot(v1, v1);
    }
    return sum;
}

// 1 / sqrt(mean(x^2) + eps) from every invocation's part of the row's sum of squares. Every
// invocation must call it.
fn inverse_rms(t: u32, sum: f32) -> f32 {
    let total = tree_reduce(t, sum, false, WG);
    return 1.0 / sqrt(total / f32(p.width) + p.eps);
}

// Writes vec4 column i of the output: to `y`, or with flag 4 to `y_pairs` (flag 4 comes
// with flag 1, so the values are BF16 already).
fn store_normed(i: u32, v: vec4<f32>) {
    if ((p.flags & NORM_PAIRS) != 0u) {
        y_pairs[i] = vec2<u32>(bf16_word(v.xy), bf16_word(v.zw));
    } else {
        y[i] = v;
    }
}

// Writes an invocation's first two vec4 columns normed: `first` holds them, then their
// weights.
fn write_first(t: u32, base: u32, columns: u32, inv: f32, first: array<vec4<f32>, 4>) {
    if (t < columns) {
        store_normed(base + t, normed(first[0], inv, first[2]));
    }
    if (t + WG < columns) {
        store_normed(base + t + WG, normed(first[1], inv, first[3]));
    }
}

// An invocation's first two vec4 columns (t and t + WG: all of a row up to 2048 wide) and
// their weights are loaded once, before the reduction, so the output pass does not wait for
// memory; wider rows load the rest as they go.
@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let columns = p.width / 4u;
    let base = wg.x * columns;
    let i0 = min(t, columns - 1u);
    let i1 = min(t + WG, columns - 1u);
    let x0 = x[base + i0];
    let x1 = x[base + i1];
    let w0 = weight_vec(i0);
    let w1 = weight_vec(i1);
    var sum = first_squares(t, columns, x0, x1);
    for (var i = t + 2u * WG; i < columns; i += WG) {
        let v = x[base + i];
        sum += dot(v, v);
    }
    let inv = inverse_rms(t, sum);
    write_first(t, base, columns, inv, array<vec4<f32>, 4>(x0, x1, w0, w1));
    for (var i = t + 2u * WG; i < columns; i += WG) {
        store_normed(base + i, normed(x[base + i], inv, weight_vec(i)));
    }
}

// Eight experts' terms of one vec4 column added to `sum` in order (experts `j0 + e` at or
// past `k` add nothing), from weights `w` and outputs `o` loaded beforehand.
fn add_terms(sum: vec4<f32>, j0: u32, w: array<f32, 8>, o: array<vec4<f32>, 8>) -> vec4<f32> {
    var s = sum;
    if (j0 < p.k) { s += w[0] * o[0]; }
    if (j0 + 1u < p.k) { s += w[1] * o[1]; }
    if (j0 + 2u < p.k) { s += w[2] * o[2]; }
    if (j0 + 3u < p.k) { s += w[3] * o[3]; }
    if (j0 + 4u < p.k) { s += w[4] * o[4]; }
    if (j0 + 5u < p.k) { s += w[5] * o[5]; }
    if (j0 + 6u < p.k) { s += w[6] * o[6]; }
    if (j0 + 7u < p.k) { s += w[7] * o[7]; }
    return s;
}

// Vec4 columns `i0` and `i1` of row `row` of the combined residual stream (see the top of
// the file), each component's terms in the order of the scalar expression. Every load of a
// batch of eight experts is issued before its terms are added: more loads in flight hide
// memory latency (a loop loading one expert at a time, ten loads in a row, measured slower).
fn combined(row: u32, i0: u32, i1: u32, gate: f32) -> array<vec4<f32>, 2> {
    let columns = p.width / 4u;
    let first = row * p.k;
    let last = first + p.k - 1u;
    var sum0 = vec4<f32>(0.0);
    var sum1 = vec4<f32>(0.0);
    for (var j0 = 0u; j0 < p.k; j0 += 8u) {
        let at = min(vec4<u32>(first + j0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last));
        let at_high = min(vec4<u32>(first + j0 + 4u) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last));
        let slot = array<u32, 8>(at.x, at.y, at.z, at.w, at_high.x, at_high.y, at_high.z, at_high.w);
        let w = array<f32, 8>(
            routed_weights[slot[0]], routed_weights[slot[1]], routed_weights[slot[2]], routed_weights[slot[3]],
            routed_weights[slot[4]], routed_weights[slot[5]], routed_weights[slot[6]], routed_weights[slot[7]],
        );
        let o0 = array<vec4<f32>, 8>(
            routed_out[slot[0] * columns + i0], routed_out[slot[1] * columns + i0],
            routed_out[slot[2] * columns + i0], routed_out[slot[3] * columns + i0],
            routed_out[slot[4] * columns + i0], routed_out[slot[5] * columns + i0],
            routed_out[slot[6] * columns + i0], routed_out[slot[7] * columns + i0],
        );
        let o1 = array<vec4<f32>, 8>(
            routed_out[slot[0] * columns + i1], routed_out[slot[1] * columns + i1],
            routed_out[slot[2] * columns + i1], routed_out[slot[3] * columns + i1],
            routed_out[slot[4] * columns + i1], routed_out[slot[5] * columns + i1],
            routed_out[slot[6] * columns + i1], routed_out[slot[7] * columns + i1],
        );
        sum0 = add_terms(sum0, j0, w, o0);
        sum1 = add_terms(sum1, j0, w, o1);
    }
    if ((p.flags & NORM_SHARED_EXPERT) != 0u) {
        sum0 += gate * shared_out[row * columns + i0];
        sum1 += gate * shared_out[row * columns + i1];
    }
    return array<vec4<f32>, 2>(x[row * columns + i0] + sum0, x[row * columns + i1] + sum1);
}

// `rms_norm` of the combined row, which it also writes to `h`. Each invocation combines its
// first two vec4 columns before the reduction, like `rms_norm`'s loads; wider rows combine
// the rest two columns at a time (t + 2 WG and t + 3 WG, ...), their squares summed in
// column order.
@compute @workgroup_size(256)
fn combine_rms_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let row = wg.x;
    let columns = p.width / 4u;
    let base = row * columns;
    var gate = 0.0;
    if ((p.flags & NORM_SHARED_EXPERT) != 0u) {
        gate = 1.0 / (1.0 + exp(-gate_logits[row * p.gate_stride + p.gate_stride - 1u]));
    }
    let i0 = min(t, columns - 1u);
    let i1 = min(t + WG, columns - 1u);
    let both = combined(row, i0, i1, gate);
    let h0 = both[0];
    let h1 = both[1];
    let w0 = weight_vec(i0);
    let w1 = weight_vec(i1);
    if (t < columns) {
        h[base + t] = h0;
    }
    if (t + WG < columns) {
        h[base + t + WG] = h1;
    }
    var sum = first_squares(t, columns, h0, h1);
    for (var i = t + 2u * WG; i < columns; i += 2u * WG) {
        let next = i + WG;
        let more = combined(row, i, min(next, columns - 1u), gate);
        h[base + i] = more[0];
        sum += dot(more[0], more[0]);
        if (next < columns) {
            h[base + next] = more[1];
            sum += dot(more[1], more[1]);
        }
    }
    let inv = inverse_rms(t, sum);
    write_first(t, base, columns, inv, array<vec4<f32>, 4>(h0, h1, w0, w1));
    for (var i = t + 2u * WG; i < columns; i += WG) {
        store_normed(base + i, normed(h[base + i], inv, weight_vec(i)));
    }
}

// The rows and weights of `rms_norm_any`, as scalars.
@group(0) @binding(9) var<storage, read> x_any: array<f32>;
@group(0) @binding(10) var<storage, read> weight_any: array<u32>;
@group(0) @binding(11) var<storage, read_write> y_any: array<f32>;

// `rms_norm` at any width: invocation t sums the squares of elements t, t + WG, ... in
// order, then writes those elements normed.
@compute @workgroup_size(256)
fn rms_norm_any(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let base = wg.x * p.width;
    var sum = 0.0;
    for (var i = t; i < p.width; i += WG) {
        let v = x_any[base + i];
        sum += v * v;
    }
    let inv = inverse_rms(t, sum);
    for (var i = t; i < p.width; i += WG) {
        var n = x_any[base + i] * inv * bf16_half(weight_any[i / 2u], i % 2u);
        if ((p.flags & NORM_ROUND) != 0u) {
            n = round_bf16(n);
        }
        y_any[base + i] = n;
    }
}
