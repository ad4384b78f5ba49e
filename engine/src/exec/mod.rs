//! Lowering a graph to GPU work: every node becomes one or more kernel launches with their
//! parameter blocks and bind groups, all built once. Running a step is one command encoder,
//! one compute pass, one submit.

use std::collections::HashMap;

use drama_graph::drama3::{STEP_INPUTS, StepShape};
use drama_graph::ir::{CacheWrite, LinearMember, NormOutput, Op, PairHalf, Projection, RouterOp, ValueKind};
use drama_graph::plan::{MemoryPlan, plan};
use drama_graph::select::stacks;
use drama_graph::{Graph, ValueId};
use drama_kernels::flags::{self, bit};
use drama_kernels::{
    AttentionParams, ElementwiseParams, GroupParams, KeptCapacity, Kernel, LINEAR_PASS_ROWS, LinearInput, LinearParams,
    LinearWidth, MAX_KEPT_EXPERTS, NormParams, RouterParams, WeightFormat,
};

mod attention_grids;

pub use attention_grids::LaunchSet;
use attention_grids::{AttentionGrids, AttentionShape};

use crate::error::EngineError;
use crate::gpu::{Dispatch, Gpu, Readback};
use crate::weights::{GpuLinear, GpuWeights, Segment, stack_key};

/// A compiled step: planned buffers and the recorded launches.
pub struct Executable {
    /// The graph it runs.
    pub graph: Graph,
    /// Its memory plan.
    pub plan: MemoryPlan,
    /// The step shape.
    pub shape: StepShape,
    buffers: Vec<wgpu::Buffer>,
    dispatches: Vec<Dispatch>,
    /// The launches of each node: a range of `dispatches`, in node order.
    node_dispatches: Vec<std::ops::Range<usize>>,
    /// The host-written inputs, in [`STEP_INPUTS`] order.
    inputs: [ValueId; STEP_INPUTS.len()],
    /// The audio logits (the step's output).
    logits: ValueId,
    /// Where [`Executable::encode`]'d steps copy their logits for the host.
    logits_readback: Readback,
    /// The attention launches' workgroup counts, written with each step's inputs.
    attention_grids: AttentionGrids,
    /// The indices in `dispatches` of the attention launches of each kind, [a workgroup per
    /// head, blocks of heads]: a run leaves out those of a kind the step has no rows of.
    attention_launches: [Vec<usize>; 2],
    /// What the last [`Executable::write_inputs`] wrote into each input buffer (in
    /// [`STEP_INPUTS`] order) and into the two attention grids: writing the same words again is
    /// skipped, so a decode step writes only what moved (its tokens and positions). Each
    /// write is a staging buffer wgpu makes and frees, on the host between two steps.
    written: std::sync::Mutex<Vec<Vec<u32>>>,
    /// The bytes of its own buffers (see [`Executable::device_bytes`]).
    device_bytes: u64,
}

/// What an [`Op::Linear`] asks of its launches besides its weights and buffers.
struct LinearSettings {
    /// Round outputs to BF16.
    round: bool,
    /// The members are a [gate, up] stack computing silu(gate) * up.
    swiglu: bool,
    /// How the launch reads x.
    input: LinearInput,
    /// Floats per output row.
    y_stride: usize,
}

/// Everything a step binds besides its own buffers.
pub struct Bindings<'a> {
    /// Weights.
    pub weights: &'a GpuWeights,
    /// Session state by name: the KV caches (`layers.{i}.k_cache`) and the voice-prefix
    /// table (`prefixes`).
    pub states: &'a HashMap<String, wgpu::Buffer>,
    /// RoPE cos/sin table.
    pub rope_table: &'a wgpu::Buffer,
}

struct Lowering<'a> {
    gpu: &'a Gpu,
    graph: &'a Graph,
    plan: &'a MemoryPlan,
    buffers: &'a [wgpu::Buffer],
    bind: &'a Bindings<'a>,
    scratch: wgpu::Buffer,
    /// Each (row, head)'s count of finished attention chunks, zero between launches
    /// (`Kernel::AttendAndCombine`; wgpu creates buffers zeroed).
    chunks_done: wgpu::Buffer,
    /// The attention launches' workgroup counts, written before each step.
    attention_grids: AttentionGrids,
    capacity: usize,
    dispatches: Vec<Dispatch>,
    /// See [`Executable`]'s field of the same name.
    attention_launches: [Vec<usize>; 2],
}

