// Top-k routing over the kept (pruned) experts, one workgroup per token, FP32.
//
// `logits` rows hold one entry per router row: per kept expert (compact) or per original id
// (full width; pruned ids are never read, the same as masking them to -inf before softmax).
// softmax: p = softmax over kept ids, choose top K by p, weights p.
// sigmoid: s = sigmoid(logit), choice score c = s + bias; with groups, a group's score is
// the sum of its best min(2, n) choices, groups without kept experts are never picked, the
// best `topk_group` groups are kept, and the top K by c among their experts are chosen;
// weights s. Then optional renormalisation and the routed scaling factor. Every ranking
// breaks ties toward the lower original id. Output: the K chosen local (kept-list) indices
// in ascending original-id order, and their weights. The workgroup loads the logits and
// computes every expert's ranking score and weight in parallel into workgroup memory (the
// softmax max and denominator by fixed reduction trees); then every eligible expert counts
// the eligible experts that outrank it (a higher score, or the same score and a lower
// index), which is its rank: ranks below K are chosen. The counting compares four scores
// at a time without branches, and the chosen set is a bit mask whose popcounts give each
// chosen expert its output position (with short-circuit conditions in the counting loop
// and one invocation sorting the chosen experts, a route took about twice as long on the
// H200: 23 routes 517 -> 248 us of a decode step's profile).

const MAX_KEPT: u32 = 512u;
const MAX_K: u32 = 16u;

