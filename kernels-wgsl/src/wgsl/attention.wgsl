// Causal grouped-query attention with the queries' rotary embedding, all FP32.
//
// Rows are tokens; `row_lane[r]` names the KV cache slot of row r and `row_pos[r]` its
// position. `attend` reads the queries from the q/k/v projection's output (rows of
// (heads + 2 * kv_heads) * head_dim values, [q | k | v]) and the keys and values from the
// caches, where that projection wrote them (linear.wgsl, `linear_kv`: keys already rotated).
// RoPE is NeoX rotate-half over the whole head with cos/sin from a table the host computes
// in f64 (`rope_table[pos * half + i]` = (cos, sin)), so every platform rotates by the same
// numbers; queries are rotated as attention stages them. In the caches and in `scratch` a
// head takes `head_stride(head_dim)` floats, whole vec4s, the padding zero: any even
// `head_dim` runs, read as vec4s.
// Attention is split over fixed chunks of positions and then combined (see `attend`). A
// row's result depends only on its own cache, whatever else is in the batch.

struct Params {
    rows: u32,
    heads: u32,       // query heads
    kv_heads: u32,
    head_dim: u32,
    capacity: u32,    // positions per cache slot
    flags: u32,       // ATTENTION_* bits (flags.rs)
    scale: f32,       // 1 / sqrt(head_dim)
    block_heads: u32, // query heads per block (see `attend_blocks`), one KV head's group
    block_from: u32,  // chunks a row must reach to go by blocks (see `by_blocks`)
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> row_lane: array<u32>;
@group(0) @binding(2) var<storage, read> row_pos: array<u32>;
@group(0) @binding(3) var<storage, read> rope_table: array<vec2<f32>>;
@group(0) @binding(7) var<storage, read_write> dst: array<f32>;
@group(0) @binding(8) var<storage, read_write> scratch: array<vec4<f32>>;

// Floats per row of the [q | k | v] input.
fn qkv_width() -> u32 {
    return (p.heads + 2u * p.kv_heads) * p.head_dim;
}

// Attention is split over chunks of CHUNK positions (flash decoding): `attend` gives each
// (row, head, chunk) a workgroup of 256 invocations that scores the chunk's positions (four
// invocations per position, each with its share of the key's vec4s in flight at once; the
// query rotated into workgroup memory), takes the chunk's max m and l = sum exp(score - m)
// by fixed trees, and the chunk's o = sum exp(score - m) v, split over (vec4 column, part of
// the positions) with eight positions in flight and the parts added in a fixed order;
// (o, m, l) go to `scratch`. `attend_combine` then gives each (row, head) a workgroup that
// rescales the chunks to their common max and normalises (`combine_chunks`), or, in
// `attend` compiled with LAST_CHUNK_COMBINES, the workgroup of the (row, head)'s last chunk
// to finish does, the same bits with a launch less (see `combine_if_last`). Rows that reach
// enough chunks go by blocks of heads instead (`attend_blocks`: each chunk read once per
// block, the same bits). Chunks are fixed position ranges [CHUNK c, CHUNK (c + 1)), so a
// row's result depends only on its own cache, never on the batch. (One workgroup per (row, head), scores through global memory,
// was slow in a decode step, bound by its chain of dependent memory round trips on a few
// of the GPU's multiprocessors. Loading an invocation's first eight values before the
// scores, or its first eight keys too before staging the query, made the launches longer.
// Both launches in one, a workgroup per (row, head) taking its chunks four at a time, 64
// invocations per chunk each doing the work of four of `attend`'s, then combining them
// itself (the same bits): one launch less per layer, but every step longer, and more so at
// longer contexts: an invocation's four times longer chain costs more than the launch it
// saves.)
//
// `scratch` holds a block per (row, head), block index row * heads + head, of
// chunks_of(capacity) * (columns + 1) vec4s (columns = head_stride(head_dim) / 4): each chunk's o
// (columns vec4s), then each chunk's (m, l, 0, 0).
const ATTEND_WG: u32 = 256u;
const CHUNK: u32 = 64u;              // positions per attention workgroup (ATTEND_WG / 4)
const COMBINE_WG: u32 = 64u;

// Chunks of a cache slot of `capacity` positions.
fn chunks_of(capacity: u32) -> u32 {
    return (capacity + CHUNK - 1u) / CHUNK;
}

// Where block `block` (row * heads + head) starts in `scratch`.
fn chunk_block(block: u32, columns: u32, capacity: u32) -> u32 {
    return block * chunks_of(capacity) * (columns + 1u);
}

const LOWEST: f32 = -3.0e38;

@group(0) @binding(4) var<storage, read> q: array<f32>;
@group(0) @binding(5) var<storage, read> k4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> v4: array<vec4<f32>>;

var<workgroup> partial: array<f32, 256>;            // each position's four quarter dot products
var<workgroup> query: array<vec4<f32>, 256>;
var<workgroup> value_parts: array<vec4<f32>, 256>;
var<workgroup> weights: array<f32, 256>;           // exp(score - m): head b's of a block at CHUNK b + s

// Element i of row r's query of head h, rotated (zero past the head: the padding of its
// last vec4). Element i of the first half pairs with element i + half of the second.
fn rotated_query(q_base: u32, i: u32, pos: u32) -> f32 {
    let half = p.head_dim / 2u;
    if (i >= p.head_dim) {
        return 0.0;
    }
    let first_half = i < half;
    let j = select(i - half, i, first_half);
    let own = q[q_base + i];
    let partner = q[q_base + select(j, j + half, first_half)];
    let t = rope_table[pos * half + j];
    // First half: a cos - b sin (a own, b partner); second half: b cos + a sin.
    return select(own * t.x + partner * t.y, own * t.x - partner * t.y, first_half);
}

// Stages row r's queries of heads h0 .. h0 + count in `query`, rotated, head b's columns
// at b * columns.
fn stage_queries(r: u32, h0: u32, count: u32, t: u32) {
    let columns = head_stride(p.head_dim) / 4u;
    let pos = row_pos[r];
    for (var at = t; at < count * columns; at += ATTEND_WG) {
        let i = 4u * (at % columns);
        let q_base = r * qkv_width() + (h0 + at / columns) * p.head_dim;
        query[at] = vec4<f32>(
            rotated_query(q_base, i, pos),
            rotated_query(q_base, i + 1u, pos),
            rotated_query(q_base, i + 2u, pos),
            rotated_query(q_base, i + 3u, pos),
        );
    }
}

// The key's vec4 columns c, c + 4, ..., c + 28 at `k_base`, each clamped to `last` (the
// quarter's last column: past it, repeated and unused), eight loads in flight.
fn eight_keys(k_base: u32, c: u32, last: u32) -> array<vec4<f32>, 8> {
    return array<vec4<f32>, 8>(
        k4[k_base + c],
        k4[k_base + min(c + 4u, last)],
        k4[k_base + min(c + 8u, last)],
        k4[k_base + min(c + 12u, last)],
        k4[k_base + min(c + 16u, last)],
        k4[k_base + min(c + 20u, last)],
        k4[k_base + min(c + 24u, last)],
        k4[k_base + min(c + 28u, last)],
    );
}

// The dot products of `eight_keys` with the staged query whose columns start at `at`: the
// first four keys' in one vec4, the last four's in the other, zero past the head.
fn eight_dots(at: u32, c: u32, last: u32, columns: u32, k: array<vec4<f32>, 8>) -> array<vec4<f32>, 2> {
    let live_a = vec4<bool>(true, c + 4u < columns, c + 8u < columns, c + 12u < columns);
    let live_b = vec4<bool>(c + 16u < columns, c + 20u < columns, c + 24u < columns, c + 28u < columns);
    return array<vec4<f32>, 2>(
        select(vec4<f32>(0.0), vec4<f32>(
            dot(query[at + c], k[0]),
            dot(query[at + min(c + 4u, last)], k[1]),
            dot(query[at + min(c + 8u, last)], k[2]),
            dot(query[at + min(c + 12u, last)], k[3])), live_a),
        select(vec4<f32>(0.0), vec4<f32>(
            dot(query[at + min(c + 16u, last)], k[4]),
            dot(query[at + min(c + 20u, last)], k[5]),
            dot(query[at + min(c + 24u, last)], k[6]),
            dot(query[at + min(c + 28u, last)], k[7])), live_b),
    );
}

// The last column a quarter owns of `columns` (only asked when it owns one: quarter <
// columns). `columns` need not be a multiple of 4: a quarter may own one column fewer than
// another, or none.
fn last_column(quarter: u32, columns: u32) -> u32 {
    return quarter + 4u * ((columns - 1u - quarter) / 4u);
}

// A quarter's dot product from its two running sums.
fn dot_total(a: vec4<f32>, b: vec4<f32>) -> f32 {
    return ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w));
}

