// Linear layers y = x W^T (+ bias), FP32 accumulation, for every weight format.
//
// The weight format is supplied by a format file appended to this one (fmt_bf16.wgsl,
// fmt_nvfp4.wgsl, fmt_fp8.wgsl). It defines `Unit` (the storage element of `w`: one
// 16- or 8-byte load; unit k of weight row n is w[n * K / UNIT + k]), UNIT (weights per
// unit), LANES (threads sharing a weight row), `decode_unit(unit)` (its weights as
// UNIT / 4 vec4s, up to a per-unit factor) and `unit_scale(row, unit)` (that factor).
// Inputs are BF16-valued f32 (the graph guarantees it), read as vec4s.
//
// A workgroup computes ROWS_PER_GROUP weight rows: LANES threads side by side along each
// row, and every thread RPT rows at once. A thread loads its RPT units of column block k
// together (RPT loads in flight), decodes each once, and reads the activations of that
// block once for all RPT rows. The LANES partial sums of each row are then added in a
// fixed order: groups of eight lanes, then the groups.
//
// Entry points:
//   `linear`:   up to MAX_ROWS activation rows per pass. With flag 4 the output is added
//               to `residual` (the residual stream) as it is written. With flag 8 the
//               weight rows are a [gate | up] stack and the output is silu(gate) * up
//               (each rounded first when flag 2 rounds).
//   `gathered`: routed experts; a workgroup per (ROWS_PER_GROUP rows, slot), the slot's
//               expert read from `expert_ids` on the GPU. Experts outside
//               [expert_begin, expert_end) live in another weight segment and are skipped.
//               Each expert has its own tensor scale (`expert_scales`; two per expert, gate
//               then up, with flag 8).
//
// Every output is computed by the same thread partition and reduction tree whatever the
// number of rows, so a row's result never depends on the other rows in the batch.

const WG: u32 = 64u;
const RPT: u32 = 4u;                          // weight rows per thread
const ROW_GROUPS: u32 = WG / LANES;           // LANES comes with the format
const ROWS_PER_GROUP: u32 = ROW_GROUPS * RPT; // weight rows per workgroup
const MAX_ROWS: u32 = 8u;                     // activation rows per pass
const VECS: u32 = UNIT / 4u;                  // vec4s of decoded weights per unit
const GROUPS: u32 = LANES / 8u;               // first-level reduction groups per weight row

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

var<workgroup> partial: array<f32, 2048>;     // [local row][lane][activation row]
var<workgroup> group_sums: array<f32, 256>;   // [local row][group][activation row]
var<workgroup> finished: array<f32, 256>;     // SwiGLU: [local row][activation row]
var<workgroup> slot_expert: u32;

// Which weight row a workgroup row computes, and which output feature. Plain:
// ROWS_PER_GROUP consecutive rows. SwiGLU (flag 8, rows stacked [gate | up], each half
// `out_features / 2` rows): the first half of the workgroup's rows are gate rows, the
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

// Accumulates this thread's RPT rows over its column blocks for `count` activation rows
// (the first at vec4 `x0`, rows `x_row` vec4s apart) into acc[j * MAX_ROWS + r]. `base`
// is the first weight row of the expert (0 for dense linears).
fn accumulate(
    acc: ptr<function, array<f32, 32>>,
    group: u32,
    first_row: u32,
    lane: u32,
    base: u32,
    x0: u32,
    x_row: u32,
    count: u32,
) {
    let units = p.in_features / UNIT;
    var rows = array<u32, RPT>();
    var valid = array<bool, RPT>();
    for (var j = 0u; j < RPT; j++) {
        let plan = plan_row(group, first_row + j);
        rows[j] = base + plan.row;
        valid[j] = plan.valid;
    }
    for (var k = lane; k < units; k += LANES) {
        var raw = array<Unit, RPT>();
        var scale = array<f32, RPT>();
        for (var j = 0u; j < RPT; j++) {
            if (valid[j]) {
                raw[j] = w[rows[j] * units + k];
                scale[j] = unit_scale(rows[j], k);
            }
        }
        var weights = array<array<vec4<f32>, VECS>, RPT>();
        for (var j = 0u; j < RPT; j++) {
            weights[j] = decode_unit(raw[j]);
        }
        for (var r = 0u; r < MAX_ROWS; r++) {
            if (r < count) {
                var xs = array<vec4<f32>, VECS>();
                for (var v = 0u; v < VECS; v++) {
                    xs[v] = x[x0 + r * x_row + k * VECS + v];
                }
                for (var j = 0u; j < RPT; j++) {
                    if (valid[j]) {
                        var s = 0.0;
                        for (var v = 0u; v < VECS; v++) {
                            s += dot(weights[j][v], xs[v]);
                        }
                        (*acc)[j * MAX_ROWS + r] += s * scale[j];
                    }
                }
            }
        }
    }
}