impl<'a> Lowering<'a> {
    fn buffer(&self, id: ValueId) -> Result<&'a wgpu::Buffer, EngineError> {
        let value = self.graph.value(id);
        if value.kind == ValueKind::State {
            return self
                .bind
                .states
                .get(&value.name)
                .ok_or_else(|| EngineError::Unsupported(format!("no state buffer {}", value.name)));
        }
        let index = self.plan.value_buffer[id.0].expect("planned value");
        Ok(&self.buffers[index])
    }

    fn launch<T: bytemuck::Pod>(
        &mut self,
        kernel: Kernel,
        params: &T,
        resources: &[&wgpu::Buffer],
        workgroups: [u32; 3],
    ) -> Result<(), EngineError> {
        self.dispatches
            .push(self.gpu.dispatch(kernel, params, resources, workgroups)?);
        Ok(())
    }

    fn elements_grid(&self, count: usize) -> [u32; 3] {
        self.gpu.elements_grid(count)
    }

    fn rows(&self, id: ValueId) -> usize {
        self.graph.value(id).shape[0]
    }

    /// The buffers of a node's values (`ids`: its inputs or outputs), named by the caller's
    /// pattern; an error if the node has another count.
    fn buffers<const N: usize>(&self, ids: &[ValueId]) -> Result<[&'a wgpu::Buffer; N], EngineError> {
        let buffers = ids.iter().map(|&id| self.buffer(id)).collect::<Result<Vec<_>, _>>()?;
        buffers.try_into().map_err(|found: Vec<_>| {
            EngineError::Unsupported(format!("a node with {} values where {N} were expected", found.len()))
        })
    }

    /// Lowers one node, by its op.
    fn lower(&mut self, node: &drama_graph::Node) -> Result<(), EngineError> {
        match &node.op {
            Op::Embed { text, audio } => self.embed(node, text, audio),
            Op::RmsNorm { weight, eps, output } => self.rms_norm(node, weight, *eps, *output),
            Op::Linear {
                members,
                in_features,
                round_output,
                residual: _,
                swiglu,
                cache_write,
                // Lowered like any linear: its output has a buffer no earlier node used and
                // its input was made visible by routing's barrier, so wgpu records none.
                beside: _,
                input,
            } => {
                let settings = LinearSettings {
                    round: *round_output,
                    swiglu: *swiglu,
                    input: *input,
                    y_stride: members.iter().map(|m| m.out).sum(),
                };
                self.linear(node, members, *in_features, cache_write.as_ref(), settings)
            }
            Op::LinearPair {
                first,
                second,
                in_features,
                input,
            } => self.linear_pair(node, [first, second], *in_features, *input),
            Op::Attention {
                heads,
                kv_heads,
                head_dim,
                round_output,
                last_chunk_combines,
            } => {
                let params =
                    self.attention_params(self.rows(node.inputs[0]), *heads, *kv_heads, *head_dim, *round_output);
                self.attention(node, &params, *heads, *last_chunk_combines)
            }
            Op::Router { route, linear } => self.router(node, route, linear.as_ref()),
            Op::Experts {
                layer,
                projections,
                out,
                in_features,
                k,
                swiglu,
                grouped: _,
                workgroup,
            } => {
                let shape = ExpertShape {
                    slots: self.rows(node.inputs[1]) * k,
                    k: *k,
                    width: *out,
                    in_features: *in_features,
                    workgroup: *workgroup,
                };
                self.experts(node, *layer, projections, *swiglu, shape)
            }
            Op::GroupSlots { experts } => self.group_slots(node, *experts),
            Op::PackBf16 => self.pack_bf16(node),
            Op::Swiglu { round_output } => self.swiglu(node, *round_output),
            Op::MoeCombineNorm {
                k,
                shared: _,
                weight,
                eps,
                output,
            } => self.moe_combine_norm(node, *k, weight, *eps, *output),
            Op::MoeCombine { .. } => Err(EngineError::Unsupported(format!(
                "{}: a plain graph's combine runs only once the passes fuse it into the norm after it",
                node.label
            ))),
        }
    }

    /// [`Op::Embed`]: inputs row_table, row_index, prefixes.
    fn embed(&mut self, node: &drama_graph::Node, text: &str, audio: &str) -> Result<(), EngineError> {
        let [table, index, prefixes] = self.buffers(&node.inputs)?;
        let [out] = self.buffers(&node.outputs)?;
        let rows = self.rows(node.inputs[0]);
        let width = self.graph.value(node.outputs[0]).shape[1];
        let grid = self.elements_grid(rows * width);
        // Launch i takes segment i of each table, the first the prefixes too.
        let weights = self.bind.weights;
        let (text, audio) = (&weights.tables[text], &weights.tables[audio]);
        for i in 0..text.segments.len().max(audio.segments.len()) {
            let (Some((text_rows, text_data)), Some((audio_rows, audio_data))) =
                (text.launch_segment(i), audio.launch_segment(i))
            else {
                return Err(EngineError::Unsupported("an embedding table without rows".into()));
            };
            let params = ElementwiseParams::embed(rows, width, text_rows, audio_rows, i == 0);
            self.launch(
                Kernel::Embed,
                &params,
                &[prefixes, audio_data, text_data, table, index, out],
                grid,
            )?;
        }
        Ok(())
    }

    /// [`Op::RmsNorm`]: input x.
    fn rms_norm(
        &mut self,
        node: &drama_graph::Node,
        weight: &str,
        eps: f32,
        output: NormOutput,
    ) -> Result<(), EngineError> {
        let [x] = self.buffers(&node.inputs)?;
        let [out] = self.buffers(&node.outputs)?;
        let shape = &self.graph.value(node.inputs[0]).shape;
        let params = NormParams {
            width: shape[1] as u32,
            flags: norm_output_flags(output),
            eps,
            ..Default::default()
        };
        let rows = shape[0] as u32;
        // The output at both of its bindings (f32 and BF16 pairs); the flags say which the
        // kernel writes.
        self.launch(
            Kernel::RmsNorm,
            &params,
            &[x, &self.bind.weights.vectors[weight], out, out],
            [rows, 1, 1],
        )
    }

    /// [`Op::Linear`]: input x; then the residual stream, or with a cache write row_lane,
    /// row_pos, k_cache and v_cache.
    fn linear(
        &mut self,
        node: &drama_graph::Node,
        members: &[LinearMember],
        in_features: usize,
        cache_write: Option<&CacheWrite>,
        settings: LinearSettings,
    ) -> Result<(), EngineError> {
        let [y] = self.buffers(&node.outputs)?;
        let (x, residual, cache) = match (node.inputs.as_slice(), cache_write) {
            ([x], None) => (self.buffer(*x)?, None, None),
            ([x, residual], None) => (self.buffer(*x)?, Some(self.buffer(*residual)?), None),
            (inputs, Some(w)) => {
                let [x, row_lane, row_pos, k_cache, v_cache] = self.buffers(inputs)?;
                let cache = CacheIo {
                    row_lane,
                    row_pos,
                    rope_table: self.bind.rope_table,
                    k_cache,
                    v_cache,
                    head_dim: w.head_dim,
                    q_width: w.heads * w.head_dim,
                    capacity: self.capacity,
                };
                (x, None, Some(cache))
            }
            (inputs, None) => {
                return Err(EngineError::Unsupported(format!(
                    "a linear with {} inputs",
                    inputs.len()
                )));
            }
        };
        let io = LinearIo {
            residual,
            cache,
            swiglu: settings.swiglu,
            input: settings.input,
            ..LinearIo::plain(x, y, self.rows(node.inputs[0]), settings.y_stride, settings.round)
        };
        self.lower_linear(members, in_features, io)
    }

    /// [`Op::LinearPair`]: input x; outputs the first half's, then the second's.
    fn linear_pair(
        &mut self,
        node: &drama_graph::Node,
        halves: [&PairHalf; 2],
        in_features: usize,
        input: LinearInput,
    ) -> Result<(), EngineError> {
        let [x] = self.buffers(&node.inputs)?;
        let [first, second] = self.buffers(&node.outputs)?;
        let rows = self.rows(node.inputs[0]);
        let io = |half: &PairHalf, y| LinearIo {
            swiglu: half.swiglu,
            input,
            ..LinearIo::plain(x, y, rows, half.width(), half.round_output)
        };
        let ios = [io(halves[0], first), io(halves[1], second)];
        self.lower_linear_pair(halves, in_features, ios)
    }

    /// [`Op::Attention`]: inputs [q|k|v], row_lane, row_pos, k_cache, v_cache.
    fn attention(
        &mut self,
        node: &drama_graph::Node,
        params: &AttentionParams,
        heads: usize,
        last_chunk_combines: bool,
    ) -> Result<(), EngineError> {
        let [qkv, row_lane, row_pos, k_cache, v_cache] = self.buffers(&node.inputs)?;
        let [out] = self.buffers(&node.outputs)?;
        let rows = self.rows(node.inputs[0]) as u32;
        let (scratch, chunks_done) = (self.scratch.clone(), self.chunks_done.clone());
        let resources = [
            row_lane,
            row_pos,
            self.bind.rope_table,
            qkv,
            k_cache,
            v_cache,
            out,
            &scratch,
            &chunks_done,
            &scratch,
        ];
        // Launched over the chunks the step's rows of each kind reach (see
        // `AttentionGrids`), at most the capacity's.
        let chunks = drama_kernels::attention_chunks(self.capacity) as u32;
        let (per_head, blocks) = if last_chunk_combines {
            (Kernel::AttendAndCombine, Kernel::AttendBlocksAndCombine)
        } else {
            (Kernel::Attend, Kernel::AttendBlocks)
        };
        let mut attend = self
            .gpu
            .dispatch(per_head, params, &resources, [rows, heads as u32, chunks])?;
        attend.indirect = Some(self.attention_grids.per_head.clone());
        self.attention_launches[0].push(self.dispatches.len());
        self.dispatches.push(attend);
        if params.block_heads > 1 {
            let grid = [rows, heads as u32 / params.block_heads, chunks];
            let mut attend = self.gpu.dispatch(blocks, params, &resources, grid)?;
            attend.indirect = Some(self.attention_grids.blocks.clone());
            self.attention_launches[1].push(self.dispatches.len());
            self.dispatches.push(attend);
        }
        if !last_chunk_combines {
            let combine = [row_pos, out, &scratch, &scratch];
            self.launch(Kernel::AttendCombine, params, &combine, [rows, heads as u32, 1])?;
        }
        Ok(())
    }

    /// [`Op::Router`]: input the logits, and optionally the input of the linear beside it;
    /// outputs ids, weights, and with `linear` its output.
    fn router(
        &mut self,
        node: &drama_graph::Node,
        route: &RouterOp,
        linear: Option<&PairHalf>,
    ) -> Result<(), EngineError> {
        let weights = self.bind.weights;
        let logits = self.buffer(node.inputs[0])?;
        let listed = match node.inputs.get(1) {
            Some(&value) => self.buffer(value)?,
            None => &weights.placeholder,
        };
        let rows = self.rows(node.inputs[0]);
        let params = router_params(route, rows, self.graph.value(node.inputs[0]).shape[1]);
        let bias = weights.score_bias.get(&route.layer).unwrap_or(&weights.placeholder);
        let (ids, chosen_weights) = (self.buffer(node.outputs[0])?, self.buffer(node.outputs[1])?);
        let routing = [
            logits,
            &weights.kept_ids[&route.layer],
            bias,
            ids,
            chosen_weights,
            listed,
        ];
        let beside = match linear {
            Some(half) => {
                let [_, _, y] = self.buffers(&node.outputs)?;
                let io = LinearIo::plain(listed, y, rows, half.width(), half.round_output);
                Some((half, self.graph.value(node.inputs[1]).shape[1], io))
            }
            None => None,
        };
        self.lower_router(&params, routing, beside)
    }

    /// [`Op::Experts`]: inputs x and ids; grouped, also the blocks and order of a
    /// [`Op::GroupSlots`].
    fn experts(
        &mut self,
        node: &drama_graph::Node,
        layer: usize,
        projections: &[(Projection, WeightFormat)],
        swiglu: bool,
        shape: ExpertShape,
    ) -> Result<(), EngineError> {
        let [out] = self.buffers(&node.outputs)?;
        let (x, slots) = match node.inputs.as_slice() {
            [x, ids] => (self.buffer(*x)?, Slots::Each(self.buffer(*ids)?)),
            inputs => {
                let [x, _ids, blocks, order] = self.buffers(inputs)?;
                let count = self.rows(inputs[2]);
                (
                    x,
                    Slots::Grouped {
                        blocks: (blocks, count),
                        order,
                    },
                )
            }
        };
        self.lower_experts(layer, projections, swiglu, shape, ExpertIo { x, slots, out })
    }

    /// [`Op::GroupSlots`]: input ids; outputs blocks and order.
    fn group_slots(&mut self, node: &drama_graph::Node, experts: usize) -> Result<(), EngineError> {
        let [ids] = self.buffers(&node.inputs)?;
        let [blocks, order] = self.buffers(&node.outputs)?;
        let slots = self.rows(node.inputs[0]) * self.graph.value(node.inputs[0]).shape[1];
        let params = GroupParams {
            slots: slots as u32,
            experts: experts as u32,
            blocks: self.rows(node.outputs[0]) as u32,
            pad: 0,
        };
        self.launch(Kernel::GroupSlots, &params, &[ids, blocks, order], [1, 1, 1])
    }

    /// [`Op::PackBf16`]: input x.
    fn pack_bf16(&mut self, node: &drama_graph::Node) -> Result<(), EngineError> {
        let [x] = self.buffers(&node.inputs)?;
        let [out] = self.buffers(&node.outputs)?;
        let shape = &self.graph.value(node.outputs[0]).shape;
        let words = shape[0] * shape[1] / 2;
        let params = ElementwiseParams {
            count: words as u32,
            ..Default::default()
        };
        let grid = self.elements_grid(words);
        self.launch(Kernel::PackBf16, &params, &[x, out], grid)
    }

    /// [`Op::Swiglu`]: input [gate | up].
    fn swiglu(&mut self, node: &drama_graph::Node, round: bool) -> Result<(), EngineError> {
        let [gate_up] = self.buffers(&node.inputs)?;
        let [out] = self.buffers(&node.outputs)?;
        let shape = &self.graph.value(node.outputs[0]).shape;
        let count = shape[0] * shape[1];
        let params = ElementwiseParams {
            count: count as u32,
            width: shape[1] as u32,
            k: 0,
            flags: bit(round, flags::elementwise::ROUND),
            ..Default::default()
        };
        let grid = self.elements_grid(count);
        self.launch(Kernel::Swiglu, &params, &[gate_up, out], grid)
    }

    /// [`Op::MoeCombineNorm`]: inputs residual, routed outputs, routed weights, and with a
    /// shared expert its gate logits and output; outputs h, then its norm.
    fn moe_combine_norm(
        &mut self,
        node: &drama_graph::Node,
        k: usize,
        weight: &str,
        eps: f32,
        output: NormOutput,
    ) -> Result<(), EngineError> {
        let weights = self.bind.weights;
        let [h, normed] = self.buffers(&node.outputs)?;
        let (residual, routed, routed_weights, shared) = match node.inputs.as_slice() {
            [residual, routed, routed_weights] => (residual, routed, routed_weights, None),
            [residual, routed, routed_weights, gate_logits, shared_out] => {
                let gate_stride = self.graph.value(*gate_logits).shape[1] as u32;
                let shared = (self.buffer(*gate_logits)?, self.buffer(*shared_out)?, gate_stride);
                (residual, routed, routed_weights, Some(shared))
            }
            inputs => {
                return Err(EngineError::Unsupported(format!(
                    "a MoE combine with {} inputs",
                    inputs.len()
                )));
            }
        };
        let (gate_logits, shared_out, gate_stride) = shared.unwrap_or((&weights.placeholder, &weights.placeholder, 0));
        let shape = &self.graph.value(*residual).shape;
        let params = NormParams {
            width: shape[1] as u32,
            flags: norm_output_flags(output) | bit(shared.is_some(), flags::norm::SHARED_EXPERT),
            eps,
            k: k as u32,
            gate_stride,
            ..Default::default()
        };
        let rows = shape[0] as u32;
        let resources = [
            self.buffer(*residual)?,
            &weights.vectors[weight],
            normed,
            self.buffer(*routed)?,
            self.buffer(*routed_weights)?,
            gate_logits,
            shared_out,
            h,
            normed,
        ];
        self.launch(Kernel::CombineRmsNorm, &params, &resources, [rows, 1, 1])
    }

    /// A linear node: one launch per segment of its stacked weight (a SwiGLU pair or a
    /// [`stacks`] group), else of each member's weight, written side by side.
    fn lower_linear(
        &mut self,
        members: &[LinearMember],
        in_features: usize,
        io: LinearIo<'_>,
    ) -> Result<(), EngineError> {
        let weights = self.bind.weights;
        if io.swiglu || stacks(members) {
            let linear = self.stacked_weight(members, in_features)?;
            // A SwiGLU stack writes one feature per gate/up row pair.
            let y_stride = if io.swiglu { linear.out } else { io.y_stride };
            let launches = linear_launches(self.gpu, linear, &weights.placeholder, &LinearIo { y_stride, ..io })?;
            self.dispatches.extend(launches);
            return Ok(());
        }
        let mut column = 0;
        for member in members {
            let linear = self.uploaded_weight(&member.weight, in_features)?;
            let launches = linear_launches(self.gpu, linear, &weights.placeholder, &LinearIo { column, ..io })?;
            self.dispatches.extend(launches);
            column += member.out;
        }
        Ok(())
    }

    /// The uploaded stack of `members` (a SwiGLU pair or a [`stacks`] group).
    fn stacked_weight(&self, members: &[LinearMember], in_features: usize) -> Result<&'a GpuLinear, EngineError> {
        self.uploaded_weight(&stack_key(members), in_features)
    }

    /// The uploaded linear under `key` (a weight name or a [`stack_key`]), checked against
    /// the node's input width.
    fn uploaded_weight(&self, key: &str, in_features: usize) -> Result<&'a GpuLinear, EngineError> {
        let linear = self
            .bind
            .weights
            .linears
            .get(key)
            .ok_or_else(|| EngineError::Unsupported(format!("{key}: not uploaded")))?;
        if linear.in_features != in_features {
            return Err(EngineError::Unsupported(format!("{key}: input width mismatch")));
        }
        Ok(linear)
    }

    /// The uploaded weight of a linear sharing a launch: its one weight, or its stack.
    fn half_weight(&self, half: &PairHalf, in_features: usize) -> Result<&'a GpuLinear, EngineError> {
        match half.members.as_slice() {
            [single] if !half.swiglu => self.uploaded_weight(&single.weight, in_features),
            members => self.stacked_weight(members, in_features),
        }
    }

    /// A linear pair: one launch when each half's weight is one segment, else each half's
    /// own launches (the same bits either way).
    fn lower_linear_pair(
        &mut self,
        halves: [&PairHalf; 2],
        in_features: usize,
        ios: [LinearIo<'_>; 2],
    ) -> Result<(), EngineError> {
        let weights = self.bind.weights;
        let linears = [
            self.half_weight(halves[0], in_features)?,
            self.half_weight(halves[1], in_features)?,
        ];
        if linears.iter().all(|l| l.segments.len() == 1) {
            let launch = linear_pair_launch(self.gpu, linears, &weights.placeholder, [&ios[0], &ios[1]])?;
            self.dispatches.push(launch);
            return Ok(());
        }
        for (half, io) in halves.into_iter().zip(ios) {
            self.lower_linear(&half.members, in_features, io)?;
        }
        Ok(())
    }

    /// A router node: one launch routing the rows and, when the linear beside it is one
    /// weight segment, computing that linear too; else the linear's own launches after it
    /// (the same bits either way).
    fn lower_router(
        &mut self,
        params: &RouterParams,
        routing: [&'a wgpu::Buffer; 6],
        beside: Option<(&PairHalf, usize, LinearIo<'a>)>,
    ) -> Result<(), EngineError> {
        let placeholder = &self.bind.weights.placeholder;
        let linear = match &beside {
            Some((half, in_features, _)) => Some(self.half_weight(half, *in_features)?),
            None => None,
        };
        let shared = match (&beside, linear) {
            (Some((_, _, io)), Some(linear)) if linear.segments.len() == 1 => Some((linear, io)),
            _ => None,
        };
        let apart = shared.is_none();
        self.dispatches
            .push(route_launch(self.gpu, params, routing, shared, placeholder)?);
        match beside {
            Some((half, in_features, io)) if apart => self.lower_linear(&half.members, in_features, io),
            _ => Ok(()),
        }
    }

    /// An experts node: one stacked [gate | up] weight with the SwiGLU epilogue, or one
    /// weight per projection written side by side; a launch per weight segment.
    fn lower_experts(
        &mut self,
        layer: usize,
        projections: &[(Projection, WeightFormat)],
        swiglu: bool,
        shape: ExpertShape,
        io: ExpertIo<'_>,
    ) -> Result<(), EngineError> {
        let weights = self.bind.weights;
        let stacks: Vec<Vec<Projection>> = if swiglu {
            vec![projections.iter().map(|(p, _)| *p).collect()]
        } else {
            projections.iter().map(|(p, _)| vec![*p]).collect()
        };
        let y_stride = if swiglu {
            shape.width
        } else {
            shape.width * projections.len()
        };
        for (index, stack) in stacks.into_iter().enumerate() {
            let x_row_div = if stack == [Projection::Down] { 1 } else { shape.k };
            let key = (layer, stack);
            let linear = weights
                .experts
                .get(&key)
                .ok_or_else(|| EngineError::Unsupported(format!("layer {layer}: no experts {:?}", key.1)))?;
            let rows_per_group =
                linear.format.gathered_rows_per_workgroup(shape.workgroup) / if swiglu { 2 } else { 1 };
            for segment in &linear.segments {
                let params = LinearParams {
                    rows: shape.slots as u32,
                    in_features: shape.in_features as u32,
                    out_features: linear.out as u32,
                    out_offset: (index * shape.width) as u32,
                    y_stride: y_stride as u32,
                    x_row_div: x_row_div as u32,
                    expert_begin: segment.range.start as u32,
                    expert_end: segment.range.end as u32,
                    flags: flags::linear::ROUND | bit(swiglu, flags::linear::SWIGLU),
                    tensor_scale: 1.0,
                    ..Default::default()
                };
                let expert_scales = segment.expert_scales.as_ref().expect("expert segment");
                let mut resources = vec![io.x, &segment.codes];
                if linear.format != WeightFormat::Bf16 {
                    resources.push(&segment.scales);
                }
                let groups = (shape.width as u32).div_ceil(rows_per_group);
                match io.slots {
                    Slots::Each(ids) => {
                        resources.extend([&weights.placeholder, ids, io.out, expert_scales, io.x]);
                        let grid = [groups, shape.slots as u32, 1];
                        self.launch(
                            Kernel::Gathered(linear.format, shape.workgroup),
                            &params,
                            &resources,
                            grid,
                        )?;
                    }
                    Slots::Grouped {
                        blocks: (blocks, count),
                        order,
                    } => {
                        resources.extend([&weights.placeholder, blocks, io.out, expert_scales, order, io.x]);
                        let grid = [groups, count as u32, 1];
                        self.launch(
                            Kernel::GatheredGrouped(linear.format, shape.workgroup),
                            &params,
                            &resources,
                            grid,
                        )?;
                    }
                }
            }
        }
        Ok(())
    }

    fn attention_params(
        &self,
        rows: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        round: bool,
    ) -> AttentionParams {
        AttentionParams {
            rows: rows as u32,
            heads: heads as u32,
            kv_heads: kv_heads as u32,
            head_dim: head_dim as u32,
            capacity: self.capacity as u32,
            flags: bit(round, flags::attention::ROUND),
            scale: 1.0 / (head_dim as f32).sqrt(),
            block_heads: self.attention_grids.block_heads,
            block_from: drama_kernels::ATTENTION_BLOCKS_FROM as u32,
            pad: [0; 2],
        }
    }
}

/// The norm kernels' flags for how they write their output.
fn norm_output_flags(output: NormOutput) -> u32 {
    match output {
        NormOutput::F32 => 0,
        NormOutput::Bf16 => flags::norm::ROUND,
        NormOutput::Bf16Pairs => flags::norm::ROUND | flags::norm::PAIRS,
    }
}

/// What an experts node reads and writes.
struct ExpertIo<'a> {
    /// Input rows (the tokens' for gate/up, the slots' for down).
    x: &'a wgpu::Buffer,
    /// How the launches find their slots.
    slots: Slots<'a>,
    /// Output [slots, width].
    out: &'a wgpu::Buffer,
}

/// How an experts node's launches find their slots.
enum Slots<'a> {
    /// A workgroup row per slot, its expert read from the ids.
    Each(&'a wgpu::Buffer),
    /// A workgroup row per block of slots sharing an expert: the blocks (buffer and count)
    /// and the slot order of a group_slots node.
    Grouped {
        blocks: (&'a wgpu::Buffer, usize),
        order: &'a wgpu::Buffer,
    },
}

/// The sizes of an experts node.
struct ExpertShape {
    /// Token rows times experts per token.
    slots: usize,
    /// Experts per token.
    k: usize,
    /// Output features per expert and projection.
    width: usize,
    /// Input features.
    in_features: usize,
    /// The launches' workgroup width.
    workgroup: LinearWidth,
}

/// Where a dense linear reads and writes.
#[derive(Clone, Copy)]
pub struct LinearIo<'a> {
    /// Input [rows, in] (BF16 values).
    pub x: &'a wgpu::Buffer,
    /// Output [rows, y_stride].
    pub y: &'a wgpu::Buffer,
    /// Activation rows.
    pub rows: usize,
    /// Output column of the linear's first feature.
    pub column: usize,
    /// Floats per output row.
    pub y_stride: usize,
    /// Round outputs to BF16.
    pub round: bool,
    /// The residual stream [rows, y_stride] to add the outputs to.
    pub residual: Option<&'a wgpu::Buffer>,
    /// The linear is a SwiGLU stack (each segment: gate rows, then the same up rows); the
    /// output is silu(gate) * up, one feature per segment row.
    pub swiglu: bool,
    /// The linear is (part of) an attention layer's [q|k|v] projection that writes each
    /// row's keys and values into the caches.
    pub cache: Option<CacheIo<'a>>,
    /// How x holds its values: f32, or BF16 pairs.
    pub input: LinearInput,
}

impl<'a> LinearIo<'a> {
    /// A linear of `rows` rows writing plain outputs (rounded to BF16 with `round`) from
    /// column 0 of rows `y_stride` wide: no residual, SwiGLU or cache write.
    pub fn plain(x: &'a wgpu::Buffer, y: &'a wgpu::Buffer, rows: usize, y_stride: usize, round: bool) -> Self {
        LinearIo {
            x,
            y,
            rows,
            column: 0,
            y_stride,
            round,
            residual: None,
            swiglu: false,
            cache: None,
            input: LinearInput::F32,
        }
    }
}

/// Where a [q|k|v] projection writes its keys (rotated) and values.
#[derive(Clone, Copy)]
pub struct CacheIo<'a> {
    /// Each row's lane [rows].
    pub row_lane: &'a wgpu::Buffer,
    /// Each row's position [rows].
    pub row_pos: &'a wgpu::Buffer,
    /// RoPE (cos, sin) per position and pair.
    pub rope_table: &'a wgpu::Buffer,
    /// Keys [lanes * capacity, kv_heads * head_dim].
    pub k_cache: &'a wgpu::Buffer,
    /// Values, laid out like the keys.
    pub v_cache: &'a wgpu::Buffer,
    /// Floats per head.
    pub head_dim: usize,
    /// Output columns before the keys (the queries).
    pub q_width: usize,
    /// Positions per lane.
    pub capacity: usize,
}

