//! The static memory plan: every activation gets a buffer, and buffers are reused once the
//! values in them are dead. Inputs get their own buffers; states (KV caches) belong to the
//! session. Values the host reads after the step are never reused. The output of a linear
//! that runs beside the launch before it ([`Op::Linear`]'s `beside`) gets a buffer no
//! earlier node used: wgpu records a barrier before any launch that writes a buffer the
//! step's pass has used before.

use serde::Serialize;

use crate::graph::Graph;
use crate::ir::ValueKind;

/// Buffer assignment of a graph.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryPlan {
    /// Size in bytes of each planned buffer.
    pub buffers: Vec<u64>,
    /// The buffer of each value (`None` for states).
    pub value_buffer: Vec<Option<usize>>,
}

impl MemoryPlan {
    /// Total bytes of planned buffers (inputs and activations).
    pub fn total_bytes(&self) -> u64 {
        self.buffers.iter().sum()
    }
}

/// Plans buffers greedily in execution order: a value takes the smallest free buffer that
/// holds it (growing it if none does; a new one for the output of a linear that runs beside
/// the launch before it), and frees its buffer after its last reader.
pub fn plan(graph: &Graph) -> MemoryPlan {
    let count = graph.values.len();
    let mut last_use = vec![None; count];
    for (index, node) in graph.nodes.iter().enumerate() {
        for input in &node.inputs {
            last_use[input.0] = Some(index);
        }
    }
    let mut buffers: Vec<u64> = Vec::new();
    let mut value_buffer = vec![None; count];
    let mut free: Vec<usize> = Vec::new();
    for (id, value) in graph.values.iter().enumerate() {
        if value.kind == ValueKind::Input {
            buffers.push(value.bytes());
            value_buffer[id] = Some(buffers.len() - 1);
        }
    }
    for (index, node) in graph.nodes.iter().enumerate() {
        let fresh = node.op.runs_beside();
        for output in &node.outputs {
            let need = graph.value(*output).bytes();
            let fitting = (0..free.len())
                .filter(|&slot| buffers[free[slot]] >= need)
                .min_by_key(|&slot| buffers[free[slot]]);
            let best = fitting.or_else(|| (0..free.len()).max_by_key(|&slot| buffers[free[slot]]));
            let best = best.filter(|_| !fresh);
            let buffer = match best {
                Some(slot) => {
                    let b = free.swap_remove(slot);
                    buffers[b] = buffers[b].max(need);
                    b
                }
                None => {
                    buffers.push(need);
                    buffers.len() - 1
                }
            };
            value_buffer[output.0] = Some(buffer);
        }
        // Free the buffers whose values die here (never the host-read outputs).
        for value in node.inputs.iter().chain(&node.outputs) {
            let dead = last_use[value.0].is_none_or(|last| last <= index);
            let kept = graph.outputs.contains(value) || graph.value(*value).kind != ValueKind::Activation;
            if dead
                && !kept
                && let Some(b) = value_buffer[value.0]
                && !free.contains(&b)
                && !live_elsewhere(graph, &value_buffer, &last_use, b, index)
            {
                free.push(b);
            }
        }
    }
    MemoryPlan { buffers, value_buffer }
}

/// Whether another value in buffer `b` is still needed after node `index`.
fn live_elsewhere(
    graph: &Graph,
    value_buffer: &[Option<usize>],
    last_use: &[Option<usize>],
    b: usize,
    index: usize,
) -> bool {
    graph.values.iter().enumerate().any(|(id, _)| {
        value_buffer[id] == Some(b)
            && (graph.outputs.iter().any(|o| o.0 == id) || last_use[id].is_some_and(|last| last > index))
    })
}
