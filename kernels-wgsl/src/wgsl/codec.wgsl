// The codec decoder's kernels, FP32 accumulation, activations time-major [frames, channels].
//
// Every convolution is causal and streams: `hist` holds the frames before this chunk (zeros
// at the start of an utterance), so a chunk's outputs are computed from exactly the inputs
// a whole-utterance decode would use, in the same order: chunked == whole, bit for bit.
// Weights are BF16 in PyTorch layout, read as stored.

const WG: u32 = 64u;

struct Params {
    frames: u32,     // input frames in this chunk (T)
    in_ch: u32,
    out_ch: u32,
    kernel: u32,     // conv1d: kernel size K; conv_transpose: rate r
    dilation: u32,
    history: u32,    // frames in `hist`
    flags: u32,      // CODEC_* bits (flags.rs)
    count: u32,      // elements of the output
    lanes: u32,      // convolutions: threads per output channel
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> hist: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<u32>;
@group(0) @binding(4) var<storage, read> bias: array<u32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
// What the epilogues of `conv1d_snake` (alpha), `conv1d_residual_snake` (alpha, the residual
// stream) and `conv_transpose_snake` (alpha) read besides the convolution, and the second
// output of the latter two.
@group(0) @binding(6) var<storage, read> alpha: array<u32>;
@group(0) @binding(7) var<storage, read> residual: array<f32>;
@group(0) @binding(8) var<storage, read_write> snaked: array<f32>;

// Channel o's snake alpha (BF16).
fn alpha_of(o: u32) -> f32 {
    return bf16_half(alpha[o / 2u], o & 1u);
}

fn weight(e: u32) -> f32 {
    return bf16_half(w[e / 2u], e & 1u);
}

// Frame `e` of [hist | x] (the chunk extended by its history), channel `i`.
fn extended(e: u32, i: u32) -> f32 {
    if (e < p.history) {
        return hist[e * p.in_ch + i];
    }
    return x[(e - p.history) * p.in_ch + i];
}

fn finish(acc: f32, o: u32) -> f32 {
    var v = acc;
    if ((p.flags & CODEC_BIAS) != 0u) {
        v += bf16_half(bias[o / 2u], o & 1u);
    }
    if ((p.flags & CODEC_ROUND) != 0u) {
        v = round_bf16(v);
    }
    return v;
}

fn index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

// The convolutions give each output channel `p.lanes` threads (a power of two dividing WG:
// more for wide inputs), which split its input channels (thread l takes l, l + lanes, ...)
// and compute FRAMES output frames at once: each weight a thread loads serves FRAMES
// frames, and neighbouring threads load neighbouring channels. A thread sums its terms in a
// fixed order with compensation, then the lanes' sums are added by a fixed compensated
// tree, so an output depends only on the layer and its inputs, never on the chunk or tile
// it falls in. (One thread per output, summing every term alone, was far slower.) A thread
// also computes several outputs that share its activation loads: a conv1d thread CHANNELS
// output channels, a conv_transpose thread PHASES phases (their weights lie side by side)
// of TRANSPOSE_CHANNELS channels. Each output's terms keep their order, so neither changes
// a bit. The counts are the fastest measured for the bench codec: the activation loads are
// the cost, so the same registers spent on more frames instead of channels measured
// slower, and more than two phases bought nothing.
const FRAMES: u32 = 4u;
const CHANNELS: u32 = 4u;
const PHASES: u32 = 2u;
const TRANSPOSE_CHANNELS: u32 = 2u;

// Compensated (Kahan) accumulation, four sums at once (one per frame): the convolutions sum
// hundreds of products, and a plain f32 sum drifts far enough to flip the BF16 rounding of
// their outputs now and then; the compensation keeps each sum within about one f32 ulp of
// exact. value - carry is the running total.
struct Sum4 {
    value: vec4<f32>,
    carry: vec4<f32>,
}

fn add4(s: Sum4, term: vec4<f32>) -> Sum4 {
    // What fast math may make of the compensation: (t - value) - y folds to 0.
    if (FAST_MATH_EMULATION) {
        return Sum4(s.value + term, vec4<f32>(0.0));
    }
    let y = term - s.carry;
    let t = s.value + y;
    return Sum4(t, (t - s.value) - y);
}

// Four outputs' partial sums per thread, output k of thread t at k * WG + t.
var<workgroup> part_value: array<vec4<f32>, 4u * WG>;
var<workgroup> part_error: array<vec4<f32>, 4u * WG>;

// Adds the `p.lanes` sums of each of a thread's first `outputs` (2 or 4) outputs across
// the lanes of its output channel by a fixed tree, each addition exact to its rounding
// error (TwoSum), the errors summed alongside; the totals stay in the slots of the
// channel's lane 0 (see `reduced`). Every thread must call it.
fn reduce_lanes(t: u32, s: array<Sum4, 4>, outputs: u32) {
    part_value[t] = s[0].value;
    part_error[t] = -s[0].carry;
    part_value[WG + t] = s[1].value;
    part_error[WG + t] = -s[1].carry;
    if (outputs > 2u) {
        part_value[2u * WG + t] = s[2].value;
        part_error[2u * WG + t] = -s[2].carry;
        part_value[3u * WG + t] = s[3].value;
        part_error[3u * WG + t] = -s[3].carry;
    }
    workgroupBarrier();
    let lane = t % p.lanes;
    for (var stride = p.lanes / 2u; stride > 0u; stride /= 2u) {
        if (lane < stride) {
            for (var k = 0u; k < outputs; k++) {
                let at = k * WG + t;
                let a = part_value[at];
                let b = part_value[at + stride];
                let sum = a + b;
                let b_part = sum - a;
                // Fast math may fold TwoSum's rounding term to 0.
                let rounding = select((a - (sum - b_part)) + (b - b_part), vec4<f32>(0.0), FAST_MATH_EMULATION);
                part_value[at] = sum;
                part_error[at] = part_error[at] + part_error[at + stride] + rounding;
            }
        }
        workgroupBarrier();
    }
}

// After `reduce_lanes`: frame f of output k of the channel whose lane 0 is thread `first`.
// Any thread of the workgroup may read it, so a channel's lanes share the writing of its
// outputs (with its lane 0 writing them all, the epilogues ran one after another, and the
// 1x1 convolutions measured markedly slower).
fn reduced(k: u32, first: u32, f: u32) -> f32 {
    let at = k * WG + first;
    return (part_value[at] + part_error[at])[f];
}

// The last frame of [hist | x].
fn last_frame() -> u32 {
    return p.history + p.frames - 1u;
}

// Frame `e` of [hist | x], channel `i`, for the four frames e .. e + 3 (frames past the
// last read the last one; their outputs are not written).
fn extended4(e: u32, i: u32) -> vec4<f32> {
    let last = last_frame();
    return vec4<f32>(
        extended(min(e, last), i),
        extended(min(e + 1u, last), i),
        extended(min(e + 2u, last), i),
        extended(min(e + 3u, last), i),
    );
}

// Whether frames e .. e + 3 of [hist | x] all lie in the chunk (x), where `frames4` reads
// them with four plain loads (uniform across a workgroup: e depends on the tile and tap).
// (Against extended4 everywhere this measured faster, most of it in the dilated
// convolutions, the same bits.)
fn in_chunk(e: u32) -> bool {
    return e >= p.history && e + 3u < p.history + p.frames;
}

// `extended4(e, i)`, the same values: in the chunk (`inside`, from `in_chunk(e)`) four
// loads a frame apart, without extended4's clamps and history branches.
fn frames4(e: u32, i: u32, inside: bool) -> vec4<f32> {
    if (inside) {
        let at = (e - p.history) * p.in_ch + i;
        return vec4<f32>(x[at], x[at + p.in_ch], x[at + 2u * p.in_ch], x[at + 3u * p.in_ch]);
    }
    return extended4(e, i);
}

// A conv1d thread's outputs: CHANNELS channels `first + c * apart` of the workgroup's
// reduction slots of thread `leader` (its channel's lane 0), FRAMES frames from t0.
struct ConvTile {
    first: u32,
    apart: u32,
    t0: u32,
    lane: u32,
    leader: u32,
}

// The weights at four indices.
fn conv_weights(at: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(weight(at.x), weight(at.y), weight(at.z), weight(at.w));
}

// Adds a conv1d thread's terms of one input channel and tap: weight k (of output channel k)
// times the four frames `xs`, to sum k.
fn add_terms(acc: array<Sum4, 4>, ws: vec4<f32>, xs: vec4<f32>) -> array<Sum4, 4> {
    return array<Sum4, 4>(
        add4(acc[0], ws.x * xs),
        add4(acc[1], ws.y * xs),
        add4(acc[2], ws.z * xs),
        add4(acc[3], ws.w * xs),
    );
}

// Causal dilated conv1d, weight [out, in, K]: y[t, o] = b[o] + sum_j sum_i
// w[o, i, j] * x[t - (K - 1 - j) * d, i]; `hist` holds (K - 1) * d frames. A workgroup per
// (CHANNELS * WG / lanes output channels, FRAMES frames); a thread's channels are
// WG / lanes apart (past the last: the last one's weights, not written).
fn conv1d_tile(wg: vec3<u32>, t: u32) -> ConvTile {
    let apart = WG / p.lanes;
    let first = wg.x * apart * CHANNELS + t / p.lanes;
    let lane = t % p.lanes;
    let t0 = wg.y * FRAMES;
    let channels = min(vec4<u32>(first) + vec4<u32>(0u, 1u, 2u, 3u) * apart, vec4<u32>(p.out_ch - 1u));
    var acc = array<Sum4, 4>();
    if (first < p.out_ch) {
        let rows = channels * p.in_ch;
        for (var j = 0u; j < p.kernel; j++) {
            let e = t0 + j * p.dilation;
            let inside = in_chunk(e);
            // Four input channels a turn, all loaded before any is summed, so that four times
            // the loads are in flight (the loads, not the sums, are what a convolution waits
            // for); each output's terms keep their order, so the bits do not change.
            var i = lane;
            for (; i + 3u * p.lanes < p.in_ch; i += 4u * p.lanes) {
                let step = vec4<u32>(p.lanes * p.kernel);
                let xs0 = frames4(e, i, inside);
                let xs1 = frames4(e, i + p.lanes, inside);
                let xs2 = frames4(e, i + 2u * p.lanes, inside);
                let xs3 = frames4(e, i + 3u * p.lanes, inside);
                let at = (rows + vec4<u32>(i)) * p.kernel + vec4<u32>(j);
                let ws0 = conv_weights(at);
                let ws1 = conv_weights(at + step);
                let ws2 = conv_weights(at + 2u * step);
                let ws3 = conv_weights(at + 3u * step);
                acc = add_terms(acc, ws0, xs0);
                acc = add_terms(acc, ws1, xs1);
                acc = add_terms(acc, ws2, xs2);
                acc = add_terms(acc, ws3, xs3);
            }
            for (; i < p.in_ch; i += p.lanes) {
                let at = (rows + vec4<u32>(i)) * p.kernel + vec4<u32>(j);
                acc = add_terms(acc, conv_weights(at), frames4(e, i, inside));
            }
        }
    }
    reduce_lanes(t, acc, CHANNELS);
    return ConvTile(first, apart, t0, lane, t - lane);
}

// Output n (channel n / FRAMES, frame n % FRAMES) of `tile`'s channels: its index in y, or
// NONE past the channels or frames.
const NONE: u32 = 0xffffffffu;

fn tile_output(tile: ConvTile, n: u32) -> u32 {
    let o = tile.first + n / FRAMES * tile.apart;
    let frame = tile.t0 + n % FRAMES;
    if (o >= p.out_ch || frame >= p.frames) {
        return NONE;
    }
    return frame * p.out_ch + o;
}

// The finished value (bias, rounding) of output n of `tile`, and its channel.
fn tile_value(tile: ConvTile, n: u32) -> f32 {
    return finish(reduced(n / FRAMES, tile.leader, n % FRAMES), tile.first + n / FRAMES * tile.apart);
}

// Each entry point below writes the CHANNELS * FRAMES outputs of a channel's thread set,
// shared among its lanes.

// The conv1d: y = the convolution (bias added, rounded as the flags ask).
@compute @workgroup_size(64)
fn conv1d(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let tile = conv1d_tile(wg, t);
    for (var n = tile.lane; n < CHANNELS * FRAMES; n += p.lanes) {
        let index = tile_output(tile, n);
        if (index != NONE) {
            y[index] = tile_value(tile, n);
        }
    }
}

// A conv1d followed by a snake (the input conv1d and the first stage's snake, or a residual
// unit's dilated conv1d and its second snake): y = snake(conv, `alpha`), rounded to BF16
// (what `snake` with flag 2 computes from the conv1d's output).
@compute @workgroup_size(64)
fn conv1d_snake(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let tile = conv1d_tile(wg, t);
    for (var n = tile.lane; n < CHANNELS * FRAMES; n += p.lanes) {
        let index = tile_output(tile, n);
        if (index != NONE) {
            y[index] = round_bf16(snake_of(tile_value(tile, n), alpha_of(index % p.out_ch)));
        }
    }
}

// A residual unit's 1x1 conv1d, the unit's residual connection and the snake that reads the
// result next (the next unit's first, or the next stage's, or the output's): y = residual +
// conv, the residual stream, and `snaked` = snake(y, `alpha`) rounded to BF16 (what `snake`
// with flag 2 computes from y).
@compute @workgroup_size(64)
fn conv1d_residual_snake(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let tile = conv1d_tile(wg, t);
    for (var n = tile.lane; n < CHANNELS * FRAMES; n += p.lanes) {
        let index = tile_output(tile, n);
        if (index != NONE) {
            let sum = residual[index] + tile_value(tile, n);
            y[index] = sum;
            snaked[index] = round_bf16(snake_of(sum, alpha_of(index % p.out_ch)));
        }
    }
}

// The output conv1d and PCM = tanh(conv). The input is clamped to +-15, where tanh is +-1
// in f32, so fast-math implementations cannot overflow.
@compute @workgroup_size(64)
fn conv1d_tanh(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let tile = conv1d_tile(wg, t);
    for (var n = tile.lane; n < CHANNELS * FRAMES; n += p.lanes) {
        let index = tile_output(tile, n);
        if (index != NONE) {
            y[index] = tanh(clamp(tile_value(tile, n), -15.0, 15.0));
        }
    }
}

// ConvTranspose1d, kernel 2r, stride r, weight [in, out, 2r], keeping the first T*r outputs:
// y[s, o] = b[o] + sum_i w[i, o, s % r] x[s / r, i] + w[i, o, s % r + r] x[s / r - 1, i];
// `hist` holds the previous frame. A workgroup per (TRANSPOSE_CHANNELS * WG / lanes output
// channels, FRAMES input frames, PHASES phases s % r), a thread's channels WG / lanes apart;
// each phase's terms in input-channel order. It also
// writes the snake that reads y next (the stage's first residual unit's, or the next
// stage's or the output's when the stage has none): `snaked` = snake(y, `alpha`) rounded to
// BF16, what `snake` with flag 2 computes from y.
@compute @workgroup_size(64)
fn conv_transpose_snake(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let r = p.kernel;
    let apart = WG / p.lanes;
    let o = wg.x * apart * TRANSPOSE_CHANNELS + t / p.lanes;
    // The thread's second channel (past the last: the last one's weights, not written).
    let o2 = min(o + apart, p.out_ch - 1u);
    let lane = t % p.lanes;
    let q0 = wg.y * FRAMES;   // first input frame; frame q is q + 1 in [hist | x]
    let phase = wg.z * PHASES;
    let phases = min(PHASES, r - phase);
    // Output k: channel k / PHASES (o or o2), phase k % PHASES.
    var acc = array<Sum4, 4>();
    if (o < p.out_ch) {
        let before_inside = in_chunk(q0);
        let last = last_frame();
        for (var i = lane; i < p.in_ch; i += p.lanes) {
            // Frames q0 .. q0 + 3 and q0 + 1 .. q0 + 4 of [hist | x] (past the last: the last,
            // as `extended4` reads them): five loads.
            let before = frames4(q0, i, before_inside);
            let now = vec4<f32>(before.yzw, extended(min(q0 + 4u, last), i));
            let a = transpose_weights(i, o, r, phase, phases);
            let b = transpose_weights(i, o2, r, phase, phases);
            acc[0] = add4(add4(acc[0], a.now.x * now), a.before.x * before);
            acc[2] = add4(add4(acc[2], b.now.x * now), b.before.x * before);
            if (phases > 1u) {
                acc[1] = add4(add4(acc[1], a.now.y * now), a.before.y * before);
                acc[3] = add4(add4(acc[3], b.now.y * now), b.before.y * before);
            }
        }
    }
    reduce_lanes(t, acc, TRANSPOSE_CHANNELS * PHASES);
    if (o >= p.out_ch) {
        return;
    }
    // The channels' outputs, shared among their lanes.
    for (var n = lane; n < TRANSPOSE_CHANNELS * PHASES * FRAMES; n += p.lanes) {
        let k = n / FRAMES;
        let f = n % FRAMES;
        let channel = o + k / PHASES * apart;
        let k_phase = k % PHASES;
        if (k_phase < phases && q0 + f < p.frames && channel < p.out_ch) {
            let index = ((q0 + f) * r + phase + k_phase) * p.out_ch + channel;
            let value = finish(reduced(k, t - lane, f), channel);
            y[index] = value;
            snaked[index] = round_bf16(snake_of(value, alpha_of(channel)));
        }
    }
}

// A transposed-convolution thread's weights from input channel i to output channel o for
// phases `phase` and `phase` + 1: those of the current frame and of the previous one.
struct TransposeWeights {
    now: vec2<f32>,
    before: vec2<f32>,
}

fn transpose_weights(i: u32, o: u32, r: u32, phase: u32, phases: u32) -> TransposeWeights {
    // `at` is even (2r per channel pair, even phases): one word holds both phases' weights
    // of the current frame, and of the previous frame too when r is even.
    let at = (i * p.out_ch + o) * 2u * r + phase;
    let word = w[at / 2u];
    let now = vec2<f32>(bf16_half(word, 0u), bf16_half(word, 1u));
    var before = vec2<f32>(weight(at + r), 0.0);
    if ((r & 1u) == 0u) {
        let pair = w[(at + r) / 2u];
        before = vec2<f32>(bf16_half(pair, 0u), bf16_half(pair, 1u));
    } else if (phases > 1u) {
        before.y = weight(at + r + 1u);
    }
    return TransposeWeights(now, before);
}

// sin(x) to about one f32 ulp wherever the compiler keeps the order of the operations (WGSL
// leaves `sin`'s accuracy to the implementation, and Vulkan allows an absolute error of
// 2^-11; Metal's default fast math may reorder this code, as it may the compensated sums
// above: unverified on Apple GPUs): the argument reduced by
// pi/4 in three parts (Cody-Waite; exact products for |x| up to about 8192), then minimax
// polynomials for sin and cos on [-pi/4, pi/4] (Cephes' sinf).
fn accurate_sin(value: f32) -> f32 {
    // Fast math may reassociate the argument reduction below; the emulation takes the
    // platform's own `sin` instead.
    if (FAST_MATH_EMULATION) {
        return sin(value);
    }
    var sign = select(1.0, -1.0, value < 0.0);
    let x = abs(value);
    var octant = u32(x * 1.2732395);   // 4 / pi
    var y = f32(octant);
    if ((octant & 1u) != 0u) {
        octant += 1u;
        y += 1.0;
    }
    octant &= 7u;
    if (octant > 3u) {
        sign = -sign;
        octant -= 4u;
    }
    let r = ((x - y * 0.78515625) - y * 2.4187564849853515625e-4) - y * 3.77489497744594108e-8;
    let z = r * r;
    if (octant == 1u || octant == 2u) {
        return sign * (((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z - 0.5 * z + 1.0);
    }
    return sign * (((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * r + r);
}

// snake(v) = v + sin(alpha v)^2 / (alpha + 1e-9).
fn snake_of(v: f32, alpha: f32) -> f32 {
    let s = accurate_sin(alpha * v);
    return v + s * s / (alpha + 1e-9);
}

// y = snake(x), alpha per channel (`w`, BF16); flag 2 rounds to BF16 (the result feeds a
// convolution).
@compute @workgroup_size(64)
fn snake(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = index(gid, nwg);
    if (n >= p.count) {
        return;
    }
    var out = snake_of(x[n], weight(n % p.out_ch));
    if ((p.flags & CODEC_ROUND) != 0u) {
        out = round_bf16(out);
    }
    y[n] = out;
}

// The history after this chunk: the last `history` frames of [hist | x], into `y`, the
// other buffer of the history's pair (the next chunk's `hist`).
@compute @workgroup_size(64)
fn shift_history(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = index(gid, nwg);
    if (n >= p.count) {
        return;
    }
    let row = n / p.in_ch;
    y[n] = extended(row + p.frames, n % p.in_ch);
}
