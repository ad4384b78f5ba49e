// Linear layers y = x W^T (+ bias), FP32 accumulation, for every weight format.
//
// A dense workgroup applies each decoded weight unit to PASS_ROWS (2) activation rows per
// pass over its weights, and a launch gives every pass its own workgroup row (see
// `linear_rows`). With each pass in workgroups of its own, two rows per pass measured
// faster than eight at eight lanes (prefill, one and two lanes unchanged). Every row is
// computed with the same partition and reduction tree whichever pass and workgroup it
// falls in, so a row's bits never depend on the rows beside it.
//
// The weight format is supplied by a format file appended to this one (fmt_bf16.wgsl,
// fmt_nvfp4.wgsl, fmt_fp8.wgsl). It defines `Unit` (the storage element of `w`: one
// 16- or 8-byte load; unit k of weight row n is w[n * K / UNIT + k]), UNIT (weights per
// unit), LANES (threads per thread row), `decode_unit(unit)` (its weights as UNIT / 4
// vec4s, up to a per-unit factor), `scale_word(row, unit)` (the stored word holding that
// factor: a load) and `scale_of(word, row, unit)` (the factor from it). Inputs are
// BF16-valued f32 (the graph guarantees it), read as vec4s.
//
// A workgroup is WG / LANES thread rows of LANES threads; each thread row computes two
// weight rows (A and B) side by side, so every activation vec4 a thread loads serves both
// (one row per thread measured slower in decode steps, much slower at 8 lanes). Each
// thread walks its units two at a time, issuing the four weight loads (two units of each
// row; the last batch too) before decoding any, so enough bytes are in flight to cover
// memory latency (eight loads in flight measured no faster). A pass of one activation row
// also issues the next batch's loads before this batch's math (`pipelined_sums`, measured
// faster at one lane); a pass of two rows does not (`batched_sums`, measured faster at
// eight lanes and in prefill than pipelining every pass, one and two lanes unchanged;
// without pipelining for one row too, the single-lane step was slower), though the bench's
// NVFP4 GEMV over two rows is slower so (the model's NVFP4 weights run in the gathered
// kernels). Pipelining NVFP4's two-row passes (the row count passed to `pipelined_sums` at
// run time), together with one loop body shared by both forms, made the BF16 steps slower.
// The shared body alone (a struct of a batch's loads, `load_batch` and `apply_batch` under
// both loops; the same bits) left the decode steps as they were but made the BF16 two-row
// passes and the prefill's dense linears longer, so the two loops stay written out. The
// gathered kernels, four weight rows per thread row, load one unit of each row per
// iteration (see `expert_sums`): larger batches, and the next batch's loads before this
// batch's math, measured slower there. The sums still run in unit order. Small per-thread
// arrays (decoded weights, the per-row sums) are only ever indexed by constants: NVIDIA's
// compiler left loop-indexed ones in local memory, which made decode steps markedly
// slower.
//
// Entry points:
//   `linear`:   a workgroup computes ROWS_PER_GROUP weight rows; each unit is decoded once
//               and applied to up to PASS_ROWS activation rows per pass. With flag 4 the
//               output is added to `residual` (the residual stream) as it is written.
//               With flag 8 the weight rows are a [gate | up] stack and the output is
//               silu(gate) * up (each rounded first when flag 2 rounds): row A of a thread
//               row is a gate row, row B the up row of the same feature.
//   `linear_kv`: `linear` for (part of) an attention layer's [q | k | v] projection: a
//               thread row computes the two halves of a head's rows (j and
//               j + head_dim / 2), so it can rotate its keys and write them and its values
//               into the KV caches (see `write_cache`).
//   `linear_pair`: two BF16 linears over the same input in one launch, each with its own
//               weight (`w`, `w_second`), output (`y`, `y_second`), width, stride and
//               flags: the first `split_groups` workgroups compute the first, the rest the
//               second, each exactly as `linear` would (a MoE layer's router logits and its
//               shared expert's SwiGLU: one launch fewer per layer). BF16 only: the second
//               weight has no scales of its own.
//   `linear_packed`, `linear_kv_packed`, `linear_pair_packed`: those three reading their
//               input as BF16 pairs (`x_packed`, binding 9) instead of f32 (`x`), for steps
//               of many rows; the same bits.
//   The routed experts' entry points, `gathered` and `gathered_grouped`, are in
//   experts.wgsl, appended to this file in the same module.
//
// Every output is computed by the same thread partition and reduction tree whatever the
// number of rows, so a row's result never depends on the other rows in the batch.

