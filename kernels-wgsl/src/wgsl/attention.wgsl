// Rotary embedding, KV-cache writes and causal grouped-query attention, all FP32.
//
// Rows are tokens; `row_lane[r]` names the KV cache slot of row r and `row_pos[r]` its
// position. Both entry points read the q/k/v projection's output: rows of
// (heads + 2 * kv_heads) * head_dim values, [q | k | v]. RoPE is NeoX rotate-half over the
// whole head with cos/sin from a table the host computes in f64
// (`rope_table[pos * half + i]` = (cos, sin)), so every platform rotates by the same
// numbers; keys are rotated as they enter the cache, queries as attention stages them.
// Attention gives each (row, head) one workgroup: scores into `scratch`, max and sum by a
// fixed tree, then each thread owns output columns. A row's result depends only on its own
// cache, whatever else is in the batch.

const WG: u32 = 64u;

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
@group(0) @binding(4) var<storage, read> src: array<f32>;
@group(0) @binding(5) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<f32>;
@group(0) @binding(7) var<storage, read_write> dst: array<f32>;
@group(0) @binding(8) var<storage, read_write> scratch: array<f32>;

// Floats per row of the [q | k | v] input.
fn qkv_width() -> u32 {
    return (p.heads + 2u * p.kv_heads) * p.head_dim;
}

// k (rotated) and v into the caches.
@compute @workgroup_size(64)
fn write_kv(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let index = gid.x + gid.y * nwg.x * WG;
    let width = p.kv_heads * p.head_dim;
    if (index >= p.rows * width) {
        return;
    }
    let r = index / width;
    let c = index % width;
    let i = c % p.head_dim;
    let pos = row_pos[r];
    let slot = (row_lane[r] * p.capacity + pos) * width + c;
    let k_base = r * qkv_width() + p.heads * p.head_dim;
    let half = p.head_dim / 2u;
    let j = i % half;
    let cs = rope_table[pos * half + j];
    let a = src[k_base + c - i + j];
    let b = src[k_base + c - i + j + half];
    k_cache[slot] = select(b * cs.x + a * cs.y, a * cs.x - b * cs.y, i < half);
    v_cache[slot] = src[k_base + width + c];
}

// Attention runs 256 invocations per (row, head), reading q, keys and values as vec4s
// (head_dim a multiple of 16, at most 1024; the engine checks): the query is rotated into
// workgroup memory; each invocation scores whole positions with eight key loads in flight
// (two groups of four partial dot products); the weighted sum of values is split over
// (vec4 column, part of the positions), eight positions in flight, and the parts added in a
// fixed order, so a row's result never depends on anything but its own cache.
const ATTEND_WG: u32 = 256u;

@group(0) @binding(4) var<storage, read> q4: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> k4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> v4: array<vec4<f32>>;

var<workgroup> partial: array<f32, 256>;
var<workgroup> query: array<vec4<f32>, 256>;
var<workgroup> value_parts: array<vec4<f32>, 256>;

fn reduce(t: u32, value: f32, is_max: bool) -> f32 {
    partial[t] = value;
    for (var stride = ATTEND_WG / 2u; stride > 0u; stride /= 2u) {
        workgroupBarrier();
        if (t < stride) {
            let other = partial[t + stride];
            partial[t] = select(partial[t] + other, max(partial[t], other), is_max);
        }
    }
    workgroupBarrier();
    let result = partial[0];
    workgroupBarrier();
    return result;
}

