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

impl Capabilities {
    /// Reads the report from the adapter's info, features and the limits the device got.
    pub fn read(info: &wgpu::AdapterInfo, features: wgpu::Features, limits: &wgpu::Limits) -> Self {
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
        }
    }
}
