//! Weights on the GPU, exactly as stored in the checkpoint (no conversion, no expansion),
//! split along their outermost dimension so no binding exceeds the device's storage-binding
//! limit. Only small per-segment staging copies are made on the host.

use std::collections::HashMap;
use std::ops::Range;

use drama_graph::ir::{LinearMember, Projection};
use drama_graph::select::{stacks, stacks_expert_swiglu};
use drama_kernels::WeightFormat;

use crate::error::EngineError;
use crate::gpu::{Gpu, Stager, bytes_of};
use drama_checkpoint::linear::FP8_BLOCK;
use drama_checkpoint::{Checkpoint, LayerMlp, LinearFormat, names};

/// One piece of a split weight: output rows (dense) or local experts (routed) it covers.
pub struct Segment {
    /// Rows or experts covered.
    pub range: Range<usize>,
    /// Codes (BF16 pairs, NVFP4 nibbles, FP8 bytes).
    pub codes: wgpu::Buffer,
    /// NVFP4 block scales or FP8 tile scales (a placeholder for BF16).
    pub scales: wgpu::Buffer,
    /// Routed experts: one tensor scale per expert of the segment.
    pub expert_scales: Option<wgpu::Buffer>,
}

/// A linear (dense, or all experts of one projection of a layer) on the GPU.
pub struct GpuLinear {
    /// Kernel format.
    pub format: WeightFormat,
    /// Output features (per expert).
    pub out: usize,
    /// Input features.
    pub in_features: usize,
    /// The pieces.
    pub segments: Vec<Segment>,
    /// BF16 bias.
    pub bias: Option<wgpu::Buffer>,
    /// NVFP4 tensor scale (1 otherwise); dense linears only.
    pub tensor_scale: f32,
}

impl GpuLinear {
    /// A bias-free linear of `out` rows held in one segment of raw `codes` and `scales` (as
    /// stored; a placeholder for BF16), tensor scale 1: what benchmarks and kernel tests
    /// launch without a checkpoint.
    pub fn one_segment(
        gpu: &Gpu,
        format: WeightFormat,
        (out, in_features): (usize, usize),
        codes: &[u8],
        scales: &[u8],
    ) -> GpuLinear {
        GpuLinear {
            format,
            out,
            in_features,
            segments: vec![Segment {
                range: 0..out,
                codes: gpu.buffer_with("w", codes),
                scales: gpu.buffer_with("scales", scales),
                expert_scales: None,
            }],
            bias: None,
            tensor_scale: 1.0,
        }
    }
}

/// A BF16 table (embeddings) split by rows.
pub struct GpuTable {
    /// Row width.
    pub width: usize,
    /// Pieces: rows covered and their data.
    pub segments: Vec<(Range<usize>, wgpu::Buffer)>,
}

impl GpuTable {
    /// What launch `i` of a step's embedding binds of this table: segment `i`'s rows and
    /// data, or past the last segment no rows and the first segment's data (bound, never
    /// read). None for a table without rows.
    pub fn launch_segment(&self, i: usize) -> Option<(Range<usize>, &wgpu::Buffer)> {
        let (_, first) = self.segments.first()?;
        Some(
            self.segments
                .get(i)
                .map_or((0..0, first), |(rows, data)| (rows.clone(), data)),
        )
    }
}

/// Every backbone weight on the GPU.
pub struct GpuWeights {
    /// Dense linears and 2-D matrices used as linears, by weight name, or stacked groups by
    /// [`stack_key`].
    pub linears: HashMap<String, GpuLinear>,
    /// Routed experts by (layer, projections stacked per expert): `[Gate, Up]` when stacked
    /// for the SwiGLU epilogue, else one projection each.
    pub experts: HashMap<(usize, Vec<Projection>), GpuLinear>,
    /// Embedding tables by tensor name.
    pub tables: HashMap<String, GpuTable>,
    /// Norm weights and other BF16 vectors by tensor name.
    pub vectors: HashMap<String, wgpu::Buffer>,
    /// Kept original expert ids per MoE layer (u32).
    pub kept_ids: HashMap<usize, wgpu::Buffer>,
    /// Selection bias per MoE layer (f32, as stored).
    pub score_bias: HashMap<usize, wgpu::Buffer>,
    /// A placeholder for unused bindings (16 bytes: one vec4, the least any binding takes).
    pub placeholder: wgpu::Buffer,
    /// Bytes uploaded.
    pub bytes: u64,
}

