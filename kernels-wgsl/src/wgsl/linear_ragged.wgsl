// A BF16 linear at any input width: y = x W^T (+ bias), FP32 accumulation, for the widths
// linear.wgsl cannot read (its weight rows start one 16-byte load each, so their width is a
// multiple of 8). Here a weight row may start at any element: weights are read as BF16
// halves of words, inputs as plain f32. The voice tower's linears use it where the
// checkpoint's widths call for it (a mel count such as 20 or 100).
//
// A workgroup computes one output (weight row `n` of activation row `r`): its WG threads
// take every WG-th input in order, then a fixed tree adds their sums, so an output depends
// only on its row and weights, never on the other rows or the launch. Flags as linear.wgsl's
// (1: add bias; 2: round the output to BF16; 4: add `residual`), in its order.

const WG: u32 = 64u;

// `Params`: linear_params.wgsl, prepended to this file.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(4) var<storage, read> bias: array<u32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;
@group(0) @binding(8) var<storage, read> residual: array<f32>;

var<workgroup> sums: array<f32, WG>;

// Element `i` of the weights, counted across rows.
fn weight(i: u32) -> f32 {
    return bf16_half(w[i / 2u], i & 1u);
}

@compute @workgroup_size(64)
fn linear_ragged(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let n = wg.x;
    let width = p.in_features;
    // Rows past the dispatch limit's grid are taken in further rounds.
    for (var r = wg.y; r < p.rows; r += nwg.y) {
        var sum = 0.0;
        for (var k = t; k < width; k += WG) {
            sum += x[r * width + k] * weight(n * width + k);
        }
        sums[t] = sum;
        workgroupBarrier();
        for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
            if (t < stride) {
                sums[t] += sums[t + stride];
            }
            workgroupBarrier();
        }
        if (t == 0u) {
            var v = sums[0];
            if ((p.flags & LINEAR_BIAS) != 0u) {
                let b = n + p.bias_offset;
                v += bf16_half(bias[b / 2u], b & 1u);
            }
            if ((p.flags & LINEAR_ROUND) != 0u) {
                v = round_bf16(v);
            }
            let at = r * p.y_stride + p.out_offset + n;
            if ((p.flags & LINEAR_RESIDUAL) != 0u) {
                v += residual[at];
            }
            y[at] = v;
        }
        workgroupBarrier();
    }
}