/// The launches of a dense linear: one per weight segment.
pub fn linear_launches(
    gpu: &Gpu,
    linear: &GpuLinear,
    placeholder: &wgpu::Buffer,
    io: &LinearIo<'_>,
) -> Result<Vec<Dispatch>, EngineError> {
    if linear.format.runs_ragged(linear.in_features) {
        return ragged_launches(gpu, linear, placeholder, io);
    }
    let kernel = Kernel::dense_linear(linear.format, io.cache.is_some(), io.input);
    linear
        .segments
        .iter()
        .map(|segment| {
            let launch = segment_launch(kernel, linear, segment, placeholder, io)?;
            Ok(gpu.dispatch(kernel, &launch.params, &launch.resources, launch.grid)?)
        })
        .collect()
}

/// The launches of a BF16 linear whose input width [`Kernel::Linear`] cannot read (see
/// [`WeightFormat::width_multiple`]): one [`Kernel::LinearRagged`] per weight segment, a
/// workgroup per output. Plain outputs of f32 inputs only (bias, rounding, a residual):
/// `checkpoint::limits` lets such widths only where the linear is used so.
fn ragged_launches(
    gpu: &Gpu,
    linear: &GpuLinear,
    placeholder: &wgpu::Buffer,
    io: &LinearIo<'_>,
) -> Result<Vec<Dispatch>, EngineError> {
    if io.cache.is_some() || io.swiglu || io.input != LinearInput::F32 {
        return Err(EngineError::Unsupported(format!(
            "a BF16 linear of input width {} computes plain outputs of f32 inputs only",
            linear.in_features
        )));
    }
    let bias = linear.bias.as_ref().unwrap_or(placeholder);
    linear
        .segments
        .iter()
        .map(|segment| {
            let params = LinearParams {
                rows: io.rows as u32,
                in_features: linear.in_features as u32,
                out_features: segment.range.len() as u32,
                out_offset: (io.column + segment.range.start) as u32,
                y_stride: io.y_stride as u32,
                x_row_div: 1,
                flags: bit(linear.bias.is_some(), flags::linear::BIAS)
                    | bit(io.round, flags::linear::ROUND)
                    | bit(io.residual.is_some(), flags::linear::RESIDUAL),
                tensor_scale: 1.0,
                bias_offset: segment.range.start as u32,
                ..Default::default()
            };
            let resources = [io.x, &segment.codes, bias, io.y, io.residual.unwrap_or(placeholder)];
            let grid = [segment.range.len() as u32, (io.rows as u32).min(u32::from(u16::MAX)), 1];
            Ok(gpu.dispatch(Kernel::LinearRagged, &params, &resources, grid)?)
        })
        .collect()
}

