// Sampling of one token per draw, exactly as `docs/contract.md` §6.1-6.2 define it and the
// host's `engine/src/sampling/exact.rs` computes it: integers only, so no compiler's float
// evaluation order, fast math or `exp` can change a token. A workgroup per draw; each
// invocation owns a contiguous block of ids, so sums in id order are block sums in
// invocation order.
//
// Logits become levels: floor(z * 2^16) saturated at +-2^30, from the f32's bits, kept here
// biased by 2^30 (0 ..= 2^31) so they compare as u32. A guided draw mixes its cond and
// uncond rows' levels: Lu + floor((Lc - Lu) * G / 2^16), saturated. The best level decides greedy
// (the lowest id at it) and every weight: (coarse[x >> 12] * fine[x & 4095]) >> 38 with
// x = floor(gap * 2^10 / tau), 0 from x = 2^21. top-k keeps the levels at or above the
// k-th best level (with its ties); top-p then the fewest best levels whose weight reaches
// ceil(S * p / 2^24). The random word r picks the first kept id in id order whose running
// weight passes floor(r * S' / 2^32). Weight sums are u64, as (low, high) word pairs.

struct Params {
    rows: u32,
    vocab: u32,
    _pad0: u32,
    _pad1: u32,
}

// One draw's settings (the host's `SampleRow`).
struct Row {
    tau: u32,         // floor(T * 2^10); 0: greedy
    top_k: u32,       // 0: no cut
    top_p: u32,       // floor(p * 2^24); 2^24: no cut
    random: u32,      // Philox4x32-10 word of (seed, draw index)
    forbidden: u32,   // the id never sampled (audio_bos)
    cond: u32,        // the row of logits drawn from
    uncond: u32,      // the uncond row it is mixed with; NO_ROW: unguided
    gamma: u32,       // floor(gamma * 2^16)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<u32>;       // rows of vocab f32 bits
@group(0) @binding(2) var<storage, read> rows: array<Row>;         // [p.rows]
@group(0) @binding(3) var<storage, read> coarse: array<u32>;       // e^(-a/16), a < 512
@group(0) @binding(4) var<storage, read> fine: array<u32>;         // e^(-b/2^16), b < 4096
@group(0) @binding(5) var<storage, read_write> tokens: array<u32>; // [p.rows]

const WG: u32 = 256u;
const LIMIT: u32 = 1073741824u;      // 2^30
const TOP_LEVEL: u32 = 2147483648u;  // 2^31: the biased level of +2^30
const FULL_P: u32 = 16777216u;       // 2^24
const NO_TOKEN: u32 = 4294967295u;   // a NaN logit
const NO_ROW: u32 = 4294967295u;     // an unguided draw's uncond row

// The draw's rows and scale, the same in every invocation.
var<private> cond_base: u32;
var<private> uncond_base: u32;
var<private> guided: bool;
var<private> gamma: u32;

var<workgroup> row_settings: Row;
var<workgroup> low_words: array<u32, 256>;
var<workgroup> high_words: array<u32, 256>;

fn is_nan_bits(bits: u32) -> bool {
    return (bits & 0x7f800000u) == 0x7f800000u && (bits & 0x7fffffu) != 0u;
}

// floor(value * 2^16) of an f32's bits, saturated at +-2^30, plus 2^30.
fn level_of(bits: u32) -> u32 {
    let exponent = (bits >> 23u) & 0xffu;
    let fraction = bits & 0x7fffffu;
    var magnitude = LIMIT;
    var inexact = false;
    if (exponent != 0xffu) {
        let mantissa = select(fraction | 0x800000u, fraction, exponent == 0u);
        let scale = i32(max(exponent, 1u)) - 134;
        if (scale >= 7) {
            magnitude = LIMIT;
        } else if (scale >= 0) {
            magnitude = min(mantissa << u32(scale), LIMIT);
        } else if (scale <= -32) {
            magnitude = 0u;
            inexact = mantissa != 0u;
        } else {
            let drop = u32(-scale);
            magnitude = mantissa >> drop;
            inexact = (mantissa & ((1u << drop) - 1u)) != 0u;
        }
    }
    if ((bits >> 31u) == 1u) {
        return LIMIT - min(magnitude + select(0u, 1u, inexact), LIMIT);
    }
    return LIMIT + magnitude;
}

// The biased level of a guided mix: Lu + floor((Lc - Lu) * gamma / 2^16), saturated. The
// quotient's magnitude rounds up when Lc < Lu, which floors the signed quotient.
fn mixed(lc: u32, lu: u32) -> u32 {
    let up = lc >= lu;
    var product = mul_wide(select(lu - lc, lc - lu, up), gamma);
    if (!up) {
        product = add64(product, vec2<u32>(0xffffu, 0u));
    }
    let quotient = (product.x >> 16u) | (product.y << 16u);
    let huge = (product.y >> 16u) != 0u;
    if (up) {
        return select(min(lu + quotient, TOP_LEVEL), TOP_LEVEL, huge || quotient >= TOP_LEVEL);
    }
    return select(lu - quotient, 0u, huge || quotient >= lu);
}

// Candidate i's level: its cond logit's, or the guided mix.
fn level_at(i: u32) -> u32 {
    let lc = level_of(logits[cond_base + i]);
    if (!guided) {
        return lc;
    }
    return mixed(lc, level_of(logits[uncond_base + i]));
}

// The 64-bit product of two words, as (low, high).
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let middle = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return vec2<u32>((p00 & 0xffffu) | (middle << 16u), a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (middle >> 16u));
}

fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let low = a.x + b.x;
    return vec2<u32>(low, a.y + b.y + select(0u, 1u, low < a.x));
}

fn less64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.y < b.y || (a.y == b.y && a.x < b.x);
}

// The weight of a candidate `gap` levels below the best at temperature `tau` (>= 1).
fn weight_of(gap: u32, tau: u32) -> u32 {
    let quotient = gap / tau;
    if (quotient >= 2048u) {
        return 0u;
    }
    let x = (quotient << 10u) + (((gap % tau) << 10u) / tau);
    if (x >= 2097152u) {
        return 0u;
    }
    return mul_wide(coarse[x >> 12u], fine[x & 4095u]).y >> 6u;
}

// The workgroup's largest `value`, or with `smallest` its smallest (every invocation must
// call it; the result is uniform).
fn reduce_extreme(t: u32, value: u32, smallest: bool) -> u32 {
    workgroupBarrier();
    low_words[t] = value;
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        workgroupBarrier();
        if (t < stride) {
            let a = low_words[t];
            let b = low_words[t + stride];
            low_words[t] = select(max(a, b), min(a, b), smallest);
        }
    }
    return workgroupUniformLoad(&low_words[0]);
}

// The workgroup's sum of 64-bit `value`s; both words uniform.
fn reduce_sum(t: u32, value: vec2<u32>) -> vec2<u32> {
    workgroupBarrier();
    low_words[t] = value.x;
    high_words[t] = value.y;
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        workgroupBarrier();
        if (t < stride) {
            let sum = add64(vec2<u32>(low_words[t], high_words[t]), vec2<u32>(low_words[t + stride], high_words[t + stride]));
            low_words[t] = sum.x;
            high_words[t] = sum.y;
        }
    }
    let low = workgroupUniformLoad(&low_words[0]);
    return vec2<u32>(low, workgroupUniformLoad(&high_words[0]));
}

// The sum of the weights of the ids in [first, end) at or above level `floor` (and,
// with `count`, how many ids they are instead).
fn block_sum(first: u32, end: u32, floor: u32, best: u32, tau: u32, forbidden: u32, count: bool) -> vec2<u32> {
    var sum = vec2<u32>(0u, 0u);
    for (var i = first; i < end; i++) {
        let level = level_at(i);
        if (i != forbidden && level >= floor) {
            sum = add64(sum, vec2<u32>(select(weight_of(best - level, tau), 1u, count), 0u));
        }
    }
    return sum;
}

