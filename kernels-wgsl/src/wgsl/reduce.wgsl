// A fixed-order tree reduction through workgroup memory, shared by the kernels whose
// invocations each hold one value to combine (RMSNorm, routing, attention): values pair up
// at distance width / 2, width / 4, ..., so the result never depends on scheduling.
// Appended to the modules that use it.

var<workgroup> tree: array<f32, 256>;   // one value per invocation, up to 256

// Reduces the values of the first `width` invocations (a power of two, at most 256) by the
// fixed tree, max or sum; every invocation gets the result. Every invocation must call it.
fn tree_reduce(t: u32, value: f32, is_max: bool, width: u32) -> f32 {
    tree[t] = value;
    for (var stride = width / 2u; stride > 0u; stride /= 2u) {
        workgroupBarrier();
        if (t < stride) {
            let other = tree[t + stride];
            tree[t] = select(tree[t] + other, max(tree[t], other), is_max);
        }
    }
    workgroupBarrier();
    let result = tree[0];
    workgroupBarrier();
    return result;
}