/// Two BF16 linears of one segment each over the same input as one launch
/// (`Kernel::LinearPair`): the first's workgroups, then the second's, each computing what
/// its own [`linear_launches`] launch would.
pub fn linear_pair_launch(
    gpu: &Gpu,
    [first, second]: [&GpuLinear; 2],
    placeholder: &wgpu::Buffer,
    [first_io, second_io]: [&LinearIo<'_>; 2],
) -> Result<Dispatch, EngineError> {
    let one_bf16_segment = |l: &GpuLinear| l.format == WeightFormat::Bf16 && l.bias.is_none() && l.segments.len() == 1;
    if !(one_bf16_segment(first) && one_bf16_segment(second) && first.in_features == second.in_features) {
        return Err(EngineError::Unsupported(
            "a linear pair needs two bias-free BF16 weights of one segment and one input width".into(),
        ));
    }
    let kernel = Kernel::LinearPair(first_io.input);
    let mut launch = segment_launch(kernel, first, &first.segments[0], placeholder, first_io)?;
    let tail = segment_launch(kernel, second, &second.segments[0], placeholder, second_io)?;
    launch.params.split_groups = launch.grid[0];
    launch.params.second_out_features = tail.params.out_features;
    launch.params.second_y_stride = tail.params.y_stride;
    launch.params.second_flags = tail.params.flags;
    // The last two bindings are the second weight and output (see `segment_launch`).
    let count = launch.resources.len();
    launch.resources[count - 2] = &second.segments[0].codes;
    launch.resources[count - 1] = second_io.y;
    launch.grid[0] += tail.grid[0];
    Ok(gpu.dispatch(kernel, &launch.params, &launch.resources, launch.grid)?)
}

/// Routing of `params.rows` tokens as one launch (`routing`: the logits, kept ids, score
/// bias, chosen ids, chosen weights, and the value routing lists for a linear that runs
/// beside a later launch, or any placeholder), compiled for the smallest [`KeptCapacity`]
/// that holds `params.kept`: alone (`Kernel::Route`), or with `linear` (one bias-free BF16
/// segment, plain outputs) computed by its other workgroups (`Kernel::RouteLinear`), each
/// output with the bits of its own launch.
pub fn route_launch(
    gpu: &Gpu,
    params: &RouterParams,
    routing: [&wgpu::Buffer; 6],
    linear: Option<(&GpuLinear, &LinearIo<'_>)>,
    placeholder: &wgpu::Buffer,
) -> Result<Dispatch, EngineError> {
    let capacity = KeptCapacity::for_kept(params.kept as usize).ok_or_else(|| {
        EngineError::Unsupported(format!(
            "{} kept experts: routing holds at most {MAX_KEPT_EXPERTS}",
            params.kept
        ))
    })?;
    let Some((linear, io)) = linear else {
        return Ok(gpu.dispatch(Kernel::Route(capacity), params, &routing, [params.rows, 1, 1])?);
    };
    let beside = linear.format == WeightFormat::Bf16
        && linear.bias.is_none()
        && linear.segments.len() == 1
        && !io.swiglu
        && io.residual.is_none()
        && io.cache.is_none();
    if !beside {
        return Err(EngineError::Unsupported(
            "the linear beside routing needs one bias-free BF16 segment and plain outputs".into(),
        ));
    }
    let mut launch = segment_launch(
        Kernel::RouteLinear(capacity),
        linear,
        &linear.segments[0],
        placeholder,
        io,
    )?;
    // Routing's workgroups lead each grid row: token wg.y * split_groups + wg.x.
    launch.params.split_groups = params.rows.div_ceil(launch.grid[1]);
    launch.grid[0] += launch.params.split_groups;
    let uniform = gpu.uniform("route", params);
    let mut resources = launch.resources;
    resources.push(&uniform);
    resources.extend(&routing[..5]);
    Ok(gpu.dispatch(Kernel::RouteLinear(capacity), &launch.params, &resources, launch.grid)?)
}

/// The parameter block of routing `rows` tokens whose logits rows are `logit_width` wide.
fn router_params(r: &RouterOp, rows: usize, logit_width: usize) -> RouterParams {
    RouterParams {
        rows: rows as u32,
        logit_width: logit_width as u32,
        kept: r.kept as u32,
        k: r.k as u32,
        flags: bit(r.sigmoid, flags::router::SIGMOID)
            | bit(r.full_width, flags::router::FULL_WIDTH)
            | bit(r.score_bias, flags::router::SCORE_BIAS)
            | bit(r.norm_topk_prob, flags::router::RENORMALIZE),
        n_group: r.n_group as u32,
        topk_group: r.topk_group as u32,
        group_size: r.group_size as u32,
        scaling: r.scaling,
        pad: [0; 3],
    }
}

/// One dense-linear launch before it is dispatched.
struct SegmentLaunch<'a> {
    params: LinearParams,
    resources: Vec<&'a wgpu::Buffer>,
    grid: [u32; 3],
}

/// The parameters, bindings and grid of the launch of `kernel` (a linear-module kernel)
/// that computes one weight segment.
fn segment_launch<'a>(
    kernel: Kernel,
    linear: &'a GpuLinear,
    segment: &'a Segment,
    placeholder: &'a wgpu::Buffer,
    io: &LinearIo<'a>,
) -> Result<SegmentLaunch<'a>, EngineError> {
    let width = kernel
        .linear_width()
        .ok_or_else(|| EngineError::Unsupported(format!("{kernel:?} does not launch a linear")))?;
    let bias = linear.bias.as_ref().unwrap_or(placeholder);
    // A SwiGLU segment holds two weight rows (gate, up) per output feature.
    let rows_per_feature = if io.swiglu { 2 } else { 1 };
    let first = io.column + segment.range.start;
    if let Some(cache) = io.cache
        && !(first.is_multiple_of(cache.head_dim) && segment.range.len().is_multiple_of(cache.head_dim))
    {
        return Err(EngineError::Unsupported(format!(
            "a [q|k|v] weight segment at column {first} of {} rows does not hold whole heads of {}",
            segment.range.len(),
            cache.head_dim
        )));
    }
    let params = LinearParams {
        rows: io.rows as u32,
        in_features: linear.in_features as u32,
        out_features: (segment.range.len() * rows_per_feature) as u32,
        out_offset: first as u32,
        y_stride: io.y_stride as u32,
        x_row_div: 1,
        flags: bit(linear.bias.is_some(), flags::linear::BIAS)
            | bit(io.round, flags::linear::ROUND)
            | bit(io.residual.is_some(), flags::linear::RESIDUAL)
            | bit(io.swiglu, flags::linear::SWIGLU),
        tensor_scale: linear.tensor_scale,
        bias_offset: segment.range.start as u32,
        head_dim: io.cache.map_or(0, |c| c.head_dim as u32),
        q_width: io.cache.map_or(0, |c| c.q_width as u32),
        capacity: io.cache.map_or(0, |c| c.capacity as u32),
        ..Default::default()
    };
    let mut resources = vec![io.x, &segment.codes];
    if linear.format != WeightFormat::Bf16 {
        resources.push(&segment.scales);
    }
    // Without a cache write the caches' read_write bindings get y, which the kernel then
    // never touches through them; the second weight and output of a linear pair get w and y.
    let [row_lane, row_pos, rope_table, k_cache, v_cache] = match io.cache {
        Some(c) => [c.row_lane, c.row_pos, c.rope_table, c.k_cache, c.v_cache],
        None => [placeholder, placeholder, placeholder, io.y, io.y],
    };
    resources.extend([
        bias,
        io.y,
        io.residual.unwrap_or(placeholder),
        io.x,
        row_lane,
        row_pos,
        rope_table,
        k_cache,
        v_cache,
        &segment.codes,
        io.y,
    ]);
    // A workgroup row per pass over the activation rows, up to the dispatch limit (the
    // kernel strides over any passes beyond it).
    let passes = io.rows.div_ceil(LINEAR_PASS_ROWS) as u32;
    let grid = [
        (segment.range.len() as u32).div_ceil(linear.format.rows_per_workgroup(width) / rows_per_feature as u32),
        passes.min(u32::from(u16::MAX)),
        1,
    ];
    Ok(SegmentLaunch {
        params,
        resources,
        grid,
    })
}

