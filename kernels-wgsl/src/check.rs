//! naga's checks of the modules: parsing and validation, and translation to Metal Shading
//! Language as wgpu's Metal backend does it.

use crate::module::{Module, Numerics};
use crate::tuning::{FORCE_LOOP_BOUNDING, ZERO_FILL_WORKGROUP_MEMORY};

/// A module that failed to parse, validate or translate.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// WGSL parse error.
    #[error("{module}: WGSL does not parse: {message}")]
    Parse {
        /// Module name.
        module: String,
        /// naga's message with source context.
        message: String,
    },
    /// naga validation error.
    #[error("{module}: WGSL does not validate: {message}")]
    Validate {
        /// Module name.
        module: String,
        /// naga's message.
        message: String,
    },
    /// MSL translation error.
    #[error("{module}: cannot translate to MSL: {message}")]
    Msl {
        /// Module name.
        module: String,
        /// naga's message.
        message: String,
    },
}

/// Parses and validates a module with naga (with the one capability beyond core WGSL the
/// kernels use: f16 packing in f32 shaders, which Metal and Vulkan have); returns the IR and
/// its analysis.
pub fn validate(module: Module) -> Result<(naga::Module, naga::valid::ModuleInfo), KernelError> {
    validate_with(module, Numerics::AsWritten)
}

/// [`validate`] of the module's source with `numerics`.
pub fn validate_with(
    module: Module,
    numerics: Numerics,
) -> Result<(naga::Module, naga::valid::ModuleInfo), KernelError> {
    let source = module.source_with(numerics);
    let ir = naga::front::wgsl::parse_str(&source).map_err(|e| KernelError::Parse {
        module: module.name(),
        message: e.emit_to_string(&source),
    })?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32,
    )
    .validate(&ir)
    .map_err(|e| KernelError::Validate {
        module: module.name(),
        message: e.emit_to_string(&source),
    })?;
    Ok((ir, info))
}

/// Translates a module to Metal Shading Language (MSL 2.4), as wgpu's Metal backend does for
/// the engine's pipelines, its pipeline constants at their defaults.
pub fn to_msl(module: Module) -> Result<String, KernelError> {
    msl_with(module, &[], ZERO_FILL_WORKGROUP_MEMORY, FORCE_LOOP_BOUNDING)
}

/// A module validated with the pipeline constants `constants` set (the others at their
/// defaults), as wgpu compiles a pipeline.
fn specialised(
    module: Module,
    constants: &[(&str, f64)],
) -> Result<(naga::Module, naga::valid::ModuleInfo), KernelError> {
    let (ir, info) = validate(module)?;
    let constants: naga::back::PipelineConstants = constants
        .iter()
        .map(|&(name, value)| (name.to_string(), value))
        .collect();
    let (ir, info) = naga::back::pipeline_constants::process_overrides(&ir, &info, None, &constants).map_err(|e| {
        KernelError::Validate {
            module: module.name(),
            message: e.to_string(),
        }
    })?;
    Ok((ir.into_owned(), info.into_owned()))
}