// WG, the invocations per workgroup, is the host's (`LinearWidth`), declared before this file.
const THREAD_ROWS: u32 = WG / LANES;          // thread rows per workgroup (LANES threads each)
const ROWS_PER_GROUP: u32 = 2u * THREAD_ROWS; // weight rows per workgroup: two per thread row
const VECS: u32 = UNIT / 4u;                  // vec4s of decoded weights per unit
const GROUPS: u32 = LANES / 8u;               // first-level reduction groups per thread row

// `Params`, the parameter block: linear_params.wgsl, prepended to this file.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w: array<Unit>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read> bias: array<u32>;
@group(0) @binding(5) var<storage, read> expert_ids: array<u32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;
@group(0) @binding(7) var<storage, read> expert_scales: array<f32>;
@group(0) @binding(8) var<storage, read> residual: array<f32>;
// The input as BF16 pairs, the lower column in a word's low half (made by `pack_bf16` in
// elementwise.wgsl), which `gathered_grouped` and the `_packed` dense entry points read. Every
// dense and gathered entry point refers to it (`unit_activations`), so each launch binds its
// input here as well as at binding 1.
@group(0) @binding(9) var<storage, read> x_packed: array<vec4<u32>>;
// The cache write of `linear_kv`.
@group(0) @binding(10) var<storage, read> row_lane: array<u32>;
@group(0) @binding(11) var<storage, read> row_pos: array<u32>;
@group(0) @binding(12) var<storage, read> rope_table: array<f32>;      // [position, head_dim / 2] (cos, sin)
@group(0) @binding(13) var<storage, read_write> k_cache: array<f32>;    // [lane * capacity + position, kv width]
@group(0) @binding(14) var<storage, read_write> v_cache: array<f32>;
// The second linear of `linear_pair`.
@group(0) @binding(15) var<storage, read> w_second: array<Unit>;
@group(0) @binding(16) var<storage, read_write> y_second: array<f32>;

const PASS_ROWS: u32 = 2u;

var<workgroup> partial: array<f32, 2u * WG * PASS_ROWS>;         // two planes
var<workgroup> group_sums: array<f32, 2u * GROUPS * THREAD_ROWS * PASS_ROWS>;

// One unit's activations of a row: VECS vec4s of `x` from vec4 `at`, or with `packed` (a
// constant at every call) the same values from `x_packed`'s vec4 `at` (eight BF16 values
// each: half the bytes and loads of `x`).
fn unit_activations(at: u32, packed: bool) -> array<vec4<f32>, VECS> {
    var v = array<vec4<f32>, VECS>();
    let i2 = min(2u, VECS - 1u);
    let i3 = min(3u, VECS - 1u);
    if (packed) {
        let first = x_packed[at];
        v[0] = vec4<f32>(bf16_pair(first.x), bf16_pair(first.y));
        v[1] = vec4<f32>(bf16_pair(first.z), bf16_pair(first.w));
        if (VECS > 2u) {
            let second = x_packed[at + 1u];
            v[i2] = vec4<f32>(bf16_pair(second.x), bf16_pair(second.y));
            v[i3] = vec4<f32>(bf16_pair(second.z), bf16_pair(second.w));
        }
        return v;
    }
    v[0] = x[at];
    v[1] = x[at + 1u];
    if (VECS > 2u) {
        v[i2] = x[at + 2u];
        v[i3] = x[at + 3u];
    }
    return v;
}

// A unit of rows A and B dotted with one unit of activations, each activation vec4 shared
// by both.
fn unit_dot2(a: array<vec4<f32>, VECS>, b: array<vec4<f32>, VECS>, xs: array<vec4<f32>, VECS>) -> vec2<f32> {
    var s = vec2<f32>(dot(a[0], xs[0]) + dot(a[1], xs[1]), dot(b[0], xs[0]) + dot(b[1], xs[1]));
    if (VECS > 2u) {
        let i2 = min(2u, VECS - 1u);
        let i3 = min(3u, VECS - 1u);
        s += vec2<f32>(dot(a[i2], xs[i2]), dot(b[i2], xs[i2]));
        s += vec2<f32>(dot(a[i3], xs[i3]), dot(b[i3], xs[i3]));
    }
    return s;
}