// Quarter `quarter` of the staged query's dot product with the key at `k_base`: its vec4
// columns quarter, quarter + 4, ..., eight key loads in flight.
fn quarter_dot(k_base: u32, quarter: u32, columns: u32) -> f32 {
    let last = last_column(quarter, columns);
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    for (var c = quarter; c < columns; c += 32u) {
        let d = eight_dots(0u, c, last, columns, eight_keys(k_base, c, last));
        a += d[0];
        b += d[1];
    }
    return dot_total(a, b);
}

// Eight values' vec4s at `at`, `at + step`, ..., `at + 7 step`, loaded at once.
fn eight_values(at: u32, step: u32) -> array<vec4<f32>, 8> {
    return array<vec4<f32>, 8>(
        v4[at],
        v4[at + step],
        v4[at + 2u * step],
        v4[at + 3u * step],
        v4[at + 4u * step],
        v4[at + 5u * step],
        v4[at + 6u * step],
        v4[at + 7u * step],
    );
}

// `eight_values` weighted by weights[w], weights[w + parts], ..., weights[w + 7 parts],
// added by a fixed tree.
fn eight_weighted(w: u32, parts: u32, v: array<vec4<f32>, 8>) -> vec4<f32> {
    return ((weights[w] * v[0] + weights[w + parts] * v[1])
        + (weights[w + 2u * parts] * v[2] + weights[w + 3u * parts] * v[3]))
        + ((weights[w + 4u * parts] * v[4] + weights[w + 5u * parts] * v[5])
        + (weights[w + 6u * parts] * v[6] + weights[w + 7u * parts] * v[7]));
}

