// RMSNorm in FP32: y = x * 1/sqrt(mean(x^2) + eps) * w, one workgroup per row. With flag 1
// the output is rounded to BF16 (when every consumer is a linear, which rounds its input
// anyway: rounding once here keeps the linears free of it).

const WG: u32 = 64u;

struct Params {
    width: u32,
    flags: u32,
    eps: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

var<workgroup> partial: array<f32, 64>;

@compute @workgroup_size(64)
fn rms_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let base = wg.x * p.width;
    var sum = 0.0;
    for (var i = t; i < p.width; i += WG) {
        let v = x[base + i];
        sum += v * v;
    }
    partial[t] = sum;
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        workgroupBarrier();
        if (t < stride) {
            partial[t] += partial[t + stride];
        }
    }
    workgroupBarrier();
    let inv = 1.0 / sqrt(partial[0] / f32(p.width) + p.eps);
    for (var i = t; i < p.width; i += WG) {
        var v = x[base + i] * inv * bf16_half(weight[i / 2u], i & 1u);
        if ((p.flags & 1u) != 0u) {
            v = round_bf16(v);
        }
        y[base + i] = v;
    }
}