// Adds one unit of rows A and B to the sums of `count` (1 or 2) activation rows, whose
// activations start at vec4 `x_vec` of `x` (or with `packed` of `x_packed`), `x_row` apart.
fn apply_pair(
    acc_a: ptr<function, array<f32, PASS_ROWS>>,
    acc_b: ptr<function, array<f32, PASS_ROWS>>,
    a: array<vec4<f32>, VECS>,
    b: array<vec4<f32>, VECS>,
    scale: vec2<f32>,
    x_vec: u32,
    x_row: u32,
    count: u32,
    packed: bool,
) {
    var d = unit_dot2(a, b, unit_activations(x_vec, packed)) * scale;
    (*acc_a)[0] += d.x;
    (*acc_b)[0] += d.y;
    if (count > 1u) {
        d = unit_dot2(a, b, unit_activations(x_vec + x_row, packed)) * scale;
        (*acc_a)[1] += d.x;
        (*acc_b)[1] += d.y;
    }
}

// A thread's sums, row A's in the first plane of `partial`, row B's in the second.
fn store_partials(t: u32, acc_a: array<f32, PASS_ROWS>, acc_b: array<f32, PASS_ROWS>) {
    let a = t * PASS_ROWS;
    let b = (WG + t) * PASS_ROWS;
    partial[a] = acc_a[0];
    partial[a + 1u] = acc_a[1];
    partial[b] = acc_b[0];
    partial[b + 1u] = acc_b[1];
}

// Sums the LANES partials of rows A and B of each thread row for activation rows < count
// in a fixed order (groups of eight lanes, then the groups). Returns the sums of
// activation row `lane` at every lane < count.
fn reduce_lanes(t: u32, count: u32) -> vec2<f32> {
    let thread_row = t / LANES;
    let lane = t % LANES;
    workgroupBarrier();
    let group = lane % GROUPS;
    let r = lane / GROUPS;
    if (r < count) {
        for (var plane = 0u; plane < 2u; plane++) {
            var s = 0.0;
            for (var i = 0u; i < 8u; i++) {
                s += partial[(plane * WG + thread_row * LANES + group * 8u + i) * PASS_ROWS + r];
            }
            group_sums[((plane * THREAD_ROWS + thread_row) * GROUPS + group) * PASS_ROWS + r] = s;
        }
    }
    workgroupBarrier();
    var sum = vec2<f32>(0.0);
    if (lane < count) {
        for (var g = 0u; g < GROUPS; g++) {
            sum.x += group_sums[(thread_row * GROUPS + g) * PASS_ROWS + lane];
            sum.y += group_sums[((THREAD_ROWS + thread_row) * GROUPS + g) * PASS_ROWS + lane];
        }
    }
    return sum;
}

// The factor of unit `k` of weight row `row`.
fn unit_scale(row: u32, k: u32) -> f32 {
    return scale_of(scale_word(row, k), row, k);
}

// A weight row's finished value: tensor scale, bias, BF16 rounding as `flags` ask.
fn finish(acc: f32, n: u32, tensor_scale: f32, flags: u32) -> f32 {
    var v = acc * tensor_scale;
    if ((flags & LINEAR_BIAS) != 0u) {
        let b = n + p.bias_offset;
        v += bf16_half(bias[b / 2u], b & 1u);
    }
    if ((flags & LINEAR_ROUND) != 0u) {
        v = round_bf16(v);
    }
    return v;
}

fn swiglu_mode(flags: u32) -> bool {
    return (flags & LINEAR_SWIGLU) != 0u;
}

// What a dense launch computes: the linear of `p`, or the second one of `linear_pair`.
struct Part {
    out_features: u32,
    y_stride: u32,
    out_offset: u32,
    flags: u32,
}

fn part_of(second: bool) -> Part {
    if (second) {
        return Part(p.second_out_features, p.second_y_stride, 0u, p.second_flags);
    }
    return Part(p.out_features, p.y_stride, p.out_offset, p.flags);
}

// Unit `i` of the part's weight (`second` is a constant at every call, so each inlined copy
// reads one buffer).
fn weight_unit(i: u32, second: bool) -> Unit {
    if (second) {
        return w_second[i];
    }
    return w[i];
}

