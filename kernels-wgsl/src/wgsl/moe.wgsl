// Groups a step's routed-expert slots by expert for `gathered_grouped` (linear.wgsl), one
// 256-invocation workgroup: `order` lists the slots expert by expert, and `blocks` gives each
// run of up to GROUP_SLOTS of an expert's slots as (expert, first index into `order`, count,
// 0), experts ascending; blocks past the last have count 0. Within an expert the slots come
// in whatever order the atomics give them places: no slot's result depends on which others
// share its block (a stable order, ranking each slot among its window's, made this launch
// costly in prefill).

const GROUP_WG: u32 = 256u;
const GROUP_SLOTS: u32 = 4u;
const MAX_EXPERTS: u32 = 512u;

struct GroupParams {
    slots: u32,
    experts: u32,   // local expert ids are below this
    blocks: u32,    // entries of `blocks` (at least the runs: slots / GROUP_SLOTS rounded up,
                    // plus experts)
    _pad: u32,
}

@group(0) @binding(0) var<uniform> g: GroupParams;
@group(0) @binding(1) var<storage, read> expert_ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> blocks: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> order: array<u32>;

var<workgroup> counts: array<atomic<u32>, MAX_EXPERTS>;
var<workgroup> cursor: array<atomic<u32>, MAX_EXPERTS>;   // next index into `order` per expert
var<workgroup> first_block: array<u32, MAX_EXPERTS>;
var<workgroup> used_blocks: u32;

@compute @workgroup_size(256)
fn group_slots(@builtin(local_invocation_index) t: u32) {
    // Workgroup memory starts undefined (see `ZERO_FILL_WORKGROUP_MEMORY` in lib.rs).
    for (var e = t; e < g.experts; e += GROUP_WG) {
        atomicStore(&counts[e], 0u);
    }
    workgroupBarrier();
    // Ids at or past `g.experts` (never made by the router) are left out, as `gathered`
    // leaves them out.
    for (var s = t; s < g.slots; s += GROUP_WG) {
        let expert = expert_ids[s];
        if (expert < g.experts) {
            atomicAdd(&counts[expert], 1u);
        }
    }
    workgroupBarrier();
    // Where each expert's slots and blocks start (one invocation: at most 512 experts).
    if (t == 0u) {
        var slot_start = 0u;
        var block_start = 0u;
        for (var e = 0u; e < g.experts; e++) {
            let count = atomicLoad(&counts[e]);
            atomicStore(&cursor[e], slot_start);
            first_block[e] = block_start;
            slot_start += count;
            block_start += (count + GROUP_SLOTS - 1u) / GROUP_SLOTS;
        }
        used_blocks = block_start;
    }
    workgroupBarrier();
    for (var e = t; e < g.experts; e += GROUP_WG) {
        let count = atomicLoad(&counts[e]);
        let start = atomicLoad(&cursor[e]);
        for (var j = 0u; j * GROUP_SLOTS < count; j++) {
            blocks[first_block[e] + j] = vec4<u32>(e, start + j * GROUP_SLOTS, min(GROUP_SLOTS, count - j * GROUP_SLOTS), 0u);
        }
    }
    for (var b = used_blocks + t; b < g.blocks; b += GROUP_WG) {
        blocks[b] = vec4<u32>(0u);
    }
    // The cursors are read above before any moves (the blocks' starts).
    workgroupBarrier();
    for (var s = t; s < g.slots; s += GROUP_WG) {
        let expert = expert_ids[s];
        if (expert < g.experts) {
            order[atomicAdd(&cursor[expert], 1u)] = s;
        }
    }
}
