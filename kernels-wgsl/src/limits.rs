//! What the kernels can run (model limits the checkpoint contract checks against) and what
//! they ask of a device.

/// Workgroup memory a device must offer (`max_compute_workgroup_storage_size`): at least
/// what the largest entry point uses (routing of 512 kept experts with the linear beside it:
/// 17728 bytes). Apple GPUs offer 32 KB, NVIDIA's Vulkan driver 48 KB, and lavapipe, on
/// which every test runs, at least this.
pub const WORKGROUP_MEMORY_BYTES: u32 = 18 * 1024;
/// Kept experts per MoE layer that routing and slot grouping take at most (the largest
/// [`KeptCapacity`], `moe.wgsl`'s MAX_EXPERTS: their workgroup arrays).
pub const MAX_KEPT_EXPERTS: usize = 512;

/// The largest `head_dim` the attention kernel runs (any even one up to it, as the
/// contract asks): its workgroup holds a query head as 256 vec4s.
pub const MAX_HEAD_DIM: usize = 1024;

/// Floats a head takes in the KV caches and in attention's scratch: `head_dim` rounded up
/// to whole vec4s (`common.wgsl`'s `head_stride`), the rest of the last vec4 zeros that no
/// kernel writes. Attention reads keys and values as vec4s, so a head must start one.
pub fn head_stride(head_dim: usize) -> usize {
    head_dim.next_multiple_of(4)
}

/// Row widths the RMSNorm kernel reads are a multiple of this: it reads rows as vec4s.
pub const NORM_WIDTH_MULTIPLE: usize = 4;

/// Expert groups a sigmoid router may have (`router.wgsl`'s MAX_GROUPS).
pub const MAX_EXPERT_GROUPS: usize = 64;

/// Experts routing chooses per token at most (`router.wgsl`'s MAX_K).
pub const MAX_ROUTED_PER_TOKEN: usize = 16;
