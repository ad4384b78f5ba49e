//! The Drama 3 builder: compiles a model description into the static graph of one step
//! (any number of token rows over any number of lanes: a prefill, a decode step, or both
//! guidance lanes at once).

use std::collections::{BTreeMap, HashMap};

use drama_kernels::{LinearInput, WeightFormat};
use serde::Serialize;

use crate::graph::{Graph, GraphBuilder, GraphError};
use crate::ir::{CacheWrite, DType, LinearMember, Op, PairHalf, Projection, RouterOp, ValueId, ValueKind};
use crate::select::{
    GROUPED_EXPERT_ROWS, expert_width, last_chunk_combines, linear_input, pairs, routes_beside_linear, shares_launch,
    stacks_expert_swiglu, stacks_swiglu,
};

/// Weight and tensor names the builder refers to; the engine's checkpoint table fills it.
pub trait WeightNames {
    /// A per-layer name from its template (`model.layers.{i}.self_attn.q_proj`).
    fn layer(&self, template: LayerWeight, layer: usize) -> String;
    /// A global tensor name.
    fn global(&self, which: GlobalWeight) -> String;
}

/// Per-layer weights the graph refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerWeight {
    /// Pre-attention norm.
    InputNorm,
    /// q projection module.
    Q,
    /// k projection module.
    K,
    /// v projection module.
    V,
    /// o projection module.
    O,
    /// Pre-MLP norm.
    PostNorm,
    /// Dense MLP gate/up/down modules.
    Dense(Projection),
    /// Router weight tensor.
    Router,
    /// Shared expert gate/up/down modules.
    Shared(Projection),
    /// Shared expert gate tensor.
    SharedGate,
}

/// Global weights the graph refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlobalWeight {
    /// Text embeddings.
    EmbedTokens,
    /// Audio embeddings.
    AudioEmbed,
    /// Final norm.
    FinalNorm,
    /// Audio head.
    AudioHead,
}

/// A MoE layer's routing description.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MoeSpec {
    /// Kept experts.
    pub kept: usize,
    /// Router logits per original id (else per kept expert).
    pub full_width_router: bool,
    /// Selection bias present.
    pub score_bias: bool,
    /// Formats of the routed experts' gate, up and down projections.
    pub expert_formats: [WeightFormat; 3],
}

/// Everything the builder needs to know about the model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSpec {
    /// H.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Head width.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Audio vocabulary (C + 2).
    pub audio_vocab: usize,
    /// Dense MLP width.
    pub dense_width: usize,
    /// Routed expert width.
    pub expert_width: usize,
    /// Shared expert width (0: none).
    pub shared_width: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Original expert count.
    pub num_experts: usize,
    /// Sigmoid routing (else softmax).
    pub sigmoid: bool,
    /// Renormalise chosen weights.
    pub norm_topk_prob: bool,
    /// Routed scaling factor.
    pub routed_scaling_factor: f32,
    /// Expert groups.
    pub n_group: usize,
    /// Groups kept.
    pub topk_group: usize,
    /// Per layer: `None` for dense layers.
    pub layers: Vec<Option<MoeSpec>>,
    /// Stored format of every linear module (absent: BF16).
    pub formats: BTreeMap<String, WeightFormat>,
}

/// The shape of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StepShape {
    /// Token rows processed.
    pub rows: usize,
    /// Cache slots (lanes) the KV caches hold.
    pub lanes: usize,
    /// Positions per cache slot.
    pub capacity: usize,
    /// Rows of the voice-prefix table (lanes * P).
    pub prefix_rows: usize,
    /// Keep every layer's hidden state and router output readable (for `drama trace`).
    pub trace: bool,
    /// The device runs a launch that needs no barrier beside the launch before it (wgpu's
    /// Vulkan and DX12 backends record barriers only where the bindings need them; its Metal
    /// and GL backends run every launch after the one before): independent work then gets
    /// launches of its own ([`Op::Linear`]'s `beside`) instead of sharing one.
    pub concurrent_launches: bool,
    /// WGSL's storage barriers order memory for the whole device (wgpu's Vulkan and DX12
    /// backends; on Metal and GL only within a workgroup), so the last workgroup of a launch
    /// to finish may read what the others wrote: attention's chunks are then combined by
    /// the last of each row's and head's to finish ([`Op::Attention`]'s
    /// `last_chunk_combines`), not by a launch of their own.
    pub device_barriers: bool,
}