/// [`to_msl`] with `constants` set and the workgroup memory fill and the loop counters on or
/// off.
fn msl_with(
    module: Module,
    constants: &[(&str, f64)],
    zero_fill: bool,
    loop_bounding: bool,
) -> Result<String, KernelError> {
    let (ir, info) = specialised(module, constants)?;
    let options = naga::back::msl::Options {
        lang_version: (2, 4),
        zero_initialize_workgroup_memory: zero_fill,
        force_loop_bounding: loop_bounding,
        // wgpu keeps bounds checks on for the engine's pipelines: every index clamped.
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: naga::proc::BoundsCheckPolicy::Restrict,
            buffer: naga::proc::BoundsCheckPolicy::Restrict,
            image_load: naga::proc::BoundsCheckPolicy::Restrict,
            binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
        },
        ..Default::default()
    };
    let (msl, _) = naga::back::msl::write_string(&ir, &info, &options, &naga::back::msl::PipelineOptions::default())
        .map_err(|e| KernelError::Msl {
            module: module.name(),
            message: e.to_string(),
        })?;
    Ok(msl)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::*;

    /// The fast-math emulation's sources parse and validate too, and differ from the
    /// sources as written in the codec module only.
    #[test]
    fn every_module_validates_in_the_fast_math_emulation() {
        for module in Module::ALL {
            validate_with(module, Numerics::FastMathEmulation).unwrap_or_else(|e| panic!("{e}"));
            let uses_switch = module
                .source()
                .lines()
                .any(|line| line.contains("FAST_MATH_EMULATION") && !line.starts_with("const "));
            assert_eq!(uses_switch, module == Module::Codec, "{}", module.name());
        }
    }

    #[test]
    fn every_module_validates_and_translates_to_msl() {
        for module in Module::ALL {
            let msl = to_msl(module).unwrap_or_else(|e| panic!("{e}"));
            assert!(msl.contains("kernel void"), "{}: no kernel in MSL", module.name());
        }
        // And with each kernel's own pipeline constants.
        for kernel in Kernel::all().into_iter().filter(|k| !k.overrides().is_empty()) {
            let msl = msl_with(
                kernel.module(),
                kernel.overrides(),
                ZERO_FILL_WORKGROUP_MEMORY,
                FORCE_LOOP_BOUNDING,
            )
            .unwrap_or_else(|e| panic!("{kernel:?}: {e}"));
            assert!(msl.contains(kernel.entry_point()), "{kernel:?}: no entry point in MSL");
        }
    }

    /// The Metal code the engine's pipelines get has no zero fill of workgroup memory at the
    /// start of a kernel: no statement `name = {};` for a workgroup variable `name` (with the
    /// fill on there is one).
    #[test]
    fn metal_kernels_do_not_zero_fill_workgroup_memory() {
        for module in Module::ALL {
            let (ir, _) = validate(module).unwrap();
            let fills: Vec<String> = ir
                .global_variables
                .iter()
                .filter(|(_, var)| var.space == naga::AddressSpace::WorkGroup)
                .filter_map(|(_, var)| var.name.as_ref().map(|name| format!("{name} = {{}};")))
                .collect();
            let has_fill = |msl: &str| msl.lines().any(|line| fills.iter().any(|fill| line.trim() == fill));
            assert!(
                !has_fill(&to_msl(module).unwrap()),
                "{}: zero fill in MSL",
                module.name()
            );
            if !fills.is_empty() {
                let filled = msl_with(module, &[], true, FORCE_LOOP_BOUNDING).unwrap();
                assert!(has_fill(&filled), "{}: the fill is not recognised", module.name());
            }
        }
    }

    /// Metal runs a pipeline whose register use caps its threadgroup below the workgroup
    /// size as a silent no-op (gfx-rs/wgpu#9176) unless the kernel declares its size: every
    /// entry point's MSL carries `[[max_total_threads_per_threadgroup(N)]]`, N its workgroup
    /// size, so Metal compiles it for N threads or fails the pipeline, an error the engine
    /// reports (`GpuError::Pipeline`).
    #[test]
    fn every_metal_kernel_declares_its_threadgroup_size() {
        for kernel in Kernel::all() {
            let msl = msl_with(
                kernel.module(),
                kernel.overrides(),
                ZERO_FILL_WORKGROUP_MEMORY,
                FORCE_LOOP_BOUNDING,
            )
            .unwrap();
            // naga's namer appends `_` to a name taken by another function of the module.
            let declared = |name: &str| {
                format!(
                    "[[max_total_threads_per_threadgroup({})]] kernel void {name}(",
                    kernel.workgroup_size()
                )
            };
            let entry = kernel.entry_point();
            assert!(
                msl.contains(&declared(entry)) || msl.contains(&declared(&format!("{entry}_"))),
                "{kernel:?}: no `{}` in its MSL",
                declared(entry)
            );
        }
    }

    /// What Metal's default fast math may break in a WGSL source (it assumes no NaN or
    /// infinity): a value compared with itself (a NaN test, which may fold to false) and a
    /// float literal past f32's range (an infinity). Comments are skipped.
    fn fast_math_hazards(source: &str) -> Vec<String> {
        let operand = |c: char| c.is_ascii_alphanumeric() || "_.[]".contains(c);
        let mut found = Vec::new();
        for (number, line) in source.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for op in ["==", "!="] {
                for (at, _) in code.match_indices(op) {
                    let left: String = code[..at]
                        .trim_end()
                        .chars()
                        .rev()
                        .take_while(|&c| operand(c))
                        .collect();
                    let left: String = left.chars().rev().collect();
                    let right: String = code[at + 2..]
                        .trim_start()
                        .chars()
                        .take_while(|&c| operand(c))
                        .collect();
                    if !left.is_empty() && left == right {
                        found.push(format!("line {}: `{left} {op} {right}`", number + 1));
                    }
                }
            }
            for token in code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '+')) {
                let literal = token.trim_start_matches(['-', '+']).trim_end_matches('f');
                let is_float = literal.starts_with(|c: char| c.is_ascii_digit()) && literal.contains(['.', 'e']);
                if let Ok(value) = literal.parse::<f64>()
                    && is_float
                    && value > f64::from(f32::MAX)
                {
                    found.push(format!("line {}: `{literal}` is past f32's range", number + 1));
                }
            }
        }
        found
    }

    /// No kernel relies on NaN or infinity: no self-comparison, no infinite literal
    /// (sentinels are finite, like attention's -3e38, or tested in integer bits, like
    /// `round_bf16`). The check finds both in a planted source.
    #[test]
    fn no_kernel_relies_on_nan_or_infinity() {
        for module in Module::ALL {
            let hazards = fast_math_hazards(&module.source());
            assert!(hazards.is_empty(), "{}: {hazards:?}", module.name());
        }
        let planted = "let m = -3.0e38; // 1e39 in a comment\nif (v != v) { return 1e39; }\nlet ok = a[i] == a[j];";
        assert_eq!(
            fast_math_hazards(planted),
            ["line 2: `v != v`", "line 2: `1e39` is past f32's range"]
        );
    }

    /// The Metal code the engine's pipelines get counts no loop's iterations (naga's
    /// `loop_bound` counters; with the counting on, the linear module has them).
    #[test]
    fn metal_kernels_do_not_count_loop_iterations() {
        for module in Module::ALL {
            assert!(
                !to_msl(module).unwrap().contains("loop_bound"),
                "{}: loop counters",
                module.name()
            );
        }
        let counted = msl_with(
            Module::Linear(WeightFormat::Nvfp4, LinearWidth::Standard),
            &[],
            ZERO_FILL_WORKGROUP_MEMORY,
            true,
        )
        .unwrap();
        assert!(counted.contains("loop_bound"), "the loop counters are not recognised");
    }

    /// [`Kernel::AttendAndCombine`]'s and [`Kernel::AttendBlocksAndCombine`]'s combine rests
    /// on naga's SPIR-V giving `storageBarrier` device memory scope with acquire-release
    /// semantics (what `Capabilities::device_barriers` claims for Vulkan): its every barrier
    /// over storage memory has them.
    #[test]
    fn storage_barriers_have_device_scope_in_spirv() {
        for kernel in [Kernel::AttendAndCombine, Kernel::AttendBlocksAndCombine] {
            assert_storage_barriers_have_device_scope(kernel);
        }
    }

    fn assert_storage_barriers_have_device_scope(kernel: Kernel) {
        let (ir, info) = specialised(kernel.module(), kernel.overrides()).unwrap();
        let pipeline = naga::back::spv::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: kernel.entry_point().to_string(),
        };
        let words =
            naga::back::spv::write_vec(&ir, &info, &naga::back::spv::Options::default(), Some(&pipeline)).unwrap();
        const OP_CONSTANT: u32 = 43;
        const OP_CONTROL_BARRIER: u32 = 224;
        const SCOPE_DEVICE: u32 = 1;
        const ACQUIRE_RELEASE: u32 = 0x8;
        const UNIFORM_MEMORY: u32 = 0x40;
        let mut constants = std::collections::HashMap::new();
        let mut barriers = Vec::new();
        let mut at = 5; // past the header
        while at < words.len() {
            let (count, opcode) = ((words[at] >> 16) as usize, words[at] & 0xffff);
            let operands = &words[at + 1..at + count];
            match opcode {
                OP_CONSTANT => {
                    constants.insert(operands[1], operands[2]);
                }
                OP_CONTROL_BARRIER => barriers.push([operands[1], operands[2]]),
                _ => {}
            }
            at += count;
        }
        let storage: Vec<[u32; 2]> = barriers
            .iter()
            .map(|ids| ids.map(|id| constants[&id]))
            .filter(|[_, semantics]| semantics & UNIFORM_MEMORY != 0)
            .collect();
        assert_eq!(storage.len(), 2, "{kernel:?}: the two storage barriers: {barriers:?}");
        for [scope, semantics] in storage {
            assert_eq!(scope, SCOPE_DEVICE);
            assert_ne!(semantics & ACQUIRE_RELEASE, 0);
        }
    }

    /// The value of the WGSL `const` named `name` (a u32 literal) in `module`.
    fn wgsl_u32(module: Module, name: &str) -> u32 {
        let (ir, _) = validate(module).unwrap();
        let (_, constant) = ir
            .constants
            .iter()
            .find(|(_, c)| c.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("{}: no const {name}", module.name()));
        match ir.global_expressions[constant.init] {
            naga::Expression::Literal(naga::Literal::U32(value)) => value,
            ref other => panic!("{}: {name} is {other:?}", module.name()),
        }
    }

    /// The sizes the host plans with are the ones the WGSL is written for.
    #[test]
    fn host_constants_match_the_wgsl() {
        for format in [WeightFormat::Bf16, WeightFormat::Nvfp4, WeightFormat::Fp8Block] {
            for width in LinearWidth::ALL {
                let linear = Module::Linear(format, width);
                assert_eq!(wgsl_u32(linear, "PASS_ROWS") as usize, LINEAR_PASS_ROWS);
                assert_eq!(wgsl_u32(linear, "GROUP_SLOTS") as usize, EXPERT_GROUP_SLOTS);
                assert_eq!(wgsl_u32(linear, "LANES"), format.thread_row_lanes());
                assert_eq!(wgsl_u32(linear, "UNIT") as usize, format.width_multiple());
                assert_eq!(wgsl_u32(linear, "WG"), width.invocations());
            }
        }
        assert_eq!(wgsl_u32(Module::Attention, "CHUNK") as usize, ATTENTION_CHUNK);
        assert_eq!(wgsl_u32(Module::Moe, "GROUP_SLOTS") as usize, EXPERT_GROUP_SLOTS);
        assert_eq!(wgsl_u32(Module::Moe, "MAX_EXPERTS") as usize, MAX_KEPT_EXPERTS);
        let router = Module::Router(KeptCapacity::ALL[0]);
        assert_eq!(wgsl_u32(router, "MAX_GROUPS") as usize, MAX_EXPERT_GROUPS);
        assert_eq!(wgsl_u32(router, "MAX_K") as usize, MAX_ROUTED_PER_TOKEN);
        for capacity in KeptCapacity::ALL {
            assert_eq!(
                wgsl_u32(Module::Router(capacity), "MAX_KEPT") as usize,
                capacity.experts()
            );
        }
        let largest = KeptCapacity::ALL[KeptCapacity::ALL.len() - 1];
        assert_eq!(largest.experts(), MAX_KEPT_EXPERTS);
    }

    #[test]
    fn every_kernel_entry_point_exists_with_its_bindings() {
        for kernel in Kernel::all() {
            let (ir, workgroup_size, uses) = entry_point_uses(kernel);
            assert_eq!(workgroup_size, [kernel.workgroup_size(), 1, 1]);
            let mut used: Vec<u32> = uses
                .iter()
                .filter_map(|&handle| ir.global_variables[handle].binding.as_ref().map(|b| b.binding))
                .collect();
            used.sort_unstable();
            assert_eq!(used, kernel.bindings(), "{kernel:?}: bindings used by the WGSL");
        }
    }

    /// Every parameter block a kernel's registry entry names is a uniform the size of the
    /// host struct the engine writes into it.
    #[test]
    fn every_parameter_block_has_its_host_size() {
        for kernel in Kernel::all() {
            let spec = kernel.spec();
            assert_eq!(
                Some(&spec.bindings[0]),
                spec.params.first().map(|(b, _)| b),
                "{kernel:?}"
            );
            let (ir, _, uses) = entry_point_uses(kernel);
            for &(binding, block) in spec.params {
                let var = uses
                    .iter()
                    .map(|&handle| &ir.global_variables[handle])
                    .find(|var| var.binding.as_ref().is_some_and(|b| b.binding == binding))
                    .unwrap_or_else(|| panic!("{kernel:?}: no binding {binding}"));
                assert_eq!(var.space, naga::AddressSpace::Uniform, "{kernel:?}: binding {binding}");
                let bytes = ir.types[var.ty].inner.size(ir.to_ctx()) as usize;
                assert_eq!(bytes, block.bytes(), "{kernel:?}: {block:?} at binding {binding}");
            }
        }
    }

    /// Every entry point's workgroup memory fits what the engine asks of a device.
    #[test]
    fn every_kernel_fits_the_workgroup_memory_required() {
        for kernel in Kernel::all() {
            let (ir, _, uses) = entry_point_uses(kernel);
            let bytes: u32 = uses
                .iter()
                .map(|&handle| &ir.global_variables[handle])
                .filter(|var| var.space == naga::AddressSpace::WorkGroup)
                .map(|var| ir.types[var.ty].inner.size(ir.to_ctx()))
                .sum();
            assert!(
                bytes <= WORKGROUP_MEMORY_BYTES,
                "{kernel:?}: {bytes} bytes of workgroup memory"
            );
        }
    }

    /// A kernel's validated module, its entry point's workgroup size, and the global
    /// variables the entry point uses.
    fn entry_point_uses(kernel: Kernel) -> (naga::Module, [u32; 3], Vec<naga::Handle<naga::GlobalVariable>>) {
        let (ir, info) = validate(kernel.module()).unwrap();
        let index = ir
            .entry_points
            .iter()
            .position(|e| e.name == kernel.entry_point())
            .unwrap_or_else(|| panic!("{kernel:?}: no entry point"));
        let uses = ir
            .global_variables
            .iter()
            .filter(|(handle, _)| !info.get_entry_point(index)[*handle].is_empty())
            .map(|(handle, _)| handle)
            .collect();
        let workgroup_size = ir.entry_points[index].workgroup_size;
        (ir, workgroup_size, uses)
    }
}