/// The buffers a step allocates for itself: its memory plan and attention's scratch.
struct StepBuffers {
    plan: MemoryPlan,
    attention: AttentionShape,
    scratch_bytes: u64,
}

impl StepBuffers {
    fn of(graph: &Graph, shape: StepShape) -> StepBuffers {
        let attention = graph
            .nodes
            .iter()
            .find_map(|n| match n.op {
                Op::Attention {
                    heads,
                    kv_heads,
                    head_dim,
                    ..
                } => Some(AttentionShape {
                    heads,
                    head_dim,
                    block_heads: drama_kernels::attention_block_heads(heads, kv_heads, head_dim),
                }),
                _ => None,
            })
            .unwrap_or(AttentionShape {
                heads: 1,
                head_dim: 1,
                block_heads: 1,
            });
        let scratch_floats =
            drama_kernels::attention_scratch_floats(shape.rows, attention.heads, attention.head_dim, shape.capacity);
        StepBuffers {
            plan: plan(graph),
            attention,
            scratch_bytes: (scratch_floats * 4) as u64,
        }
    }

    /// The largest of them, in bytes.
    fn largest(&self) -> u64 {
        self.plan
            .buffers
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
            .max(self.scratch_bytes)
    }
}

/// The largest buffer a step of `graph` (built for `shape`) would allocate for itself, in
/// bytes: [`Executable::compile`] refuses a step where it exceeds the device's storage-binding
/// limit. Nothing is allocated.
pub fn largest_step_buffer(graph: &Graph, shape: StepShape) -> u64 {
    StepBuffers::of(graph, shape).largest()
}