struct Params {
    rows: u32,
    logit_width: u32,   // router rows per token
    kept: u32,          // E_kept
    k: u32,
    flags: u32,         // 1: sigmoid (else softmax); 2: full-width logits; 4: selection bias;
                        // 8: renormalise the chosen weights
    n_group: u32,
    topk_group: u32,
    group_size: u32,    // original ids per group
    scaling: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> kept_ids: array<u32>;
@group(0) @binding(3) var<storage, read> score_bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> chosen_ids: array<u32>;
@group(0) @binding(5) var<storage, read_write> chosen_weights: array<f32>;

// (A branch, not `select`: a select would load kept_ids[i] for compact routers too and make
// the logit's load wait for it.)
fn logit(row: u32, i: u32) -> f32 {
    var column = i;
    if ((p.flags & 2u) != 0u) {
        column = kept_ids[i];
    }
    return logits[row * p.logit_width + column];
}

fn sigmoid(v: f32) -> f32 {
    return 1.0 / (1.0 + exp(-v));
}

var<workgroup> raw: array<f32, MAX_KEPT>;      // logits of the kept experts
var<workgroup> rank: array<f32, MAX_KEPT>;     // ranking score: softmax probability, or sigmoid + bias
var<workgroup> value: array<f32, MAX_KEPT>;    // weight: softmax probability, or sigmoid
var<workgroup> group: array<u32, MAX_KEPT>;    // group of each kept expert
var<workgroup> eligible: array<u32, MAX_KEPT>;  // 1: may still be chosen
var<workgroup> ranking: array<vec4<f32>, 128>;  // MAX_KEPT / 4: the ranking scores, four at a time
var<workgroup> ranking_eligible: array<vec4<u32>, 128>;  // MAX_KEPT / 4: `eligible`, four at a time
var<workgroup> chosen: array<atomic<u32>, 16>;  // MAX_KEPT / 32: bit i set when expert i is among the top K
var<workgroup> by_position: array<u32, MAX_K>;  // chosen kept index by output position

const WG: u32 = 256u;

// Sigmoid routers with groups: a group's score is the sum of its best min(2, n) ranking
// scores; groups without kept experts are never picked; the best `topk_group` groups stay
// eligible (ties toward the lower group index). Runs on one invocation.
fn keep_best_groups() {
    var allowed = array<u32, 2>(0u, 0u);
    var best = array<f32, 64>();
    var non_empty = array<u32, 2>();
    for (var g = 0u; g < p.n_group; g++) {
        var first = -3.0e38;
        var second = -3.0e38;
        var count = 0u;
        for (var i = 0u; i < p.kept; i++) {
            if (group[i] != g) {
                continue;
            }
            let c = rank[i];
            count += 1u;
            if (c > first) {
                second = first;
                first = c;
            } else if (c > second) {
                second = c;
            }
        }
        if (count > 0u) {
            non_empty[g / 32u] |= 1u << (g % 32u);
            best[g] = select(first + second, first, count == 1u);
        }
    }
    for (var pick = 0u; pick < p.topk_group; pick++) {
        var winner = 0xffffffffu;
        for (var g = 0u; g < p.n_group; g++) {
            let free = ((non_empty[g / 32u] >> (g % 32u)) & 1u) != 0u
                && ((allowed[g / 32u] >> (g % 32u)) & 1u) == 0u;
            if (free && (winner == 0xffffffffu || best[g] > best[winner])) {
                winner = g;
            }
        }
        if (winner != 0xffffffffu) {
            allowed[winner / 32u] |= 1u << (winner % 32u);
        }
    }
    for (var i = 0u; i < p.kept; i++) {
        let g = group[i];
        if (((allowed[g / 32u] >> (g % 32u)) & 1u) == 0u) {
            eligible[i] = 0u;
        }
    }
}

@compute @workgroup_size(256)
fn route(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let row = wg.x;
    for (var i = t; i < p.kept; i += WG) {
        raw[i] = logit(row, i);
        group[i] = kept_ids[i] / p.group_size;
        eligible[i] = 1u;
    }
    workgroupBarrier();
    var local_max = -3.0e38;
    for (var i = t; i < p.kept; i += WG) {
        local_max = max(local_max, raw[i]);
    }
    // Trees as wide as the kept experts need (the invocations past them hold nothing).
    let width = min(WG, 1u << firstLeadingBit(max(p.kept, 2u) * 2u - 1u));
    let max_logit = tree_reduce(t, local_max, true, width);
    var local_sum = 0.0;
    for (var i = t; i < p.kept; i += WG) {
        local_sum += exp(raw[i] - max_logit);
    }
    let total = tree_reduce(t, local_sum, false, width);
    for (var i = t; i < p.kept; i += WG) {
        if ((p.flags & 1u) == 0u) {
            let probability = exp(raw[i] - max_logit) / total;
            rank[i] = probability;
            value[i] = probability;
        } else {
            let s = sigmoid(raw[i]);
            value[i] = s;
            var c = s;
            if ((p.flags & 4u) != 0u) {
                c += score_bias[select(i, kept_ids[i], (p.flags & 2u) != 0u)];
            }
            rank[i] = c;
        }
    }
    workgroupBarrier();
    if (p.n_group > 1u) {
        if (t == 0u) {
            keep_best_groups();
        }
        workgroupBarrier();
    }
    // Ranking scores and eligibility as vec4s for the counting below, each vec4 written whole
    // by one invocation (a component write may rewrite the whole vector on some compilers);
    // the padding past `kept` is never eligible. The chosen mask and positions start clear.
    for (var q = t; q < MAX_KEPT / 4u; q += WG) {
        let i = 4u * q;
        ranking[q] = vec4<f32>(rank[i], rank[i + 1u], rank[i + 2u], rank[i + 3u]);
        let live = vec4<u32>(i) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(p.kept);
        let allowed = vec4<u32>(eligible[i], eligible[i + 1u], eligible[i + 2u], eligible[i + 3u]);
        ranking_eligible[q] = select(vec4<u32>(0u), allowed, live);
    }
    if (t < MAX_KEPT / 32u) {
        atomicStore(&chosen[t], 0u);
    }
    if (t < MAX_K) {
        by_position[t] = 0u;
    }
    workgroupBarrier();
    // An eligible expert's rank: the eligible experts with a higher score, or the same score
    // and a lower index (branch-free, four at a time). Ranks below K are chosen.
    let quads = (p.kept + 3u) / 4u;
    for (var i = t; i < p.kept; i += WG) {
        let mine = vec4<f32>(rank[i]);
        var above = vec4<u32>(0u);
        for (var q = 0u; q < quads; q++) {
            let other = ranking[q];
            let lower = vec4<u32>(4u * q) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(i);
            let outranks = (other > mine) | ((other == mine) & lower);
            above += select(vec4<u32>(0u), vec4<u32>(1u), outranks & (ranking_eligible[q] != vec4<u32>(0u)));
        }
        if (eligible[i] != 0u && above.x + above.y + above.z + above.w < p.k) {
            atomicOr(&chosen[i / 32u], 1u << (i % 32u));
        }
    }
    workgroupBarrier();
    // A chosen expert's output position: the chosen experts below it (ascending kept index
    // = ascending original id, kept ids are sorted).
    for (var i = t; i < p.kept; i += WG) {
        let word = atomicLoad(&chosen[i / 32u]);
        if (((word >> (i % 32u)) & 1u) != 0u) {
            var below = countOneBits(word & ((1u << (i % 32u)) - 1u));
            for (var w = 0u; w < i / 32u; w++) {
                below += countOneBits(atomicLoad(&chosen[w]));
            }
            if (below < MAX_K) {
                by_position[below] = i;
            }
        }
    }
    workgroupBarrier();
    if (t < p.k) {
        // Every writer sums the chosen weights in the same (position) order.
        var chosen_sum = 0.0;
        for (var j = 0u; j < p.k; j++) {
            chosen_sum += value[by_position[j]];
        }
        let i = by_position[t];
        var v = value[i];
        if ((p.flags & 8u) != 0u) {
            v = v / chosen_sum;
        }
        chosen_ids[row * p.k + t] = i;
        chosen_weights[row * p.k + t] = v * p.scaling;
    }
}
