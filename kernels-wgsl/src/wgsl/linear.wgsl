// Linear layers y = x W^T (+ bias), FP32 accumulation, for every weight format.
//
// A dense workgroup applies each decoded weight unit to PASS_ROWS (2) activation rows per
// pass over its weights, and a launch gives every pass its own workgroup row (see
// `linear_rows`). Eight-row passes, one after another in each workgroup, were the choice
// for steps of more than two rows until the passes got workgroups of their own: then two
// rows per pass made an H200 eight-lane decode step shorter (prefill, one and two lanes
// unchanged). Every row is computed with the same partition and reduction
// tree whichever pass and workgroup it falls in, so a row's bits never depend on the rows
// beside it.
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
// (one row per thread measured slower in H200 decode steps, much slower at 8 lanes). Each
// thread walks its units two at a time, issuing the four weight loads (two units of each
// row; the last batch too) before decoding any, so enough bytes are in flight to cover
// memory latency (eight loads in flight measured no faster). A pass of one activation row
// also issues the next batch's loads before this batch's math (`pipelined_sums`, which
// shortened the single-lane H200 decode step); a pass of two rows does not
// (`batched_sums`), which shortened the H200's eight-lane decode step and the prefill, one
// and two lanes unchanged (pipelining every pass, as before; without it for one row too,
// the single-lane step was longer), though the bench's NVFP4 GEMV over two rows got longer
// (the model's NVFP4 weights run in the gathered kernels). Pipelining NVFP4's two-row
// passes again (the row count passed to `pipelined_sums` at run time), together with one
// loop body shared by both forms, made the BF16 steps slower. The shared body alone (a
// struct of a batch's loads, `load_batch` and `apply_batch` under both loops; the same
// bits) left the decode steps as they were but made the BF16 two-row passes and the
// prefill's dense linears longer, so the two loops stay written out. The gathered kernels,
// four weight rows per thread row, load one unit of each row per iteration (see
// `expert_sums`): larger batches, and the next batch's loads before this batch's math,
// measured slower there. The sums still run in unit order. Small per-thread arrays
// (decoded weights, the per-row sums) are only ever indexed by constants: NVIDIA's compiler
// left loop-indexed ones in local memory, and the H200 decode step got markedly shorter
// when they were written out.
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
//   `gathered`: routed experts; a workgroup per (GATHERED_ROWS weight rows, slot), four
//               per thread row (two [gate, up] pairs with SwiGLU), the slot's expert read
//               from `expert_ids` on the GPU. Experts outside
//               [expert_begin, expert_end) live in another weight segment and are skipped.
//               Each expert has its own tensor scale (`expert_scales`: one per expert of
//               the segment, or gate then up with flag 8).
//   `gathered_grouped`: `gathered` for steps of many rows: a workgroup per (GATHERED_ROWS
//               weight rows, block of up to GROUP_SLOTS slots sharing an expert, made by
//               `group_slots` in moe.wgsl), each expert's rows loaded once per block, each
//               slot's sums exactly those `gathered` computes for it. Its activations
//               come as BF16 pairs (`x_packed`).
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
// the row's lane and position; query columns stay in y only (attention rotates them).
fn write_cache(row: u32, column: u32, a: f32, b: f32) {
    if (column < p.q_width) {
        return;
    }
    let kv_width = (p.y_stride - p.q_width) / 2u;
    var c = column - p.q_width;
    let pos = row_pos[row];
    let half = p.head_dim / 2u;
    let slot = (row_lane[row] * p.capacity + pos) * kv_width;
    if (c < kv_width) {
        let entry = 2u * (pos * half + c % p.head_dim);
        let cos = rope_table[entry];
        let sin = rope_table[entry + 1u];
        k_cache[slot + c] = a * cos - b * sin;
        k_cache[slot + c + half] = b * cos + a * sin;
        return;
    }
    c -= kv_width;
    v_cache[slot + c] = a;
    v_cache[slot + c + half] = b;
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
// a flag of the parameter block, the bench's large NVFP4 linear was markedly slower on the
// H200). Every dense entry point still names the cache bindings and the pair's second
// weight and output.
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

// Gathered launches give each thread row four weight rows (two [gate, up] pairs with the
// SwiGLU epilogue): routed NVFP4 experts load 64 activation bytes per 8-byte unit, so
// sharing each activation load among more rows matters more than for the dense kernel
// (four rows per thread row instead of two shortened every H200 decode step, most at eight
// lanes). NVFP4's thread rows are LANES (16) threads here too: with 32, each thread walking
// half as many units, the one-lane step got shorter but the others and the prefill longer,
// and a row's bits must not depend on how many rows its step has.
const GATHERED_ROWS: u32 = 4u * THREAD_ROWS;   // weight rows per gathered workgroup

// One unit of each of four rows dotted with one unit of activations, each activation vec4
// shared by all four.
fn unit_dot4(
    a: array<vec4<f32>, VECS>,
    b: array<vec4<f32>, VECS>,
    c: array<vec4<f32>, VECS>,
    d: array<vec4<f32>, VECS>,
    xs: array<vec4<f32>, VECS>,
) -> vec4<f32> {
    var s = vec4<f32>(
        dot(a[0], xs[0]) + dot(a[1], xs[1]),
        dot(b[0], xs[0]) + dot(b[1], xs[1]),
        dot(c[0], xs[0]) + dot(c[1], xs[1]),
        dot(d[0], xs[0]) + dot(d[1], xs[1]),
    );
    if (VECS > 2u) {
        let i2 = min(2u, VECS - 1u);
        let i3 = min(3u, VECS - 1u);
        s += vec4<f32>(dot(a[i2], xs[i2]), dot(b[i2], xs[i2]), dot(c[i2], xs[i2]), dot(d[i2], xs[i2]));
        s += vec4<f32>(dot(a[i3], xs[i3]), dot(b[i3], xs[i3]), dot(c[i3], xs[i3]), dot(d[i3], xs[i3]));
    }
    return s;
}

// A gathered thread row's four weight rows (within the expert) and which are valid. Plain:
// rows group * GATHERED_ROWS + thread_row + i * THREAD_ROWS. SwiGLU: features f0 = group *
// 2 * THREAD_ROWS + thread_row and f1 = f0 + THREAD_ROWS; rows (gate f0, up f0, gate f1,
// up f1). Invalid rows name row 0 of the expert (in bounds, never written).
struct RowQuad {
    rows: vec4<u32>,
    valid: vec4<bool>,
    features: vec2<u32>,   // SwiGLU: the two output features
}

fn plan_quad(group: u32, thread_row: u32) -> RowQuad {
    if (!swiglu_mode(p.flags)) {
        let first = group * GATHERED_ROWS + thread_row;
        let rows = vec4<u32>(first) + vec4<u32>(0u, 1u, 2u, 3u) * THREAD_ROWS;
        let valid = rows < vec4<u32>(p.out_features);
        return RowQuad(select(vec4<u32>(0u), rows, valid), valid, vec2<u32>(0u));
    }
    let width = p.out_features / 2u;
    let f0 = group * 2u * THREAD_ROWS + thread_row;
    let f1 = f0 + THREAD_ROWS;
    let rows = vec4<u32>(f0, f0 + width, f1, f1 + width);
    let valid = vec4<bool>(f0 < width, f0 < width, f1 < width, f1 < width);
    return RowQuad(select(vec4<u32>(0u), rows, valid), valid, vec2<u32>(f0, f1));
}

// Sums the LANES partials of each of a thread row's four weight rows (planes of `partial`,
// one float per thread) in a fixed order: groups of eight lanes, then the groups. Returns
// the four sums at lane 0. Every thread must call it.
fn reduce_quad(t: u32) -> vec4<f32> {
    let thread_row = t / LANES;
    let lane = t % LANES;
    workgroupBarrier();
    let group = lane % GROUPS;
    let plane = lane / GROUPS;
    if (plane < 4u) {
        var s = 0.0;
        for (var i = 0u; i < 8u; i++) {
            s += partial[plane * WG + thread_row * LANES + group * 8u + i];
        }
        group_sums[(plane * THREAD_ROWS + thread_row) * GROUPS + group] = s;
    }
    workgroupBarrier();
    var sum = vec4<f32>(0.0);
    if (lane == 0u) {
        for (var g = 0u; g < GROUPS; g++) {
            sum += vec4<f32>(
                group_sums[(0u * THREAD_ROWS + thread_row) * GROUPS + g],
                group_sums[(1u * THREAD_ROWS + thread_row) * GROUPS + g],
                group_sums[(2u * THREAD_ROWS + thread_row) * GROUPS + g],
                group_sums[(3u * THREAD_ROWS + thread_row) * GROUPS + g],
            );
        }
    }
    return sum;
}

// Slots of one expert a `gathered_grouped` workgroup computes in one pass over its rows
// (eight against four shortened the H200 prefill's grouped experts; decode steps do not
// group).
const GROUP_SLOTS: u32 = 8u;

// Where each of a block's slots reads its activations (vec4 index), by slot.
alias SlotVecs = array<u32, GROUP_SLOTS>;

// One unit of each of the four rows (scaled by `scale`) added to the sums of the first
// `count` slots of a block, slot i's activations at `x_at[i] + offset` (of `x_packed` with
// `packed`): each slot gets the term it gets when computed alone. (Written out: every array
// index is a constant. As loops over the slots, here and in `gathered_grouped`, the arrays
// went to local memory and the H200 pair step and prefill got markedly longer.)
fn add_unit(
    acc: ptr<function, array<vec4<f32>, GROUP_SLOTS>>,
    a: Unit,
    b: Unit,
    c: Unit,
    d: Unit,
    scale: vec4<f32>,
    x_at: SlotVecs,
    offset: u32,
    count: u32,
    packed: bool,
) {
    let da = decode_unit(a);
    let db = decode_unit(b);
    let dc = decode_unit(c);
    let dd = decode_unit(d);
    (*acc)[0] += unit_dot4(da, db, dc, dd, unit_activations(x_at[0] + offset, packed)) * scale;
    if (count > 1u) {
        (*acc)[1] += unit_dot4(da, db, dc, dd, unit_activations(x_at[1] + offset, packed)) * scale;
    }
    if (count > 2u) {
        (*acc)[2] += unit_dot4(da, db, dc, dd, unit_activations(x_at[2] + offset, packed)) * scale;
    }
    if (count > 3u) {
        (*acc)[3] += unit_dot4(da, db, dc, dd, unit_activations(x_at[3] + offset, packed)) * scale;
    }
    if (count > 4u) {
        (*acc)[4] += unit_dot4(da, db, dc, dd, unit_activations(x_at[4] + offset, packed)) * scale;
    }
    if (count > 5u) {
        (*acc)[5] += unit_dot4(da, db, dc, dd, unit_activations(x_at[5] + offset, packed)) * scale;
    }
    if (count > 6u) {
        (*acc)[6] += unit_dot4(da, db, dc, dd, unit_activations(x_at[6] + offset, packed)) * scale;
    }
    if (count > 7u) {
        (*acc)[7] += unit_dot4(da, db, dc, dd, unit_activations(x_at[7] + offset, packed)) * scale;
    }
}

// The four rows' sums of the first `count` (1 to GROUP_SLOTS) slots routed to one expert
// (weight rows `n`, activations from vec4 `x_at` of `x`, or with `packed` of `x_packed`):
// the rows' units are loaded once for all the slots, and each slot's sum gets exactly the
// terms, in the same order, that it gets when computed alone.
fn expert_sums(n: vec4<u32>, valid: bool, lane: u32, x_at: SlotVecs, count: u32, packed: bool) -> array<vec4<f32>, GROUP_SLOTS> {
    var acc = array<vec4<f32>, GROUP_SLOTS>();
    if (!valid) {
        return acc;
    }
    let units = p.in_features / UNIT;
    let base = n * units;
    let unit_vecs = select(VECS, VECS / 2u, packed);
    // One unit of each row per iteration: on the H200 the fewer loads in flight per thread,
    // the shorter the launches (two, four and eight units per iteration made the pair
    // step's gathered launches longer, the more the longer; two made the prefill longer too).
    for (var k = lane; k < units; k += LANES) {
        let s = vec4<f32>(unit_scale(n.x, k), unit_scale(n.y, k), unit_scale(n.z, k), unit_scale(n.w, k));
        add_unit(&acc, w[base.x + k], w[base.y + k], w[base.z + k], w[base.w + k], s, x_at, k * unit_vecs, count, packed);
    }
    return acc;
}

// Reduces one slot's sums of the thread rows' four weight rows and writes them (lane 0 of
// each thread row writes). Every invocation must call it.
fn finish_slot(t: u32, slot: u32, acc: vec4<f32>, quad: RowQuad, local_expert: u32) {
    partial[t] = acc.x;
    partial[WG + t] = acc.y;
    partial[2u * WG + t] = acc.z;
    partial[3u * WG + t] = acc.w;
    let sum = reduce_quad(t);
    if (t % LANES == 0u) {
        write_quad(slot, sum, quad, local_expert);
    }
}

// Writes a slot's finished outputs of a thread row's four weight rows from their sums.
fn write_quad(slot: u32, sum: vec4<f32>, quad: RowQuad, local_expert: u32) {
    let row_base = slot * p.y_stride + p.out_offset;
    if (swiglu_mode(p.flags)) {
        // SwiGLU stacks keep two tensor scales per expert: gate, then up.
        let gate_scale = expert_scales[local_expert * 2u];
        let up_scale = expert_scales[local_expert * 2u + 1u];
        if (quad.valid.x) {
            let gate = finish(sum.x, quad.rows.x, gate_scale, p.flags);
            let up = finish(sum.y, quad.rows.y, up_scale, p.flags);
            y[row_base + quad.features.x] = swiglu(gate, up, p.flags);
        }
        if (quad.valid.z) {
            let gate = finish(sum.z, quad.rows.z, gate_scale, p.flags);
            let up = finish(sum.w, quad.rows.w, up_scale, p.flags);
            y[row_base + quad.features.y] = swiglu(gate, up, p.flags);
        }
        return;
    }
    let scale = expert_scales[local_expert];
    if (quad.valid.x) {
        y[row_base + quad.rows.x] = finish(sum.x, quad.rows.x, scale, p.flags);
    }
    if (quad.valid.y) {
        y[row_base + quad.rows.y] = finish(sum.y, quad.rows.y, scale, p.flags);
    }
    if (quad.valid.z) {
        y[row_base + quad.rows.z] = finish(sum.z, quad.rows.z, scale, p.flags);
    }
    if (quad.valid.w) {
        y[row_base + quad.rows.w] = finish(sum.w, quad.rows.w, scale, p.flags);
    }
}

// A workgroup per (GATHERED_ROWS weight rows, slot). Every invocation reads the slot's
// expert itself: a load from a read-only buffer at a uniform index is uniform, so the early
// return leaves the barriers below in uniform control flow. (One invocation reading it for
// all through workgroup memory and a workgroupUniformLoad, a barrier more, measured the same
// on the H200.)
@compute @workgroup_size(WG)
fn gathered(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let quad = plan_quad(wg.x, t / LANES);
    let slot = wg.y;
    let expert = expert_ids[slot];
    if (expert < p.expert_begin || expert >= p.expert_end) {
        return;
    }
    let local_expert = expert - p.expert_begin;
    let n = vec4<u32>(local_expert * p.out_features) + quad.rows;
    var x_at = SlotVecs();
    x_at[0] = (slot / p.x_row_div) * (p.in_features / 4u);
    let acc = expert_sums(n, quad.valid.x, t % LANES, x_at, 1u, false);
    finish_slot(t, slot, acc[0], quad, local_expert);
}

// `gathered_grouped`'s view of bindings 5 and 8: the blocks of up to GROUP_SLOTS slots that
// share an expert, and the slots in expert order (made by `group_slots` in moe.wgsl).
@group(0) @binding(5) var<storage, read> slot_blocks: array<vec4<u32>>;   // (expert, first, count, 0)
@group(0) @binding(8) var<storage, read> slot_order: array<u32>;

// `gathered_grouped`'s sums of a block's slots ([slot][plane][invocation]) and the first
// level of their reduction ([slot][plane][thread row][group]): 18 KB at 128 invocations,
// the most WORKGROUP_MEMORY_BYTES allows.
var<workgroup> block_partials: array<f32, GROUP_SLOTS * 4u * WG>;
var<workgroup> block_group_sums: array<f32, GROUP_SLOTS * 4u * THREAD_ROWS * GROUPS>;

// Stores an invocation's sums of one slot's four weight rows (the slot's four planes of
// `block_partials`).
fn store_slot_sums(slot: u32, t: u32, acc: vec4<f32>) {
    let base = slot * 4u * WG + t;
    block_partials[base] = acc.x;
    block_partials[base + WG] = acc.y;
    block_partials[base + 2u * WG] = acc.z;
    block_partials[base + 3u * WG] = acc.w;
}

// Reduces and writes a block's sums (its first `count` slots, listed from `first` in
// `slot_order`) in `reduce_quad`'s order and tree, so each output gets the bits
// `finish_slot` gives it, but every slot's reduction at once: two barriers for the block
// instead of two per slot, the sums and the writes spread over the workgroup. (Against one
// slot after another this shortened the H200 prefill and its grouped launches.)
fn finish_block(t: u32, group: u32, first: u32, acc: array<vec4<f32>, GROUP_SLOTS>, local_expert: u32, count: u32) {
    store_slot_sums(0u, t, acc[0]);
    store_slot_sums(1u, t, acc[1]);
    store_slot_sums(2u, t, acc[2]);
    store_slot_sums(3u, t, acc[3]);
    store_slot_sums(4u, t, acc[4]);
    store_slot_sums(5u, t, acc[5]);
    store_slot_sums(6u, t, acc[6]);
    store_slot_sums(7u, t, acc[7]);
    workgroupBarrier();
    // Sums of eight lanes: j = ((slot * 4 + plane) * THREAD_ROWS + thread_row) * GROUPS + group.
    for (var j = t; j < count * 4u * THREAD_ROWS * GROUPS; j += WG) {
        let group_of_lanes = j % GROUPS;
        let thread_row = (j / GROUPS) % THREAD_ROWS;
        let slot_plane = j / (GROUPS * THREAD_ROWS);
        let base = slot_plane * WG + thread_row * LANES + group_of_lanes * 8u;
        var s = 0.0;
        for (var i = 0u; i < 8u; i++) {
            s += block_partials[base + i];
        }
        block_group_sums[j] = s;
    }
    workgroupBarrier();
    // A slot's four sums of one thread row: j = slot * THREAD_ROWS + thread_row.
    for (var j = t; j < count * THREAD_ROWS; j += WG) {
        let slot = j / THREAD_ROWS;
        let thread_row = j % THREAD_ROWS;
        var sum = vec4<f32>(0.0);
        for (var g = 0u; g < GROUPS; g++) {
            let at = (slot * 4u * THREAD_ROWS + thread_row) * GROUPS + g;
            let step = THREAD_ROWS * GROUPS;
            sum += vec4<f32>(
                block_group_sums[at],
                block_group_sums[at + step],
                block_group_sums[at + 2u * step],
                block_group_sums[at + 3u * step],
            );
        }
        write_quad(slot_order[first + slot], sum, plan_quad(group, thread_row), local_expert);
    }
}

// A workgroup per (GATHERED_ROWS weight rows, block of slots routed to one expert): the
// expert's rows are read once for the block's slots instead of once per slot (steps of
// many rows, whose slots share experts). Each slot gets the bits `gathered` gives it. The
// activations are read as BF16 pairs, which halves the loads that dominate these launches
// (each 8-byte weight unit is applied to 64 bytes of f32 activations per slot; a timing
// emulation, the f32 buffer read as pairs, shortened the H200 prefill's grouped launches).
@compute @workgroup_size(WG)
fn gathered_grouped(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let quad = plan_quad(wg.x, t / LANES);
    let block = slot_blocks[wg.y];
    let expert = block.x;
    let count = block.z;
    if (count == 0u || expert < p.expert_begin || expert >= p.expert_end) {
        return;
    }
    let local_expert = expert - p.expert_begin;
    let n = vec4<u32>(local_expert * p.out_features) + quad.rows;
    let last = block.y + count - 1u;
    var x_at = SlotVecs();
    let row_vecs = p.in_features / 8u;   // of x_packed
    x_at[0] = slot_order[block.y] / p.x_row_div * row_vecs;
    x_at[1] = slot_order[min(block.y + 1u, last)] / p.x_row_div * row_vecs;
    x_at[2] = slot_order[min(block.y + 2u, last)] / p.x_row_div * row_vecs;
    x_at[3] = slot_order[min(block.y + 3u, last)] / p.x_row_div * row_vecs;
    x_at[4] = slot_order[min(block.y + 4u, last)] / p.x_row_div * row_vecs;
    x_at[5] = slot_order[min(block.y + 5u, last)] / p.x_row_div * row_vecs;
    x_at[6] = slot_order[min(block.y + 6u, last)] / p.x_row_div * row_vecs;
    x_at[7] = slot_order[min(block.y + 7u, last)] / p.x_row_div * row_vecs;
    let acc = expert_sums(n, quad.valid.x, t % LANES, x_at, count, true);
    finish_block(t, wg.x, block.y, acc, local_expert, count);
}
