// Top-k routing over the kept (pruned) experts, one workgroup per token, FP32; and in the
// same launch an independent BF16 linear (a MoE layer's shared-expert down projection).
//
// This file is appended to the BF16 linear module (linear.wgsl + fmt_bf16.wgsl), whose
// `Params` (`p`, binding 0), bindings and `linear_rows` it uses; routing has its own
// parameter block (`rp`, binding 17) and bindings (18-23). A `route_linear` launch's first
// `p.split_groups` workgroups of each grid row route; the others compute the linear exactly
// as `linear` would, so each gets the bits of its own launch. Routing after the router
// logits and the shared expert's down projection after its gate/up read nothing of each
// other: one launch fewer per MoE layer, where launches run one after another (wgpu's Metal
// and GL backends). Where a launch that needs no barrier runs beside the one before it
// (Vulkan, DX12), the projection is a launch of its own beside the routed experts' gate/up
// instead (see `Op::Linear`'s `beside` in the graph crate), and routing alone (`route`)
// lists its input (`listed`) without reading it: the barrier wgpu records before routing,
// which reads the logits the launch before it wrote, then makes that input visible too, and
// the projection's launch needs no barrier of its own.
//
// `logits` rows hold one entry per router row: per kept expert (compact) or per original id
// (full width; pruned ids are never read, the same as masking them to -inf before softmax).
// softmax: p = softmax over kept ids, choose top K by p (ranked by the logits, which order
// exactly as the exact probabilities do), weights p.
// sigmoid: s = sigmoid(logit), choice score c = s + bias; with groups, a group's score is
// the sum of its best min(2, n) choices, groups without kept experts are never picked, the
// best `topk_group` groups are kept, and the top K by c among their experts are chosen;
// weights s. Then optional renormalisation and the routed scaling factor. Every ranking
// breaks ties toward the lower original id. Output: the K chosen local (kept-list) indices
// in ascending original-id order, and their weights. The workgroup loads the logits, a quad
// of experts per invocation, and computes every expert's ranking score (and a sigmoid
// router's weight) into workgroup memory; then every eligible expert counts the eligible
// experts that outrank it (a higher score, or the same score and a lower index), which is
// its rank: ranks below K are chosen. A softmax router's largest logit and denominator
// (fixed reduction trees) serve only the K chosen experts' probabilities. The counting
// compares four scores at a time without branches, and the chosen set is a bit mask whose
// popcounts give each chosen expert its output position (short-circuit conditions in the
// counting loop and one invocation sorting the chosen experts made routing much slower,
// and counting without the eligibility loads where a router has no groups, two quads at a
// time, made it longer too).
//
// Routing alone (`route`) runs 256 invocations per token, beside the linear
// (`route_linear`) the linear's WG (64: the host's `SHARED_LAUNCH_LINEAR_WIDTH`). With two
// invocations per kept expert (routing alone, up to 128 kept), each counts the experts
// above its expert in half of the quads, and the two counts are added; the chosen weights
// are gathered into workgroup memory once, so the renormalising sum reads them without a
// chain of dependent loads (with the trees' two levels per barrier, steps measured slightly
// shorter; eligibility as bits set by workgroup atomics and counts split by dividing by the
// kept count made routing slower, and so did routing on 128 invocations).
// For the softmax denominator the first WG invocations each sum their experts' terms in
// index order (i = t, t + WG, ...), then a fixed tree combines their sums: the same bits
// from either entry point.

// MAX_KEPT, the kept experts the workgroup arrays hold, is declared by the host when it
// assembles the module (`KeptCapacity`): a multiple of 32.
const MAX_K: u32 = 16u;
// Expert groups a sigmoid router may have (`keep_best_groups`' arrays: a score and a bit
// each; the host's MAX_EXPERT_GROUPS).
const MAX_GROUPS: u32 = 64u;

