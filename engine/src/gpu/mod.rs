//! The wgpu device: explicit backend choice, the capability report, buffers, pipelines and
//! dispatch helpers. Nothing else in the engine talks to the adapter.

mod capabilities;
mod readback;
mod timeline;
mod upload;
mod wait;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use drama_kernels::{Kernel, Numerics, ProbeParams};
use wgpu::util::DeviceExt;

pub use capabilities::{
    CONCURRENT_LAUNCH_BACKENDS, Capabilities, DEVICE_BARRIER_BACKENDS, MAX_STORAGE_BINDING, MatrixUnit,
    storage_binding_limit,
};
pub use readback::Readback;
pub use timeline::{MAX_MARKED_SUBMISSIONS, MarkedSpan, Marks, SubmissionTimeline};
pub(crate) use upload::bytes_of;
pub use upload::{Stager, UPLOAD_BATCH};
pub use wait::WaitHistory;

/// Which graphics API to run on. `Auto` takes the platform's native one (Metal on Apple,
/// Vulkan elsewhere, DX12 on Windows) and never falls back to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// The platform's native API.
    #[default]
    Auto,
    /// Apple Metal.
    Metal,
    /// Vulkan (including Mesa's lavapipe on CPUs).
    Vulkan,
    /// Direct3D 12.
    Dx12,
}

/// Why a `--backend` name was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendNameError {
    /// OpenGL: wgpu's GL backend offers fewer storage bindings per shader stage than the
    /// engine's largest kernel binds, so no checkpoint could run on it.
    #[error(
        "the gl backend is not supported: wgpu's OpenGL backend offers 16 storage buffers per shader stage \
         and the engine's largest kernel binds {NEEDED_STORAGE_BUFFERS}; use vulkan (Mesa's lavapipe runs on any CPU)"
    )]
    Gl,
    /// A name that is no backend.
    #[error("unknown backend {0:?} (auto, metal, vulkan, dx12)")]
    Unknown(String),
}

impl BackendChoice {
    /// Parses `auto|metal|vulkan|dx12`; `gl` is refused with the reason.
    pub fn parse(text: &str) -> Result<Self, BackendNameError> {
        Ok(match text {
            "auto" => BackendChoice::Auto,
            "metal" => BackendChoice::Metal,
            "vulkan" => BackendChoice::Vulkan,
            "dx12" => BackendChoice::Dx12,
            "gl" => return Err(BackendNameError::Gl),
            _ => return Err(BackendNameError::Unknown(text.to_string())),
        })
    }

    /// The name [`BackendChoice::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Metal => "metal",
            BackendChoice::Vulkan => "vulkan",
            BackendChoice::Dx12 => "dx12",
        }
    }

    /// Whether launches that need no barrier run beside the launch before them on the API
    /// this choice opens (see [`Capabilities::concurrent_launches`]).
    pub fn runs_launches_concurrently(self) -> bool {
        self.backends().intersects(CONCURRENT_LAUNCH_BACKENDS)
    }

    /// Whether WGSL's storage barriers order memory for the whole device on the API this
    /// choice opens (see [`Capabilities::device_barriers`]).
    pub fn has_device_barriers(self) -> bool {
        self.backends().intersects(DEVICE_BARRIER_BACKENDS)
    }

    fn backends(self) -> wgpu::Backends {
        match self {
            BackendChoice::Auto => {
                if cfg!(target_vendor = "apple") {
                    wgpu::Backends::METAL
                } else if cfg!(windows) {
                    wgpu::Backends::DX12
                } else {
                    wgpu::Backends::VULKAN
                }
            }
            BackendChoice::Metal => wgpu::Backends::METAL,
            BackendChoice::Vulkan => wgpu::Backends::VULKAN,
            BackendChoice::Dx12 => wgpu::Backends::DX12,
        }
    }
}

