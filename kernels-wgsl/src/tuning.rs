//! The kernels' tuning and compile settings: choices that change speed, never bits (the
//! tests hold them to that).

use crate::format::LinearWidth;

/// The workgroup width of the dense linears ([`Kernel::Linear`], [`Kernel::LinearKv`]): wide
/// (measured: shorter launches than at 64 invocations in decode steps of every lane count,
/// the prefill's the same).
pub const DENSE_LINEAR_WIDTH: LinearWidth = LinearWidth::Wide;

/// The workgroup width of the launches a linear shares: [`Kernel::LinearPair`] (wide made its
/// eight-lane launches longer) and the routing modules' linear
/// ([`Kernel::RouteLinear`]). Routing sums its softmax denominator over the first WG
/// invocations in both its entry points (`router.wgsl`), so another width there would change
/// routing's bits.
pub const SHARED_LAUNCH_LINEAR_WIDTH: LinearWidth = LinearWidth::Standard;
/// Activation rows a dense linear workgroup applies each decoded weight to per pass over its
/// weights (`linear.wgsl`'s PASS_ROWS); a launch gives each pass its own workgroup row.
pub const LINEAR_PASS_ROWS: usize = 2;
/// Slots of one expert a `gathered_grouped` workgroup computes together (`experts.wgsl`'s and
/// `moe.wgsl`'s GROUP_SLOTS).
pub const EXPERT_GROUP_SLOTS: usize = 4;

/// Whether a workgroup's memory is filled with zeros before its first invocation runs, as
/// WGSL promises by default: off. Every kernel here writes each workgroup value before it
/// reads it, so the fill would buy nothing, and on Apple GPUs it costs every workgroup of
/// every launch: naga's Metal translation has the first invocation store every workgroup
/// variable the entry point uses, one after another, while the others wait at a barrier
/// (naga 30's `write_workgroup_variables_initialization`): 10 KB per attention workgroup,
/// 5.6-16 KB per routing one (by its [`KeptCapacity`]). Vulkan drivers fill natively (steps
/// measured the same either way). The engine's pipelines and [`to_msl`] use this setting.
pub const ZERO_FILL_WORKGROUP_MEMORY: bool = false;

/// Whether the translated kernels count every loop's iterations and leave a loop after
/// 2^64 of them (wgpu's default `force_loop_bounding`, which keeps a shader compiler from
/// treating an endless loop as unreachable): off. Every loop here ends: its counter moves
/// by a step that is never zero (a constant, or a parameter the host makes nonzero: a
/// convolution's lanes, the roofline's stride, a linear's workgroup rows; attention's
/// `parts` loops run only when `parts` is nonzero) toward a bound that the counter reaches
/// without wrapping (sizes stay below 2^31). A new loop must keep to that. The counters
/// cost: an extra count and branch per iteration, measured to lengthen steps and codec
/// chunks, the PCM identical.
pub const FORCE_LOOP_BOUNDING: bool = false;
/// Positions per attention chunk (`attention.wgsl`'s CHUNK): `Kernel::Attend` runs one
/// workgroup per (row, head, chunk), `[rows, heads, attention_chunks(capacity)]`.
pub const ATTENTION_CHUNK: usize = 64;

/// Chunks of a cache slot of `capacity` positions.
pub fn attention_chunks(capacity: usize) -> usize {
    capacity.div_ceil(ATTENTION_CHUNK)
}

/// Chunks a row must reach for attention to read them by blocks of a key/value head's query
/// heads (`attention.wgsl`'s `attend_blocks`, one workgroup per block and chunk) rather than
/// a workgroup per head and chunk. The same bits either way; blocks read each chunk of the
/// caches once per block instead of once per head but make a short row's chain of
/// dependent steps longer.
pub const ATTENTION_BLOCKS_FROM: usize = 32;

/// Query heads per attention block for `heads` query heads over `kv_heads` key/value heads
/// `head_dim` wide: the largest count of at most four that divides a key/value head's group
/// and whose heads' vec4 columns each fit the invocations the combining workgroup gives a
/// head (`combine_share` in attention.wgsl: 256 / b rounded down to a multiple of 8, which
/// also lets the workgroup stage the block's queries); 1 where no block is worth it.
pub fn attention_block_heads(heads: usize, kv_heads: usize, head_dim: usize) -> usize {
    let group = heads / kv_heads.max(1);
    let columns = crate::head_stride(head_dim) / 4;
    (1..=4)
        .rev()
        .find(|&b| group.is_multiple_of(b) && columns <= 256 / b / 8 * 8)
        .unwrap_or(1)
}

/// Floats of the scratch buffer attention needs for `rows` rows (`attention.wgsl`): per
/// (row, head) and chunk, a head's partial output ([`crate::head_stride`] floats) and a
/// vec4 of the chunk's max and exponential sum.
pub fn attention_scratch_floats(rows: usize, heads: usize, head_dim: usize, capacity: usize) -> usize {
    rows * heads * attention_chunks(capacity) * (crate::head_stride(head_dim) + 4)
}
