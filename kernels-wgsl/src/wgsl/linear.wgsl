// Linear layers y = x W^T (+ bias), FP32 accumulation, for every weight format.
//
// The weight format is supplied by a format file appended to this one (fmt_bf16.wgsl,
// fmt_nvfp4.wgsl, fmt_fp8.wgsl). It defines `Unit` (the storage element of `w`: one
// 16- or 8-byte load; unit k of weight row n is w[n * K / UNIT + k]), UNIT (weights per
// unit), LANES (threads per weight row), `decode_unit(unit)` (its weights as UNIT / 4
// vec4s, up to a per-unit factor) and `unit_scale(row, unit)` (that factor). Inputs are
// BF16-valued f32 (the graph guarantees it), read as vec4s.
//
// Each thread walks its units four at a time, issuing the four weight loads before
// decoding any (the last batch too), so enough bytes are in flight to cover memory
// latency; the sums still run in unit order. Small per-thread arrays (decoded weights, the
// per-row sums) are only ever indexed by constants: NVIDIA's compiler left loop-indexed
// ones in local memory (3.87 -> 3.36 ms per H200 decode step when written out).
//
// Entry points:
//   `linear`:   a workgroup computes ROWS_PER_GROUP weight rows, LANES threads per row
//               reading it side by side; each unit is decoded once and
//               applied to up to MAX_ROWS activation rows per pass. With flag 4 the
//               output is added to `residual` (the residual stream) as it is written.
//               With flag 8 the weight rows are a [gate | up] stack and the output is
//               silu(gate) * up (each rounded first when flag 2 rounds).
//   `gathered`: routed experts; a workgroup per (ROWS_PER_GROUP weight rows, slot), the
//               slot's expert read from `expert_ids` on the GPU. Experts outside
//               [expert_begin, expert_end) live in another weight segment and are skipped.
//               Each expert has its own tensor scale (`expert_scales`: one per expert of
//               the segment, or gate then up with flag 8).
//
// Every output is computed by the same thread partition and reduction tree whatever the
// number of rows, so a row's result never depends on the other rows in the batch.

const WG: u32 = 64u;
const ROWS_PER_GROUP: u32 = WG / LANES;  // weight rows per workgroup; LANES comes with the format
const MAX_ROWS: u32 = 8u;                // activation rows per pass (apply_unit writes out 8)
const VECS: u32 = UNIT / 4u;             // vec4s of decoded weights per unit
const GROUPS: u32 = LANES / 8u;          // first-level reduction groups per weight row

