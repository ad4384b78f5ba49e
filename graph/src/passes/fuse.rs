//! Fusions: work of several plain nodes done by one launch, the same bits as apart.

use crate::drama3::StepShape;
use crate::graph::{Graph, Node};
use crate::ir::{Op, PairHalf, Projection};
use crate::select::{pairs, routes_beside_linear, shares_launch, stacks_expert_swiglu, stacks_swiglu};

use super::edit::{producer, readers};

/// A SwiGLU whose [gate | up] input only it reads, made by a linear whose members stack
/// ([`stacks_swiglu`]) or by routed experts whose gate and up stack
/// ([`stacks_expert_swiglu`]), is computed in that node's epilogue: the two nodes become
/// one, labelled as the SwiGLU and writing its output.
pub fn stack_swiglu(graph: &mut Graph, _: &StepShape) {
    let mut index = 0;
    while index < graph.nodes.len() {
        if let Op::Swiglu { round_output } = graph.nodes[index].op
            && let [gate_up] = graph.nodes[index].inputs[..]
            && readers(graph, gate_up) == [index]
            && let Some(maker) = producer(graph, gate_up)
            && let Some(stacked) = stacked_swiglu(&graph.nodes[maker].op, round_output)
        {
            let swiglu = graph.nodes.remove(index);
            let node = &mut graph.nodes[maker];
            node.op = stacked;
            node.outputs = swiglu.outputs;
            node.label = swiglu.label;
            continue;
        }
        index += 1;
    }
}

/// `op` computing the SwiGLU of its outputs in its epilogue, if its members stack.
fn stacked_swiglu(op: &Op, round_output: bool) -> Option<Op> {
    match op {
        Op::Linear {
            members,
            in_features,
            residual: false,
            swiglu: false,
            cache_write: None,
            beside,
            input,
            ..
        } if stacks_swiglu(members) => Some(Op::Linear {
            members: members.clone(),
            in_features: *in_features,
            round_output,
            residual: false,
            swiglu: true,
            cache_write: None,
            beside: *beside,
            input: *input,
        }),
        Op::Experts {
            projections,
            swiglu: false,
            ..
        } if matches!(projections[..], [(Projection::Gate, gate), (Projection::Up, up)]
            if stacks_expert_swiglu(gate, up)) =>
        {
            let mut stacked = op.clone();
            if let Op::Experts { swiglu, .. } = &mut stacked {
                *swiglu = true;
            }
            Some(stacked)
        }
        _ => None,
    }
}

/// Two linears in a row over the same input that can share a launch ([`pairs`]: a MoE
/// layer's router logits and its shared expert's SwiGLU) become one [`Op::LinearPair`],
/// labelled as the first; the second's output is named after it (`{label}.1`).
pub fn pair_linears(graph: &mut Graph, _: &StepShape) {
    let mut index = 0;
    while index + 1 < graph.nodes.len() {
        let (first, second) = (&graph.nodes[index], &graph.nodes[index + 1]);
        if let (Some((first_half, in_features, input)), Some((second_half, _, _))) = (half(first), half(second))
            && first.inputs == second.inputs
            && pairs(&first_half, &second_half)
        {
            let second = graph.nodes.remove(index + 1);
            let node = &mut graph.nodes[index];
            graph.values[second.outputs[0].0].name = format!("{}.1", node.label);
            node.op = Op::LinearPair {
                first: first_half,
                second: second_half,
                in_features,
                input,
            };
            node.outputs.extend(second.outputs);
        }
        index += 1;
    }
}

/// A linear node that reads nothing but its input, as a [`PairHalf`], with its width and
/// how it reads its input.
fn half(node: &Node) -> Option<(PairHalf, usize, drama_kernels::LinearInput)> {
    match &node.op {
        Op::Linear {
            members,
            in_features,
            round_output,
            residual: false,
            swiglu,
            cache_write: None,
            beside: false,
            input,
        } => Some((
            PairHalf {
                members: members.clone(),
                round_output: *round_output,
                swiglu: *swiglu,
            },
            *in_features,
            *input,
        )),
        _ => None,
    }
}