// Writes output element `index` of the part.
fn store_output(index: u32, value: f32, second: bool) {
    if (second) {
        y_second[index] = value;
    } else {
        y[index] = value;
    }
}

// A plain (not SwiGLU) output with the residual added (flag 4).
fn epilogue(index: u32, value: f32, flags: u32) -> f32 {
    if ((flags & LINEAR_RESIDUAL) != 0u) {
        return residual[index] + value;
    }
    return value;
}

// `linear_kv`: the values of y columns `column` and `column + head_dim / 2` (one head's rows j
// and j + head_dim / 2) of activation row `row`. Key columns go into `k_cache` rotated by
// the row's position (RoPE over the head's halves), value columns into `v_cache`, both at
// the row's lane and position; query columns stay in y only (attention rotates them). A
// head takes `head_stride(head_dim)` floats of a cache row (see attention.wgsl).
fn write_cache(row: u32, column: u32, a: f32, b: f32) {
    if (column < p.q_width) {
        return;
    }
    let kv_width = (p.y_stride - p.q_width) / 2u;
    var c = column - p.q_width;
    let pos = row_pos[row];
    let half = p.head_dim / 2u;
    let stride = head_stride(p.head_dim);
    let slot = (row_lane[row] * p.capacity + pos) * (kv_width / p.head_dim * stride);
    let is_key = c < kv_width;
    if (!is_key) {
        c -= kv_width;
    }
    let i = c % p.head_dim;
    let at = slot + c / p.head_dim * stride + i;
    if (is_key) {
        let entry = 2u * (pos * half + i);
        let cos = rope_table[entry];
        let sin = rope_table[entry + 1u];
        k_cache[at] = a * cos - b * sin;
        k_cache[at + half] = b * cos + a * sin;
        return;
    }
    v_cache[at] = a;
    v_cache[at + half] = b;
}

// silu(gate) * up, rounded to BF16 when flag 2 rounds.
fn swiglu(g: f32, u: f32, flags: u32) -> f32 {
    var v = g / (1.0 + exp(-g)) * u;
    if ((flags & LINEAR_ROUND) != 0u) {
        v = round_bf16(v);
    }
    return v;
}

// The two weight rows of a thread row and its output features. Plain: rows
// group * ROWS_PER_GROUP + thread_row and + THREAD_ROWS. SwiGLU (stacked [gate | up], each
// half out_features / 2 rows): row A is a gate row, row B the up row of the same feature.
// Cache write (head_dim-row blocks): row A is row j of a block, row B row j + head_dim / 2.
struct RowPair {
    feature_a: u32,
    feature_b: u32,
    row_a: u32,
    row_b: u32,
    valid_a: bool,
    valid_b: bool,
}

fn plan_rows(group: u32, thread_row: u32, cache: bool, part: Part) -> RowPair {
    if (cache) {
        let half = p.head_dim / 2u;
        let pair = group * THREAD_ROWS + thread_row;
        let a = pair / half * p.head_dim + pair % half;
        let valid = a < part.out_features;
        return RowPair(a, a + half, a, a + half, valid, valid);
    }
    if (!swiglu_mode(part.flags)) {
        let a = group * ROWS_PER_GROUP + thread_row;
        let b = a + THREAD_ROWS;
        return RowPair(a, b, a, b, a < part.out_features, b < part.out_features);
    }
    let width = part.out_features / 2u;
    let feature = group * THREAD_ROWS + thread_row;
    let valid = feature < width;
    return RowPair(feature, feature, feature, feature + width, valid, valid);
}

@compute @workgroup_size(WG)
fn linear(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    linear_rows(wg, groups.y, t, false, false, false);
}

// `linear` reading its input as BF16 pairs (`x_packed`; steps of many rows).
@compute @workgroup_size(WG)
fn linear_packed(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    linear_rows(wg, groups.y, t, false, false, true);
}

// An attention layer's [q | k | v] projection, writing the KV caches as it goes (see
// `write_cache`). Its own entry point, passing `cache` as a constant, so that a compiler that
// inlines `linear_rows` (NVIDIA's did) drops that code from the other linears (with it behind
// a flag of the parameter block, the bench's large NVFP4 linear measured markedly slower).
// Every dense entry point still names the cache bindings and the pair's second weight and
// output.
@compute @workgroup_size(WG)
fn linear_kv(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    linear_rows(wg, groups.y, t, true, false, false);
}

