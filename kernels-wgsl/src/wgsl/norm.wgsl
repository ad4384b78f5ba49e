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

@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let columns = p.width / 4u;
    let base = wg.x * columns;
    var sum = 0.0;
    for (var i = t; i < columns; i += WG) {
        let v = x[base + i];
        sum += dot(v, v);
    }
    let total = tree_reduce(t, sum, false, WG);
    let inv = 1.0 / sqrt(total / f32(p.width) + p.eps);
    for (var i = t; i < columns; i += WG) {
        let wv = weight[i];
        let scale = vec4<f32>(bf16_half(wv.x, 0u), bf16_half(wv.x, 1u), bf16_half(wv.y, 0u), bf16_half(wv.y, 1u));
        var v = x[base + i] * inv * scale;
        if ((p.flags & 1u) != 0u) {
            v = vec4<f32>(round_bf16(v.x), round_bf16(v.y), round_bf16(v.z), round_bf16(v.w));
        }
        y[base + i] = v;
    }
}
