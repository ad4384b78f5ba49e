//! The WGSL compute kernels of the Drama 3 engine.
//!
//! One `.wgsl` file per kernel family under `wgsl/`; a [`Module`] is a family assembled with
//! the shared helpers (and, for linears, a weight-format file). A [`Kernel`] is one entry
//! point of a module together with the bindings it uses and its parameter block. Kernels know
//! nothing of the model: shapes arrive in the parameter blocks at dispatch time.
//!
//! [`validate`] runs naga's validator on a module and [`to_msl`] translates it to Metal
//! Shading Language; the tests do both for every module, so everything that ships also
//! compiles for Apple GPUs.

mod check;
mod codec_launch;
pub mod flags;
mod format;
mod kernel;
mod limits;
mod module;
mod params;
mod tuning;

pub use check::{KernelError, to_msl, validate, validate_with};
pub use codec_launch::{CODEC_CONV_FRAMES, CodecLaunch, conv_transpose_launch, conv1d_launch};
pub use format::{ConvOutput, KeptCapacity, LinearInput, LinearWidth, WeightFormat, row_source};
pub use kernel::{Kernel, KernelSpec, ParamBlock};
pub use limits::{
    MAX_EXPERT_GROUPS, MAX_HEAD_DIM, MAX_KEPT_EXPERTS, MAX_ROUTED_PER_TOKEN, NORM_WIDTH_MULTIPLE,
    WORKGROUP_MEMORY_BYTES, head_stride,
};
pub use module::{Module, Numerics};
pub use params::{
    AttentionParams, BandwidthParams, CodecParams, ElementwiseParams, GroupParams, LinearParams, NormParams,
    ProbeParams, RouterParams, SampleParams, SampleRow,
};
pub use tuning::{
    ATTENTION_BLOCKS_FROM, ATTENTION_CHUNK, DENSE_LINEAR_WIDTH, EXPERT_GROUP_SLOTS, FORCE_LOOP_BOUNDING,
    LINEAR_PASS_ROWS, SHARED_LAUNCH_LINEAR_WIDTH, ZERO_FILL_WORKGROUP_MEMORY, attention_block_heads, attention_chunks,
    attention_scratch_floats,
};