/// Names of the host-written inputs, in the order the engine fills them. (The voice-prefix
/// table, `prefixes`, is session state like the KV caches: written when a prefix is set.)
pub const STEP_INPUTS: [&str; 4] = ["row_table", "row_index", "row_lane", "row_pos"];

/// Where an embedded row comes from (the values of `row_table`).
pub use drama_kernels::row_source;

/// The residual stream after a layer: a value, or a MoE layer's combine left to the norm
/// that follows it.
enum Residual {
    Value(ValueId),
    Combine {
        /// The MoE layer.
        layer: usize,
        /// The inputs of its [`Op::MoeCombineNorm`] (the norm's own come with it).
        inputs: Vec<ValueId>,
        /// It has a shared expert.
        shared: bool,
    },
}

struct Build<'a> {
    b: GraphBuilder,
    spec: &'a ModelSpec,
    names: &'a dyn WeightNames,
    trace: bool,
    /// Token rows of the step.
    rows: usize,
    /// See [`StepShape::concurrent_launches`].
    concurrent: bool,
    /// See [`StepShape::device_barriers`].
    device_barriers: bool,
    /// Values packed into BF16 pairs so far, and their packed copies.
    packed: HashMap<ValueId, ValueId>,
}

impl Build<'_> {
    fn format(&self, module: &str) -> WeightFormat {
        self.spec.formats.get(module).copied().unwrap_or(WeightFormat::Bf16)
    }

    fn linear(
        &mut self,
        label: &str,
        x: ValueId,
        members: &[(String, usize, bool)],
        round: bool,
        residual: Option<ValueId>,
    ) -> Result<ValueId, GraphError> {
        let members = self.members(members);
        self.linear_node(label, x, members, round, residual, false)
    }

    /// `x` as the step's linears read it ([`linear_input`]): for steps of many rows packed
    /// into BF16 pairs, once, by a launch labelled after the first linear that reads it.
    fn linear_input(&mut self, label: &str, x: ValueId) -> Result<(ValueId, LinearInput), GraphError> {
        let input = linear_input(self.rows);
        if input == LinearInput::F32 {
            return Ok((x, input));
        }
        if let Some(&packed) = self.packed.get(&x) {
            return Ok((packed, input));
        }
        let packed = self.b.node1(&format!("{label}.input"), Op::PackBf16, &[x])?;
        self.packed.insert(x, packed);
        Ok((packed, input))
    }

    fn members(&self, members: &[(String, usize, bool)]) -> Vec<LinearMember> {
        members
            .iter()
            .map(|(weight, out, bias)| LinearMember {
                format: self.format(weight),
                weight: weight.clone(),
                out: *out,
                bias: *bias,
            })
            .collect()
    }

    fn linear_node(
        &mut self,
        label: &str,
        x: ValueId,
        members: Vec<LinearMember>,
        round: bool,
        residual: Option<ValueId>,
        swiglu: bool,
    ) -> Result<ValueId, GraphError> {
        let in_features = self.b_width(x);
        // The ragged-width kernel reads f32 rows (`WeightFormat::runs_ragged`).
        let ragged = members.iter().any(|m| m.format.runs_ragged(in_features));
        let (x, input) = if ragged {
            (x, LinearInput::F32)
        } else {
            self.linear_input(label, x)?
        };
        self.b.node1(
            label,
            Op::Linear {
                members,
                in_features,
                round_output: round,
                residual: residual.is_some(),
                swiglu,
                cache_write: None,
                beside: false,
                input,
            },
            &[x].into_iter().chain(residual).collect::<Vec<_>>(),
        )
    }

    /// The RMSNorm of the residual stream `x` (labelled `label` when `x` is a value), and the
    /// stream itself: a MoE layer's pending combine is computed by the norm's launch
    /// ([`Op::MoeCombineNorm`], labelled `layers.{i}.hidden` like the value it writes).
    fn norm(&mut self, label: &str, x: Residual, weight: String) -> Result<(ValueId, ValueId), GraphError> {
        let eps = self.spec.eps;
        match x {
            Residual::Value(x) => {
                let op = Op::RmsNorm {
                    weight,
                    eps,
                    round_output: true,
                };
                Ok((x, self.b.node1(label, op, &[x])?))
            }
            Residual::Combine { layer, inputs, shared } => {
                let op = Op::MoeCombineNorm {
                    k: self.spec.top_k,
                    shared,
                    weight,
                    eps,
                    round_output: true,
                };
                let outputs = self.b.node(&format!("layers.{layer}.hidden"), op, &inputs)?;
                if self.trace {
                    self.b.output(outputs[0]);
                }
                Ok((outputs[0], outputs[1]))
            }
        }
    }

    fn b_width(&self, x: ValueId) -> usize {
        *self.b.shape(x).last().unwrap_or(&0)
    }

    fn swiglu_mlp(
        &mut self,
        label: &str,
        x: ValueId,
        modules: [String; 3],
        width: usize,
        down: (&str, Option<ValueId>),
    ) -> Result<ValueId, GraphError> {
        let h = self.spec.hidden;
        let [gate_m, up_m, down_m] = modules;
        let act = self.swiglu_act(label, x, [gate_m, up_m], width)?;
        // The down projection: its label, and the residual stream it adds into (if any).
        let (down_label, residual) = down;
        self.linear(down_label, act, &[(down_m, h, false)], true, residual)
    }

    /// silu(gate(x)) * up(x), rounded to BF16.
    fn swiglu_act(
        &mut self,
        label: &str,
        x: ValueId,
        modules: [String; 2],
        width: usize,
    ) -> Result<ValueId, GraphError> {
        let [gate_m, up_m] = modules;
        let members = self.members(&[(gate_m, width, false), (up_m, width, false)]);
        // Stacked gate/up compute the SwiGLU in their epilogue; otherwise a separate node.
        if stacks_swiglu(&members) {
            return self.linear_node(&format!("{label}.act"), x, members, true, None, true);
        }
        let gate_up = self.linear_node(&format!("{label}.gate_up"), x, members, true, None, false)?;
        self.b
            .node1(&format!("{label}.act"), Op::Swiglu { round_output: true }, &[gate_up])
    }
}