struct RouterParams {
    rows: u32,
    logit_width: u32,   // router rows per token
    kept: u32,          // E_kept
    k: u32,
    flags: u32,         // ROUTER_* bits (flags.rs)
    n_group: u32,
    topk_group: u32,
    group_size: u32,    // original ids per group
    scaling: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(17) var<uniform> rp: RouterParams;
@group(0) @binding(18) var<storage, read> logits: array<f32>;
@group(0) @binding(19) var<storage, read> kept_ids: array<u32>;
@group(0) @binding(20) var<storage, read> score_bias: array<f32>;
@group(0) @binding(21) var<storage, read_write> chosen_ids: array<u32>;
@group(0) @binding(22) var<storage, read_write> chosen_weights: array<f32>;
@group(0) @binding(23) var<storage, read> listed: array<vec4<f32>>;

// (A branch, not `select`: a select would load kept_ids[i] for compact routers too and make
// the logit's load wait for it.)
fn logit(row: u32, i: u32) -> f32 {
    var column = i;
    if ((rp.flags & ROUTER_FULL_WIDTH) != 0u) {
        column = kept_ids[i];
    }
    return logits[row * rp.logit_width + column];
}

fn sigmoid(v: f32) -> f32 {
    return 1.0 / (1.0 + exp(-v));
}

var<workgroup> raw: array<f32, MAX_KEPT>;      // logits of the kept experts
var<workgroup> rank: array<f32, MAX_KEPT>;     // ranking score: the logit (softmax), or sigmoid + bias
var<workgroup> expert_weight: array<f32, MAX_KEPT>;  // a sigmoid router's weight: the sigmoid
var<workgroup> expert_group: array<u32, MAX_KEPT>;   // group of each kept expert
var<workgroup> eligible: array<u32, MAX_KEPT>;  // 1: may still be chosen
var<workgroup> ranking: array<vec4<f32>, MAX_KEPT / 4u>;  // the ranking scores, four at a time
var<workgroup> ranking_eligible: array<vec4<u32>, MAX_KEPT / 4u>;  // `eligible`, four at a time
var<workgroup> chosen: array<atomic<u32>, MAX_KEPT / 32u>;  // bit i set when expert i is among the top K
var<workgroup> by_position: array<u32, MAX_K>;  // chosen kept index by output position
var<workgroup> counts: array<u32, ROUTE_WG>;   // each (expert, half)'s count of experts above it
var<workgroup> chosen_weight: array<f32, MAX_K>;  // the chosen experts' weights by output position

// Sigmoid routers with groups: a group's score is the sum of its best min(2, n) ranking
// scores; groups without kept experts are never picked; the best `topk_group` groups stay
// eligible (ties toward the lower group index). Runs on one invocation.
fn keep_best_groups() {
    var allowed = array<u32, MAX_GROUPS / 32u>();
    var best = array<f32, MAX_GROUPS>();
    var non_empty = array<u32, 2>();
    for (var g = 0u; g < rp.n_group; g++) {
        var first = -3.0e38;
        var second = -3.0e38;
        var count = 0u;
        for (var i = 0u; i < rp.kept; i++) {
            if (expert_group[i] != g) {
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
    for (var pick = 0u; pick < rp.topk_group; pick++) {
        var winner = 0xffffffffu;
        for (var g = 0u; g < rp.n_group; g++) {
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
    for (var i = 0u; i < rp.kept; i++) {
        let g = expert_group[i];
        if (((allowed[g / 32u] >> (g % 32u)) & 1u) == 0u) {
            eligible[i] = 0u;
        }
    }
}

// Routing alone: a workgroup of ROUTE_WG invocations per token. (With the linear's 64, the
// routing launches of eight-lane decode steps measured slower.)
const ROUTE_WG: u32 = 256u;

@compute @workgroup_size(256)
fn route(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    _ = &listed;
    route_token(wg.x, t, ROUTE_WG);
}

// Routing and the linear: the first `p.split_groups` workgroups of each grid row route,
// token wg.y * p.split_groups + wg.x (a uniform condition: the barriers of `route_token` and
// of `linear_rows` stay in uniform control flow); the others compute the linear.
@compute @workgroup_size(WG)
fn route_linear(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    if (wg.x < p.split_groups) {
        let row = wg.y * p.split_groups + wg.x;
        if (row < rp.rows) {
            route_token(row, t, WG);
        }
        return;
    }
    linear_rows(vec3<u32>(wg.x - p.split_groups, wg.y, wg.z), groups.y, t, false, false, false);
}

// Keeps what routing needs of kept expert i, whose logit is `l`: the logit, its eligibility,
// its group (grouped routing), its weight (sigmoid routers) and its ranking score, which it
// returns. A softmax router ranks by the logit itself: the exact probabilities rank as their
// logits do (exp and the division by one denominator are monotonic), and two different
// logits never tie, where their f32 probabilities can (whenever their differences from the
// largest logit round to the same f32, or f32 exp maps them alike).
fn keep_expert(i: u32, l: f32) -> f32 {
    raw[i] = l;
    eligible[i] = 1u;
    // Only grouped routing reads the groups: a compact router's launch then loads no kept id
    // before its first barrier.
    if (rp.n_group > 1u) {
        expert_group[i] = kept_ids[i] / rp.group_size;
    }
    var c = l;
    if ((rp.flags & ROUTER_SIGMOID) != 0u) {
        let s = sigmoid(l);
        expert_weight[i] = s;
        c = s;
        if ((rp.flags & ROUTER_SCORE_BIAS) != 0u) {
            c += score_bias[select(i, kept_ids[i], (rp.flags & ROUTER_FULL_WIDTH) != 0u)];
        }
    }
    rank[i] = c;
    return c;
}

// The experts of quad q (4 q .. 4 q + 3) that are kept experts, not padding.
fn quad_live(q: u32) -> vec4<bool> {
    return vec4<u32>(4u * q) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(rp.kept);
}

// The experts of quad q, past `kept` the last kept expert (for loads issued together whose
// padding values go unused).
fn quad_clamped(q: u32) -> vec4<u32> {
    return min(vec4<u32>(4u * q) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(rp.kept - 1u));
}

// Routes token `row` with a workgroup of `invocations` (WG or ROUTE_WG, a constant at each
// call). Every invocation of the workgroup must call it.
fn route_token(row: u32, t: u32, invocations: u32) {
    let softmax = (rp.flags & ROUTER_SIGMOID) == 0u;
    let quads = (rp.kept + 3u) / 4u;
    // A quad of kept experts per invocation: their four logits loaded together (past `kept`:
    // the last expert's, unused), each expert kept (`keep_expert`), and the ranking scores
    // and eligibility as vec4s for the counting below, each vec4 written whole by one
    // invocation (a component write may rewrite the whole vector on some compilers); the
    // padding past `kept`, up to MAX_KEPT, is never eligible. The chosen mask and positions
    // start clear.
    for (var q = t; q < MAX_KEPT / 4u; q += invocations) {
        let i = 4u * q;
        let live = quad_live(q);
        var scores = vec4<f32>(0.0);
        if (q < quads) {
            let e = quad_clamped(q);
            let l = vec4<f32>(logit(row, e.x), logit(row, e.y), logit(row, e.z), logit(row, e.w));
            scores.x = keep_expert(i, l.x);
            if (live.y) {
                scores.y = keep_expert(i + 1u, l.y);
            }
            if (live.z) {
                scores.z = keep_expert(i + 2u, l.z);
            }
            if (live.w) {
                scores.w = keep_expert(i + 3u, l.w);
            }
        }
        ranking[q] = scores;
        ranking_eligible[q] = select(vec4<u32>(0u), vec4<u32>(1u), live);
    }
    if (t < MAX_KEPT / 32u) {
        atomicStore(&chosen[t], 0u);
    }
    if (t < MAX_K) {
        by_position[t] = 0u;
    }
    workgroupBarrier();
    if (rp.n_group > 1u) {
        if (t == 0u) {
            keep_best_groups();
        }
        workgroupBarrier();
        for (var q = t; q < quads; q += invocations) {
            let e = quad_clamped(q);
            let allowed = vec4<u32>(eligible[e.x], eligible[e.y], eligible[e.z], eligible[e.w]);
            ranking_eligible[q] = select(vec4<u32>(0u), allowed, quad_live(q));
        }
        workgroupBarrier();
    }
    // An eligible expert's rank: the eligible experts with a higher score, or the same score
    // and a lower index. Ranks below K are chosen. With two invocations per expert the
    // halves of the quads are counted apart, and added once the barriers below have made
    // both counts visible.
    let split = invocations >= 2u * MAX_KEPT;
    if (split) {
        let i = t % MAX_KEPT;
        let half = t / MAX_KEPT;
        var above = 0u;
        if (half < 2u && i < rp.kept) {
            above = count_above(i, half * (MAX_KEPT / 8u), (half + 1u) * (MAX_KEPT / 8u));
        }
        counts[t] = above;
    } else {
        for (var i = t; i < rp.kept; i += invocations) {
            choose_within_k(i, count_above(i, 0u, quads));
        }
    }
    // A softmax router's weights: the largest logit and the denominator (their trees'
    // barriers also serve the counting).
    var max_logit = 0.0;
    var total = 0.0;
    if (softmax) {
        var local_max = -3.0e38;
        for (var i = t; i < rp.kept; i += invocations) {
            local_max = max(local_max, raw[i]);
        }
        // Trees as wide as the kept experts need (the invocations past them hold nothing).
        let span = 1u << firstLeadingBit(max(rp.kept, 2u) * 2u - 1u);
        max_logit = tree_reduce(t, local_max, true, min(invocations, span));
        // The denominator: the sums of the first WG invocations whatever the workgroup's
        // size, so both entry points give the same bits.
        var local_sum = 0.0;
        for (var i = t; t < WG && i < rp.kept; i += WG) {
            local_sum += exp(raw[i] - max_logit);
        }
        total = tree_reduce(t, local_sum, false, min(WG, span));
    } else {
        workgroupBarrier();
    }
    if (split && t < rp.kept) {
        choose_within_k(t, counts[t] + counts[t + MAX_KEPT]);
    }
    workgroupBarrier();
    // A chosen expert's output position: the chosen experts below it (ascending kept index
    // = ascending original id, kept ids are sorted).
    for (var i = t; i < rp.kept; i += invocations) {
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
    // The chosen experts' weights (softmax: their probabilities), once.
    if (t < rp.k) {
        let i = by_position[t];
        if (softmax) {
            chosen_weight[t] = exp(raw[i] - max_logit) / total;
        } else {
            chosen_weight[t] = expert_weight[i];
        }
    }
    workgroupBarrier();
    if (t < rp.k) {
        var v = chosen_weight[t];
        if ((rp.flags & ROUTER_RENORMALIZE) != 0u) {
            // Every writer sums the chosen weights in the same (position) order.
            var chosen_sum = 0.0;
            for (var j = 0u; j < rp.k; j++) {
                chosen_sum += chosen_weight[j];
            }
            v = v / chosen_sum;
        }
        chosen_ids[row * rp.k + t] = by_position[t];
        chosen_weights[row * rp.k + t] = v * rp.scaling;
    }
}

// The eligible experts among quads [q_begin, q_end) that outrank expert i (a higher score,
// or the same score and a lower index), branch-free four at a time.
fn count_above(i: u32, q_begin: u32, q_end: u32) -> u32 {
    let mine = vec4<f32>(rank[i]);
    var above = vec4<u32>(0u);
    for (var q = q_begin; q < q_end; q++) {
        let other = ranking[q];
        let lower = vec4<u32>(4u * q) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(i);
        let outranks = (other > mine) | ((other == mine) & lower);
        above += select(vec4<u32>(0u), vec4<u32>(1u), outranks & (ranking_eligible[q] != vec4<u32>(0u)));
    }
    return above.x + above.y + above.z + above.w;
}

// Marks eligible expert i chosen when fewer than K experts outrank it.
fn choose_within_k(i: u32, above: u32) {
    if (eligible[i] != 0u && above < rp.k) {
        atomicOr(&chosen[i / 32u], 1u << (i % 32u));
    }
}
