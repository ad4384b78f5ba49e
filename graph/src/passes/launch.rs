//! Launch choices by the step's size and the device: how the routed experts are launched,
//! how linears read their inputs and how attention combines its chunks. None changes a bit.

use drama_kernels::LinearInput;

use crate::drama3::StepShape;
use crate::graph::Graph;
use crate::ir::{DType, NormOutput, Op, ValueId};
use crate::select::{GROUPED_EXPERT_ROWS, expert_width, last_chunk_combines, linear_input};

use super::edit::{insert_node, producer, readers};

/// Steps of at least [`GROUPED_EXPERT_ROWS`] rows group each layer's routed-expert slots by
/// expert right after routing ([`Op::GroupSlots`], `layers.{i}.group_slots`), and launch the
/// layer's routed experts over those groups.
pub fn group_expert_slots(graph: &mut Graph, shape: &StepShape) {
    if shape.rows < GROUPED_EXPERT_ROWS {
        return;
    }
    let mut index = 0;
    while index < graph.nodes.len() {
        if let Op::Router { route, .. } = &graph.nodes[index].op {
            let label = format!("layers.{}.group_slots", route.layer);
            let grouping = Op::GroupSlots { experts: route.kept };
            let ids = graph.nodes[index].outputs[0];
            let groups = insert_node(graph, index + 1, label, grouping, vec![ids]);
            for reader in readers(graph, ids) {
                let node = &mut graph.nodes[reader];
                if let Op::Experts { grouped, .. } = &mut node.op {
                    *grouped = true;
                    node.inputs.extend(&groups);
                }
            }
            index += 1;
        }
        index += 1;
    }
}

/// The routed experts' workgroup width for the step's rows ([`expert_width`]).
pub fn expert_workgroups(graph: &mut Graph, shape: &StepShape) {
    for node in &mut graph.nodes {
        if let Op::Experts { workgroup, .. } = &mut node.op {
            *workgroup = expert_width(shape.rows);
        }
    }
}

/// Steps whose linears read BF16 pairs ([`linear_input`]) pack each value a linear, a
/// linear pair or grouped routed experts read once, and those readers read the packed copy.
/// A norm whose every reader reads pairs writes its output packed
/// ([`NormOutput::Bf16Pairs`]); any other value is packed by a launch right before its
/// first reader (`{reader}.input`). Left as f32: a linear that runs beside the launch
/// before it (it reads what routing lists) and one whose BF16 width only the ragged-width
/// kernel reads.
pub fn pack_linear_inputs(graph: &mut Graph, shape: &StepShape) {
    if linear_input(shape.rows) != LinearInput::Bf16Pairs {
        return;
    }
    let mut packed = std::collections::HashMap::new();
    let mut index = 0;
    while index < graph.nodes.len() {
        if reads_packed(&graph.nodes[index].op) {
            let x = graph.nodes[index].inputs[0];
            let copy = match packed.get(&x) {
                Some(&copy) => copy,
                None if norm_writes_pairs(graph, x) => {
                    packed.insert(x, x);
                    x
                }
                None => {
                    let label = format!("{}.input", graph.nodes[index].label);
                    let copy = insert_node(graph, index, label, Op::PackBf16, vec![x])[0];
                    index += 1;
                    packed.insert(x, copy);
                    copy
                }
            };
            let node = &mut graph.nodes[index];
            node.inputs[0] = copy;
            if let Op::Linear { input, .. } | Op::LinearPair { input, .. } = &mut node.op {
                *input = LinearInput::Bf16Pairs;
            }
            debug_assert_eq!(graph.value(copy).dtype, DType::Bf16Pairs);
        }
        index += 1;
    }
}

/// Makes the norm that writes `x` write it as BF16 pairs, where `x` is a BF16-rounding
/// norm's normed output (a combine's last) and every reader reads it as pairs; returns
/// whether it did.
fn norm_writes_pairs(graph: &mut Graph, x: ValueId) -> bool {
    let Some(maker) = producer(graph, x) else {
        return false;
    };
    if graph.nodes[maker].outputs.last() != Some(&x) {
        return false;
    }
    let all_read_pairs = readers(graph, x)
        .into_iter()
        .all(|reader| reads_packed(&graph.nodes[reader].op) && graph.nodes[reader].inputs[0] == x);
    let output = match &mut graph.nodes[maker].op {
        Op::RmsNorm { output, .. } | Op::MoeCombineNorm { output, .. } => output,
        _ => return false,
    };
    if *output != NormOutput::Bf16 || !all_read_pairs || graph.outputs.contains(&x) {
        return false;
    }
    *output = NormOutput::Bf16Pairs;
    graph.values[x.0].dtype = DType::Bf16Pairs;
    true
}

/// Whether a node reads its first input as BF16 pairs in a step whose linears do.
fn reads_packed(op: &Op) -> bool {
    match op {
        Op::Linear {
            members,
            in_features,
            beside: false,
            ..
        } => !members.iter().any(|m| m.format.runs_ragged(*in_features)),
        Op::LinearPair { .. } | Op::Experts { grouped: true, .. } => true,
        _ => false,
    }
}

/// Attention's chunks combined in its own launch where the device and the step's size allow
/// ([`last_chunk_combines`]).
pub fn attention_combine(graph: &mut Graph, shape: &StepShape) {
    for node in &mut graph.nodes {
        if let Op::Attention {
            last_chunk_combines: combines,
            ..
        } = &mut node.op
        {
            *combines = last_chunk_combines(shape.rows, shape.device_barriers);
        }
    }
}