impl Executable {
    /// Plans and lowers `graph`: buffers, parameter blocks, bind groups, launches.
    pub fn compile(gpu: &Gpu, graph: Graph, shape: StepShape, bind: &Bindings<'_>) -> Result<Executable, EngineError> {
        let buffers = StepBuffers::of(&graph, shape);
        let largest = buffers.largest();
        let limit = gpu.caps.max_storage_binding;
        if largest > limit {
            return Err(EngineError::Unsupported(format!(
                "a step of {} rows needs a {largest}-byte activation buffer, above the device's storage-binding limit of {limit} bytes; process fewer rows per step",
                shape.rows
            )));
        }
        let StepBuffers {
            plan,
            attention,
            scratch_bytes,
        } = buffers;
        let buffers: Vec<wgpu::Buffer> = plan
            .buffers
            .iter()
            .enumerate()
            .map(|(i, &size)| gpu.buffer(&format!("b{i}"), size))
            .collect();
        let scratch = gpu.buffer("attention scratch", scratch_bytes);
        let chunks_done_bytes = (shape.rows * attention.heads * 4) as u64;
        let chunks_done = gpu.buffer("attention chunks done", chunks_done_bytes);
        let attention_grids = AttentionGrids::new(gpu, shape.rows, attention);
        let mut lowering = Lowering {
            gpu,
            graph: &graph,
            plan: &plan,
            buffers: &buffers,
            bind,
            scratch,
            chunks_done,
            attention_grids: attention_grids.clone(),
            capacity: shape.capacity,
            dispatches: Vec::new(),
            attention_launches: [Vec::new(), Vec::new()],
        };
        let find = |name: &str| {
            graph
                .find(name)
                .ok_or_else(|| EngineError::Unsupported(format!("the step graph has no value {name}")))
        };
        let inputs = [
            find(STEP_INPUTS[0])?,
            find(STEP_INPUTS[1])?,
            find(STEP_INPUTS[2])?,
            find(STEP_INPUTS[3])?,
        ];
        let logits = find("logits")?;
        let mut node_dispatches = Vec::with_capacity(graph.nodes.len());
        for node in &graph.nodes {
            let start = lowering.dispatches.len();
            lowering.lower(node)?;
            node_dispatches.push(start..lowering.dispatches.len());
        }
        let (dispatches, attention_launches) = (lowering.dispatches, lowering.attention_launches);
        let logits_bytes = graph.value(logits).shape.iter().product::<usize>() * 4;
        let logits_readback = Readback::new(gpu, "logits", logits_bytes as u64);
        let device_bytes = plan.buffers.iter().sum::<u64>() + scratch_bytes + chunks_done_bytes + logits_bytes as u64;
        Ok(Executable {
            graph,
            plan,
            shape,
            buffers,
            dispatches,
            node_dispatches,
            inputs,
            logits,
            logits_readback,
            attention_grids,
            attention_launches,
            written: std::sync::Mutex::new(vec![Vec::new(); STEP_INPUTS.len() + 2]),
            device_bytes,
        })
    }