/// A dense linear's storage facts.
#[derive(Clone, Copy)]
struct Stored {
    format: LinearFormat,
    out: usize,
    in_: usize,
    has_bias: bool,
    tensor_scale: f32,
}

struct Uploader<'a> {
    checkpoint: &'a Checkpoint,
    limit: usize,
    bytes: u64,
    stager: Stager<'a>,
}

impl<'a> Uploader<'a> {
    fn new(gpu: &'a Gpu, checkpoint: &'a Checkpoint) -> Uploader<'a> {
        Uploader {
            checkpoint,
            limit: usize::try_from(gpu.caps.max_storage_binding).unwrap_or(usize::MAX),
            bytes: 0,
            stager: Stager::new(gpu),
        }
    }

    fn raw(&self, name: &str) -> &'a [u8] {
        let entry = self.checkpoint.weights.entry(name).expect("validated tensor");
        self.checkpoint.weights.bytes(entry)
    }

    fn buffer(&mut self, label: &str, bytes: &[u8]) -> Result<wgpu::Buffer, EngineError> {
        self.gathered(label, &[bytes])
    }

    /// A buffer of `pieces` one after another, copied straight from the checkpoint (see
    /// [`Stager`]).
    fn gathered(&mut self, label: &str, pieces: &[&[u8]]) -> Result<wgpu::Buffer, EngineError> {
        self.bytes += pieces.iter().map(|piece| piece.len() as u64).sum::<u64>();
        Ok(self.stager.buffer(label, pieces)?)
    }

    /// Waits until every buffer holds its bytes; returns the bytes uploaded.
    fn finish(self) -> Result<u64, EngineError> {
        self.stager.finish()?;
        Ok(self.bytes)
    }

    /// Rows per segment for `row_bytes` per row, a multiple of `align`, within the limit
    /// and the 65535-workgroup dispatch limit.
    fn rows_per_segment(&self, what: &str, row_bytes: usize, align: usize) -> Result<usize, EngineError> {
        let fit = (self.limit / row_bytes.max(1)).min(65535);
        let rows = fit / align * align;
        if rows == 0 {
            return Err(EngineError::Unsupported(format!(
                "{what}: {align} row(s) of {row_bytes} bytes (the smallest segment) do not fit the device's storage-binding limit of {} bytes",
                self.limit
            )));
        }
        Ok(rows)
    }

    /// The row multiple of a dense linear's segments: whole attention heads (a [q|k|v]
    /// projection rotates and caches keys head by head) and whole scale tiles of `tile` rows.
    fn dense_row_align(&self, tile: usize) -> usize {
        let head = self.checkpoint.config.head_dim;
        (1..=head)
            .map(|n| n * tile)
            .find(|rows| rows % head == 0)
            .unwrap_or(head * tile)
    }

    /// How a dense linear (module) or a 2-D BF16 matrix (a bias-free linear) is stored.
    fn stored(&self, weight: &str) -> Stored {
        match self.checkpoint.linear(weight) {
            Some(info) => Stored {
                format: info.format,
                out: info.shape[0],
                in_: info.shape[1],
                has_bias: info.has_bias,
                tensor_scale: info.tensor_scale,
            },
            None => {
                let entry = self.checkpoint.weights.entry(weight).expect("validated tensor");
                Stored {
                    format: LinearFormat::Bf16,
                    out: entry.shape[0],
                    in_: entry.shape[1],
                    has_bias: false,
                    tensor_scale: 1.0,
                }
            }
        }
    }

    /// Several BF16 linears over one input as one: their rows placed one after another in
    /// the same buffers (bytes as stored), so a single launch computes them all.
    fn stacked(&mut self, modules: &[String]) -> Result<GpuLinear, EngineError> {
        let stored: Vec<Stored> = modules.iter().map(|m| self.stored(m)).collect();
        let first = stored[0];
        let label = modules.join(" + ");
        if !stored
            .iter()
            .all(|s| s.format == LinearFormat::Bf16 && s.in_ == first.in_ && s.has_bias == first.has_bias)
        {
            return Err(EngineError::Unsupported(format!(
                "{label}: only BF16 linears of one input width, all with or all without a bias, can be stacked"
            )));
        }
        let row_bytes = code_bytes_per_row(first.format, first.in_);
        let mut codes = Vec::new();
        let mut bias = Vec::new();
        for (module, s) in modules.iter().zip(&stored) {
            let is_module = self.checkpoint.linear(module).is_some();
            codes.push(self.raw(&codes_tensor(module, s.format, is_module)));
            if s.has_bias {
                bias.push(self.raw(&format!("{module}.bias")));
            }
        }
        let out: usize = stored.iter().map(|s| s.out).sum();
        let per = self.rows_per_segment(&label, row_bytes, self.dense_row_align(1))?;
        let bias = first.has_bias.then(|| self.gathered(&label, &bias)).transpose()?;
        self.bf16_stack(&label, out, first.in_, per, bias, |_, rows| {
            bytes_of(&codes, rows.start * row_bytes..rows.end * row_bytes)
        })
    }

    /// A BF16 [gate, up] pair stacked for the SwiGLU epilogue: each segment covers
    /// features a..b and holds gate rows a..b, then up rows a..b, so a launch always sees
    /// both halves of its features.
    fn stacked_swiglu(&mut self, gate: &str, up: &str) -> Result<GpuLinear, EngineError> {
        let (g, u) = (self.stored(gate), self.stored(up));
        let label = format!("{gate} + {up}");
        if g.format != LinearFormat::Bf16
            || u.format != LinearFormat::Bf16
            || g.has_bias
            || u.has_bias
            || g.out != u.out
            || g.in_ != u.in_
        {
            return Err(EngineError::Unsupported(format!(
                "{label}: a SwiGLU stack needs two bias-free BF16 linears of one shape"
            )));
        }
        let row_bytes = code_bytes_per_row(g.format, g.in_);
        let per = self.rows_per_segment(&label, 2 * row_bytes, 1)?;
        let is_module = |m: &str| self.checkpoint.linear(m).is_some();
        let (gate_codes, up_codes) = (
            codes_tensor(gate, g.format, is_module(gate)),
            codes_tensor(up, u.format, is_module(up)),
        );
        self.bf16_stack(&label, g.out, g.in_, per, None, |uploader, rows| {
            let bytes = rows.start * row_bytes..rows.end * row_bytes;
            vec![
                &uploader.raw(&gate_codes)[bytes.clone()],
                &uploader.raw(&up_codes)[bytes],
            ]
        })
    }

    /// A stacked BF16 linear of `out` rows (features) in segments of `per`: `codes(self,
    /// rows)` gives the pieces of the checkpoint that make the segment covering `rows`.
    fn bf16_stack(
        &mut self,
        label: &str,
        out: usize,
        in_features: usize,
        per: usize,
        bias: Option<wgpu::Buffer>,
        codes: impl Fn(&Self, std::ops::Range<usize>) -> Vec<&'a [u8]>,
    ) -> Result<GpuLinear, EngineError> {
        let mut segments = Vec::new();
        for start in (0..out).step_by(per) {
            let range = start..(start + per).min(out);
            let pieces = codes(self, range.clone());
            segments.push(Segment {
                codes: self.gathered(label, &pieces)?,
                scales: self.buffer(label, &NO_SCALES)?,
                expert_scales: None,
                range,
            });
        }
        Ok(GpuLinear {
            format: WeightFormat::Bf16,
            out,
            in_features,
            segments,
            bias,
            tensor_scale: 1.0,
        })
    }

    /// A dense linear (module) or a 2-D BF16 matrix used as a bias-free linear.
    fn linear(&mut self, weight: &str) -> Result<GpuLinear, EngineError> {
        let Stored {
            format,
            out,
            in_,
            has_bias,
            tensor_scale,
        } = self.stored(weight);
        let codes_name = codes_tensor(weight, format, self.checkpoint.linear(weight).is_some());
        let row_bytes = code_bytes_per_row(format, in_);
        let tile = if format == LinearFormat::Fp8Block { FP8_BLOCK } else { 1 };
        let per = self.rows_per_segment(weight, row_bytes, self.dense_row_align(tile))?;
        let mut segments = Vec::new();
        for start in (0..out).step_by(per) {
            let range = start..(start + per).min(out);
            let codes = &self.raw(&codes_name)[range.start * row_bytes..range.end * row_bytes];
            let scales = self.scales(weight, format, out, in_, range.clone());
            segments.push(Segment {
                codes: self.buffer(weight, codes)?,
                scales: self.buffer(weight, scales)?,
                expert_scales: None,
                range,
            });
        }
        let bias = if has_bias {
            let bytes = self.raw(&format!("{weight}.bias"));
            Some(self.buffer(weight, bytes)?)
        } else {
            None
        };
        Ok(GpuLinear {
            format: format.kernel_format(),
            out,
            in_features: in_,
            segments,
            bias,
            tensor_scale,
        })
    }

    /// Scale bytes of rows `range` of a linear (BF16 has none: four zero bytes stand in).
    fn scales(&self, module: &str, format: LinearFormat, out: usize, in_: usize, range: Range<usize>) -> &'a [u8] {
        match format {
            LinearFormat::Bf16 => &NO_SCALES,
            LinearFormat::Nvfp4ModelOpt | LinearFormat::Nvfp4CompressedTensors => {
                let per_row = in_ / 16;
                &self.raw(&format!("{module}.weight_scale"))[range.start * per_row..range.end * per_row]
            }
            LinearFormat::Fp8Block => {
                let per_tile_row = in_.div_ceil(FP8_BLOCK) * 4;
                let tiles = range.start / FP8_BLOCK..range.end.div_ceil(FP8_BLOCK).min(out.div_ceil(FP8_BLOCK));
                &self.raw(&format!("{module}.weight_scale_inv"))[tiles.start * per_tile_row..tiles.end * per_tile_row]
            }
        }
    }

    /// All kept experts of a layer for one projection, or for several stacked per expert
    /// (gate rows then up rows), concatenated expert after expert. Stacked experts keep one
    /// tensor scale per projection: `expert_scales` holds them expert by expert.
    fn experts(&mut self, layer: usize, projections: &[Projection], kept: &[usize]) -> Result<GpuLinear, EngineError> {
        let modules: Vec<Vec<String>> = kept
            .iter()
            .map(|&e| {
                projections
                    .iter()
                    .map(|&p| names::expert(names::EXPERT[p as usize], layer, e))
                    .collect()
            })
            .collect();
        let info = self.checkpoint.linear(&modules[0][0]).expect("validated expert");
        // One format per projection across the layer: `checkpoint::limits` refuses others
        // when the checkpoint opens.
        let (format, out, in_) = (info.format, info.shape[0], info.shape[1]);
        let label = &modules[0][0];
        let expert_bytes = code_bytes_per_row(format, in_) * out * projections.len();
        let per = self.rows_per_segment(label, expert_bytes, 1)?;
        let codes_name = |m: &str| codes_tensor(m, format, true);
        let mut segments = Vec::new();
        for start in (0..kept.len()).step_by(per) {
            let range = start..(start + per).min(kept.len());
            let mut codes = Vec::new();
            let mut scales = Vec::new();
            let mut tensor_scales = Vec::new();
            for module in modules[range.clone()].iter().flatten() {
                codes.push(self.raw(&codes_name(module)));
                scales.push(self.scales(module, format, out, in_, 0..out));
                tensor_scales.push(self.checkpoint.linear(module).expect("validated").tensor_scale);
            }
            if format == LinearFormat::Bf16 {
                scales = vec![&NO_SCALES];
            }
            let first = &modules[range.start][0];
            let expert_scales = self.buffer(first, bytemuck::cast_slice(&tensor_scales))?;
            segments.push(Segment {
                codes: self.gathered(first, &codes)?,
                scales: self.gathered(first, &scales)?,
                expert_scales: Some(expert_scales),
                range,
            });
        }
        Ok(GpuLinear {
            format: format.kernel_format(),
            out: out * projections.len(),
            in_features: in_,
            segments,
            bias: None,
            tensor_scale: 1.0,
        })
    }

    fn table(&mut self, name: &str) -> Result<GpuTable, EngineError> {
        let entry = self.checkpoint.weights.entry(name).expect("validated tensor");
        let (rows, width) = (entry.shape[0], entry.shape[1]);
        // Segments start on even elements so BF16 pairs never straddle two buffers.
        let per = self.rows_per_segment(name, width * 2, if width % 2 == 0 { 1 } else { 2 })?;
        let mut segments = Vec::new();
        for start in (0..rows).step_by(per) {
            let range = start..(start + per).min(rows);
            let bytes = &self.raw(name)[range.start * width * 2..range.end * width * 2];
            segments.push((range, self.buffer(name, bytes)?));
        }
        Ok(GpuTable { width, segments })
    }
}

