// A fixed-order tree reduction through workgroup memory, shared by the kernels whose
// invocations each hold one value to combine (RMSNorm, routing, attention): values pair up
// at distance width / 2, width / 4, ..., so the result never depends on scheduling.
// Appended to the modules that use it.

var<workgroup> tree: array<f32, 256>;   // one value per invocation, up to 256

// Reduces the values of the first `width` invocations (a power of two, at most 256) by the
// fixed tree, max or sum; every invocation gets the result. Every invocation must call it.
// Two levels of the tree per barrier: invocation i < w / 4 of a round over w values
// combines (x[i], x[i + w / 2]) and (x[i + w / 4], x[i + 3 w / 4]), then the two results,
// exactly the additions of the levels at distance w / 2 and w / 4; with an odd number of
// levels, every invocation does the last one itself (tree[0] and tree[1]). (Against one
// level per barrier, this halves the barriers and measured faster in the prefill's
// attention, decode steps about the same. Every invocation finishing the last five levels
// itself from the 32 values left, one barrier instead of five, made every decode step
// longer: 32 loads from workgroup memory in each invocation cost more than the barriers.)
fn tree_reduce(t: u32, value: f32, is_max: bool, width: u32) -> f32 {
    tree[t] = value;
    var w = width;
    for (; w >= 4u; w /= 4u) {
        workgroupBarrier();
        let q = w / 4u;
        if (t < q) {
            let a = combine(tree[t], tree[t + 2u * q], is_max);
            let b = combine(tree[t + q], tree[t + 3u * q], is_max);
            tree[t] = combine(a, b, is_max);
        }
    }
    workgroupBarrier();
    var result = tree[0];
    if (w == 2u) {
        result = combine(result, tree[1], is_max);
    }
    workgroupBarrier();
    return result;
}

// One addition (or max) of the tree.
fn combine(a: f32, b: f32, is_max: bool) -> f32 {
    return select(a + b, max(a, b), is_max);
}
