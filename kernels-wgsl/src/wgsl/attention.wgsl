// Causal grouped-query attention with the queries' rotary embedding, all FP32.
//
// Rows are tokens; `row_lane[r]` names the KV cache slot of row r and `row_pos[r]` its
// position. `attend` reads the queries from the q/k/v projection's output (rows of
// (heads + 2 * kv_heads) * head_dim values, [q | k | v]) and the keys and values from the
// caches, where that projection wrote them (linear.wgsl, `linear_kv`: keys already rotated).
// RoPE is NeoX rotate-half over the whole head with cos/sin from a table the host computes
// in f64 (`rope_table[pos * half + i]` = (cos, sin)), so every platform rotates by the same
// numbers; queries are rotated as attention stages them.
// Attention is split over fixed chunks of positions and then combined (see `attend`). A
// row's result depends only on its own cache, whatever else is in the batch.

struct Params {
    rows: u32,
    heads: u32,       // query heads
    kv_heads: u32,
    head_dim: u32,
    capacity: u32,    // positions per cache slot
    flags: u32,       // attention: 1 = round output to BF16
    scale: f32,       // 1 / sqrt(head_dim)
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> row_lane: array<u32>;
@group(0) @binding(2) var<storage, read> row_pos: array<u32>;
@group(0) @binding(3) var<storage, read> rope_table: array<vec2<f32>>;
@group(0) @binding(7) var<storage, read_write> dst: array<f32>;
@group(0) @binding(8) var<storage, read_write> scratch: array<f32>;

// Floats per row of the [q | k | v] input.
fn qkv_width() -> u32 {
    return (p.heads + 2u * p.kv_heads) * p.head_dim;
}

// Attention is split over chunks of CHUNK positions (flash decoding): `attend` gives each
// (row, head, chunk) a workgroup of 256 invocations that scores the chunk's positions
// (four invocations per position, each with its share of the key's vec4s in flight at
// once; the query rotated into workgroup memory), takes the chunk's max m and
// l = sum exp(score - m) by fixed trees, and the chunk's o = sum exp(score - m) v, split
// over (vec4 column, part of the positions) with eight positions in flight and the parts
// added in a fixed order; (o, m, l) go to `scratch`. `attend_combine` then gives each
// (row, head) a workgroup that rescales the chunks to their common max and normalises.
// Chunks are fixed position ranges [CHUNK c, CHUNK (c + 1)), so a row's result depends only
// on its own cache, never on the batch. (One workgroup per (row, head), scores through
// global memory, took about 19 us per attention in an H200 decode step, bound by its chain
// of dependent memory round trips on 16 of 132 SMs.)
//
// `scratch` per (row, head): chunk_count * head_dim floats of o, then (m, l) per chunk,
// chunk_count = ceil(capacity / CHUNK).
const ATTEND_WG: u32 = 256u;
const CHUNK: u32 = 64u;              // positions per attention workgroup (ATTEND_WG / 4)
const COMBINE_WG: u32 = 64u;

@group(0) @binding(4) var<storage, read> q4: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> k4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> v4: array<vec4<f32>>;

var<workgroup> partial: array<f32, 256>;            // each position's four quarter dot products
var<workgroup> query: array<vec4<f32>, 256>;
var<workgroup> value_parts: array<vec4<f32>, 256>;
var<workgroup> weights: array<f32, 64>;           // CHUNK: exp(score - m) per position
var<workgroup> row_length: u32;

fn chunk_count() -> u32 {
    return (p.capacity + CHUNK - 1u) / CHUNK;
}

// Where (row, head)'s chunk results start in `scratch`.
fn scratch_base(r: u32, h: u32) -> u32 {
    return (r * p.heads + h) * chunk_count() * (p.head_dim + 2u);
}

const LOWEST: f32 = -3.0e38;

// The query's vec4 columns c, c + 4, ..., c + 28 dotted with eight key vec4s, as two vec4s
// of four dot products each (columns past the head's end: zero).
fn key_batch_dots(c: u32, columns: u32, last: u32, k: array<vec4<f32>, 8>) -> array<vec4<f32>, 2> {
    let live_a = vec4<bool>(true, c + 4u < columns, c + 8u < columns, c + 12u < columns);
    let live_b = vec4<bool>(c + 16u < columns, c + 20u < columns, c + 24u < columns, c + 28u < columns);
    return array<vec4<f32>, 2>(
        select(vec4<f32>(0.0), vec4<f32>(
            dot(query[c], k[0]), dot(query[min(c + 4u, last)], k[1]),
            dot(query[min(c + 8u, last)], k[2]), dot(query[min(c + 12u, last)], k[3])), live_a),
        select(vec4<f32>(0.0), vec4<f32>(
            dot(query[min(c + 16u, last)], k[4]), dot(query[min(c + 20u, last)], k[5]),
            dot(query[min(c + 24u, last)], k[6]), dot(query[min(c + 28u, last)], k[7])), live_b),
    );
}

// Eight key vec4s of one position: columns c, c + 4, ..., c + 28 (past the end: `last`).
fn load_key_batch(k_base: u32, c: u32, last: u32) -> array<vec4<f32>, 8> {
    return array<vec4<f32>, 8>(
        k4[k_base + c], k4[k_base + min(c + 4u, last)], k4[k_base + min(c + 8u, last)],
        k4[k_base + min(c + 12u, last)], k4[k_base + min(c + 16u, last)], k4[k_base + min(c + 20u, last)],
        k4[k_base + min(c + 24u, last)], k4[k_base + min(c + 28u, last)],
    );
}

// In: [q | k | v] rows (q not yet rotated); out: (o, m, l) of one chunk in `scratch`.
// The first batch of each invocation's key and value loads is issued before the query is
// staged, so their memory round trips overlap the staging and the softmax trees.
@compute @workgroup_size(256)
fn attend(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let r = wg.x;
    let h = wg.y;
    let chunk = wg.z;
    let lane_slot = row_lane[r];
    if (t == 0u) {
        row_length = row_pos[r] + 1u;
    }
    let length = workgroupUniformLoad(&row_length);
    let first = chunk * CHUNK;
    if (first >= length) {
        return;
    }
    let count = min(CHUNK, length - first);
    let g = h / (p.heads / p.kv_heads);
    let columns = p.head_dim / 4u;                 // vec4s per head
    let kv_row = p.kv_heads * columns;             // vec4s per cache position
    let cache_base = lane_slot * p.capacity * kv_row + g * columns;
    // Scores: invocation t takes quarter t % 4 (vec4 columns quarter, quarter + 4, ...) of
    // position first + t / 4, eight key loads in flight (past the end: repeated, unused).
    let slot = t / 4u;
    let quarter = t % 4u;
    let last = columns - 4u + quarter;
    let k_base = cache_base + (first + min(slot, count - 1u)) * kv_row;
    let keys = load_key_batch(k_base, quarter, last);
    // Values: invocation t owns vec4 column t % columns over positions part, part + parts,
    // ...; the first eight positions' loads (clamped to the chunk, unused past it) start now.
    let parts = ATTEND_WG / columns;
    let vc = t % columns;
    let part = t / columns;
    var values: array<vec4<f32>, 8>;
    if (part < parts) {
        let v_base = cache_base + first * kv_row + vc;
        values = array<vec4<f32>, 8>(
            v4[v_base + min(part, count - 1u) * kv_row],
            v4[v_base + min(part + parts, count - 1u) * kv_row],
            v4[v_base + min(part + 2u * parts, count - 1u) * kv_row],
            v4[v_base + min(part + 3u * parts, count - 1u) * kv_row],
            v4[v_base + min(part + 4u * parts, count - 1u) * kv_row],
            v4[v_base + min(part + 5u * parts, count - 1u) * kv_row],
            v4[v_base + min(part + 6u * parts, count - 1u) * kv_row],
            v4[v_base + min(part + 7u * parts, count - 1u) * kv_row],
        );
    }
    let q_base = (r * qkv_width() + h * p.head_dim) / 4u;
    // Column c of the first half pairs with column c + half / 4 of the second.
    let half_columns = columns / 2u;
    let pos = row_pos[r];
    for (var c = t; c < columns; c += ATTEND_WG) {
        let first_half = c < half_columns;
        let own = q4[q_base + c];
        let partner = q4[q_base + select(c - half_columns, c + half_columns, first_half)];
        let j = 4u * select(c - half_columns, c, first_half);
        let t0 = rope_table[pos * (p.head_dim / 2u) + j];
        let t1 = rope_table[pos * (p.head_dim / 2u) + j + 1u];
        let t2 = rope_table[pos * (p.head_dim / 2u) + j + 2u];
        let t3 = rope_table[pos * (p.head_dim / 2u) + j + 3u];
        let cosine = vec4<f32>(t0.x, t1.x, t2.x, t3.x);
        let sine = vec4<f32>(t0.y, t1.y, t2.y, t3.y);
        // First half: a cos - b sin (a own, b partner); second half: b cos + a sin.
        query[c] = select(own * cosine + partner * sine, own * cosine - partner * sine, first_half);
    }
    workgroupBarrier();
    var own_part = 0.0;
    if (slot < count) {
        let dots = key_batch_dots(quarter, columns, last, keys);
        var a = dots[0];
        var b = dots[1];
        for (var kc = quarter + 32u; kc < columns; kc += 32u) {
            let more = key_batch_dots(kc, columns, last, load_key_batch(k_base, kc, last));
            a += more[0];
            b += more[1];
        }
        own_part = ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w));
    }
    partial[t] = own_part;
    workgroupBarrier();
    var score = LOWEST;
    if (t < count) {
        score = ((partial[4u * t] + partial[4u * t + 1u]) + (partial[4u * t + 2u] + partial[4u * t + 3u])) * p.scale;
    }
    workgroupBarrier();
    let m = tree_reduce(t, score, true, CHUNK);
    var e = 0.0;
    if (t < count) {
        e = exp(score - m);
        weights[t] = e;
    }
    let l = tree_reduce(t, e, false, CHUNK);
    var acc = vec4<f32>(0.0);
    if (part < parts) {
        var s = part;
        var batch = values;
        for (; s + 7u * parts < count; s += 8u * parts) {
            if (s != part) {
                let v_base = cache_base + (first + s) * kv_row + vc;
                batch = array<vec4<f32>, 8>(
                    v4[v_base], v4[v_base + parts * kv_row], v4[v_base + 2u * parts * kv_row],
                    v4[v_base + 3u * parts * kv_row], v4[v_base + 4u * parts * kv_row],
                    v4[v_base + 5u * parts * kv_row], v4[v_base + 6u * parts * kv_row],
                    v4[v_base + 7u * parts * kv_row],
                );
            }
            let e0 = weights[s];
            let e1 = weights[s + parts];
            let e2 = weights[s + 2u * parts];
            let e3 = weights[s + 3u * parts];
            let e4 = weights[s + 4u * parts];
            let e5 = weights[s + 5u * parts];
            let e6 = weights[s + 6u * parts];
            let e7 = weights[s + 7u * parts];
            acc += ((e0 * batch[0] + e1 * batch[1]) + (e2 * batch[2] + e3 * batch[3]))
                + ((e4 * batch[4] + e5 * batch[5]) + (e6 * batch[6] + e7 * batch[7]));
        }
        for (; s < count; s += parts) {
            acc += weights[s] * v4[cache_base + (first + s) * kv_row + vc];
        }
    }
    value_parts[t] = acc;
    workgroupBarrier();
    let base = scratch_base(r, h);
    if (part == 0u) {
        var sum = vec4<f32>(0.0);
        for (var q = 0u; q < parts; q++) {
            sum += value_parts[q * columns + vc];
        }
        let o = base + chunk * p.head_dim + vc * 4u;
        scratch[o] = sum.x;
        scratch[o + 1u] = sum.y;
        scratch[o + 2u] = sum.z;
        scratch[o + 3u] = sum.w;
    }
    if (t == 0u) {
        let stats = base + chunk_count() * p.head_dim + 2u * chunk;
        scratch[stats] = m;
        scratch[stats + 1u] = l;
    }
}