    /// The bytes of the buffers it allocated for itself: activations, attention scratch and
    /// the logits' readback (its launches' parameter blocks, a few hundred bytes each, aside).
    pub fn device_bytes(&self) -> u64 {
        self.device_bytes
    }

    /// Kernel launches per step whose rows all take attention one way (a workgroup per head
    /// or blocks of heads: one attention launch of the two per layer).
    pub fn dispatch_count(&self) -> usize {
        self.dispatches.len() - self.attention_launches[1].len()
    }

    /// Kernel launches per step (as [`Executable::dispatch_count`] counts them) that wait
    /// for the launch before them: all but the first of each linear that runs beside it
    /// (`beside`; any further launch of such a linear writes the buffer its first wrote, and
    /// waits).
    pub fn waiting_dispatch_count(&self) -> usize {
        let beside = self.graph.nodes.iter().filter(|n| n.op.runs_beside()).count();
        self.dispatch_count() - beside
    }

    /// The attention launches the last written inputs need (see [`LaunchSet`]).
    pub fn launch_set(&self) -> LaunchSet {
        let written = self.written.lock().expect("input record poisoned");
        let grids = &written[STEP_INPUTS.len()..];
        LaunchSet::of_written([&grids[0], &grids[1]])
    }

    /// The launches of `span` (indices into `dispatches`) a run records for the last written
    /// inputs: all but the attention launches of a kind no row takes, which would launch no
    /// workgroup and still cost a launch.
    fn launches(&self, span: std::ops::Range<usize>) -> Vec<&Dispatch> {
        let set = self.launch_set();
        // Each kind's launches are in ascending order: a search per launch, no list built.
        let skipped =
            |i: &usize| (0..2).any(|kind| !set.runs(kind) && self.attention_launches[kind].binary_search(i).is_ok());
        span.filter(|i| !skipped(i)).map(|i| &self.dispatches[i]).collect()
    }