/// What a format without scales binds as its scales.
const NO_SCALES: [u8; 4] = [0; 4];

/// The key a stacked group of linears is found under in [`GpuWeights::linears`]: its
/// members' weight names joined by `+`.
pub fn stack_key(members: &[LinearMember]) -> String {
    members.iter().map(|m| m.weight.as_str()).collect::<Vec<_>>().join("+")
}

fn codes_tensor(module: &str, format: LinearFormat, is_module: bool) -> String {
    match (is_module, format) {
        (false, _) => module.to_string(),
        (true, LinearFormat::Nvfp4CompressedTensors) => format!("{module}.weight_packed"),
        (true, _) => format!("{module}.weight"),
    }
}

fn code_bytes_per_row(format: LinearFormat, in_: usize) -> usize {
    match format {
        LinearFormat::Bf16 => in_ * 2,
        LinearFormat::Nvfp4ModelOpt | LinearFormat::Nvfp4CompressedTensors => in_ / 2,
        LinearFormat::Fp8Block => in_,
    }
}

/// Uploads one linear module (or 2-D BF16 matrix used as a linear) of a validated checkpoint.
pub fn upload_linear(gpu: &Gpu, checkpoint: &Checkpoint, weight: &str) -> Result<GpuLinear, EngineError> {
    let mut up = Uploader::new(gpu, checkpoint);
    let linear = up.linear(weight)?;
    up.finish()?;
    Ok(linear)
}

