// Combines a MoE layer without a shared expert into the residual stream, FP32, one thread
// per element: out = residual + sum_j weight[j] * expert_out[j], the K experts of a token
// summed in ascending original-id order (the router's order). (With a shared expert the
// shared down projection's epilogue does this, in linear.wgsl.)

const WG: u32 = 64u;

struct Params {
    count: u32,   // tokens * width
    width: u32,   // hidden size
    k: u32,       // experts per token
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> residual: array<f32>;
@group(0) @binding(2) var<storage, read> expert_out: array<f32>;   // [tokens * k, width]
@group(0) @binding(3) var<storage, read> weights: array<f32>;      // [tokens * k]
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn moe_combine(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= p.count) {
        return;
    }
    let token = i / p.width;
    let h = i % p.width;
    var sum = 0.0;
    for (var j = 0u; j < p.k; j++) {
        let slot = token * p.k + j;
        sum += weights[slot] * expert_out[slot * p.width + h];
    }
    out[i] = residual[i] + sum;
}
