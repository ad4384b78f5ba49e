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
    max_block: u32,   // the most query heads a workgroup takes (see `row_block_heads`)
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
// (row, block of heads, chunk) a workgroup of 256 invocations. A block is `block_heads`
// query heads of one KV head's group (`row_block_heads`), so the chunk's
// keys and values are read once for all of them. The workgroup scores the chunk's positions
// (four invocations per position, each with its share of the key's vec4s in flight at once,
// dotted with every staged query of the block; the queries rotated into workgroup memory),
// takes each head's max m and l = sum exp(score - m) over the chunk by fixed trees (a block
// of 64 invocations per head), and each head's o = sum exp(score - m) v, split over (vec4
// column, part of the positions) with eight positions in flight, every value loaded once
// for the whole block, the parts added in a fixed order; (o, m, l) go to `scratch`.
// `attend_combine` then gives each (row, block) a workgroup that rescales the chunks to
// their common max and normalises (`write_combined`), or, in `attend` compiled with
// LAST_CHUNK_COMBINES, the workgroup of the (row, block)'s last chunk to finish does, the
// same bits with a launch less (see `combine_if_last`). Chunks are fixed position ranges
// [CHUNK c, CHUNK (c + 1)), so a row's result depends only on its own cache, never on the
// batch. (A workgroup per (row, head), which read each chunk of the caches once per query
// head, took a pair step at 4000 positions to 1.39x the step at 256. One workgroup per
// (row, head), scores through global memory, was slow in a decode step, bound by its chain
// of dependent memory round trips on a few of the GPU's multiprocessors. Loading an
// invocation's first eight values before the scores, or its first eight keys too before
// staging the query, made the launches longer. Both launches in one, a workgroup per (row,
// head) taking its chunks four at a time, 64 invocations per chunk each doing the work of
// four of `attend`'s, then combining them itself (the same bits): one launch less per
// layer, but every step longer, and more so at longer contexts: an invocation's four times
// longer chain costs more than the launch it saves.)
//
// `scratch` holds a block per (row, head), block index row * heads + head, of
// chunks_of(capacity) * (columns + 1) vec4s (columns = head_stride(head_dim) / 4): each chunk's o
// (columns vec4s), then each chunk's (m, l, 0, 0).
const ATTEND_WG: u32 = 256u;
const CHUNK: u32 = 64u;              // positions per attention workgroup (ATTEND_WG / 4)
const MAX_BLOCK_HEADS: u32 = 4u;     // ATTEND_WG / CHUNK: a tree block of CHUNK per head

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

// Head b's quarter dot products: position s's four at 256 b + 4 s.
var<workgroup> partial: array<f32, 1024>;
var<workgroup> query: array<vec4<f32>, 256>;       // the block's queries, head after head
var<workgroup> value_parts: array<vec4<f32>, 256>;
var<workgroup> weights: array<f32, 256>;           // exp(score - m): head b's at CHUNK b + s
var<workgroup> head_max: array<f32, 4>;            // MAX_BLOCK_HEADS: the combine's maxima
var<workgroup> head_total: array<f32, 4>;          // and denominators

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

// Stages row r's queries of heads h0 .. h0 + block_heads in `query`, rotated, head b's
// columns at b * columns.
fn stage_queries(r: u32, h0: u32, block_heads: u32, t: u32) {
    let columns = head_stride(p.head_dim) / 4u;
    let pos = row_pos[r];
    for (var at = t; at < block_heads * columns; at += ATTEND_WG) {
        let b = at / columns;
        let i = 4u * (at % columns);
        let q_base = r * qkv_width() + (h0 + b) * p.head_dim;
        query[at] = vec4<f32>(
            rotated_query(q_base, i, pos),
            rotated_query(q_base, i + 1u, pos),
            rotated_query(q_base, i + 2u, pos),
            rotated_query(q_base, i + 3u, pos),
        );
    }
}