/// Floats per position of a layer's key (or value) cache: each KV head in whole vec4s
/// ([`drama_kernels::head_stride`]), which is how attention reads them.
pub fn kv_cache_width(kv_heads: usize, head_dim: usize) -> usize {
    kv_heads * drama_kernels::head_stride(head_dim)
}

/// Builds the graph of one step.
pub fn build(spec: &ModelSpec, names: &dyn WeightNames, shape: StepShape) -> Result<Graph, GraphError> {
    let s = spec;
    let (h, rows) = (s.hidden, shape.rows);
    let kv_width = s.kv_heads * s.head_dim;
    let mut g = Build {
        b: GraphBuilder::default(),
        spec,
        names,
        trace: shape.trace,
        rows: shape.rows,
        concurrent: shape.concurrent_launches,
        device_barriers: shape.device_barriers,
        packed: HashMap::new(),
    };
    let row_table = g.b.input("row_table", vec![rows], DType::U32, ValueKind::Input);
    let row_index = g.b.input("row_index", vec![rows], DType::U32, ValueKind::Input);
    let row_lane = g.b.input("row_lane", vec![rows], DType::U32, ValueKind::Input);
    let row_pos = g.b.input("row_pos", vec![rows], DType::U32, ValueKind::Input);
    let prefixes = g.b.input(
        "prefixes",
        vec![shape.prefix_rows.max(1), h],
        DType::F32,
        ValueKind::State,
    );
    let embed = Op::Embed {
        text: names.global(GlobalWeight::EmbedTokens),
        audio: names.global(GlobalWeight::AudioEmbed),
    };
    let mut x = Residual::Value(g.b.node1("embed", embed, &[row_table, row_index, prefixes])?);
    let cache_shape = vec![shape.lanes * shape.capacity, kv_cache_width(s.kv_heads, s.head_dim)];
    for (i, moe) in s.layers.iter().enumerate() {
        let l = |w: LayerWeight| names.layer(w, i);
        let at = |what: &str| format!("layers.{i}.{what}");
        let k_cache =
            g.b.input(&at("k_cache"), cache_shape.clone(), DType::F32, ValueKind::State);
        let v_cache =
            g.b.input(&at("v_cache"), cache_shape.clone(), DType::F32, ValueKind::State);
        let (stream, normed) = g.norm(&at("input_norm"), x, l(LayerWeight::InputNorm))?;
        // The [q|k|v] projection also writes this step's keys and values into the caches.
        let members = g.members(&[
            (l(LayerWeight::Q), s.heads * s.head_dim, true),
            (l(LayerWeight::K), kv_width, true),
            (l(LayerWeight::V), kv_width, true),
        ]);
        let (qkv_input, input) = g.linear_input(&at("qkv_proj"), normed)?;
        let qkv = g.b.node1(
            &at("qkv_proj"),
            Op::Linear {
                members,
                in_features: h,
                round_output: true,
                residual: false,
                swiglu: false,
                cache_write: Some(CacheWrite {
                    heads: s.heads,
                    kv_heads: s.kv_heads,
                    head_dim: s.head_dim,
                }),
                beside: false,
                input,
            },
            &[qkv_input, row_lane, row_pos, k_cache, v_cache],
        )?;
        let attended = g.b.node1(
            &at("attention"),
            Op::Attention {
                heads: s.heads,
                kv_heads: s.kv_heads,
                head_dim: s.head_dim,
                round_output: true,
                last_chunk_combines: last_chunk_combines(rows, g.device_barriers),
            },
            &[qkv, row_lane, row_pos, k_cache, v_cache],
        )?;
        // The residual stream after attention: x + o_proj(attended).
        let stream = g.linear(
            &at("o_proj"),
            attended,
            &[(l(LayerWeight::O), h, false)],
            true,
            Some(stream),
        )?;
        let (stream, normed) = g.norm(&at("post_norm"), Residual::Value(stream), l(LayerWeight::PostNorm))?;
        x = match moe {
            None => {
                let modules = [Projection::Gate, Projection::Up, Projection::Down].map(|p| l(LayerWeight::Dense(p)));
                let hidden = g.swiglu_mlp(
                    &at("mlp"),
                    normed,
                    modules,
                    s.dense_width,
                    (&at("hidden"), Some(stream)),
                )?;
                if g.trace {
                    g.b.output(hidden);
                }
                Residual::Value(hidden)
            }
            Some(moe) => moe_block(&mut g, i, moe, stream, normed)?,
        };
    }
    let (_, normed) = g.norm("final_norm", x, names.global(GlobalWeight::FinalNorm))?;
    let logits = g.linear(
        "logits",
        normed,
        &[(names.global(GlobalWeight::AudioHead), s.audio_vocab, false)],
        false,
        None,
    )?;
    g.b.output(logits);
    Ok(g.b.finish())
}