// `linear_kv` reading its input as BF16 pairs.
@compute @workgroup_size(WG)
fn linear_kv_packed(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    linear_rows(wg, groups.y, t, true, false, true);
}

// Two linears in one launch (see the list of entry points): each workgroup computes one of
// them with the partition and reduction tree `linear` uses, so the bits are `linear`'s.
@compute @workgroup_size(WG)
fn linear_pair(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    linear_pair_rows(wg, groups.y, t, false);
}

// `linear_pair` reading its input as BF16 pairs.
@compute @workgroup_size(WG)
fn linear_pair_packed(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    linear_pair_rows(wg, groups.y, t, true);
}

// A workgroup of `linear_pair`: the first linear's, or the second's past `split_groups`.
fn linear_pair_rows(wg: vec3<u32>, row_blocks: u32, t: u32, packed: bool) {
    if (wg.x < p.split_groups) {
        linear_rows(wg, row_blocks, t, false, false, packed);
    } else {
        linear_rows(vec3<u32>(wg.x - p.split_groups, wg.y, wg.z), row_blocks, t, false, true, packed);
    }
}

// Rows A and B (weight rows `na`, `nb`) over a pass of one activation row (vec4s from
// `x0`), software pipelined: the next batch's loads (past the end: the last unit, unused)
// are issued before this batch's math.
fn pipelined_sums(
    acc_a: ptr<function, array<f32, PASS_ROWS>>,
    acc_b: ptr<function, array<f32, PASS_ROWS>>,
    na: u32,
    nb: u32,
    lane: u32,
    x0: u32,
    second: bool,
    packed: bool,
) {
    let unit_vecs = select(VECS, VECS / 2u, packed);
    let units = p.in_features / UNIT;
    let base_a = na * units;
    let base_b = nb * units;
    let last = units - 1u;
    var k = lane;
    let f0 = min(k, last);
    let f1 = min(k + LANES, last);
    var a0 = weight_unit(base_a + f0, second);
    var b0 = weight_unit(base_b + f0, second);
    var a1 = weight_unit(base_a + f1, second);
    var b1 = weight_unit(base_b + f1, second);
    var sa0 = scale_word(na, f0);
    var sb0 = scale_word(nb, f0);
    var sa1 = scale_word(na, f1);
    var sb1 = scale_word(nb, f1);
    for (; k < units; k += 2u * LANES) {
        let k1 = min(k + LANES, last);
        let n0 = min(k + 2u * LANES, last);
        let n1 = min(k + 3u * LANES, last);
        let next_a0 = weight_unit(base_a + n0, second);
        let next_b0 = weight_unit(base_b + n0, second);
        let next_a1 = weight_unit(base_a + n1, second);
        let next_b1 = weight_unit(base_b + n1, second);
        let next_sa0 = scale_word(na, n0);
        let next_sb0 = scale_word(nb, n0);
        let next_sa1 = scale_word(na, n1);
        let next_sb1 = scale_word(nb, n1);
        let s0 = vec2<f32>(scale_of(sa0, na, k), scale_of(sb0, nb, k));
        apply_pair(acc_a, acc_b, decode_unit(a0), decode_unit(b0), s0, x0 + k * unit_vecs, 0u, 1u, packed);
        if (k + LANES < units) {
            let s1 = vec2<f32>(scale_of(sa1, na, k1), scale_of(sb1, nb, k1));
            apply_pair(acc_a, acc_b, decode_unit(a1), decode_unit(b1), s1, x0 + k1 * unit_vecs, 0u, 1u, packed);
        }
        a0 = next_a0;
        b0 = next_b0;
        a1 = next_a1;
        b1 = next_b1;
        sa0 = next_sa0;
        sb0 = next_sb0;
        sa1 = next_sa1;
        sb1 = next_sb1;
    }
}

