// Device probes the engine runs once when it opens a device: behaviour the kernels rely on
// that an adapter may lack without saying so.
//
// `unpack_f16`: the NVFP4 and FP8 decoders turn weight codes and NVFP4 block scales into f16
// bit patterns, many of them subnormal (E2M1 +-0.5, every E4M3 subnormal), and convert them with
// `unpack2x16float`. A driver that flushes f16 subnormals to zero would decode those
// weights as 0; the engine compares this kernel's output with the exact values and refuses
// such an adapter.

struct Params {
    count: u32,   // words to convert
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> words: array<u32>;
@group(0) @binding(2) var<storage, read_write> halves: array<vec2<f32>>;

@compute @workgroup_size(64)
fn unpack_f16(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < p.count) {
        halves[gid.x] = unpack2x16float(words[gid.x]);
    }
}