/// The members of each linear of a step (each half of a linear pair and the linear beside
/// routing counting as one), in output-column order, and whether it computes a SwiGLU (the
/// same for every step shape): what the engine uploads, stacking the SwiGLU pairs and the
/// groups [`crate::select::stacks`] names.
pub fn linear_groups(spec: &ModelSpec, names: &dyn WeightNames) -> Result<Vec<(Vec<LinearMember>, bool)>, GraphError> {
    let shape = StepShape {
        rows: 1,
        lanes: 1,
        capacity: 1,
        prefix_rows: 1,
        trace: false,
        concurrent_launches: false,
        device_barriers: false,
    };
    let graph = build(spec, names, shape)?;
    Ok(graph
        .nodes
        .iter()
        .flat_map(|node| match &node.op {
            Op::Linear { members, swiglu, .. } => vec![(members.clone(), *swiglu)],
            Op::Router { linear: Some(half), .. } => vec![(half.members.clone(), half.swiglu)],
            Op::LinearPair { first, second, .. } => {
                [first, second].map(|half| (half.members.clone(), half.swiglu)).to_vec()
            }
            _ => Vec::new(),
        })
        .collect())
}

/// A MoE layer up to its combine, which the next norm computes (see [`Residual`]).
fn moe_block(g: &mut Build<'_>, i: usize, moe: &MoeSpec, x: ValueId, normed: ValueId) -> Result<Residual, GraphError> {
    let s = g.spec;
    let l = |w: LayerWeight| g.names.layer(w, i);
    let at = |what: &str| format!("layers.{i}.{what}");
    let router_rows = if moe.full_width_router { s.num_experts } else { moe.kept };
    // With a shared expert its gate logit comes from the same node, as the last column.
    let gate_column = s.shared_width > 0;
    let mut members = vec![(l(LayerWeight::Router), router_rows, false)];
    if gate_column {
        members.push((l(LayerWeight::SharedGate), 1, false));
    }
    let router = PairHalf {
        members: g.members(&members),
        round_output: false,
        swiglu: false,
    };
    let [shared_gate, shared_up, shared_down] =
        [Projection::Gate, Projection::Up, Projection::Down].map(|p| l(LayerWeight::Shared(p)));
    let shared = PairHalf {
        members: g.members(&[
            (shared_gate.clone(), s.shared_width, false),
            (shared_up.clone(), s.shared_width, false),
        ]),
        round_output: true,
        swiglu: true,
    };
    // The router logits and the shared expert's activation read the same row: one launch
    // computes both where it can.
    let (logits, shared_act) = if s.shared_width > 0 && pairs(&router, &shared) {
        let (pair_input, input) = g.linear_input(&at("router_logits"), normed)?;
        let pair = Op::LinearPair {
            first: router,
            second: shared,
            in_features: g.b_width(normed),
            input,
        };
        let outputs = g.b.node(&at("router_logits"), pair, &[pair_input])?;
        (outputs[0], Some(outputs[1]))
    } else {
        let logits = g.linear_node(&at("router_logits"), normed, router.members, false, None, false)?;
        (logits, None)
    };
    let route = RouterOp {
        layer: i,
        kept: moe.kept,
        k: s.top_k,
        sigmoid: s.sigmoid,
        full_width: moe.full_width_router,
        score_bias: moe.score_bias,
        norm_topk_prob: s.norm_topk_prob,
        scaling: s.routed_scaling_factor,
        n_group: s.n_group,
        topk_group: s.topk_group,
        group_size: s.num_experts / s.n_group.max(1),
        gate_column,
    };
    // The shared expert's activation.
    let shared_act = match shared_act {
        Some(act) => Some(act),
        None if s.shared_width > 0 => {
            Some(g.swiglu_act(&at("shared_expert"), normed, [shared_gate, shared_up], s.shared_width)?)
        }
        None => None,
    };
    // Its down projection reads nothing routing or the routed experts write. Where launches
    // run one after another, routing's launch computes it too where it can (a launch fewer
    // per layer). Where a launch that needs no barrier runs beside the one before it, it is a
    // launch of its own beside the routed gate/up, and routing lists its input so that the
    // barrier before routing makes that visible: the projection then overlaps the routed
    // experts instead of lengthening routing's launch, which the steps wait on (the same bits).
    let shared_down = PairHalf {
        members: g.members(&[(shared_down, s.hidden, false)]),
        round_output: true,
        swiglu: false,
    };
    // A BF16 width the main linear kernel cannot read runs in the ragged-width kernel: a
    // launch of its own after the ones before it, reading f32 rows.
    let ragged_down = shared_down.members.iter().any(|m| m.format.runs_ragged(s.shared_width));
    let fused = shared_act.filter(|_| {
        !g.concurrent && !ragged_down && shares_launch(&shared_down) && routes_beside_linear(g.rows, route.kept)
    });
    let listed = if g.concurrent { shared_act } else { fused };
    let op = Op::Router {
        route,
        linear: fused.map(|_| shared_down.clone()),
    };
    let routed = g.b.node(
        &at("router"),
        op,
        &[logits].into_iter().chain(listed).collect::<Vec<_>>(),
    )?;
    let (ids, weights) = (routed[0], routed[1]);
    if g.trace {
        g.b.output(ids);
        g.b.output(weights);
    }
    // Steps of many rows group their slots by expert once per layer (see GROUPED_EXPERT_ROWS).
    let groups = if g.rows >= GROUPED_EXPERT_ROWS {
        let grouping = Op::GroupSlots { experts: moe.kept };
        g.b.node(&at("group_slots"), grouping, &[ids])?
    } else {
        Vec::new()
    };
    // Grouped launches read their input as BF16 pairs (see `linear_input`).
    let grouped = !groups.is_empty();
    let expert =
        |g: &mut Build<'_>, label: &str, projections: &[Projection], input: ValueId, out: usize, swiglu: bool| {
            let in_features = *g.b.shape(input).last().unwrap_or(&0);
            let (input, _) = g.linear_input(&at(label), input)?;
            g.b.node1(
                &at(label),
                Op::Experts {
                    layer: i,
                    projections: projections
                        .iter()
                        .map(|&p| (p, moe.expert_formats[p as usize]))
                        .collect(),
                    out,
                    in_features,
                    k: s.top_k,
                    swiglu,
                    grouped,
                    workgroup: expert_width(g.rows),
                },
                &[input, ids]
                    .into_iter()
                    .chain(groups.iter().copied())
                    .collect::<Vec<_>>(),
            )
        };
    let gate_up = [Projection::Gate, Projection::Up];
    let [gate_format, up_format, _] = moe.expert_formats;
    // Stacked gate/up experts compute the SwiGLU in their epilogue; otherwise a separate node.
    let act = if stacks_expert_swiglu(gate_format, up_format) {
        expert(g, "experts.act", &gate_up, normed, s.expert_width, true)?
    } else {
        let both = expert(g, "experts.gate_up", &gate_up, normed, s.expert_width, false)?;
        g.b.node1(&at("experts.act"), Op::Swiglu { round_output: true }, &[both])?
    };
    let shared = match shared_act {
        Some(_) if fused.is_some() => Some(routed[2]),
        Some(act) => {
            // Beside the launch before it, it reads what routing lists: the activation as
            // the pair wrote it. One after another, it reads what the step's linears read.
            let beside = g.concurrent && !ragged_down;
            let (act, input) = if beside || ragged_down {
                (act, LinearInput::F32)
            } else {
                g.linear_input(&at("shared_expert.down"), act)?
            };
            Some(g.b.node1(
                &at("shared_expert.down"),
                Op::Linear {
                    members: shared_down.members,
                    in_features: s.shared_width,
                    round_output: true,
                    residual: false,
                    swiglu: false,
                    cache_write: None,
                    beside,
                    input,
                },
                &[act],
            )?)
        }
        None => None,
    };
    let down = expert(g, "experts.down", &[Projection::Down], act, s.hidden, false)?;
    let mut inputs = vec![x, down, weights];
    if let Some(shared) = shared {
        inputs.extend([logits, shared]);
    }
    Ok(Residual::Combine {
        layer: i,
        inputs,
        shared: shared_act.is_some(),
    })
}