// One pass of `quarter_dots` for the staged query of head b: eight keys' vec4s (columns c,
// c + 4, ..., c + 28, clamped to `last`) against the query's, nothing past the head.
fn eight_dots(b: u32, c: u32, last: u32, columns: u32, k: array<vec4<f32>, 8>) -> f32 {
    let at = b * columns;
    let c1 = min(c + 4u, last);
    let c2 = min(c + 8u, last);
    let c3 = min(c + 12u, last);
    let c4 = min(c + 16u, last);
    let c5 = min(c + 20u, last);
    let c6 = min(c + 24u, last);
    let c7 = min(c + 28u, last);
    let live_a = vec4<bool>(true, c + 4u < columns, c + 8u < columns, c + 12u < columns);
    let live_b = vec4<bool>(c + 16u < columns, c + 20u < columns, c + 24u < columns, c + 28u < columns);
    let a = select(vec4<f32>(0.0), vec4<f32>(
        dot(query[at + c], k[0]), dot(query[at + c1], k[1]), dot(query[at + c2], k[2]), dot(query[at + c3], k[3])), live_a);
    let d = select(vec4<f32>(0.0), vec4<f32>(
        dot(query[at + c4], k[4]), dot(query[at + c5], k[5]), dot(query[at + c6], k[6]), dot(query[at + c7], k[7])), live_b);
    return ((a.x + a.y) + (a.z + a.w)) + ((d.x + d.y) + (d.z + d.w));
}

// Quarter `quarter` of each staged query's dot product with the key at `k_base` (head b's
// in component b, zero past the block): its vec4 columns quarter, quarter + 4, ..., eight
// key loads in flight, each dotted with every query of the block (past the end: its last
// column repeated, unused). `columns` need not be a multiple of 4: a quarter may own one
// column fewer than another, or none.
fn quarter_dots(k_base: u32, quarter: u32, columns: u32, block_heads: u32) -> vec4<f32> {
    // Only read when the quarter owns a column (quarter < columns).
    let last = quarter + 4u * ((columns - 1u - quarter) / 4u);
    var sums = vec4<f32>(0.0);
    for (var c = quarter; c < columns; c += 32u) {
        let k = array<vec4<f32>, 8>(
            k4[k_base + c],
            k4[k_base + min(c + 4u, last)],
            k4[k_base + min(c + 8u, last)],
            k4[k_base + min(c + 12u, last)],
            k4[k_base + min(c + 16u, last)],
            k4[k_base + min(c + 20u, last)],
            k4[k_base + min(c + 24u, last)],
            k4[k_base + min(c + 28u, last)],
        );
        sums.x += eight_dots(0u, c, last, columns, k);
        if (block_heads > 1u) {
            sums.y += eight_dots(1u, c, last, columns, k);
        }
        if (block_heads > 2u) {
            sums.z += eight_dots(2u, c, last, columns, k);
        }
        if (block_heads > 3u) {
            sums.w += eight_dots(3u, c, last, columns, k);
        }
    }
    return sums;
}

// Eight values' vec4s weighted by head b's weights of positions s, s + parts, ...,
// s + 7 parts, added by a fixed tree.
fn eight_weighted(b: u32, s: u32, parts: u32, v: array<vec4<f32>, 8>) -> vec4<f32> {
    let w = CHUNK * b + s;
    return ((weights[w] * v[0] + weights[w + parts] * v[1])
        + (weights[w + 2u * parts] * v[2] + weights[w + 3u * parts] * v[3]))
        + ((weights[w + 4u * parts] * v[4] + weights[w + 5u * parts] * v[5])
        + (weights[w + 6u * parts] * v[6] + weights[w + 7u * parts] * v[7]));
}

// Part `part` of parts of a chunk's o for one vec4 column, for each head b of the block (in
// element b): sum over its positions s = part, part + parts, ... below `count` of head b's
// weights[s] times the value at `v_base + s * kv_row`, eight positions in flight, each
// value loaded once for the block.
fn value_parts_of(v_base: u32, kv_row: u32, part: u32, parts: u32, count: u32, block_heads: u32) -> array<vec4<f32>, 4> {
    var acc = array<vec4<f32>, 4>();
    var s = part;
    for (; s + 7u * parts < count; s += 8u * parts) {
        let at = v_base + s * kv_row;
        let step = parts * kv_row;
        let v = array<vec4<f32>, 8>(
            v4[at],
            v4[at + step],
            v4[at + 2u * step],
            v4[at + 3u * step],
            v4[at + 4u * step],
            v4[at + 5u * step],
            v4[at + 6u * step],
            v4[at + 7u * step],
        );
        acc[0] += eight_weighted(0u, s, parts, v);
        if (block_heads > 1u) {
            acc[1] += eight_weighted(1u, s, parts, v);
        }
        if (block_heads > 2u) {
            acc[2] += eight_weighted(2u, s, parts, v);
        }
        if (block_heads > 3u) {
            acc[3] += eight_weighted(3u, s, parts, v);
        }
    }
    for (; s < count; s += parts) {
        let v = v4[v_base + s * kv_row];
        acc[0] += weights[s] * v;
        acc[1] += weights[CHUNK + s] * v;
        acc[2] += weights[2u * CHUNK + s] * v;
        acc[3] += weights[3u * CHUNK + s] * v;
    }
    return acc;
}