// out: dst [rows, heads * head_dim] = sum_c o_c exp(m_c - M) / sum_c l_c exp(m_c - M),
// M the largest m_c, over the row's chunks (each sum in chunk order).
@compute @workgroup_size(64)
fn attend_combine(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let r = wg.x;
    let h = wg.y;
    let chunks = (row_pos[r] + CHUNK) / CHUNK;     // ceil((pos + 1) / CHUNK)
    let base = scratch_base(r, h);
    let stats = base + chunk_count() * p.head_dim;
    // Every invocation finds M and the denominator itself, in chunk order (a few chunks,
    // the same addresses for the whole workgroup): no trees, no barriers.
    var m = LOWEST;
    for (var c = 0u; c < chunks; c++) {
        m = max(m, scratch[stats + 2u * c]);
    }
    var total = 0.0;
    for (var c = 0u; c < chunks; c++) {
        total += scratch[stats + 2u * c + 1u] * exp(scratch[stats + 2u * c] - m);
    }
    let out_base = (r * p.heads + h) * p.head_dim;
    for (var i = t; i < p.head_dim; i += COMBINE_WG) {
        var sum = 0.0;
        for (var c = 0u; c < chunks; c++) {
            sum += scratch[base + c * p.head_dim + i] * exp(scratch[stats + 2u * c] - m);
        }
        var out = sum / total;
        if ((p.flags & 1u) != 0u) {
            out = round_bf16(out);
        }
        dst[out_base + i] = out;
    }
}
