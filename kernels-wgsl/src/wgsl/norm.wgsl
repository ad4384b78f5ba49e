// RMSNorm in FP32: y = x * 1/sqrt(mean(x^2) + eps) * w, one 256-invocation workgroup per
// row reading vec4s (the width is a multiple of 4: every normed vector feeds a linear, whose
// input width is a multiple of 8). With flag 1 the output is rounded to BF16 (when every
// consumer is a linear, which rounds its input anyway: rounding once here keeps the linears
// free of it).

const WG: u32 = 256u;

struct Params {
    width: u32,
    flags: u32,
    eps: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> weight: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read_write> y: array<vec4<f32>>;

// The weights as f32s.
fn weight_vec(i: u32) -> vec4<f32> {
    let wv = weight[i];
    return vec4<f32>(bf16_half(wv.x, 0u), bf16_half(wv.x, 1u), bf16_half(wv.y, 0u), bf16_half(wv.y, 1u));
}

// x * inv * w, rounded to BF16 with flag 1.
fn normed(v: vec4<f32>, inv: f32, w: vec4<f32>) -> vec4<f32> {
    var n = v * inv * w;
    if ((p.flags & 1u) != 0u) {
        n = vec4<f32>(round_bf16(n.x), round_bf16(n.y), round_bf16(n.z), round_bf16(n.w));
    }
    return n;
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
    var sum = 0.0;
    if (t < columns) {
        sum += dot(x0, x0);
    }
    if (t + WG < columns) {
        sum += dot(x1, x1);
    }
    for (var i = t + 2u * WG; i < columns; i += WG) {
        let v = x[base + i];
        sum += dot(v, v);
    }
    let total = tree_reduce(t, sum, false, WG);
    let inv = 1.0 / sqrt(total / f32(p.width) + p.eps);
    if (t < columns) {
        y[base + t] = normed(x0, inv, w0);
    }
    if (t + WG < columns) {
        y[base + t + WG] = normed(x1, inv, w1);
    }
    for (var i = t + 2u * WG; i < columns; i += WG) {
        y[base + i] = normed(x[base + i], inv, weight_vec(i));
    }
}