impl GpuWeights {
    /// Uploads every backbone weight of a validated checkpoint. `linear_groups` are the
    /// members of the step graph's linear nodes and whether each computes a SwiGLU: SwiGLU
    /// pairs and the groups [`stacks`] names are stacked (found under their weight names
    /// joined by `+`), the others uploaded member by member. Routed experts whose gate and
    /// up formats [`stacks_expert_swiglu`] are stacked per expert under `[Gate, Up]`.
    pub fn upload(
        gpu: &Gpu,
        checkpoint: &Checkpoint,
        linear_groups: &[(Vec<LinearMember>, bool)],
    ) -> Result<GpuWeights, EngineError> {
        let mut up = Uploader::new(gpu, checkpoint);
        let mut linears = HashMap::new();
        let mut experts = HashMap::new();
        let mut vectors = HashMap::new();
        let mut kept_ids = HashMap::new();
        let mut score_bias = HashMap::new();
        let mut norms = vec![names::FINAL_NORM.to_string()];
        for (i, mlp) in checkpoint.layers.iter().enumerate() {
            norms.push(names::layer(names::INPUT_NORM, i));
            norms.push(names::layer(names::POST_ATTN_NORM, i));
            if let LayerMlp::Moe(moe) = mlp {
                let format = |p: Projection| {
                    let module = names::expert(names::EXPERT[p as usize], i, moe.kept_expert_ids[0]);
                    checkpoint
                        .linear(&module)
                        .expect("validated expert")
                        .format
                        .kernel_format()
                };
                let stacks = if stacks_expert_swiglu(format(Projection::Gate), format(Projection::Up)) {
                    vec![vec![Projection::Gate, Projection::Up], vec![Projection::Down]]
                } else {
                    vec![vec![Projection::Gate], vec![Projection::Up], vec![Projection::Down]]
                };
                for projections in stacks {
                    let linear = up.experts(i, &projections, &moe.kept_expert_ids)?;
                    experts.insert((i, projections), linear);
                }
                let ids: Vec<u32> = moe.kept_expert_ids.iter().map(|&e| e as u32).collect();
                kept_ids.insert(i, up.buffer("kept_expert_ids", bytemuck::cast_slice(&ids))?);
                if moe.has_score_bias {
                    let bytes = up.raw(&names::layer(names::ROUTER_BIAS, i));
                    score_bias.insert(i, up.buffer("score_bias", bytes)?);
                }
            }
        }
        for (group, swiglu) in linear_groups {
            let names: Vec<String> = group.iter().map(|m| m.weight.clone()).collect();
            if *swiglu {
                linears.insert(stack_key(group), up.stacked_swiglu(&names[0], &names[1])?);
                continue;
            }
            if stacks(group) {
                linears.insert(stack_key(group), up.stacked(&names)?);
                continue;
            }
            for weight in names {
                if let std::collections::hash_map::Entry::Vacant(slot) = linears.entry(weight) {
                    let linear = up.linear(slot.key())?;
                    slot.insert(linear);
                }
            }
        }
        for norm in norms {
            let bytes = up.raw(&norm);
            vectors.insert(norm.clone(), up.buffer(&norm, bytes)?);
        }
        let mut tables = HashMap::new();
        for table in [names::EMBED_TOKENS, names::AUDIO_EMBED] {
            tables.insert(table.to_string(), up.table(table)?);
        }
        let placeholder = gpu.buffer("placeholder", 16);
        let bytes = up.finish()?;
        Ok(GpuWeights {
            linears,
            experts,
            tables,
            vectors,
            kept_ids,
            score_bias,
            placeholder,
            bytes,
        })
    }
}