/// How to open the device.
#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    /// Graphics API.
    pub backend: BackendChoice,
    /// Lower the storage-binding limit (tests use this to force weight splitting).
    pub max_storage_binding: Option<u64>,
    /// Whether waits for submitted work end by polling (see [`Gpu::wait_for`]). None: on
    /// every adapter but a CPU one (tests use this to poll on lavapipe too).
    pub poll_waits: Option<bool>,
    /// Bytes of buffer writes gathered before they are sent to the GPU while weights
    /// upload (None: [`UPLOAD_BATCH`]; tests send every buffer alone).
    pub upload_batch: Option<u64>,
    /// Whether steps are built for launches that run beside the launch before them (see
    /// [`Capabilities::concurrent_launches`]). None: as the backend runs them (tests build
    /// the other form too, to compare their bits).
    pub concurrent_launches: Option<bool>,
    /// Whether steps are built for device-scope storage barriers (see
    /// [`Capabilities::device_barriers`]). None: as the backend has them (tests build the
    /// other form too, to compare their bits).
    pub device_barriers: Option<bool>,
    /// How the kernels' floating point is compiled (tests run them as Metal's fast math may
    /// compile them, on any GPU).
    pub numerics: Numerics,
}

/// Why the GPU could not be used.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No adapter of the requested backend exists on this machine.
    #[error("no {backend:?} adapter is available ({reason}); no other backend is tried")]
    NoAdapter {
        /// What was asked for.
        backend: BackendChoice,
        /// wgpu's reason.
        reason: String,
    },
    /// The device could not be created with the limits the engine needs.
    #[error("the {adapter} device refused the engine's requirements: {reason}")]
    Device {
        /// Adapter name.
        adapter: String,
        /// wgpu's reason.
        reason: String,
    },
    /// A limit is below what the engine needs.
    #[error("the adapter's {limit} is {found}, the engine needs at least {needed}")]
    Limit {
        /// Limit name.
        limit: &'static str,
        /// Adapter value.
        found: u64,
        /// Required value.
        needed: u64,
    },
    /// The adapter lacks a shader capability the kernels use.
    #[error("the adapter lacks {0}, which the weight-decoding kernels use")]
    Capability(&'static str),
    /// A shader or pipeline failed to build (a bug: tests validate every kernel).
    #[error("kernel {kernel}: {reason}")]
    Pipeline {
        /// The kernel.
        kernel: String,
        /// wgpu's validation message.
        reason: String,
    },
    /// Reading results back failed.
    #[error("reading back from the GPU failed: {0}")]
    Readback(String),
    /// Staging memory for an upload could not be mapped (wgpu could not make it: out of
    /// memory, say, or the device was lost).
    #[error("staging memory for an upload to the GPU could not be mapped: {0}")]
    Staging(String),
    /// Waiting for submitted work failed (the device was lost, say).
    #[error("waiting for the GPU failed: {0}")]
    Wait(String),
    /// wgpu reported an error outside an error scope (running out of GPU memory, say),
    /// surfaced at the next wait for the GPU.
    #[error("the GPU reported an error: {0}")]
    Reported(String),
}

/// The opened device and everything built on it once.
pub struct Gpu {
    /// The wgpu device.
    pub device: wgpu::Device,
    /// Its queue. Submit through [`Gpu::submit_commands`], never `queue.submit`, where other
    /// threads may use the device too (see [`Gpu::submit_commands`]).
    pub queue: wgpu::Queue,
    /// What the adapter offers.
    pub caps: Capabilities,
    /// Waits end by polling instead of blocking all the way (see [`Gpu::wait_for`]).
    polls_waits: bool,
    /// See [`GpuOptions::upload_batch`].
    upload_batch: u64,
    pipelines: Mutex<HashMap<Kernel, Arc<wgpu::ComputePipeline>>>,
    /// The first error wgpu reported outside an error scope since the last wait, which
    /// returns it (wgpu's default handler would panic).
    reported: Arc<Mutex<Option<String>>>,
    /// Held while the device is polled or its queue submitted to (see
    /// [`Gpu::submit_commands`]).
    polling: Mutex<()>,
}

