//! What the passes share to edit a graph: who makes and who reads a value, new values, and
//! the clean-up and check after the last pass.

use crate::graph::{Graph, GraphError, Node};
use crate::ir::{DType, Op, Value, ValueId, ValueKind};

/// The index of the node that makes `value`.
pub fn producer(graph: &Graph, value: ValueId) -> Option<usize> {
    graph.nodes.iter().position(|node| node.outputs.contains(&value))
}

/// The indices of the nodes that read `value`, in order.
pub fn readers(graph: &Graph, value: ValueId) -> Vec<usize> {
    (0..graph.nodes.len())
        .filter(|&index| graph.nodes[index].inputs.contains(&value))
        .collect()
}

/// A new activation.
pub fn new_value(graph: &mut Graph, name: String, shape: Vec<usize>, dtype: DType) -> ValueId {
    graph.values.push(Value {
        name,
        shape,
        dtype,
        kind: ValueKind::Activation,
    });
    ValueId(graph.values.len() - 1)
}

/// Inserts a node made of `op` reading `inputs` at `index`, its outputs new values named
/// after `label` as [`crate::GraphBuilder`] names them (typed by [`crate::infer::infer`]);
/// returns them. Panics where the op does not fit its inputs: a pass's bug.
pub fn insert_node(graph: &mut Graph, index: usize, label: String, op: Op, inputs: Vec<ValueId>) -> Vec<ValueId> {
    let values: Vec<&Value> = inputs.iter().map(|&i| graph.value(i)).collect();
    let typed = crate::infer::infer(&op, &values).unwrap_or_else(|e| panic!("pass made {label}: {e}"));
    let outputs = typed
        .into_iter()
        .enumerate()
        .map(|(n, (shape, dtype))| {
            let suffix = if n == 0 { String::new() } else { format!(".{n}") };
            new_value(graph, format!("{label}{suffix}"), shape, dtype)
        })
        .collect::<Vec<_>>();
    graph.nodes.insert(
        index,
        Node {
            op,
            inputs,
            outputs: outputs.clone(),
            label,
        },
    );
    outputs
}

/// Drops the activations no node makes or reads any more (what a fusion left behind),
/// keeping the others in their order.
pub fn compact(graph: &mut Graph) {
    let mut used = vec![false; graph.values.len()];
    for node in &graph.nodes {
        for value in node.inputs.iter().chain(&node.outputs) {
            used[value.0] = true;
        }
    }
    for value in &graph.outputs {
        used[value.0] = true;
    }
    let mut renumbered = vec![None; graph.values.len()];
    let mut kept = Vec::new();
    for (id, value) in std::mem::take(&mut graph.values).into_iter().enumerate() {
        if used[id] || value.kind != ValueKind::Activation {
            renumbered[id] = Some(ValueId(kept.len()));
            kept.push(value);
        }
    }
    graph.values = kept;
    let new = |id: &mut ValueId| *id = renumbered[id.0].expect("a used value is kept");
    for node in &mut graph.nodes {
        node.inputs.iter_mut().for_each(new);
        node.outputs.iter_mut().for_each(new);
    }
    graph.outputs.iter_mut().for_each(new);
}

/// Checks every node's inputs against its op again, and that its outputs have the types
/// the op gives them.
pub fn check(graph: &Graph) -> Result<(), GraphError> {
    for node in &graph.nodes {
        let fail = |problem: String| GraphError {
            label: node.label.clone(),
            op: node.op.name(),
            problem,
        };
        let inputs: Vec<&Value> = node.inputs.iter().map(|&i| graph.value(i)).collect();
        let typed = crate::infer::infer(&node.op, &inputs).map_err(fail)?;
        let made: Vec<(Vec<usize>, DType)> = node
            .outputs
            .iter()
            .map(|&o| (graph.value(o).shape.clone(), graph.value(o).dtype))
            .collect();
        if typed != made {
            return Err(fail(format!("its outputs are {made:?}, the op makes {typed:?}")));
        }
    }
    Ok(())
}