// In: [q | k | v] rows (q not yet rotated); out: dst [rows, heads * head_dim].
@compute @workgroup_size(256)
fn attend(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let r = wg.x;
    let h = wg.y;
    let g = h / (p.heads / p.kv_heads);
    let columns = p.head_dim / 4u;                 // vec4s per head
    let kv_row = p.kv_heads * columns;             // vec4s per cache position
    let length = row_pos[r] + 1u;
    let cache_base = row_lane[r] * p.capacity * kv_row + g * columns;
    let q_base = (r * qkv_width() + h * p.head_dim) / 4u;
    let out_base = (r * p.heads + h) * p.head_dim;
    let s_base = (r * p.heads + h) * p.capacity;
    // Column c of the first half pairs with column c + half / 4 of the second.
    let half_columns = columns / 2u;
    let pos = row_pos[r];
    for (var c = t; c < columns; c += ATTEND_WG) {
        let first = c < half_columns;
        let own = q4[q_base + c];
        let partner = q4[q_base + select(c - half_columns, c + half_columns, first)];
        let j = 4u * select(c - half_columns, c, first);
        let t0 = rope_table[pos * (p.head_dim / 2u) + j];
        let t1 = rope_table[pos * (p.head_dim / 2u) + j + 1u];
        let t2 = rope_table[pos * (p.head_dim / 2u) + j + 2u];
        let t3 = rope_table[pos * (p.head_dim / 2u) + j + 3u];
        let cosine = vec4<f32>(t0.x, t1.x, t2.x, t3.x);
        let sine = vec4<f32>(t0.y, t1.y, t2.y, t3.y);
        // First half: a cos - b sin (a own, b partner); second half: b cos + a sin.
        query[c] = select(own * cosine + partner * sine, own * cosine - partner * sine, first);
    }
    workgroupBarrier();
    var local_max = -3.0e38;
    for (var s = t; s < length; s += ATTEND_WG) {
        let k_base = cache_base + s * kv_row;
        // Eight key loads in flight per step (the second four past the end: repeated, unused).
        var a = vec4<f32>(0.0);
        var b = vec4<f32>(0.0);
        for (var c = 0u; c < columns; c += 8u) {
            let d = min(c + 4u, columns - 4u);
            let k0 = k4[k_base + c];
            let k1 = k4[k_base + c + 1u];
            let k2 = k4[k_base + c + 2u];
            let k3 = k4[k_base + c + 3u];
            let k5 = k4[k_base + d];
            let k6 = k4[k_base + d + 1u];
            let k7 = k4[k_base + d + 2u];
            let k8 = k4[k_base + d + 3u];
            a += vec4<f32>(dot(query[c], k0), dot(query[c + 1u], k1), dot(query[c + 2u], k2), dot(query[c + 3u], k3));
            if (c + 4u < columns) {
                b += vec4<f32>(dot(query[d], k5), dot(query[d + 1u], k6), dot(query[d + 2u], k7), dot(query[d + 3u], k8));
            }
        }
        let score = (((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w))) * p.scale;
        scratch[s_base + s] = score;
        local_max = max(local_max, score);
    }
    let m = reduce(t, local_max, true);
    var local_sum = 0.0;
    for (var s = t; s < length; s += ATTEND_WG) {
        let e = exp(scratch[s_base + s] - m);
        scratch[s_base + s] = e;
        local_sum += e;
    }
    let total = reduce(t, local_sum, false);
    storageBarrier();
    workgroupBarrier();
    // Invocation t owns vec4 column t % columns over positions part, part + parts, ...
    let parts = ATTEND_WG / columns;
    let c = t % columns;
    let part = t / columns;
    var acc = vec4<f32>(0.0);
    if (part < parts) {
        var s = part;
        for (; s + 7u * parts < length; s += 8u * parts) {
            let e0 = scratch[s_base + s];
            let e1 = scratch[s_base + s + parts];
            let e2 = scratch[s_base + s + 2u * parts];
            let e3 = scratch[s_base + s + 3u * parts];
            let e4 = scratch[s_base + s + 4u * parts];
            let e5 = scratch[s_base + s + 5u * parts];
            let e6 = scratch[s_base + s + 6u * parts];
            let e7 = scratch[s_base + s + 7u * parts];
            let v0 = v4[cache_base + s * kv_row + c];
            let v1 = v4[cache_base + (s + parts) * kv_row + c];
            let v2 = v4[cache_base + (s + 2u * parts) * kv_row + c];
            let v3 = v4[cache_base + (s + 3u * parts) * kv_row + c];
            let v5 = v4[cache_base + (s + 4u * parts) * kv_row + c];
            let v6 = v4[cache_base + (s + 5u * parts) * kv_row + c];
            let v7 = v4[cache_base + (s + 6u * parts) * kv_row + c];
            let v8 = v4[cache_base + (s + 7u * parts) * kv_row + c];
            acc += ((e0 * v0 + e1 * v1) + (e2 * v2 + e3 * v3)) + ((e4 * v5 + e5 * v6) + (e6 * v7 + e7 * v8));
        }
        for (; s + 3u * parts < length; s += 4u * parts) {
            let e0 = scratch[s_base + s];
            let e1 = scratch[s_base + s + parts];
            let e2 = scratch[s_base + s + 2u * parts];
            let e3 = scratch[s_base + s + 3u * parts];
            let v0 = v4[cache_base + s * kv_row + c];
            let v1 = v4[cache_base + (s + parts) * kv_row + c];
            let v2 = v4[cache_base + (s + 2u * parts) * kv_row + c];
            let v3 = v4[cache_base + (s + 3u * parts) * kv_row + c];
            acc += (e0 * v0 + e1 * v1) + (e2 * v2 + e3 * v3);
        }
        for (; s < length; s += parts) {
            acc += scratch[s_base + s] * v4[cache_base + s * kv_row + c];
        }
    }
    value_parts[t] = acc;
    workgroupBarrier();
    if (part == 0u) {
        var sum = vec4<f32>(0.0);
        for (var q = 0u; q < parts; q++) {
            sum += value_parts[q * columns + c];
        }
        var out = sum / total;
        if ((p.flags & 1u) != 0u) {
            out = vec4<f32>(round_bf16(out.x), round_bf16(out.y), round_bf16(out.z), round_bf16(out.w));
        }
        let o = out_base + c * 4u;
        dst[o] = out.x;
        dst[o + 1u] = out.y;
        dst[o + 2u] = out.z;
        dst[o + 3u] = out.w;
    }
}