// Rows A and B over a pass of `count` activation rows (row r's vec4s from x0 + r * x_row;
// two, since passes of one take `pipelined_sums`), a batch of two units of each row at a
// time. Written out apart from `pipelined_sums`, whose loads run a batch ahead: sharing one
// body with it made these passes longer (see the top of the file).
fn batched_sums(
    acc_a: ptr<function, array<f32, PASS_ROWS>>,
    acc_b: ptr<function, array<f32, PASS_ROWS>>,
    na: u32,
    nb: u32,
    lane: u32,
    x0: u32,
    x_row: u32,
    count: u32,
    second: bool,
    packed: bool,
) {
    let unit_vecs = select(VECS, VECS / 2u, packed);
    let units = p.in_features / UNIT;
    let base_a = na * units;
    let base_b = nb * units;
    let last = units - 1u;
    for (var k = lane; k < units; k += 2u * LANES) {
        let k1 = min(k + LANES, last);
        let a0 = weight_unit(base_a + k, second);
        let b0 = weight_unit(base_b + k, second);
        let a1 = weight_unit(base_a + k1, second);
        let b1 = weight_unit(base_b + k1, second);
        let sa0 = scale_word(na, k);
        let sb0 = scale_word(nb, k);
        let sa1 = scale_word(na, k1);
        let sb1 = scale_word(nb, k1);
        let s0 = vec2<f32>(scale_of(sa0, na, k), scale_of(sb0, nb, k));
        apply_pair(acc_a, acc_b, decode_unit(a0), decode_unit(b0), s0, x0 + k * unit_vecs, x_row, count, packed);
        if (k + LANES < units) {
            let s1 = vec2<f32>(scale_of(sa1, na, k1), scale_of(sb1, nb, k1));
            apply_pair(acc_a, acc_b, decode_unit(a1), decode_unit(b1), s1, x0 + k1 * unit_vecs, x_row, count, packed);
        }
    }
}

// The dense linear; `cache` (a constant at each entry point) adds the KV-cache write, and
// `second` (a constant at each call) makes it the second linear of `linear_pair`. The grid's
// `row_blocks` workgroup rows share the passes over the activation rows (workgroup row y
// takes passes y, y + row_blocks, ...): a prefill's passes run side by side instead of one
// after another in each workgroup, and a row's result does not depend on which workgroup
// computed it.
fn linear_rows(wg: vec3<u32>, row_blocks: u32, t: u32, cache: bool, second: bool, packed: bool) {
    let thread_row = t / LANES;
    let lane = t % LANES;
    let part = part_of(second);
    let plan = plan_rows(wg.x, thread_row, cache, part);
    let na = plan.row_a;
    // An invalid row B reads row A's units (in bounds) and is never written.
    let nb = select(na, plan.row_b, plan.valid_b);
    let x_row = p.in_features / select(4u, 8u, packed);   // vec4s of x or x_packed per row
    for (var row0 = wg.y * PASS_ROWS; row0 < p.rows; row0 += row_blocks * PASS_ROWS) {
        let count = min(PASS_ROWS, p.rows - row0);
        var acc_a = array<f32, PASS_ROWS>();
        var acc_b = array<f32, PASS_ROWS>();
        if (plan.valid_a) {
            let x0 = row0 * x_row;
            if (count == 1u) {
                pipelined_sums(&acc_a, &acc_b, na, nb, lane, x0, second, packed);
            } else {
                batched_sums(&acc_a, &acc_b, na, nb, lane, x0, x_row, count, second, packed);
            }
        }
        store_partials(t, acc_a, acc_b);
        let sum = reduce_lanes(t, count);
        let value_a = finish(sum.x, na, p.tensor_scale, part.flags);
        let value_b = finish(sum.y, nb, p.tensor_scale, part.flags);
        let row_base = (row0 + lane) * part.y_stride + part.out_offset;
        if (lane < count) {
            if (swiglu_mode(part.flags)) {
                if (plan.valid_a) {
                    store_output(row_base + plan.feature_a, swiglu(value_a, value_b, part.flags), second);
                }
            } else {
                if (plan.valid_a) {
                    let index = row_base + plan.feature_a;
                    store_output(index, epilogue(index, value_a, part.flags), second);
                }
                if (plan.valid_b) {
                    let index = row_base + plan.feature_b;
                    store_output(index, epilogue(index, value_b, part.flags), second);
                }
                if (cache && plan.valid_a) {
                    write_cache(row0 + lane, part.out_offset + plan.feature_a, value_a, value_b);
                }
            }
        }
        workgroupBarrier();
    }
}
