// The routed experts' linears: linear.wgsl's helpers, bindings and format file, with each
// slot's expert read on the GPU. Appended to linear.wgsl in the same module.
//
// Entry points:
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

// Gathered launches give each thread row four weight rows (two [gate, up] pairs with the
// SwiGLU epilogue): routed NVFP4 experts load 64 activation bytes per 8-byte unit, so
// sharing each activation load among more rows matters more than for the dense kernel
// (four rows per thread row measured faster than two in every decode step, most at eight
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

// Slots of one expert a `gathered_grouped` workgroup computes in one pass over its rows.
// Four measured faster than eight, in the prefill and in decode steps of 16 to 64 lanes:
// each slot's sums take registers whether its block fills them or not, and an expert's
// rows read once per four slots instead of eight cost little against the slots' own work.
const GROUP_SLOTS: u32 = 4u;

// Where each of a block's slots reads its activations (vec4 index), by slot.
alias SlotVecs = array<u32, GROUP_SLOTS>;

// One unit of each of the four rows (scaled by `scale`) added to the sums of the first
// `count` slots of a block, slot i's activations at `x_at[i] + offset` (of `x_packed` with
// `packed`): each slot gets the term it gets when computed alone. (Written out: every array
// index is a constant. As loops over the slots, here and in `gathered_grouped`, the arrays
// went to local memory, which made the pair step and prefill markedly slower.)
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
    // One unit of each row per iteration: here fewer loads in flight per thread measured
    // faster (two, four and eight units per iteration made the pair step's gathered
    // launches longer, the more the longer; two made the prefill longer too).
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
// all through workgroup memory and a workgroupUniformLoad, a barrier more, measured the
// same.)
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
// level of their reduction ([slot][plane][thread row][group]): 9 KB at 128 invocations.
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
// slot after another this measured faster in the prefill's grouped launches.)
fn finish_block(t: u32, group: u32, first: u32, acc: array<vec4<f32>, GROUP_SLOTS>, local_expert: u32, count: u32) {
    store_slot_sums(0u, t, acc[0]);
    store_slot_sums(1u, t, acc[1]);
    store_slot_sums(2u, t, acc[2]);
    store_slot_sums(3u, t, acc[3]);
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
// emulation, the f32 buffer read as pairs, shortened the prefill's grouped launches).
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
    let acc = expert_sums(n, quad.valid.x, t % LANES, x_at, count, true);
    finish_block(t, wg.x, block.y, acc, local_expert, count);
}