// Where row r's cache of head h's KV group starts (vec4s).
fn cache_base_of(r: u32, h: u32) -> u32 {
    let columns = head_stride(p.head_dim) / 4u;
    let g = h / (p.heads / p.kv_heads);
    return row_lane[r] * p.capacity * p.kv_heads * columns + g * columns;
}

// A row takes blocks of more heads as it grows: blocks of the most heads b (a divisor of
// `max_block`) with b * CHUNKS_PER_BLOCK_HEAD <= the chunks it reaches. A row's blocks
// follow from its own length, never from the step around it, so a head of a row is always
// computed by the same code (its place in its block), alone or in any batch.
const CHUNKS_PER_BLOCK_HEAD: u32 = 8u;

fn row_block_heads(r: u32) -> u32 {
    let chunks = row_pos[r] / CHUNK + 1u;
    var b = p.max_block;
    while (b > 1u && (p.max_block % b != 0u || b * CHUNKS_PER_BLOCK_HEAD > chunks)) {
        b -= 1u;
    }
    return b;
}

var<workgroup> block_of_row: u32;

// `row_block_heads(r)`, as a value the whole workgroup shares (every invocation must call
// it).
fn block_heads_of(r: u32, t: u32) -> u32 {
    if (t == 0u) {
        block_of_row = row_block_heads(r);
    }
    return workgroupUniformLoad(&block_of_row);
}

// In: [q | k | v] rows (q not yet rotated); out: (o, m, l) of one chunk of each head of the
// block in `scratch`, and with LAST_CHUNK_COMBINES the combined output of the row's and
// block's chunks if this chunk finished last (see `combine_if_last`). (The body as a
// function of (row, head, chunk) measured slower in the prefill's attention launches.)
@compute @workgroup_size(256)
fn attend(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let r = wg.x;
    let block_heads = block_heads_of(r, t);
    let h0 = wg.y * block_heads;
    let chunk = wg.z;
    let length = row_pos[r] + 1u;
    let first = chunk * CHUNK;
    if (first >= length || h0 >= p.heads) {
        return;
    }
    let count = min(CHUNK, length - first);
    let columns = head_stride(p.head_dim) / 4u;    // vec4s per head
    let kv_row = p.kv_heads * columns;             // vec4s per cache position
    let cache_base = cache_base_of(r, h0);
    stage_queries(r, h0, block_heads, t);
    workgroupBarrier();
    // Scores: invocation t takes quarter t % 4 of position first + t / 4, for every head.
    let slot = t / 4u;
    var own_parts = vec4<f32>(0.0);
    if (slot < count) {
        own_parts = quarter_dots(cache_base + (first + slot) * kv_row, t % 4u, columns, block_heads);
    }
    partial[t] = own_parts.x;
    partial[ATTEND_WG + t] = own_parts.y;
    partial[2u * ATTEND_WG + t] = own_parts.z;
    partial[3u * ATTEND_WG + t] = own_parts.w;
    workgroupBarrier();
    // Invocation t holds head b = t / CHUNK's score of position s = t % CHUNK.
    let b = t / CHUNK;
    let s = t % CHUNK;
    let live = b < block_heads && s < count;
    var score = LOWEST;
    if (live) {
        let at = ATTEND_WG * b + 4u * s;
        score = ((partial[at] + partial[at + 1u]) + (partial[at + 2u] + partial[at + 3u])) * p.scale;
    }
    let m = tree_reduce_blocks(t, score, true, CHUNK);
    var e = 0.0;
    if (live) {
        e = exp(score - m);
    }
    weights[t] = e;
    let l = tree_reduce_blocks(t, e, false, CHUNK);
    let stats = chunks_of(p.capacity) * columns + chunk;
    if (s == 0u && b < block_heads) {
        scratch[chunk_block(r * p.heads + h0 + b, columns, p.capacity) + stats] = vec4<f32>(m, l, 0.0, 0.0);
    }
    // Invocation t owns vec4 column t % columns over positions part, part + parts, ...
    let parts = ATTEND_WG / columns;
    let c = t % columns;
    let part = t / columns;
    var acc = array<vec4<f32>, 4>();
    if (part < parts) {
        acc = value_parts_of(cache_base + first * kv_row + c, kv_row, part, parts, count, block_heads);
    }
    for (var hb = 0u; hb < MAX_BLOCK_HEADS; hb++) {
        if (hb < block_heads) {
            value_parts[t] = acc[hb];
            workgroupBarrier();
            if (part == 0u) {
                var sum = vec4<f32>(0.0);
                for (var q = 0u; q < parts; q++) {
                    sum += value_parts[q * columns + c];
                }
                scratch[chunk_block(r * p.heads + h0 + hb, columns, p.capacity) + chunk * columns + c] = sum;
            }
            workgroupBarrier();
        }
    }
    if (LAST_CHUNK_COMBINES) {
        combine_if_last(r, wg.y, block_heads, t);
    }
}