/// The storage bindings the engine's largest kernel uses (routing with the BF16 linear
/// beside it: seventeen; Metal offers 31, lavapipe 32, NVIDIA far more, wgpu's GL 16).
const NEEDED_STORAGE_BUFFERS: u32 = 17;

impl Gpu {
    /// Opens the adapter of the chosen backend. Never falls back to another backend.
    pub fn new(options: &GpuOptions) -> Result<Gpu, GpuError> {
        let backends = options.backend.backends();
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends,
            // wgpu checks the counts of every indirect launch with a compute dispatch of its
            // own recorded before it. The engine's one indirect launch (attention over the
            // chunks a step reaches, whose kernel does not read `num_workgroups`) takes
            // counts the host writes clamped to a grid already checked against the device's
            // limits when the step was compiled (`Gpu::dispatch`), so that check only cost
            // time: an extra dependent dispatch per attention layer.
            flags: wgpu::InstanceFlags::from_build_config() - wgpu::InstanceFlags::VALIDATION_INDIRECT_CALL,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            force_fallback_adapter: false,
            compatible_surface: None,
            // Report the adapter's real limits: the engine sizes weight splits by them.
            apply_limit_buckets: false,
        }))
        .map_err(|e| GpuError::NoAdapter {
            backend: options.backend,
            reason: e.to_string(),
        })?;
        let mut limits = adapter.limits();
        if limits.max_storage_buffers_per_shader_stage < NEEDED_STORAGE_BUFFERS {
            return Err(GpuError::Limit {
                limit: "max_storage_buffers_per_shader_stage",
                found: limits.max_storage_buffers_per_shader_stage.into(),
                needed: NEEDED_STORAGE_BUFFERS.into(),
            });
        }
        if limits.max_compute_workgroup_storage_size < drama_kernels::WORKGROUP_MEMORY_BYTES {
            return Err(GpuError::Limit {
                limit: "max_compute_workgroup_storage_size",
                found: limits.max_compute_workgroup_storage_size.into(),
                needed: drama_kernels::WORKGROUP_MEMORY_BYTES.into(),
            });
        }
        // The NVFP4 and FP8 decoders convert packed f16 bit patterns (`unpack2x16float`).
        if !adapter
            .get_downlevel_capabilities()
            .flags
            .contains(wgpu::DownlevelFlags::SHADER_F16_IN_F32)
        {
            return Err(GpuError::Capability("f16 packing in f32 shaders (SHADER_F16_IN_F32)"));
        }
        limits.max_storage_buffer_binding_size = storage_binding_limit(limits.max_storage_buffer_binding_size);
        if let Some(cap) = options.max_storage_binding {
            let cap = cap.min(limits.max_storage_buffer_binding_size);
            limits.max_storage_buffer_binding_size = cap;
        }
        let info = adapter.get_info();
        // Timestamps at pass boundaries (the only kind Apple GPUs have) time steps when offered.
        let features = adapter.features() & wgpu::Features::TIMESTAMP_QUERY;
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("drama"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| GpuError::Device {
            adapter: info.name.clone(),
            reason: e.to_string(),
        })?;
        let mut caps = Capabilities::read(&adapter, &limits);
        caps.concurrent_launches = options.concurrent_launches.unwrap_or(caps.concurrent_launches);
        caps.device_barriers = options.device_barriers.unwrap_or(caps.device_barriers);
        caps.numerics = options.numerics;
        let reported = Arc::new(Mutex::new(None));
        let first = reported.clone();
        device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
            first
                .lock()
                .expect("error slot poisoned")
                .get_or_insert(error.to_string());
        }));
        let gpu = Gpu {
            device,
            queue,
            caps,
            polls_waits: options.poll_waits.unwrap_or(info.device_type != wgpu::DeviceType::Cpu),
            upload_batch: options.upload_batch.unwrap_or(UPLOAD_BATCH),
            pipelines: Mutex::new(HashMap::new()),
            reported,
            polling: Mutex::new(()),
        };
        gpu.probe_f16_subnormals()?;
        Ok(gpu)
    }

    /// Converts f16 bit patterns the weight decoders produce (subnormals among them) on the
    /// device and refuses it unless every value comes back exact: a driver that flushed
    /// f16 subnormals would decode E2M1 +-0.5 and every E4M3 subnormal weight as 0.
    fn probe_f16_subnormals(&self) -> Result<(), GpuError> {
        // (low half, high half): E2M1 +0.5 and -0.5 as the NVFP4 decoder places them
        // (2^-15), the smallest and largest f16 subnormals, and a normal pair.
        let cases: [(u16, u16); 3] = [(0x0200, 0x8200), (0x0001, 0x03ff), (0x3c00, 0xc000)];
        let words: Vec<u32> = cases
            .iter()
            .map(|&(lo, hi)| u32::from(lo) | (u32::from(hi) << 16))
            .collect();
        let input = self.buffer_with("f16 probe input", bytemuck::cast_slice(&words));
        let output = self.buffer("f16 probe output", (cases.len() * 8) as u64);
        let params = ProbeParams {
            count: cases.len() as u32,
            pad: [0; 3],
        };
        let probe = self.dispatch(Kernel::UnpackF16, &params, &[&input, &output], [1, 1, 1])?;
        self.submit(std::slice::from_ref(&probe));
        let got = self.read_f32(&output)?;
        let want: Vec<f32> = cases
            .iter()
            .flat_map(|&(lo, hi)| [half::f16::from_bits(lo).to_f32(), half::f16::from_bits(hi).to_f32()])
            .collect();
        if got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()) {
            Ok(())
        } else {
            Err(GpuError::Capability(
                "exact f16 subnormals in unpack2x16float (this adapter flushes them to zero)",
            ))
        }
    }

    /// The compute pipeline of a kernel, built on first use and cached. Threads may build
    /// different kernels' pipelines at once (the cache is not held while one builds).
    pub fn pipeline(&self, kernel: Kernel) -> Result<Arc<wgpu::ComputePipeline>, GpuError> {
        if let Some(pipeline) = self.pipelines.lock().expect("pipeline cache poisoned").get(&kernel) {
            return Ok(pipeline.clone());
        }
        let built = Arc::new(self.build_pipeline(kernel)?);
        // A thread that built the same kernel meanwhile stored its pipeline first: keep that.
        let mut cache = self.pipelines.lock().expect("pipeline cache poisoned");
        Ok(cache.entry(kernel).or_insert(built).clone())
    }

    /// Compiles a kernel's module and its pipeline; a validation error names the kernel.
    /// (wgpu's error scopes are per thread.)
    fn build_pipeline(&self, kernel: Kernel) -> Result<wgpu::ComputePipeline, GpuError> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let descriptor = wgpu::ShaderModuleDescriptor {
            label: Some(&kernel.module().name()),
            source: wgpu::ShaderSource::Wgsl(kernel.module().source_with(self.caps.numerics).into()),
        };
        let mut checks = wgpu::ShaderRuntimeChecks::checked();
        checks.force_loop_bounding = drama_kernels::FORCE_LOOP_BOUNDING;
        // SAFETY: the one check left out is the loop counting, which the kernels do not
        // need: every loop of theirs ends (see `FORCE_LOOP_BOUNDING`); bounds checks stay.
        let module = unsafe { self.device.create_shader_module_trusted(descriptor, checks) };
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(kernel.entry_point()),
            layout: None,
            module: &module,
            entry_point: Some(kernel.entry_point()),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: kernel.overrides(),
                zero_initialize_workgroup_memory: drama_kernels::ZERO_FILL_WORKGROUP_MEMORY,
            },
            cache: None,
        });
        if let Some(error) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Pipeline {
                kernel: format!("{kernel:?}"),
                reason: error.to_string(),
            });
        }
        Ok(pipeline)
    }

    /// A zero-filled storage buffer of `size` bytes (at least 4).
    pub fn buffer(&self, label: &str, size: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: size.max(4).div_ceil(4) * 4,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    }

    /// A uniform buffer holding one parameter block.
    pub fn uniform<T: bytemuck::Pod>(&self, label: &str, value: &T) -> wgpu::Buffer {
        self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: bytemuck::bytes_of(value),
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        })
    }

    /// Binds `buffers` to the kernel's bindings, in the order of [`Kernel::bindings`].
    pub fn bind_group(&self, kernel: Kernel, buffers: &[&wgpu::Buffer]) -> Result<wgpu::BindGroup, GpuError> {
        let bindings = kernel.bindings();
        assert_eq!(bindings.len(), buffers.len(), "{kernel:?}: binding count");
        let pipeline = self.pipeline(kernel)?;
        let entries: Vec<wgpu::BindGroupEntry> = bindings
            .iter()
            .zip(buffers)
            .map(|(&binding, buffer)| wgpu::BindGroupEntry {
                binding,
                resource: buffer.as_entire_binding(),
            })
            .collect();
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(kernel.entry_point()),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        if let Some(error) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Pipeline {
                kernel: format!("{kernel:?} bind group"),
                reason: error.to_string(),
            });
        }
        Ok(group)
    }

    /// One kernel launch: a parameter block, the kernel's bindings after it, a grid.
    pub fn dispatch<T: bytemuck::Pod>(
        &self,
        kernel: Kernel,
        params: &T,
        resources: &[&wgpu::Buffer],
        workgroups: [u32; 3],
    ) -> Result<Dispatch, GpuError> {
        let most = self.caps.max_workgroups_per_dimension;
        if let Some(&count) = workgroups.iter().find(|&&count| count > most) {
            return Err(GpuError::Limit {
                limit: "max_compute_workgroups_per_dimension (a step too large for one launch)",
                found: u64::from(most),
                needed: u64::from(count),
            });
        }
        let uniform = self.uniform(kernel.entry_point(), params);
        let mut all = vec![&uniform];
        all.extend_from_slice(resources);
        Ok(Dispatch {
            kernel,
            pipeline: self.pipeline(kernel)?,
            bind_group: self.bind_group(kernel, &all)?,
            workgroups,
            indirect: None,
        })
    }

    /// Workgroups covering `elements` one-thread-per-element work.
    pub fn elements_grid(&self, elements: usize) -> [u32; 3] {
        grid_for(elements as u64, 64, self.caps.max_workgroups_per_dimension.min(65535))
    }

    /// Records `dispatches` into one compute pass and submits them.
    pub fn submit<'a>(&self, dispatches: impl IntoIterator<Item = &'a Dispatch>) {
        self.submit_commands([self.encode(dispatches)]);
    }

    /// Submits `commands` to the queue. One thread at a time polls the device or submits:
    /// wgpu 30's poll, while another thread polls or submits (a submission retires finished
    /// ones too), can read its fence, then find the queue empty because the other thread
    /// retired a later submission meanwhile, and panic on its own assertion (fixed upstream
    /// by gfx-rs/wgpu#9958; op_misc's tests, whose threads share one device, hit it: see
    /// `docs/performance.md`).
    pub fn submit_commands(&self, commands: impl IntoIterator<Item = wgpu::CommandBuffer>) -> wgpu::SubmissionIndex {
        let _one_at_a_time = self.polling();
        self.queue.submit(commands)
    }

    /// The lock every poll and submission holds (see [`Gpu::submit_commands`]). It guards
    /// no data, so a thread that panicked holding it leaves nothing to distrust.
    fn polling(&self) -> std::sync::MutexGuard<'_, ()> {
        self.polling.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records `dispatches` into one compute pass of a command buffer, to submit later.
    pub fn encode<'a>(&self, dispatches: impl IntoIterator<Item = &'a Dispatch>) -> wgpu::CommandBuffer {
        self.encode_then_copy(dispatches, None)
    }

    /// Like [`Gpu::encode`], then (with `copy`) the copy of a result into its readback.
    pub fn encode_then_copy<'a>(
        &self,
        dispatches: impl IntoIterator<Item = &'a Dispatch>,
        copy: Option<(&wgpu::Buffer, &Readback)>,
    ) -> wgpu::CommandBuffer {
        let mut encoder = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("step"),
                timestamp_writes: None,
            });
            for dispatch in dispatches {
                dispatch.record(&mut pass);
            }
        }
        if let Some((source, readback)) = copy {
            readback.record(&mut encoder, source);
        }
        encoder.finish()
    }

    /// Blocks until the queue is idle.
    pub fn wait(&self) -> Result<(), GpuError> {
        self.block(None, None).map(|_| ())
    }

    /// Blocks until `submission` has finished.
    pub fn finish(&self, submission: &wgpu::SubmissionIndex) -> Result<(), GpuError> {
        self.block(Some(submission), None).map(|_| ())
    }

    /// Runs every dispatch in a pass of its own, timestamps at each pass's boundaries (what
    /// Apple GPUs allow too), and returns each dispatch's GPU time. A profiling mode: the
    /// passes add boundaries a normal step does not have. Needs timestamp queries.
    pub fn profile_submit<'a>(
        &self,
        dispatches: impl IntoIterator<Item = &'a Dispatch>,
    ) -> Result<Vec<std::time::Duration>, GpuError> {
        let dispatches: Vec<&Dispatch> = dispatches.into_iter().collect();
        if !self.caps.timestamps {
            return Err(GpuError::Limit {
                limit: "timestamp queries (profiling needs them)",
                found: 0,
                needed: 1,
            });
        }
        let mut times = Vec::with_capacity(dispatches.len());
        // wgpu caps a query set at 4096 queries: profile in chunks of 2048 dispatches.
        for chunk in dispatches.chunks(2048) {
            let count = 2 * chunk.len() as u32;
            let queries = self.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("profile timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count,
            });
            let mut encoder = self.device.create_command_encoder(&Default::default());
            for (i, dispatch) in chunk.iter().enumerate() {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some(dispatch.kernel.entry_point()),
                    timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                        query_set: &queries,
                        beginning_of_pass_write_index: Some(2 * i as u32),
                        end_of_pass_write_index: Some(2 * i as u32 + 1),
                    }),
                });
                dispatch.record(&mut pass);
            }
            let nanos = self.resolve_timestamps(encoder, &queries, count)?;
            times.extend(nanos.chunks_exact(2).map(|t| nanos_between(t[0], t[1])));
        }
        Ok(times)
    }

    /// Runs `dispatches` in one pass and returns its GPU time: from timestamps written at the
    /// pass boundaries where the adapter offers them, else the wall time of submit-and-wait.
    pub fn timed_submit<'a>(
        &self,
        dispatches: impl IntoIterator<Item = &'a Dispatch>,
    ) -> Result<std::time::Duration, GpuError> {
        if !self.caps.timestamps {
            let start = std::time::Instant::now();
            self.submit(dispatches);
            self.wait()?;
            return Ok(start.elapsed());
        }
        let queries = self.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("pass timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        });
        let mut encoder = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("timed"),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: &queries,
                    beginning_of_pass_write_index: Some(0),
                    end_of_pass_write_index: Some(1),
                }),
            });
            for dispatch in dispatches {
                dispatch.record(&mut pass);
            }
        }
        let nanos = self.resolve_timestamps(encoder, &queries, 2)?;
        Ok(nanos_between(nanos[0], nanos[1]))
    }

    /// Submits `encoder` with the resolve of the first `count` timestamps of `queries`
    /// behind it and returns them, in nanoseconds of the GPU's clock, once written.
    fn resolve_timestamps(
        &self,
        mut encoder: wgpu::CommandEncoder,
        queries: &wgpu::QuerySet,
        count: u32,
    ) -> Result<Vec<f64>, GpuError> {
        let resolved = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamps"),
            size: u64::from(count) * 8,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        encoder.resolve_query_set(queries, 0..count, &resolved, 0);
        self.submit_commands([encoder.finish()]);
        let ticks: Vec<u64> = self.read_first(&resolved, count as usize)?;
        let period = f64::from(self.queue.get_timestamp_period());
        Ok(ticks.into_iter().map(|t| t as f64 * period).collect())
    }

    /// Copies `buffer` back to the host as f32 values (blocking).
    pub fn read_f32(&self, buffer: &wgpu::Buffer) -> Result<Vec<f32>, GpuError> {
        self.read_first(buffer, (buffer.size() / 4) as usize)
    }

    /// Copies `buffer` back to the host as u32 values (blocking).
    pub fn read_u32(&self, buffer: &wgpu::Buffer) -> Result<Vec<u32>, GpuError> {
        self.read_first(buffer, (buffer.size() / 4) as usize)
    }

    /// Copies the first `count` values of `buffer` back to the host (blocking); only those
    /// bytes are copied (a planned buffer is often larger than the value it holds), and they
    /// are cast straight from the mapped range.
    pub fn read_first<T: bytemuck::Pod>(&self, buffer: &wgpu::Buffer, count: usize) -> Result<Vec<T>, GpuError> {
        let readback = Readback::new(self, "readback", (count * std::mem::size_of::<T>()) as u64);
        let mut encoder = self.device.create_command_encoder(&Default::default());
        readback.record(&mut encoder, buffer);
        let submission = self.submit_commands([encoder.finish()]);
        readback.read(self, submission)
    }
}

