// A fixed-order tree reduction through workgroup memory, shared by the kernels whose
// invocations each hold one value to combine (RMSNorm, routing, attention): values pair up
// at distance width / 2, width / 4, ..., so the result never depends on scheduling.
// Appended to the modules that use it.

var<workgroup> tree: array<f32, 256>;   // one value per invocation, up to 256

// Reduces the values of the first `width` invocations (a power of two, at most 256) by the
// fixed tree, max or sum; every invocation gets the result. Every invocation must call it.
fn tree_reduce(t: u32, value: f32, is_max: bool, width: u32) -> f32 {
    return reduce_blocks(t, value, is_max, width, false);
}

// `tree_reduce` in every aligned block of `width` invocations at once (0 to width - 1,
// width to 2 width - 1, ...), the same tree in each: every invocation gets its own block's
// result, the bits `tree_reduce` gives for the same values. Every invocation must call it.
fn tree_reduce_blocks(t: u32, value: f32, is_max: bool, width: u32) -> f32 {
    return reduce_blocks(t, value, is_max, width, true);
}

// The tree of `tree_reduce` (`blocks` false: one block, the first) or `tree_reduce_blocks`.
// Two levels of the tree per barrier: invocation i < w / 4 of a round over w values
// combines (x[i], x[i + w / 2]) and (x[i + w / 4], x[i + 3 w / 4]), then the two results,
// exactly the additions of the levels at distance w / 2 and w / 4; with an odd number of
// levels, every invocation does the last one itself (x[0] and x[1]). (Against one level
// per barrier, this halves the barriers and measured faster in the prefill's attention,
// decode steps about the same. Every invocation finishing the last five levels itself from
// the 32 values left, one barrier instead of five, made every decode step longer: 32 loads
// from workgroup memory in each invocation cost more than the barriers.)
fn reduce_blocks(t: u32, value: f32, is_max: bool, width: u32, blocks: bool) -> f32 {
    tree[t] = value;
    let i = select(t, t % width, blocks);
    let base = t - i;
    var w = width;
    for (; w >= 4u; w /= 4u) {
        workgroupBarrier();
        let q = w / 4u;
        if (i < q) {
            let a = combine(tree[base + i], tree[base + i + 2u * q], is_max);
            let b = combine(tree[base + i + q], tree[base + i + 3u * q], is_max);
            tree[base + i] = combine(a, b, is_max);
        }
    }
    workgroupBarrier();
    var result = tree[base];
    if (w == 2u) {
        result = combine(result, tree[base + 1u], is_max);
    }
    workgroupBarrier();
    return result;
}

// One addition (or max) of the tree.
fn combine(a: f32, b: f32, is_max: bool) -> f32 {
    return select(a + b, max(a, b), is_max);
}