// Part `part` of parts of a chunk's o for one vec4 column: sum over its positions s = part,
// part + parts, ... below `count` of weights[s] times the value at `v_base + s * kv_row`,
// eight positions in flight.
fn value_part(v_base: u32, kv_row: u32, part: u32, parts: u32, count: u32) -> vec4<f32> {
    var acc = vec4<f32>(0.0);
    var s = part;
    for (; s + 7u * parts < count; s += 8u * parts) {
        acc += eight_weighted(s, parts, eight_values(v_base + s * kv_row, parts * kv_row));
    }
    for (; s < count; s += parts) {
        acc += weights[s] * v4[v_base + s * kv_row];
    }
    return acc;
}

// Stores a chunk's o for one (row, head) (`head_block`: see `chunk_block`) from each
// invocation's part `acc` (invocation t's of column t % columns), the parts added in order;
// every invocation must call it (a barrier).
fn store_chunk_o(acc: vec4<f32>, head_block: u32, chunk: u32, t: u32, columns: u32) {
    value_parts[t] = acc;
    workgroupBarrier();
    let c = t % columns;
    let parts = ATTEND_WG / columns;
    if (t / columns == 0u) {
        var sum = vec4<f32>(0.0);
        for (var q = 0u; q < parts; q++) {
            sum += value_parts[q * columns + c];
        }
        scratch[chunk_block(head_block, columns, p.capacity) + chunk * columns + c] = sum;
    }
}

// Stores a chunk's (m, l) for one (row, head) (`head_block`: see `chunk_block`).
fn store_chunk_stats(head_block: u32, chunk: u32, columns: u32, m: f32, l: f32) {
    scratch[chunk_block(head_block, columns, p.capacity) + chunks_of(p.capacity) * columns + chunk] = vec4<f32>(m, l, 0.0, 0.0);
}

// Where row r's cache of head h's KV group starts (vec4s).
fn cache_base_of(r: u32, h: u32) -> u32 {
    let columns = head_stride(p.head_dim) / 4u;
    let g = h / (p.heads / p.kv_heads);
    return row_lane[r] * p.capacity * p.kv_heads * columns + g * columns;
}

// Whether row r goes by blocks of heads (`attend_blocks`) rather than a workgroup per head
// (`attend`): from the number of chunks it reaches, so a row's code depends on its own
// position alone, never on the step around it.
fn by_blocks(r: u32) -> bool {
    return p.block_heads > 1u && row_pos[r] / CHUNK + 1u >= p.block_from;
}