    /// Every launch a run records for the last written inputs.
    fn all_launches(&self) -> Vec<&Dispatch> {
        self.launches(0..self.dispatches.len())
    }

    /// The buffer holding a value (inputs and activations).
    fn value_buffer(&self, id: ValueId) -> &wgpu::Buffer {
        &self.buffers[self.plan.value_buffer[id.0].expect("planned value")]
    }

    /// Writes the host inputs (one u32 per row each, in [`STEP_INPUTS`] order) for the next
    /// run.
    pub fn write_inputs(&self, gpu: &Gpu, values: [&[u32]; STEP_INPUTS.len()]) -> Result<(), EngineError> {
        let mut written = self.written.lock().expect("input record poisoned");
        for (((name, &id), values), last) in STEP_INPUTS.iter().zip(&self.inputs).zip(values).zip(&mut *written) {
            let bytes: &[u8] = bytemuck::cast_slice(values);
            let buffer = self.value_buffer(id);
            if bytes.len() as u64 > buffer.size() {
                return Err(EngineError::Input(format!(
                    "{name}: {} bytes for a {}-byte input",
                    bytes.len(),
                    buffer.size()
                )));
            }
            write_if_changed(gpu, buffer, values, last);
        }
        let positions = values[STEP_INPUTS
            .iter()
            .position(|&name| name == "row_pos")
            .expect("a step input")];
        let [per_head, blocks] = self.attention_grids.counts(positions, self.shape.capacity);
        let grids = &self.attention_grids;
        write_if_changed(gpu, &grids.per_head, &per_head, &mut written[STEP_INPUTS.len()]);
        write_if_changed(gpu, &grids.blocks, &blocks, &mut written[STEP_INPUTS.len() + 1]);
        Ok(())
    }

    /// The buffer a run leaves its logits in, [rows, C + 2] f32 (work queued behind the
    /// run reads them there).
    pub fn logits_buffer(&self) -> &wgpu::Buffer {
        self.value_buffer(self.logits)
    }

    /// The buffer of the `row_index` input (one u32 per row, the second of [`STEP_INPUTS`]):
    /// work queued after [`Executable::write_inputs`] and before the run may overwrite
    /// words of it.
    pub fn row_index_buffer(&self) -> &wgpu::Buffer {
        self.value_buffer(self.inputs[1])
    }

    /// Reads the audio logits of the last run.
    pub fn read_logits(&self, gpu: &Gpu) -> Result<Vec<f32>, EngineError> {
        self.read_f32(gpu, self.logits)
    }

    /// The audio logits an [`Executable::encode`]'d step copied out, once its `submission`
    /// has finished (later submissions may still run).
    pub fn read_encoded_logits(&self, gpu: &Gpu, submission: wgpu::SubmissionIndex) -> Result<Vec<f32>, EngineError> {
        Ok(self.logits_readback.read(gpu, submission)?)
    }

    /// Records every launch into one pass of a command buffer, then the copy of the logits
    /// for [`Executable::read_encoded_logits`]; submitting it runs the step with whatever
    /// the inputs hold at that time.
    pub fn encode(&self, gpu: &Gpu) -> wgpu::CommandBuffer {
        gpu.encode_then_copy(
            self.all_launches(),
            Some((self.value_buffer(self.logits), &self.logits_readback)),
        )
    }

    /// Runs the step one dispatch per pass and returns each kernel's GPU time, in order.
    pub fn profile_run(&self, gpu: &Gpu) -> Result<Vec<(Kernel, std::time::Duration)>, EngineError> {
        let launches = self.all_launches();
        let times = gpu.profile_submit(launches.iter().copied())?;
        Ok(launches.iter().map(|d| d.kernel).zip(times).collect())
    }

    /// Launches of the nodes labelled `first` through `last` (in node order).
    pub fn dispatch_span(&self, first: &str, last: &str) -> Result<std::ops::Range<usize>, EngineError> {
        let index = |label: &str| {
            self.graph
                .nodes
                .iter()
                .position(|n| n.label == label)
                .ok_or_else(|| EngineError::Input(format!("the step has no node {label}")))
        };
        let (a, b) = (index(first)?, index(last)?);
        if a > b {
            return Err(EngineError::Input(format!("node {first} comes after {last}")));
        }
        Ok(self.node_dispatches[a].start..self.node_dispatches[b].end)
    }

    /// Runs the launches of the nodes labelled `first` through `last` (in node order) as one
    /// pass on whatever the buffers hold, and returns its GPU time: a part of a step, timed
    /// alone.
    pub fn timed_run_span(&self, gpu: &Gpu, first: &str, last: &str) -> Result<std::time::Duration, EngineError> {
        let span = self.dispatch_span(first, last)?;
        Ok(gpu.timed_submit(self.launches(span))?)
    }

    /// Runs the step and returns its pass's GPU time.
    pub fn timed_run(&self, gpu: &Gpu) -> Result<std::time::Duration, EngineError> {
        Ok(gpu.timed_submit(self.all_launches())?)
    }

    /// Reads a value back as f32 (its first `elements`).
    pub fn read_f32(&self, gpu: &Gpu, id: ValueId) -> Result<Vec<f32>, EngineError> {
        let n: usize = self.graph.value(id).shape.iter().product();
        Ok(gpu.read_first(self.value_buffer(id), n)?)
    }

    /// Reads a value back as u32.
    pub fn read_u32(&self, gpu: &Gpu, id: ValueId) -> Result<Vec<u32>, EngineError> {
        let n: usize = self.graph.value(id).shape.iter().product();
        Ok(gpu.read_first(self.value_buffer(id), n)?)
    }
}

/// Writes `words` at the start of `buffer` unless `last` (what the last write put there)
/// holds the same words; `last` then holds them.
fn write_if_changed(gpu: &Gpu, buffer: &wgpu::Buffer, words: &[u32], last: &mut Vec<u32>) {
    if last.as_slice() != words {
        gpu.queue.write_buffer(buffer, 0, bytemuck::cast_slice(words));
        last.clear();
        last.extend_from_slice(words);
    }
}
