//! What the adapter offers, read once when the device opens.

use serde::Serialize;

/// The capability report: read once from the adapter, consulted by kernel choice and refusals.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Capabilities {
    /// Graphics API in use.
    pub backend: String,
    /// Adapter name.
    pub adapter: String,
    /// Driver and its version.
    pub driver: String,
    /// Integrated, discrete, CPU...
    pub device_type: String,
    /// `shader-f16` is offered.
    pub shader_f16: bool,
    /// Subgroup operations are offered.
    pub subgroups: bool,
    /// Smallest and largest subgroup size the adapter reports.
    pub subgroup_sizes: (u32, u32),
    /// Timestamp queries at pass boundaries are offered.
    pub timestamps: bool,
    /// Largest storage binding, in bytes (weights are split to fit).
    pub max_storage_binding: u64,
    /// Largest buffer, in bytes.
    pub max_buffer: u64,
    /// Workgroups per dispatch dimension.
    pub max_workgroups_per_dimension: u32,
    /// A launch that needs no barrier may run beside the launch before it (the backend is
    /// one of [`CONCURRENT_LAUNCH_BACKENDS`]).
    pub concurrent_launches: bool,
    /// WGSL's `storageBarrier` orders storage memory for the whole device (the backend is
    /// one of [`DEVICE_BARRIER_BACKENDS`]), so a launch's last workgroup to finish may read
    /// what the others wrote.
    pub device_barriers: bool,
    /// The floating point of the kernels as compiled here: as written, or the source's
    /// emulation of Metal's fast math (tests; see [`drama_kernels::Numerics`]). On Metal,
    /// Apple's compiler applies fast math to the kernels as written.
    pub numerics: drama_kernels::Numerics,
    /// What the platform's shader compiler may do to floating point: Apple's Metal compiler
    /// defaults to fast math (wgpu sets no math mode); Vulkan and DX12 compile as written.
    pub compiler_math: &'static str,
    /// The largest `head_dim` attention runs (any even one up to it): its workgroup holds
    /// one query head; the same on every backend, as the kernel's workgroup memory fits
    /// WebGPU's minimum of 16 KiB.
    pub max_head_dim: usize,
    /// The matrix units (tensor cores, simdgroup matrices) the adapter offers through wgpu's
    /// experimental cooperative matrices: the configurations wgpu maps (square tiles of 8
    /// or 16, one subgroup's), empty where there are none (lavapipe of Mesa 22). Reported,
    /// not used: every kernel sums in FP32 on the ordinary units, the same way at every
    /// step size (`docs/performance.md`, "What stands in the way", says why).
    pub matrix_units: Vec<MatrixUnit>,
}

/// One matrix-unit configuration: C (m x n) += A (m x k) B (k x n), one subgroup's tile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MatrixUnit {
    /// Rows of A and C.
    pub m: u32,
    /// Columns of B and C.
    pub n: u32,
    /// Columns of A, rows of B.
    pub k: u32,
    /// The element type of A and B (`F16`, `F32`...).
    pub inputs: String,
    /// The element type of C and the result.
    pub accumulator: String,
}

impl From<&wgpu::CooperativeMatrixProperties> for MatrixUnit {
    fn from(p: &wgpu::CooperativeMatrixProperties) -> Self {
        MatrixUnit {
            m: p.m_size,
            n: p.n_size,
            k: p.k_size,
            inputs: format!("{:?}", p.ab_type),
            accumulator: format!("{:?}", p.cr_type),
        }
    }
}

/// The backends on which a launch that needs no barrier runs beside the launch before it:
/// wgpu records barriers there only where the bindings need them, while its Metal and GL
/// backends run every launch after the one before (Metal's serial compute encoders).
pub const CONCURRENT_LAUNCH_BACKENDS: wgpu::Backends = wgpu::Backends::VULKAN.union(wgpu::Backends::DX12);

/// The backends on which WGSL's `storageBarrier` orders storage memory for the whole
/// device: naga gives it device memory scope in SPIR-V and writes
/// `DeviceMemoryBarrierWithGroupSync` in HLSL, but `threadgroup_barrier(mem_device)` in MSL
/// and `memoryBarrierBuffer` in GLSL, which order memory within the workgroup only.
pub const DEVICE_BARRIER_BACKENDS: wgpu::Backends = wgpu::Backends::VULKAN.union(wgpu::Backends::DX12);

/// The most bytes the engine binds as one storage buffer, whatever the adapter reports:
/// 2^31. On Metal, naga's bounds checks read a binding's length as a 32-bit `uint`, so a
/// binding of 2^32 bytes or more reads zeros and drops writes past byte 2^32 - 4 with no
/// error; wgpu 30 caps the reported limit below that only while its indirect-call
/// validation is on, which the engine turns off (gfx-rs/wgpu#10305). 2^31 keeps every
/// byte offset a kernel computes in 32 bits with room to spare.
pub const MAX_STORAGE_BINDING: u64 = 1 << 31;

/// The storage-binding limit the engine asks the device for: the adapter's, at most
/// [`MAX_STORAGE_BINDING`].
pub fn storage_binding_limit(reported: u64) -> u64 {
    reported.min(MAX_STORAGE_BINDING)
}

impl Capabilities {
    /// Reads the report from the adapter (its info, features and matrix units) and the
    /// limits the device got.
    pub fn read(adapter: &wgpu::Adapter, limits: &wgpu::Limits) -> Self {
        let (info, features) = (adapter.get_info(), adapter.features());
        Capabilities {
            backend: format!("{:?}", info.backend),
            adapter: info.name.clone(),
            driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
            device_type: format!("{:?}", info.device_type),
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            subgroups: features.contains(wgpu::Features::SUBGROUP),
            subgroup_sizes: (info.subgroup_min_size, info.subgroup_max_size),
            timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            max_storage_binding: limits.max_storage_buffer_binding_size,
            max_buffer: limits.max_buffer_size,
            max_workgroups_per_dimension: limits.max_compute_workgroups_per_dimension,
            concurrent_launches: CONCURRENT_LAUNCH_BACKENDS.contains(info.backend.into()),
            device_barriers: DEVICE_BARRIER_BACKENDS.contains(info.backend.into()),
            numerics: drama_kernels::Numerics::AsWritten,
            compiler_math: if info.backend == wgpu::Backend::Metal {
                "fast (Apple's default: reassociation, contraction, no NaN or infinity, fast sin/cos/exp)"
            } else {
                "as written (IEEE, no fast-math flags)"
            },
            max_head_dim: drama_kernels::MAX_HEAD_DIM,
            matrix_units: adapter
                .cooperative_matrix_properties()
                .iter()
                .map(MatrixUnit::from)
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An adapter reporting 4 GiB or 13.3 GiB (an M4 Pro with wgpu 30) gets 2 GiB; smaller
    /// limits (lavapipe's 128 MiB) stay as reported.
    #[test]
    fn storage_bindings_stay_below_two_gib_whatever_the_adapter_reports() {
        assert_eq!(storage_binding_limit(14_302_248_960), 1 << 31);
        assert_eq!(storage_binding_limit(u64::from(u32::MAX)), 1 << 31);
        assert_eq!(storage_binding_limit(1 << 31), 1 << 31);
        assert_eq!(storage_binding_limit(128 << 20), 128 << 20);
    }
}