struct Params {
    rows: u32,          // activation rows (linear) or slots (gathered)
    in_features: u32,   // K
    out_features: u32,  // N: weight rows in this segment (per expert when gathered)
    out_offset: u32,    // column of y where this segment's first output goes
    y_stride: u32,      // floats per row of y
    x_row_div: u32,     // gathered: input row = slot / x_row_div
    expert_begin: u32,  // gathered: local expert ids held by this segment
    expert_end: u32,
    flags: u32,         // 1: add bias; 2: round the output to BF16; 4: add `residual`;
                        // 8: SwiGLU of stacked [gate | up] rows (see `plan_row`)
    tensor_scale: f32,  // linear: NVFP4 per-tensor scale (1 for other formats)
    bias_offset: u32,   // bias element of this segment's first output
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w: array<Unit>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read> bias: array<u32>;
@group(0) @binding(5) var<storage, read> expert_ids: array<u32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;
@group(0) @binding(7) var<storage, read> expert_scales: array<f32>;
@group(0) @binding(8) var<storage, read> residual: array<f32>;

var<workgroup> partial: array<f32, 512>;        // WG * MAX_ROWS: one per thread and row
var<workgroup> group_sums: array<f32, 64>;      // WG / 8 * MAX_ROWS: one per group and row
var<workgroup> slot_expert: u32;
var<workgroup> finished: array<f32, 64>;        // SwiGLU: ROWS_PER_GROUP * MAX_ROWS finished values

// One unit's decoded weights dotted with the activation row at vec4 `x_vec`.
// Constant indices only (no loop), so the decoded weights stay in registers.
fn unit_dot(weights: array<vec4<f32>, VECS>, x_vec: u32) -> f32 {
    var s = dot(weights[0], x[x_vec]) + dot(weights[1], x[x_vec + 1u]);
    if (VECS > 2u) {
        // Four-vec4 units; the indices stay in bounds for two-vec4 units, where this is dead.
        s += dot(weights[min(2u, VECS - 1u)], x[x_vec + 2u]);
        s += dot(weights[min(3u, VECS - 1u)], x[x_vec + 3u]);
    }
    return s;
}

// Adds one unit (decoded weights, factor, column `k`) to the sums of `count` activation
// rows starting at vec4 `x_vec` (rows `x_row` vec4s apart). Written out row by row: only
// constant indices into `acc`, so the sums stay in registers.
fn apply_unit(
    acc: ptr<function, array<f32, MAX_ROWS>>,
    weights: array<vec4<f32>, VECS>,
    scale: f32,
    x_vec: u32,
    x_row: u32,
    count: u32,
) {
    (*acc)[0] += unit_dot(weights, x_vec) * scale;
    if (count > 1u) {
        (*acc)[1] += unit_dot(weights, x_vec + 1u * x_row) * scale;
    }
    if (count > 2u) {
        (*acc)[2] += unit_dot(weights, x_vec + 2u * x_row) * scale;
    }
    if (count > 3u) {
        (*acc)[3] += unit_dot(weights, x_vec + 3u * x_row) * scale;
    }
    if (count > 4u) {
        (*acc)[4] += unit_dot(weights, x_vec + 4u * x_row) * scale;
    }
    if (count > 5u) {
        (*acc)[5] += unit_dot(weights, x_vec + 5u * x_row) * scale;
    }
    if (count > 6u) {
        (*acc)[6] += unit_dot(weights, x_vec + 6u * x_row) * scale;
    }
    if (count > 7u) {
        (*acc)[7] += unit_dot(weights, x_vec + 7u * x_row) * scale;
    }
}

// Sums the LANES partials of each weight row for rows r < count, in a fixed order: groups
// of eight consecutive lanes first, then the groups. Returns the sum of row `lane` at every
// lane < count; every thread of the workgroup must call it.
fn reduce_lanes(t: u32, count: u32) -> f32 {
    let local_row = t / LANES;
    let lane = t % LANES;
    workgroupBarrier();
    let group = lane % GROUPS;
    let r = lane / GROUPS;
    if (r < count) {
        var s = 0.0;
        for (var i = 0u; i < 8u; i++) {
            s += partial[(local_row * LANES + group * 8u + i) * MAX_ROWS + r];
        }
        group_sums[(local_row * GROUPS + group) * MAX_ROWS + r] = s;
    }
    workgroupBarrier();
    var sum = 0.0;
    if (lane < count) {
        for (var g = 0u; g < GROUPS; g++) {
            sum += group_sums[(local_row * GROUPS + g) * MAX_ROWS + lane];
        }
    }
    return sum;
}

fn finish(acc: f32, n: u32, tensor_scale: f32) -> f32 {
    var v = acc * tensor_scale;
    if ((p.flags & 1u) != 0u) {
        let b = n + p.bias_offset;
        v += bf16_half(bias[b / 2u], b & 1u);
    }
    if ((p.flags & 2u) != 0u) {
        v = round_bf16(v);
    }
    return v;
}

// Which weight row a thread's row of the workgroup computes, and which output feature.
// Plain: ROWS_PER_GROUP consecutive rows. SwiGLU (flag 8, rows stacked [gate | up], each
// half `out_features / 2` rows): the first half of the workgroup's rows are gate rows, the
// second half the up rows of the same features.
struct RowPlan {
    feature: u32,   // output column (before out_offset)
    row: u32,       // weight row within the expert (or the dense segment)
    is_up: u32,     // SwiGLU: 1 for the up half
    valid: bool,
}

fn swiglu_mode() -> bool {
    return (p.flags & 8u) != 0u;
}

fn plan_row(group: u32, local_row: u32) -> RowPlan {
    if (!swiglu_mode()) {
        let n = group * ROWS_PER_GROUP + local_row;
        return RowPlan(n, n, 0u, n < p.out_features);
    }
    let half = ROWS_PER_GROUP / 2u;
    let width = p.out_features / 2u;
    let feature = group * half + local_row % half;
    let is_up = local_row / half;
    return RowPlan(feature, feature + is_up * width, is_up, feature < width);
}

// SwiGLU: the finished value of activation row `r` passes through workgroup memory so
// each gate-half thread can combine its gate value with the up value of the same feature;
// returns silu(gate) * up there (rounded when flag 2 rounds). Every thread must call it.
fn swiglu_combine(plan: RowPlan, local_row: u32, r: u32, value: f32, is_mine: bool) -> f32 {
    if (is_mine) {
        finished[local_row * MAX_ROWS + r] = value;
    }
    workgroupBarrier();
    if (!is_mine || plan.is_up != 0u) {
        return 0.0;
    }
    let g = finished[local_row * MAX_ROWS + r];
    let u = finished[(local_row + ROWS_PER_GROUP / 2u) * MAX_ROWS + r];
    var v = g / (1.0 + exp(-g)) * u;
    if ((p.flags & 2u) != 0u) {
        v = round_bf16(v);
    }
    return v;
}

@compute @workgroup_size(64)
fn linear(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let local_row = t / LANES;
    let lane = t % LANES;
    let plan = plan_row(wg.x, local_row);
    let n = plan.row;
    let units = p.in_features / UNIT;
    let x_row = p.in_features / 4u;
    for (var row0 = 0u; row0 < p.rows; row0 += MAX_ROWS) {
        let count = min(MAX_ROWS, p.rows - row0);
        var acc = array<f32, MAX_ROWS>();
        if (plan.valid) {
            let base = n * units;
            let x0 = row0 * x_row;
            let last = units - 1u;
            for (var k = lane; k < units; k += 4u * LANES) {
                // Four loads issued together (past the end: the last unit, not used).
                let k1 = min(k + LANES, last);
                let k2 = min(k + 2u * LANES, last);
                let k3 = min(k + 3u * LANES, last);
                let u0 = w[base + k];
                let u1 = w[base + k1];
                let u2 = w[base + k2];
                let u3 = w[base + k3];
                let s0 = unit_scale(n, k);
                let s1 = unit_scale(n, k1);
                let s2 = unit_scale(n, k2);
                let s3 = unit_scale(n, k3);
                apply_unit(&acc, decode_unit(u0), s0, x0 + k * VECS, x_row, count);
                if (k + LANES < units) {
                    apply_unit(&acc, decode_unit(u1), s1, x0 + k1 * VECS, x_row, count);
                }
                if (k + 2u * LANES < units) {
                    apply_unit(&acc, decode_unit(u2), s2, x0 + k2 * VECS, x_row, count);
                }
                if (k + 3u * LANES < units) {
                    apply_unit(&acc, decode_unit(u3), s3, x0 + k3 * VECS, x_row, count);
                }
            }
        }
        partial[t * MAX_ROWS + 0u] = acc[0];
        partial[t * MAX_ROWS + 1u] = acc[1];
        partial[t * MAX_ROWS + 2u] = acc[2];
        partial[t * MAX_ROWS + 3u] = acc[3];
        partial[t * MAX_ROWS + 4u] = acc[4];
        partial[t * MAX_ROWS + 5u] = acc[5];
        partial[t * MAX_ROWS + 6u] = acc[6];
        partial[t * MAX_ROWS + 7u] = acc[7];
        let sum = reduce_lanes(t, count);
        let is_mine = plan.valid && lane < count;
        let value = finish(sum, n, p.tensor_scale);
        let index = (row0 + lane) * p.y_stride + p.out_offset + plan.feature;
        if (swiglu_mode()) {
            let v = swiglu_combine(plan, local_row, lane, value, is_mine);
            if (is_mine && plan.is_up == 0u) {
                y[index] = v;
            }
        } else if (is_mine) {
            var v = value;
            if ((p.flags & 4u) != 0u) {
                v = residual[index] + v;
            }
            y[index] = v;
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(64)
fn gathered(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let local_row = t / LANES;
    let lane = t % LANES;
    let plan = plan_row(wg.x, local_row);
    let slot = wg.y;
    if (t == 0u) {
        slot_expert = expert_ids[slot];
    }
    let expert = workgroupUniformLoad(&slot_expert);
    if (expert < p.expert_begin || expert >= p.expert_end) {
        return;
    }
    let local_expert = expert - p.expert_begin;
    let row = local_expert * p.out_features + plan.row;
    let x_base = (slot / p.x_row_div) * (p.in_features / 4u);
    let units = p.in_features / UNIT;
    var acc = 0.0;
    if (plan.valid) {
        let base = row * units;
        let last = units - 1u;
        for (var k = lane; k < units; k += 4u * LANES) {
            // Four loads issued together (past the end: the last unit, not used).
            let k1 = min(k + LANES, last);
            let k2 = min(k + 2u * LANES, last);
            let k3 = min(k + 3u * LANES, last);
            let u0 = w[base + k];
            let u1 = w[base + k1];
            let u2 = w[base + k2];
            let u3 = w[base + k3];
            let s0 = unit_scale(row, k);
            let s1 = unit_scale(row, k1);
            let s2 = unit_scale(row, k2);
            let s3 = unit_scale(row, k3);
            acc += unit_dot(decode_unit(u0), x_base + k * VECS) * s0;
            if (k + LANES < units) {
                acc += unit_dot(decode_unit(u1), x_base + k1 * VECS) * s1;
            }
            if (k + 2u * LANES < units) {
                acc += unit_dot(decode_unit(u2), x_base + k2 * VECS) * s2;
            }
            if (k + 3u * LANES < units) {
                acc += unit_dot(decode_unit(u3), x_base + k3 * VECS) * s3;
            }
        }
    }
    partial[t * MAX_ROWS] = acc;
    let sum = reduce_lanes(t, 1u);
    // SwiGLU stacks keep two tensor scales per expert: gate, then up.
    let scale_index = select(local_expert, local_expert * 2u + plan.is_up, swiglu_mode());
    let value = finish(sum, plan.row, expert_scales[scale_index]);
    let is_mine = plan.valid && lane == 0u;
    let index = slot * p.y_stride + p.out_offset + plan.feature;
    if (swiglu_mode()) {
        let v = swiglu_combine(plan, local_row, 0u, value, is_mine);
        if (is_mine && plan.is_up == 0u) {
            y[index] = v;
        }
    } else if (is_mine) {
        y[index] = value;
    }
}
