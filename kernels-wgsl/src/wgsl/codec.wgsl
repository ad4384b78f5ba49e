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

// Compensated (Kahan) accumulation: the convolutions sum hundreds of products, and a plain
// f32 sum drifts far enough to flip the BF16 rounding of their outputs now and then; the
// compensation keeps the sum within about one f32 ulp of exact, in a fixed order.
struct Sum {
    value: f32,
    carry: f32,
}

fn add(s: Sum, term: f32) -> Sum {
    let y = term - s.carry;
    let t = s.value + y;
    return Sum(t, (t - s.value) - y);
}

fn index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

// Causal dilated conv1d, weight [out, in, K]: y[t, o] = b[o] + sum_j sum_i
// w[o, i, j] * x[t - (K - 1 - j) * d, i]; `hist` holds (K - 1) * d frames.
@compute @workgroup_size(64)
fn conv1d(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = index(gid, nwg);
    if (n >= p.count) {
        return;
    }
    let t = n / p.out_ch;
    let o = n % p.out_ch;
    var acc = Sum(0.0, 0.0);
    for (var j = 0u; j < p.kernel; j++) {
        let e = t + j * p.dilation;
        for (var i = 0u; i < p.in_ch; i++) {
            acc = add(acc, weight((o * p.in_ch + i) * p.kernel + j) * extended(e, i));
        }
    }
    y[n] = finish(acc.value, o);
}

// ConvTranspose1d, kernel 2r, stride r, weight [in, out, 2r], keeping the first T*r outputs:
// y[s, o] = b[o] + sum_i w[i, o, s % r] x[s / r, i] + w[i, o, s % r + r] x[s / r - 1, i];
// `hist` holds the previous frame.
@compute @workgroup_size(64)
fn conv_transpose(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = index(gid, nwg);
    if (n >= p.count) {
        return;
    }
    let r = p.kernel;
    let s = n / p.out_ch;
    let o = n % p.out_ch;
    let frame = s / r + 1u; // in [hist | x] coordinates
    let phase = s % r;
    var acc = Sum(0.0, 0.0);
    for (var i = 0u; i < p.in_ch; i++) {
        let base = (i * p.out_ch + o) * 2u * r;
        acc = add(acc, weight(base + phase) * extended(frame, i));
        acc = add(acc, weight(base + phase + r) * extended(frame - 1u, i));
    }
    y[n] = finish(acc.value, o);
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
    let s = sin(alpha * v);
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