/// The time from one timestamp to a later one (zero if it is not later), both in
/// nanoseconds.
fn nanos_between(start: f64, end: f64) -> std::time::Duration {
    std::time::Duration::from_nanos((end - start).max(0.0) as u64)
}

/// One recorded kernel launch.
pub struct Dispatch {
    /// The kernel.
    pub kernel: Kernel,
    /// Its pipeline.
    pub pipeline: Arc<wgpu::ComputePipeline>,
    /// Its resources.
    pub bind_group: wgpu::BindGroup,
    /// Workgroup counts (with `indirect`, the most the launch may take).
    pub workgroups: [u32; 3],
    /// When set, the launch reads its workgroup counts from this buffer (three u32s), which
    /// the host writes before each submit, so recorded commands can vary them. They must
    /// never exceed `workgroups` (the counts checked against the device's limits): wgpu does
    /// not check them again (see [`Gpu::new`]).
    pub indirect: Option<wgpu::Buffer>,
}

impl Dispatch {
    /// Records the launch into a compute pass.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        match &self.indirect {
            Some(counts) => pass.dispatch_workgroups_indirect(counts, 0),
            None => pass.dispatch_workgroups(self.workgroups[0], self.workgroups[1], self.workgroups[2]),
        }
    }
}

/// Workgroup counts covering `elements` one-thread-per-element work of `workgroup_size`,
/// folded into two dimensions when one would pass `max_per_dim`.
pub fn grid_for(elements: u64, workgroup_size: u32, max_per_dim: u32) -> [u32; 3] {
    let groups = elements.div_ceil(u64::from(workgroup_size)).max(1);
    if groups <= u64::from(max_per_dim) {
        [groups as u32, 1, 1]
    } else {
        let x = u64::from(max_per_dim);
        [x as u32, groups.div_ceil(x) as u32, 1]
    }
}
