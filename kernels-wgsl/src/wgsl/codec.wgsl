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
    flags: u32,      // 1: add bias; 2: round output to BF16
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
    if ((p.flags & 1u) != 0u) {
        v += bf16_half(bias[o / 2u], o & 1u);
    }
    if ((p.flags & 2u) != 0u) {
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
// it falls in. (One thread per output, summing every term alone, took about 14 ms per chunk
// of 8 codes of the bench codec on an H200.)
const FRAMES: u32 = 4u;

// Compensated (Kahan) accumulation, four sums at once (one per frame): the convolutions sum
// hundreds of products, and a plain f32 sum drifts far enough to flip the BF16 rounding of
// their outputs now and then; the compensation keeps each sum within about one f32 ulp of
// exact. value - carry is the running total.
struct Sum4 {
    value: vec4<f32>,
    carry: vec4<f32>,
}

fn add4(s: Sum4, term: vec4<f32>) -> Sum4 {
    let y = term - s.carry;
    let t = s.value + y;
    return Sum4(t, (t - s.value) - y);
}

var<workgroup> part_value: array<vec4<f32>, WG>;
var<workgroup> part_error: array<vec4<f32>, WG>;

// Adds the `p.lanes` sums of each output channel of the workgroup by a fixed tree, each
// addition exact to its rounding error (TwoSum), the errors summed alongside. Lane 0 of a
// channel gets its total. Every thread must call it.
fn reduce_lanes(t: u32, s: Sum4) -> vec4<f32> {
    part_value[t] = s.value;
    part_error[t] = -s.carry;
    workgroupBarrier();
    let lane = t % p.lanes;
    for (var stride = p.lanes / 2u; stride > 0u; stride /= 2u) {
        if (lane < stride) {
            let a = part_value[t];
            let b = part_value[t + stride];
            let sum = a + b;
            let b_part = sum - a;
            let rounding = (a - (sum - b_part)) + (b - b_part);
            part_value[t] = sum;
            part_error[t] = part_error[t] + part_error[t + stride] + rounding;
        }
        workgroupBarrier();
    }
    return part_value[t] + part_error[t];
}

// Frame `e` of [hist | x], channel `i`, for the four frames e .. e + 3 (frames past the
// last read the last one; their outputs are not written).
fn extended4(e: u32, i: u32) -> vec4<f32> {
    let last = p.history + p.frames - 1u;
    return vec4<f32>(
        extended(min(e, last), i),
        extended(min(e + 1u, last), i),
        extended(min(e + 2u, last), i),
        extended(min(e + 3u, last), i),
    );
}

// Causal dilated conv1d, weight [out, in, K]: y[t, o] = b[o] + sum_j sum_i
// w[o, i, j] * x[t - (K - 1 - j) * d, i]; `hist` holds (K - 1) * d frames. A workgroup per
// (WG / lanes output channels, FRAMES frames).
@compute @workgroup_size(64)
fn conv1d(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let o = wg.x * (WG / p.lanes) + t / p.lanes;
    let lane = t % p.lanes;
    let t0 = wg.y * FRAMES;
    var acc = Sum4(vec4<f32>(0.0), vec4<f32>(0.0));
    if (o < p.out_ch) {
        for (var j = 0u; j < p.kernel; j++) {
            for (var i = lane; i < p.in_ch; i += p.lanes) {
                acc = add4(acc, weight((o * p.in_ch + i) * p.kernel + j) * extended4(t0 + j * p.dilation, i));
            }
        }
    }
    let total = reduce_lanes(t, acc);
    if (o < p.out_ch && lane == 0u) {
        for (var f = 0u; f < FRAMES; f++) {
            if (t0 + f < p.frames) {
                y[(t0 + f) * p.out_ch + o] = finish(total[f], o);
            }
        }
    }
}

// ConvTranspose1d, kernel 2r, stride r, weight [in, out, 2r], keeping the first T*r outputs:
// y[s, o] = b[o] + sum_i w[i, o, s % r] x[s / r, i] + w[i, o, s % r + r] x[s / r - 1, i];
// `hist` holds the previous frame. A workgroup per (WG / lanes output channels, FRAMES
// input frames, phase s % r): its frames share their weights.
@compute @workgroup_size(64)
fn conv_transpose(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let r = p.kernel;
    let o = wg.x * (WG / p.lanes) + t / p.lanes;
    let lane = t % p.lanes;
    let q0 = wg.y * FRAMES;   // first input frame; frame q is q + 1 in [hist | x]
    let phase = wg.z;
    var acc = Sum4(vec4<f32>(0.0), vec4<f32>(0.0));
    if (o < p.out_ch) {
        for (var i = lane; i < p.in_ch; i += p.lanes) {
            let base = (i * p.out_ch + o) * 2u * r;
            acc = add4(acc, weight(base + phase) * extended4(q0 + 1u, i));
            acc = add4(acc, weight(base + phase + r) * extended4(q0, i));
        }
    }
    let total = reduce_lanes(t, acc);
    if (o < p.out_ch && lane == 0u) {
        for (var f = 0u; f < FRAMES; f++) {
            if (q0 + f < p.frames) {
                y[((q0 + f) * r + phase) * p.out_ch + o] = finish(total[f], o);
            }
        }
    }
}

// sin(x) to about one f32 ulp wherever the compiler keeps the order of the operations (WGSL
// leaves `sin`'s accuracy to the implementation, and Vulkan allows an absolute error of
// 2^-11; Metal's default fast math may reorder this code, as it may the compensated sums
// above: unverified on Apple GPUs): the argument reduced by
// pi/4 in three parts (Cody-Waite; exact products for |x| up to about 8192), then minimax
// polynomials for sin and cos on [-pi/4, pi/4] (Cephes' sinf).
fn accurate_sin(value: f32) -> f32 {
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

// snake(x) = x + sin(alpha x)^2 / (alpha + 1e-9), alpha per channel (`w`, BF16); flag 2
// rounds to BF16 (the result feeds a convolution).
@compute @workgroup_size(64)
fn snake(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = index(gid, nwg);
    if (n >= p.count) {
        return;
    }
    let alpha = weight(n % p.out_ch);
    let v = x[n];
    let s = accurate_sin(alpha * v);
    var out = v + s * s / (alpha + 1e-9);
    if ((p.flags & 2u) != 0u) {
        out = round_bf16(out);
    }
    y[n] = out;
}

// PCM = tanh(x). The input is clamped to +-15, where tanh is +-1 in f32, so fast-math
// implementations cannot overflow.
@compute @workgroup_size(64)
fn tanh_out(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = index(gid, nwg);
    if (n >= p.count) {
        return;
    }
    y[n] = tanh(clamp(x[n], -15.0, 15.0));
}

// The history after this chunk: the last `history` frames of [hist | x], into `y`.
@compute @workgroup_size(64)
fn shift_history(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = index(gid, nwg);
    if (n >= p.count) {
        return;
    }
    let row = n / p.in_ch;
    y[n] = extended(row + p.frames, n % p.in_ch);
}

// y = x (a plain copy, to commit a new history).
@compute @workgroup_size(64)
fn copy(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = index(gid, nwg);
    if (n >= p.count) {
        return;
    }
    y[n] = x[n];
}