/// A MoE layer's shared-expert down projection reads nothing routing or the routed experts
/// write. Where launches run one after another, routing's launch computes it too where it
/// can ([`routes_beside_linear`]; a launch fewer per layer): the router gets the linear, its
/// input, and its output as a third (`{label}.2`). Where a launch that needs no barrier runs
/// beside the one before it ([`StepShape::concurrent_launches`]), it stays a launch of its
/// own beside the routed gate/up (`beside`), and routing lists its input so that the barrier
/// before routing makes that visible: the projection then overlaps the routed experts
/// instead of lengthening routing's launch. A BF16 width the main linear kernel cannot read
/// runs in the ragged-width kernel, after the launches before it.
pub fn route_with_shared_down(graph: &mut Graph, shape: &StepShape) {
    let mut index = 0;
    while index < graph.nodes.len() {
        if let Some(found) = shared_down_of_router(graph, index) {
            let fused = !shape.concurrent_launches
                && !found.ragged
                && shares_launch(&found.linear)
                && routes_beside_linear(shape.rows, found.kept);
            let activation = graph.nodes[found.down].inputs[0];
            if fused {
                let down = graph.nodes.remove(found.down);
                let node = &mut graph.nodes[index];
                graph.values[down.outputs[0].0].name = format!("{}.2", node.label);
                if let Op::Router { linear, .. } = &mut node.op {
                    *linear = Some(found.linear);
                }
                node.inputs.push(activation);
                node.outputs.extend(down.outputs);
            } else if shape.concurrent_launches {
                graph.nodes[index].inputs.push(activation);
                if let Op::Linear { beside, .. } = &mut graph.nodes[found.down].op {
                    *beside = !found.ragged;
                }
            }
        }
        index += 1;
    }
}

/// A router's layer's shared-expert down projection, as [`route_with_shared_down`] weighs it.
struct SharedDown {
    /// The down projection's node.
    down: usize,
    /// It as the linear of a router.
    linear: PairHalf,
    /// Its BF16 width is one only the ragged-width kernel reads.
    ragged: bool,
    /// The router's kept experts.
    kept: usize,
}

/// For the router at `index` (routing only): its layer's shared-expert down projection, the
/// linear whose output the combine that reads the router's weights adds as its shared
/// expert's.
fn shared_down_of_router(graph: &Graph, index: usize) -> Option<SharedDown> {
    let router = &graph.nodes[index];
    let Op::Router {
        route, linear: None, ..
    } = &router.op
    else {
        return None;
    };
    let weights = *router.outputs.get(1)?;
    let combine = readers(graph, weights)
        .into_iter()
        .find(|&r| matches!(graph.nodes[r].op, Op::MoeCombine { shared: true, .. }))?;
    let down = producer(graph, graph.nodes[combine].inputs[4])?;
    let (linear, in_features, _) = half(&graph.nodes[down])?;
    Some(SharedDown {
        down,
        ragged: linear.members.iter().any(|m| m.format.runs_ragged(in_features)),
        linear,
        kept: route.kept,
    })
}

/// A MoE combine followed by the RMSNorm of its output (the next layer's input norm, or the
/// final norm) is computed in the norm's launch ([`Op::MoeCombineNorm`]): one node labelled
/// as the combine, writing the combined stream and the normed rows (`{label}.1`).
pub fn combine_into_norm(graph: &mut Graph, _: &StepShape) {
    let mut index = 0;
    while index + 1 < graph.nodes.len() {
        let (combine, norm) = (&graph.nodes[index], &graph.nodes[index + 1]);
        if let (Op::MoeCombine { k, shared }, Op::RmsNorm { weight, eps, output }) = (&combine.op, &norm.op)
            && norm.inputs == combine.outputs
        {
            let op = Op::MoeCombineNorm {
                k: *k,
                shared: *shared,
                weight: weight.clone(),
                eps: *eps,
                output: *output,
            };
            let norm = graph.nodes.remove(index + 1);
            let node = &mut graph.nodes[index];
            graph.values[norm.outputs[0].0].name = format!("{}.1", node.label);
            node.op = op;
            node.outputs.extend(norm.outputs);
        }
        index += 1;
    }
}