@compute @workgroup_size(256)
fn sample(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let row = wg.x;
    if (t == 0u) {
        row_settings = rows[row];
    }
    let s = workgroupUniformLoad(&row_settings);
    cond_base = s.cond * p.vocab;
    guided = s.uncond != NO_ROW;
    uncond_base = select(cond_base, s.uncond * p.vocab, guided);
    gamma = s.gamma;
    let block = (p.vocab + WG - 1u) / WG;
    let first = min(t * block, p.vocab);
    let end = min(first + block, p.vocab);
    var nan = 0u;
    var best = 0u;
    for (var i = first; i < end; i++) {
        if (is_nan_bits(logits[cond_base + i]) || is_nan_bits(logits[uncond_base + i])) {
            nan = 1u;
        } else if (i != s.forbidden) {
            best = max(best, level_at(i));
        }
    }
    if (reduce_extreme(t, nan, false) != 0u) {
        if (t == 0u) {
            tokens[row] = NO_TOKEN;
        }
        return;
    }
    let top = reduce_extreme(t, best, false);
    if (s.tau == 0u) {
        var id = NO_TOKEN;
        for (var i = first; i < end; i++) {
            if (i != s.forbidden && level_at(i) == top && id == NO_TOKEN) {
                id = i;
            }
        }
        let token = reduce_extreme(t, id, true);
        if (t == 0u) {
            tokens[row] = token;
        }
        return;
    }
    // top-k: the largest level with at least k candidates at or above it.
    var lowest = 0u;
    var candidates = 0u;
    if (s.top_k > 0u) {
        candidates = reduce_sum(t, block_sum(first, end, 0u, top, s.tau, s.forbidden, true)).x;
    }
    if (s.top_k > 0u && s.top_k < candidates) {
        var low = 0u;
        var high = TOP_LEVEL;
        for (var step = 0u; step < 32u; step++) {
            let middle = low + (high - low + 1u) / 2u;
            let at_least = reduce_sum(t, block_sum(first, end, middle, top, s.tau, s.forbidden, true)).x;
            if (at_least >= s.top_k) {
                low = middle;
            } else {
                high = middle - 1u;
            }
        }
        lowest = low;
    }
    // top-p: the largest level whose weight at or above it reaches ceil(S p / 2^24).
    if (s.top_p < FULL_P) {
        let total = reduce_sum(t, block_sum(first, end, lowest, top, s.tau, s.forbidden, false));
        // S p as three words (low, middle, high), then shifted right by 24, rounding up.
        let low_product = mul_wide(total.x, s.top_p);
        let high_product = mul_wide(total.y, s.top_p);
        let middle = add64(vec2<u32>(low_product.y, 0u), vec2<u32>(high_product.x, 0u));
        let top_word = high_product.y + middle.y;
        var threshold = vec2<u32>((low_product.x >> 24u) | (middle.x << 8u), (middle.x >> 24u) | (top_word << 8u));
        if ((low_product.x & 0xffffffu) != 0u) {
            threshold = add64(threshold, vec2<u32>(1u, 0u));
        }
        var low = lowest;
        var high = TOP_LEVEL;
        for (var step = 0u; step < 32u; step++) {
            let middle = low + (high - low + 1u) / 2u;
            let mass = reduce_sum(t, block_sum(first, end, middle, top, s.tau, s.forbidden, false));
            if (!less64(mass, threshold)) {
                low = middle;
            } else {
                high = middle - 1u;
            }
        }
        lowest = low;
    }
    // The draw: the goal floor(r S' / 2^32), then the first kept id whose running weight
    // passes it, each invocation's block after the blocks before it.
    let own = block_sum(first, end, lowest, top, s.tau, s.forbidden, false);
    let total = reduce_sum(t, own);
    let goal = add64(mul_wide(s.random, total.y), vec2<u32>(mul_wide(s.random, total.x).y, 0u));
    // Exclusive prefix sums of the blocks (Hillis-Steele over the invocations).
    workgroupBarrier();
    low_words[t] = own.x;
    high_words[t] = own.y;
    for (var offset = 1u; offset < WG; offset <<= 1u) {
        workgroupBarrier();
        var sum = vec2<u32>(low_words[t], high_words[t]);
        if (t >= offset) {
            sum = add64(sum, vec2<u32>(low_words[t - offset], high_words[t - offset]));
        }
        workgroupBarrier();
        low_words[t] = sum.x;
        high_words[t] = sum.y;
    }
    workgroupBarrier();
    let inclusive = vec2<u32>(low_words[t], high_words[t]);
    var running = vec2<u32>(0u, 0u);
    if (t > 0u) {
        running = vec2<u32>(low_words[t - 1u], high_words[t - 1u]);
    }
    if (!less64(goal, running) && less64(goal, inclusive)) {
        for (var i = first; i < end; i++) {
            let level = level_at(i);
            if (i != s.forbidden && level >= lowest) {
                running = add64(running, vec2<u32>(weight_of(top - level, s.tau), 0u));
                if (less64(goal, running)) {
                    tokens[row] = i;
                    break;
                }
            }
        }
    }
}