// The combine (`write_combined`) reads each head's chunk statistics (m, l), a block of 64
// invocations per head, and takes their largest m and the denominator by fixed trees; then
// every (head, vec4 column) gets 256 / (block_heads columns) invocations, each summing its
// column over every such chunk, COMBINE_BATCH chunks at a time, every load of a batch
// issued before its values are used; the invocations' sums are added in a fixed order. A
// row of up to 64 chunks waits for a memory round trip for the statistics and a few for
// the sums. (One invocation per (head, column) taking every chunk, four
// at a time, made the last chunk's workgroup of a long row wait for a round trip per four
// chunks: at 4000 positions, 16 for the maxima and 16 for the sums, after every other
// workgroup of the launch had finished.)
const COMBINE_BATCH: u32 = 8u;

// A chunk's term of a column's sum, `o exp(chunk_max - m)`, where `live` (a chunk up to the
// row's; past it a batch reads the last again, unused).
fn chunk_term(sum: vec4<f32>, live: bool, o: vec4<f32>, chunk_max: f32, m: f32) -> vec4<f32> {
    if (live) {
        return sum + o * exp(chunk_max - m);
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

// Writes row r's output of heads h0 .. h0 + block_heads (dst [rows, heads * head_dim]),
// combined from their chunks: for each head, sum_c o_c exp(m_c - M) / sum_c l_c exp(m_c -
// M), M the largest m_c, over the chunks up to the row's (see COMBINE_BATCH for the order);
// the padding past the head is not written. `across`: see `scratch_vec`. Every invocation
// must call it.
fn write_combined(r: u32, h0: u32, block_heads: u32, t: u32, across: bool) {
    let columns = head_stride(p.head_dim) / 4u;
    let chunks = row_pos[r] / CHUNK + 1u;
    let last = chunks - 1u;
    let stats_at = chunks_of(p.capacity) * columns;
    // The statistics: head b = t / CHUNK's chunks t % CHUNK, t % CHUNK + CHUNK, ... (the
    // first kept, read again only past CHUNK chunks).
    let b = t / CHUNK;
    let stats = chunk_block(r * p.heads + h0 + b, columns, p.capacity) + stats_at;
    let first = t % CHUNK;
    var first_stats = vec2<f32>(LOWEST, 0.0);
    var m = LOWEST;
    if (b < block_heads && first < chunks) {
        first_stats = scratch_xy(stats + first, across);
        m = first_stats.x;
        for (var c = first + CHUNK; c < chunks; c += CHUNK) {
            m = max(m, scratch_x(stats + c, across));
        }
    }
    m = tree_reduce_blocks(t, m, true, CHUNK);
    var l = 0.0;
    if (b < block_heads && first < chunks) {
        l = first_stats.y * exp(first_stats.x - m);
        for (var c = first + CHUNK; c < chunks; c += CHUNK) {
            let s = scratch_xy(stats + c, across);
            l += s.y * exp(s.x - m);
        }
    }
    l = tree_reduce_blocks(t, l, false, CHUNK);
    if (first == 0u) {
        head_max[b] = m;
        head_total[b] = l;
    }
    workgroupBarrier();
    // The sums: invocation t takes (head, column) pair t % pairs over the chunks
    // t / pairs, t / pairs + spread, ...
    let pairs = block_heads * columns;
    let spread = max(ATTEND_WG / pairs, 1u);
    let pair = t % pairs;
    let own = t / pairs;
    let hb = pair / columns;
    let j = pair % columns;
    let block = chunk_block(r * p.heads + h0 + hb, columns, p.capacity);
    let mh = head_max[hb];
    var sum = vec4<f32>(0.0);
    if (own < spread) {
        for (var c = own; c < chunks; c += COMBINE_BATCH * spread) {
            let at = array<u32, 8>(
                c,
                min(c + spread, last),
                min(c + 2u * spread, last),
                min(c + 3u * spread, last),
                min(c + 4u * spread, last),
                min(c + 5u * spread, last),
                min(c + 6u * spread, last),
                min(c + 7u * spread, last),
            );
            let o = array<vec4<f32>, 8>(
                scratch_vec(block + at[0] * columns + j, across),
                scratch_vec(block + at[1] * columns + j, across),
                scratch_vec(block + at[2] * columns + j, across),
                scratch_vec(block + at[3] * columns + j, across),
                scratch_vec(block + at[4] * columns + j, across),
                scratch_vec(block + at[5] * columns + j, across),
                scratch_vec(block + at[6] * columns + j, across),
                scratch_vec(block + at[7] * columns + j, across),
            );
            let cm = array<f32, 8>(
                scratch_x(block + stats_at + at[0], across),
                scratch_x(block + stats_at + at[1], across),
                scratch_x(block + stats_at + at[2], across),
                scratch_x(block + stats_at + at[3], across),
                scratch_x(block + stats_at + at[4], across),
                scratch_x(block + stats_at + at[5], across),
                scratch_x(block + stats_at + at[6], across),
                scratch_x(block + stats_at + at[7], across),
            );
            sum = chunk_term(sum, c < chunks, o[0], cm[0], mh);
            sum = chunk_term(sum, c + spread < chunks, o[1], cm[1], mh);
            sum = chunk_term(sum, c + 2u * spread < chunks, o[2], cm[2], mh);
            sum = chunk_term(sum, c + 3u * spread < chunks, o[3], cm[3], mh);
            sum = chunk_term(sum, c + 4u * spread < chunks, o[4], cm[4], mh);
            sum = chunk_term(sum, c + 5u * spread < chunks, o[5], cm[5], mh);
            sum = chunk_term(sum, c + 6u * spread < chunks, o[6], cm[6], mh);
            sum = chunk_term(sum, c + 7u * spread < chunks, o[7], cm[7], mh);
        }
    }
    value_parts[t] = sum;
    workgroupBarrier();
    if (own == 0u) {
        var all_sum = vec4<f32>(0.0);
        for (var k = 0u; k < spread; k++) {
            all_sum += value_parts[k * pairs + t];
        }
        var out = all_sum / head_total[hb];
        if ((p.flags & ATTENTION_ROUND) != 0u) {
            out = round_bf16_4(out);
        }
        let out_base = (r * p.heads + h0 + hb) * p.head_dim;
        for (var k = 0u; k < 4u; k++) {
            if (4u * j + k < p.head_dim) {
                dst[out_base + 4u * j + k] = out[k];
            }
        }
    }
}

// out: dst [rows, heads * head_dim], each (row, block of heads) combined from its chunks, a
// workgroup each (launched over [rows, heads]: the workgroups past a row's blocks return).
@compute @workgroup_size(256)
fn attend_combine(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let block_heads = block_heads_of(wg.x, t);
    if (wg.y * block_heads >= p.heads) {
        return;
    }
    write_combined(wg.x, wg.y * block_heads, block_heads, t, false);
}

// With LAST_CHUNK_COMBINES (a constant each pipeline sets: the engine's `Kernel::Attend` and
// `Kernel::AttendAndCombine`) `attend` also does `attend_combine`'s work, one launch for
// both: each (row, block of heads) counts its finished chunks in `chunks_done`, and the workgroup of
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
// the combine, if its chunk finished last.
fn combine_if_last(r: u32, block: u32, block_heads: u32, t: u32) {
    storageBarrier();
    let counter = r * p.heads + block;
    if (t == 0u) {
        finished_chunks = atomicAdd(&chunks_done[counter], 1u) + 1u;
    }
    if (workgroupUniformLoad(&finished_chunks) <= row_pos[r] / CHUNK) {
        return;
    }
    storageBarrier();
    if (t == 0u) {
        atomicStore(&chunks_done[counter], 0u);
    }
    write_combined(r, block * block_heads, block_heads, t, true);
}