// Adds the LANES partials of every (workgroup row, activation row < count) in a fixed
// order: groups of eight consecutive lanes, then the groups. The sum of task
// (local_row, r) = (task / MAX_ROWS, task % MAX_ROWS) lands in `partial[task]` for the
// caller's second pass; every thread of the workgroup must call it.
fn reduce_rows(t: u32, acc: array<f32, 32>, count: u32) {
    let group = t / LANES;
    let lane = t % LANES;
    for (var j = 0u; j < RPT; j++) {
        for (var r = 0u; r < MAX_ROWS; r++) {
            partial[((group * RPT + j) * LANES + lane) * MAX_ROWS + r] = acc[j * MAX_ROWS + r];
        }
    }
    workgroupBarrier();
    for (var task = t; task < ROWS_PER_GROUP * GROUPS * MAX_ROWS; task += WG) {
        let r = task % MAX_ROWS;
        let g = (task / MAX_ROWS) % GROUPS;
        let local_row = task / (MAX_ROWS * GROUPS);
        if (r < count) {
            var s = 0.0;
            for (var i = 0u; i < 8u; i++) {
                s += partial[(local_row * LANES + g * 8u + i) * MAX_ROWS + r];
            }
            group_sums[task] = s;
        }
    }
    workgroupBarrier();
}

// The second pass of `reduce_rows` for task (local_row, r).
fn row_sum(local_row: u32, r: u32) -> f32 {
    var sum = 0.0;
    for (var g = 0u; g < GROUPS; g++) {
        sum += group_sums[(local_row * GROUPS + g) * MAX_ROWS + r];
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

// SwiGLU of finished values in `finished`: silu(gate) * up of gate row `local_row`.
fn swiglu_of(local_row: u32, r: u32) -> f32 {
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
    let first_row = (t / LANES) * RPT;
    let x_row = p.in_features / 4u;
    for (var row0 = 0u; row0 < p.rows; row0 += MAX_ROWS) {
        let count = min(MAX_ROWS, p.rows - row0);
        var acc = array<f32, 32>();
        accumulate(&acc, wg.x, first_row, t % LANES, 0u, row0 * x_row, x_row, count);
        reduce_rows(t, acc, count);
        for (var task = t; task < ROWS_PER_GROUP * MAX_ROWS; task += WG) {
            let local_row = task / MAX_ROWS;
            let r = task % MAX_ROWS;
            let plan = plan_row(wg.x, local_row);
            if (plan.valid && r < count) {
                let value = finish(row_sum(local_row, r), plan.row, p.tensor_scale);
                if (swiglu_mode()) {
                    finished[task] = value;
                } else {
                    let index = (row0 + r) * p.y_stride + p.out_offset + plan.feature;
                    var v = value;
                    if ((p.flags & 4u) != 0u) {
                        v = residual[index] + v;
                    }
                    y[index] = v;
                }
            }
        }
        if (swiglu_mode()) {
            workgroupBarrier();
            for (var task = t; task < ROWS_PER_GROUP / 2u * MAX_ROWS; task += WG) {
                let local_row = task / MAX_ROWS;
                let r = task % MAX_ROWS;
                let plan = plan_row(wg.x, local_row);
                if (plan.valid && r < count) {
                    y[(row0 + r) * p.y_stride + p.out_offset + plan.feature] = swiglu_of(local_row, r);
                }
            }
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(64)
fn gathered(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let slot = wg.y;
    if (t == 0u) {
        slot_expert = expert_ids[slot];
    }
    let expert = workgroupUniformLoad(&slot_expert);
    if (expert < p.expert_begin || expert >= p.expert_end) {
        return;
    }
    let local_expert = expert - p.expert_begin;
    let x_base = (slot / p.x_row_div) * (p.in_features / 4u);
    var acc = array<f32, 32>();
    accumulate(&acc, wg.x, (t / LANES) * RPT, t % LANES, local_expert * p.out_features, x_base, 0u, 1u);
    reduce_rows(t, acc, 1u);
    for (var local_row = t; local_row < ROWS_PER_GROUP; local_row += WG) {
        let plan = plan_row(wg.x, local_row);
        if (plan.valid) {
            // SwiGLU stacks keep two tensor scales per expert: gate, then up.
            let scale_index = select(local_expert, local_expert * 2u + plan.is_up, swiglu_mode());
            let value = finish(row_sum(local_row, 0u), plan.row, expert_scales[scale_index]);
            if (swiglu_mode()) {
                finished[local_row * MAX_ROWS] = value;
            } else {
                y[slot * p.y_stride + p.out_offset + plan.feature] = value;
            }
        }
    }
    if (swiglu_mode()) {
        workgroupBarrier();
        for (var local_row = t; local_row < ROWS_PER_GROUP / 2u; local_row += WG) {
            let plan = plan_row(wg.x, local_row);
            if (plan.valid) {
                y[slot * p.y_stride + p.out_offset + plan.feature] = swiglu_of(local_row, 0u);
            }
        }
    }
}
