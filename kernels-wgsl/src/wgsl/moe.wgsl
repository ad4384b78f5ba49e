// Combines a MoE layer's outputs into the residual stream, FP32, one thread per element:
// out = residual + sum_j weight[j] * expert_out[j] (+ sigmoid(shared_gate) * shared_out),
// the K experts of a token summed in ascending original-id order (the router's order).

const WG: u32 = 64u;

struct Params {
    count: u32,   // tokens * width
    width: u32,   // hidden size
    k: u32,       // experts per token
    has_shared: u32,  // 1: add the gated shared expert
    gate_stride: u32, // floats per shared_gate row; the logit is the last
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> residual: array<f32>;
@group(0) @binding(2) var<storage, read> expert_out: array<f32>;   // [tokens * k, width]
@group(0) @binding(3) var<storage, read> weights: array<f32>;      // [tokens * k]
@group(0) @binding(4) var<storage, read> shared_out: array<f32>;   // [tokens, width]
@group(0) @binding(5) var<storage, read> shared_gate: array<f32>;  // [tokens, gate_stride]
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

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
    if (p.has_shared != 0u) {
        let logit = shared_gate[token * p.gate_stride + p.gate_stride - 1u];
        sum += (1.0 / (1.0 + exp(-logit))) * shared_out[i];
    }
    out[i] = residual[i] + sum;
}
