// Reductions over one value per invocation through workgroup memory, shared by the kernels
// that combine them (RMSNorm, routing, attention). Appended to the modules that use them.

var<workgroup> tree: array<f32, 256>;           // one value per invocation, up to 256
var<workgroup> group_max: array<f32, MAX_GROUPS>;

// Groups `workgroup_max` splits its values into.
const MAX_GROUPS: u32 = 16u;

// The sum of the values of the first `width` invocations (a power of two, at most 256) by a
// fixed tree: values pair up at distance width / 2, width / 4, ..., so the result never
// depends on scheduling; every invocation gets it. Every invocation must call it.
fn tree_sum(t: u32, value: f32, width: u32) -> f32 {
    tree[t] = value;
    for (var stride = width / 2u; stride > 0u; stride /= 2u) {
        workgroupBarrier();
        if (t < stride) {
            tree[t] += tree[t + stride];
        }
    }
    workgroupBarrier();
    let result = tree[0];
    workgroupBarrier();
    return result;
}

// The largest value of the first `width` invocations (a power of two, at most 256); every
// invocation gets it. A maximum is exact in any order, so instead of a tree (a barrier per
// level) the first invocations each take the maximum of one group of values and every
// invocation takes the maximum of those: three barriers whatever the width (the H200's
// decode steps: see docs/performance.md). Every invocation must call it.
fn workgroup_max(t: u32, value: f32, width: u32) -> f32 {
    tree[t] = value;
    workgroupBarrier();
    let groups = min(width, MAX_GROUPS);
    let size = width / groups;
    if (t < groups) {
        var m = tree[t * size];
        for (var i = 1u; i < size; i++) {
            m = max(m, tree[t * size + i]);
        }
        group_max[t] = m;
    }
    workgroupBarrier();
    var result = group_max[0];
    for (var g = 1u; g < groups; g++) {
        result = max(result, group_max[g]);
    }
    workgroupBarrier();
    return result;
}