// In: [q | k | v] rows (q not yet rotated); out: (o, m, l) of one chunk in `scratch`, and
// with LAST_CHUNK_COMBINES the combined output of the row's and head's chunks if this chunk
// finished last (see `combine_if_last`); the rows that go by blocks are `attend_blocks`'.
// (The body as a function of (row, head, chunk) measured slower in the prefill's attention
// launches.)
@compute @workgroup_size(256)
fn attend(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let r = wg.x;
    let h = wg.y;
    let chunk = wg.z;
    let length = row_pos[r] + 1u;
    let first = chunk * CHUNK;
    if (first >= length || by_blocks(r)) {
        return;
    }
    let count = min(CHUNK, length - first);
    let columns = head_stride(p.head_dim) / 4u;    // vec4s per head
    let kv_row = p.kv_heads * columns;             // vec4s per cache position
    let cache_base = cache_base_of(r, h);
    stage_queries(r, h, 1u, t);
    workgroupBarrier();
    // Scores: invocation t takes quarter t % 4 of position first + t / 4.
    let slot = t / 4u;
    var own_part = 0.0;
    if (slot < count) {
        own_part = quarter_dot(cache_base + (first + slot) * kv_row, t % 4u, columns);
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
    // Invocation t owns vec4 column t % columns over positions part, part + parts, ...
    let parts = ATTEND_WG / columns;
    let part = t / columns;
    var acc = vec4<f32>(0.0);
    if (part < parts) {
        acc = value_part(cache_base + first * kv_row + t % columns, kv_row, part, parts, count);
    }
    let head_block = r * p.heads + h;
    store_chunk_o(acc, head_block, chunk, t, columns);
    if (t == 0u) {
        store_chunk_stats(head_block, chunk, columns, m, l);
    }
    if (LAST_CHUNK_COMBINES) {
        combine_if_last(r, h, 1u, t);
    }
}

// A long row's chunk by blocks of heads: `attend_blocks` gives each (row, block of
// `block_heads` query heads of one KV head's group, chunk) a workgroup that reads the
// chunk's keys and values once for the whole block, where `attend` reads them once per
// head. Every head's arithmetic is `attend`'s, in the same order, so either gives the same
// bits; a row takes one or the other by its own length (`by_blocks`), so that even a
// compiler free to reassociate (Metal's fast math) cannot make batched != solo. (Blocks for
// every row made short rows' attention longer: a short row is a chain of dependent steps
// on few workgroups, and fewer, longer workgroups lengthen it. Long rows have chunks to
// spare.)
const MAX_BLOCK_HEADS: u32 = 4u;     // ATTEND_WG / CHUNK: a tree block of CHUNK per head

// Head b's quarter dot products: position s's four at ATTEND_WG b + 4 s.
var<workgroup> block_partial: array<f32, 1024>;

// The key's vec4 columns c0, c0 + 4, c0 + 8, c0 + 12 at `k_base`, each clamped to `last`.
fn four_keys(k_base: u32, c0: u32, last: u32) -> array<vec4<f32>, 4> {
    return array<vec4<f32>, 4>(
        k4[k_base + min(c0, last)],
        k4[k_base + min(c0 + 4u, last)],
        k4[k_base + min(c0 + 8u, last)],
        k4[k_base + min(c0 + 12u, last)],
    );
}

// `four_keys` dotted with the staged query whose columns start at `at`, zero past the head:
// one half of `eight_dots`.
fn four_dots(at: u32, c0: u32, last: u32, columns: u32, k: array<vec4<f32>, 4>) -> vec4<f32> {
    let live = vec4<bool>(c0 < columns, c0 + 4u < columns, c0 + 8u < columns, c0 + 12u < columns);
    return select(vec4<f32>(0.0), vec4<f32>(
        dot(query[at + min(c0, last)], k[0]),
        dot(query[at + min(c0 + 4u, last)], k[1]),
        dot(query[at + min(c0 + 8u, last)], k[2]),
        dot(query[at + min(c0 + 12u, last)], k[3])), live);
}

// The four heads' quarter dot products of the key at `k_base` (head b's in component b,
// zero past the block), each head's sums as `quarter_dot`'s, every key loaded once. Four
// key loads in flight, not `quarter_dot`'s eight: beside the block's eight running sums,
// eight keys at once measured longer steps at long contexts.
fn quarter_dots(k_base: u32, quarter: u32, columns: u32) -> vec4<f32> {
    let last = last_column(quarter, columns);
    var a0 = vec4<f32>(0.0);
    var b0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var b1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var b2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    var b3 = vec4<f32>(0.0);
    for (var c = quarter; c < columns; c += 32u) {
        let ka = four_keys(k_base, c, last);
        a0 += four_dots(0u, c, last, columns, ka);
        if (p.block_heads > 1u) {
            a1 += four_dots(columns, c, last, columns, ka);
        }
        if (p.block_heads > 2u) {
            a2 += four_dots(2u * columns, c, last, columns, ka);
        }
        if (p.block_heads > 3u) {
            a3 += four_dots(3u * columns, c, last, columns, ka);
        }
        let kb = four_keys(k_base, c + 16u, last);
        b0 += four_dots(0u, c + 16u, last, columns, kb);
        if (p.block_heads > 1u) {
            b1 += four_dots(columns, c + 16u, last, columns, kb);
        }
        if (p.block_heads > 2u) {
            b2 += four_dots(2u * columns, c + 16u, last, columns, kb);
        }
        if (p.block_heads > 3u) {
            b3 += four_dots(3u * columns, c + 16u, last, columns, kb);
        }
    }
    return vec4<f32>(dot_total(a0, b0), dot_total(a1, b1), dot_total(a2, b2), dot_total(a3, b3));
}

// `value_part` for each head of the block (head b's weights at CHUNK b), every value loaded
// once for the block.
fn value_parts_of(v_base: u32, kv_row: u32, part: u32, parts: u32, count: u32) -> array<vec4<f32>, 4> {
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    var s = part;
    for (; s + 7u * parts < count; s += 8u * parts) {
        let v = eight_values(v_base + s * kv_row, parts * kv_row);
        acc0 += eight_weighted(s, parts, v);
        if (p.block_heads > 1u) {
            acc1 += eight_weighted(CHUNK + s, parts, v);
        }
        if (p.block_heads > 2u) {
            acc2 += eight_weighted(2u * CHUNK + s, parts, v);
        }
        if (p.block_heads > 3u) {
            acc3 += eight_weighted(3u * CHUNK + s, parts, v);
        }
    }
    for (; s < count; s += parts) {
        let v = v4[v_base + s * kv_row];
        acc0 += weights[s] * v;
        acc1 += weights[CHUNK + s] * v;
        acc2 += weights[2u * CHUNK + s] * v;
        acc3 += weights[3u * CHUNK + s] * v;
    }
    return array<vec4<f32>, 4>(acc0, acc1, acc2, acc3);
}

// `attend` for the rows that go by blocks: a workgroup per (row, block of heads, chunk),
// [rows, heads / block_heads, chunks].
@compute @workgroup_size(256)
fn attend_blocks(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let r = wg.x;
    let chunk = wg.z;
    if (chunk * CHUNK > row_pos[r] || !by_blocks(r)) {
        return;
    }
    attend_block(r, wg.y * p.block_heads, chunk, t);
}

// The work of `attend_blocks`' workgroup of (row r, the block from head h0, chunk) (every
// invocation must call it).
fn attend_block(r: u32, h0: u32, chunk: u32, t: u32) {
    let first = chunk * CHUNK;
    let count = min(CHUNK, row_pos[r] + 1u - first);
    let columns = head_stride(p.head_dim) / 4u;
    let kv_row = p.kv_heads * columns;
    let cache_base = cache_base_of(r, h0);
    stage_queries(r, h0, p.block_heads, t);
    workgroupBarrier();
    // Scores: invocation t takes quarter t % 4 of position first + t / 4, for every head.
    let slot = t / 4u;
    var own_parts = vec4<f32>(0.0);
    if (slot < count) {
        own_parts = quarter_dots(cache_base + (first + slot) * kv_row, t % 4u, columns);
    }
    block_partial[t] = own_parts.x;
    block_partial[ATTEND_WG + t] = own_parts.y;
    block_partial[2u * ATTEND_WG + t] = own_parts.z;
    block_partial[3u * ATTEND_WG + t] = own_parts.w;
    workgroupBarrier();
    // Invocation t holds head b = t / CHUNK's score of position s = t % CHUNK.
    let b = t / CHUNK;
    let s = t % CHUNK;
    let live = b < p.block_heads && s < count;
    var score = LOWEST;
    if (live) {
        let at = ATTEND_WG * b + 4u * s;
        score = ((block_partial[at] + block_partial[at + 1u]) + (block_partial[at + 2u] + block_partial[at + 3u])) * p.scale;
    }
    let m = tree_reduce_blocks(t, score, true, CHUNK);
    var e = 0.0;
    if (live) {
        e = exp(score - m);
    }
    weights[t] = e;
    let l = tree_reduce_blocks(t, e, false, CHUNK);
    if (s == 0u && b < p.block_heads) {
        store_chunk_stats(r * p.heads + h0 + b, chunk, columns, m, l);
    }
    let parts = ATTEND_WG / columns;
    let part = t / columns;
    var acc = array<vec4<f32>, 4>();
    if (part < parts) {
        acc = value_parts_of(cache_base + first * kv_row + t % columns, kv_row, part, parts, count);
    }
    let head_block = r * p.heads + h0;
    store_chunk_o(acc[0], head_block, chunk, t, columns);
    if (p.block_heads > 1u) {
        workgroupBarrier();
        store_chunk_o(acc[1], head_block + 1u, chunk, t, columns);
    }
    if (p.block_heads > 2u) {
        workgroupBarrier();
        store_chunk_o(acc[2], head_block + 2u, chunk, t, columns);
    }
    if (p.block_heads > 3u) {
        workgroupBarrier();
        store_chunk_o(acc[3], head_block + 3u, chunk, t, columns);
    }
    if (LAST_CHUNK_COMBINES) {
        combine_if_last(r, h0, p.block_heads, t);
    }
}

// `attend_combine` gives each invocation a vec4 column of a (row, head)'s output: it finds
// the chunks' largest m itself (a few chunks, the same addresses for the whole workgroup:
// no trees, no barriers), then sums the denominator and its column in one pass. Chunks are
// read COMBINE_BATCH at a time, every load of a batch issued before its values are used,
// so a row of up to COMBINE_BATCH chunks waits for one memory round trip for the maxima
// and one for the sums. (Reading one chunk at a time measured slower; two scalar columns
// per invocation, the denominator and each column summed in passes of their own, made the
// launches and the decode steps longer, the prefill about the same. Eight chunks a batch
// measured no faster.)
const COMBINE_BATCH: u32 = 4u;

// Chunk c's term of a sum in chunk order, `value exp(m_c - M)`; nothing past the row's last
// chunk.
fn chunk_term(sum: f32, c: u32, chunks: u32, value: f32, chunk_max: f32, m: f32) -> f32 {
    if (c < chunks) {
        return sum + value * exp(chunk_max - m);
    }
    return sum;
}

// `chunk_term` for a vec4 of o (each component the same arithmetic).
fn chunk_vec_term(sum: vec4<f32>, c: u32, chunks: u32, value: vec4<f32>, chunk_max: f32, m: f32) -> vec4<f32> {
    if (c < chunks) {
        return sum + value * exp(chunk_max - m);
    }
    return sum;
}

// `scratch`'s vec4 `i`, and its first one or two components. With `across` (a constant at
// every call: reading what other workgroups of the same launch wrote, as `combine_if_last`
// does) through atomic loads of `scratch_bits` (see there).
fn scratch_vec(i: u32, across: bool) -> vec4<f32> {
    if (across) {
        let at = 4u * i;
        return bitcast<vec4<f32>>(vec4<u32>(
            atomicLoad(&scratch_bits[at]),
            atomicLoad(&scratch_bits[at + 1u]),
            atomicLoad(&scratch_bits[at + 2u]),
            atomicLoad(&scratch_bits[at + 3u]),
        ));
    }
    return scratch[i];
}

fn scratch_x(i: u32, across: bool) -> f32 {
    if (across) {
        return bitcast<f32>(atomicLoad(&scratch_bits[4u * i]));
    }
    return scratch[i].x;
}

fn scratch_xy(i: u32, across: bool) -> vec2<f32> {
    if (across) {
        return bitcast<vec2<f32>>(vec2<u32>(atomicLoad(&scratch_bits[4u * i]), atomicLoad(&scratch_bits[4u * i + 1u])));
    }
    return scratch[i].xy;
}

// Vec4 column j of the attention output of block `block` (see `chunk_block`), whose row is
// at position `pos`: sum_c o_c exp(m_c - M) / sum_c l_c exp(m_c - M), M the largest m_c,
// over the chunks up to the row's (each sum in chunk order), unrounded. Past the row's last
// chunk a batch reads the last again, unused (or, for the maximum, harmless). `across`:
// see `scratch_vec`.
fn combine_chunks(block: u32, columns: u32, capacity: u32, pos: u32, j: u32, across: bool) -> vec4<f32> {
    let chunks = pos / CHUNK + 1u;
    let last = chunks - 1u;
    let stats = block + chunks_of(capacity) * columns;
    var m = LOWEST;
    for (var c = 0u; c < chunks; c += COMBINE_BATCH) {
        let m0 = scratch_x(stats + c, across);
        let m1 = scratch_x(stats + min(c + 1u, last), across);
        let m2 = scratch_x(stats + min(c + 2u, last), across);
        let m3 = scratch_x(stats + min(c + 3u, last), across);
        m = max(max(max(max(m, m0), m1), m2), m3);
    }
    var total = 0.0;
    var sum = vec4<f32>(0.0);
    for (var c = 0u; c < chunks; c += COMBINE_BATCH) {
        let c1 = min(c + 1u, last);
        let c2 = min(c + 2u, last);
        let c3 = min(c + 3u, last);
        let s0 = scratch_xy(stats + c, across);
        let s1 = scratch_xy(stats + c1, across);
        let s2 = scratch_xy(stats + c2, across);
        let s3 = scratch_xy(stats + c3, across);
        let o0 = scratch_vec(block + c * columns + j, across);
        let o1 = scratch_vec(block + c1 * columns + j, across);
        let o2 = scratch_vec(block + c2 * columns + j, across);
        let o3 = scratch_vec(block + c3 * columns + j, across);
        total = chunk_term(total, c, chunks, s0.y, s0.x, m);
        total = chunk_term(total, c + 1u, chunks, s1.y, s1.x, m);
        total = chunk_term(total, c + 2u, chunks, s2.y, s2.x, m);
        total = chunk_term(total, c + 3u, chunks, s3.y, s3.x, m);
        sum = chunk_vec_term(sum, c, chunks, o0, s0.x, m);
        sum = chunk_vec_term(sum, c + 1u, chunks, o1, s1.x, m);
        sum = chunk_vec_term(sum, c + 2u, chunks, o2, s2.x, m);
        sum = chunk_vec_term(sum, c + 3u, chunks, o3, s3.x, m);
    }
    return sum / total;
}

// Writes row r's output of head h (dst [rows, heads * head_dim]) combined from its chunks
// (`combine_chunks`, `across` as there), a vec4 column per invocation: columns first,
// first + stride, ...; the padding past the head is not written.
fn write_combined(r: u32, h: u32, first: u32, stride: u32, across: bool) {
    let columns = head_stride(p.head_dim) / 4u;
    let block = chunk_block(r * p.heads + h, columns, p.capacity);
    for (var j = first; j < columns; j += stride) {
        write_column(r, h, j, combine_chunks(block, columns, p.capacity, row_pos[r], j, across));
    }
}

// Writes vec4 column j of row r's output of head h (dst [rows, heads * head_dim]) from its
// unrounded value `combined`; the padding past the head is not written.
fn write_column(r: u32, h: u32, j: u32, combined: vec4<f32>) {
    var out = combined;
    if ((p.flags & ATTENTION_ROUND) != 0u) {
        out = round_bf16_4(out);
    }
    let out_base = (r * p.heads + h) * p.head_dim;
    for (var k = 0u; k < 4u; k++) {
        if (4u * j + k < p.head_dim) {
            dst[out_base + 4u * j + k] = out[k];
        }
    }
}

// out: dst [rows, heads * head_dim], each (row, head) combined from its chunks, a workgroup
// each.
@compute @workgroup_size(64)
fn attend_combine(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    write_combined(wg.x, wg.y, t, COMBINE_WG, false);
}

// With LAST_CHUNK_COMBINES (a constant each pipeline sets: the engine's `Kernel::Attend` and
// `Kernel::AttendAndCombine`) `attend` also does `attend_combine`'s work, one launch for
// both: each (row, head) counts its finished chunks in `chunks_done`, and the workgroup of
// the last to finish combines them (reading every chunk's results from `scratch`) and sets
// the count back to zero for the next launch. On SPIR-V naga gives `storageBarrier` device
// memory scope with acquire-release semantics: the barrier before the count releases the
// chunk's results, the one after it acquires the other chunks'. (On Metal it orders memory
// within the threadgroup only, so steps there keep the two launches.) The combining
// workgroup reads the chunks' results with atomic loads (`scratch_bits`, the same buffer
// as `scratch`): plain loads may be served by a cache of its own that still holds what the
// buffer held before. On NVIDIA's Vulkan driver a linear whose last workgroup normed the
// rows the others had written read, with plain loads, values from before (in some step
// forms, every time), and the right ones with atomic loads. (Against plain loads the
// decode steps measured the same within their spread; reading one chunk at a time instead
// of four made them longer.)
@group(0) @binding(9) var<storage, read_write> chunks_done: array<atomic<u32>>;
@group(0) @binding(10) var<storage, read_write> scratch_bits: array<atomic<u32>>;
var<workgroup> finished_chunks: u32;
// A pipeline constant rather than a flag of the parameter block, so that the pipeline of
// steps that combine in a launch of their own carries none of the combine's code: with a
// flag, the atomic reads made the prefill's attention launches, which never combine,
// longer; the constant takes back most of that, the decode steps the same.
override LAST_CHUNK_COMBINES: bool = false;

// The end of a chunk's workgroup with LAST_CHUNK_COMBINES (every invocation must call it):
// the combine of heads h .. h + heads (counted together, as h's), if its chunk finished
// last.
fn combine_if_last(r: u32, h: u32, heads: u32, t: u32) {
    storageBarrier();
    let counter = r * p.heads + h;
    if (t == 0u) {
        finished_chunks = atomicAdd(&chunks_done[counter], 1u) + 1u;
    }
    // The row's chunks, once this one is the last of them to finish.
    let chunks = workgroupUniformLoad(&finished_chunks);
    if (chunks <= row_pos[r] / CHUNK) {
        return;
    }
    storageBarrier();
    if (t == 0u) {
        atomicStore(&chunks_done[counter], 0u);
    }
    // A row by heads of up to CHAINED_CHUNKS chunks combines a column an invocation with
    // `combine_chunks`' own loads; longer rows by heads, and rows by blocks, with the whole
    // workgroup (`combine_staged`). The same bits either way.
    if (heads == 1u && chunks <= CHAINED_CHUNKS) {
        write_combined(r, h, t, ATTEND_WG, true);
    } else {
        combine_staged(r, h, heads, chunks, t);
    }
}

// The longest row by heads, in chunks, that combines with `combine_chunks`' chain: three of
// its batches. (Staged, rows of 9 to 12 chunks took longer; from 13, the chain's fourth
// batch, staged took less.)
const CHAINED_CHUNKS: u32 = 3u * COMBINE_BATCH;

// Chunks whose results an invocation of the combining workgroup loads at once.
const STAGED_BATCH: u32 = 8u;

// Invocations per head when a chunk's workgroup combines `heads` heads: a
// multiple of STAGED_BATCH (so a batch never crosses a round, see `combine_staged`), at
// least a head's vec4 columns (`attention_block_heads` in tuning.rs sees to it).
fn combine_share(heads: u32) -> u32 {
    return ATTEND_WG / heads / STAGED_BATCH * STAGED_BATCH;
}

// Stages (m, l) of chunks first .. first + share of each head of the block in `query`
// (head b's at share b: `combine_staged`), one chunk an invocation.
fn stage_chunk_stats(stats: u32, first: u32, chunks: u32, u: u32, t: u32, live: bool) {
    workgroupBarrier();
    if (live && first + u < chunks) {
        query[t] = scratch_vec(stats + first + u, true);
    }
    workgroupBarrier();
}

// `combine_chunks` for heads h .. h + heads of row r, whose `chunks` chunks' results the
// launch's other workgroups wrote, by the whole workgroup, written to `dst`: the same
// arithmetic in the same order, so the same bits. The chunks' (m, l) are staged in `query`
// (free once the chunk's scores are taken) in rounds of `combine_share(heads)` chunks a
// head, a load an invocation, so the maximum waits for one memory round trip a round, not
// one per COMBINE_BATCH chunks; the sums load only each chunk's o, STAGED_BATCH at once.
// (With `combine_chunks`' chain of loads, the combine was the largest part of a long row's
// attention.)
fn combine_staged(r: u32, h: u32, heads: u32, chunks: u32, t: u32) {
    let columns = head_stride(p.head_dim) / 4u;
    let share = combine_share(heads);
    let b = t / share;
    let u = t % share;
    let live = b < heads;
    let block = chunk_block(r * p.heads + h + min(b, heads - 1u), columns, p.capacity);
    let stats = block + chunks_of(p.capacity) * columns;
    let staged = b * share;
    var m = LOWEST;
    for (var first = 0u; first < chunks; first += share) {
        stage_chunk_stats(stats, first, chunks, u, t, live);
        if (live) {
            for (var i = 0u; i < min(share, chunks - first); i++) {
                m = max(m, query[staged + i].x);
            }
        }
    }
    // Invocation u of a head sums column u.
    let summing = live && u < columns;
    let last = chunks - 1u;
    var total = 0.0;
    var sum = vec4<f32>(0.0);
    for (var first = 0u; first < chunks; first += share) {
        if (chunks > share) {
            stage_chunk_stats(stats, first, chunks, u, t, live);
        }
        if (summing) {
            for (var i = 0u; i < min(share, chunks - first); i += STAGED_BATCH) {
                let c = first + i;
                var o = eight_chunk_os(block, c, last, columns, u);
                for (var k = 0u; k < STAGED_BATCH; k++) {
                    let s = query[staged + i + k];
                    total = chunk_term(total, c + k, chunks, s.y, s.x, m);
                    sum = chunk_vec_term(sum, c + k, chunks, o[k], s.x, m);
                }
            }
        }
    }
    if (summing) {
        write_column(r, h + b, u, sum / total);
    }
}

// Column j of the o of chunks c .. c + 7 of block `block`, each clamped to `last` (past
// it, repeated and unused), loaded at once.
fn eight_chunk_os(block: u32, c: u32, last: u32, columns: u32, j: u32) -> array<vec4<f32>, 8> {
    return array<vec4<f32>, 8>(
        scratch_vec(block + c * columns + j, true),
        scratch_vec(block + min(c + 1u, last) * columns + j, true),
        scratch_vec(block + min(c + 2u, last) * columns + j, true),
        scratch_vec(block + min(c + 3u, last) * columns + j, true),
        scratch_vec(block + min(c + 4u, last) * columns + j, true),
        scratch_vec(block + min(c + 5u, last) * columns + j, true),
        scratch_vec(block + min(c + 6u, last) * columns + j, true),
        scratch_vec(block + min(c + 7u, last) * columns + j, true),
    );
}
