// The read-bandwidth roofline: every invocation streams 16-byte loads through a grid-stride
// loop, four independent loads in flight per iteration, and folds them with xor into one
// word per invocation, so no load can be optimised away. Measures the ceiling the
// weight-streaming kernels are compared against.

struct Params {
    words: u32,      // vec4<u32> elements in `data`
    stride: u32,     // total invocations of the grid
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> data: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> sink: array<u32>;

@compute @workgroup_size(256)
fn read_bandwidth(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let index = gid.x + gid.y * nwg.x * 256u;
    let s = p.stride;
    var a = vec4<u32>(0u);
    var b = vec4<u32>(0u);
    var c = vec4<u32>(0u);
    var d = vec4<u32>(0u);
    var i = index;
    for (; i + 3u * s < p.words; i += 4u * s) {
        a ^= data[i];
        b ^= data[i + s];
        c ^= data[i + 2u * s];
        d ^= data[i + 3u * s];
    }
    for (; i < p.words; i += s) {
        a ^= data[i];
    }
    let acc = a ^ b ^ c ^ d;
    sink[index] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}
