//! Readable text, JSON and Graphviz DOT dumps of a graph and its memory plan, all from one
//! walk over the nodes.

use std::fmt::Write;

use serde::Serialize;

use crate::graph::Graph;
use crate::ir::{Op, ValueId};
use crate::plan::MemoryPlan;
use crate::select::kernels_of;

/// One node as dumped.
#[derive(Debug, Clone, Serialize)]
pub struct NodeDump {
    /// Position in execution order.
    pub index: usize,
    /// Label.
    pub label: String,
    /// Op name.
    pub op: &'static str,
    /// Input value names.
    pub inputs: Vec<String>,
    /// Outputs: name, shape, dtype, buffer.
    pub outputs: Vec<ValueDump>,
    /// Weight formats used (linears and experts).
    pub formats: Vec<String>,
    /// Kernels launched.
    pub kernels: Vec<String>,
    /// The op with its attributes.
    pub attributes: Op,
}

/// One value as dumped.
#[derive(Debug, Clone, Serialize)]
pub struct ValueDump {
    /// Name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Dtype.
    pub dtype: String,
    /// Planned buffer.
    pub buffer: Option<usize>,
}

/// The whole dump.
#[derive(Debug, Clone, Serialize)]
pub struct GraphDump {
    /// Nodes in execution order.
    pub nodes: Vec<NodeDump>,
    /// Planned buffers and their sizes.
    pub buffers: Vec<u64>,
    /// Sum of planned buffer sizes.
    pub activation_bytes: u64,
    /// Kernel launches of one step, before weight splitting.
    pub kernel_launches: usize,
    /// Those that run beside the launch before them (see [`Op::Linear`]'s `beside`).
    pub beside_launches: usize,
}

fn value_dump(graph: &Graph, plan: &MemoryPlan, id: ValueId) -> ValueDump {
    let v = graph.value(id);
    ValueDump {
        name: v.name.clone(),
        shape: v.shape.clone(),
        dtype: format!("{:?}", v.dtype).to_lowercase(),
        buffer: plan.value_buffer[id.0],
    }
}

/// Walks the graph once into the dump structure.
pub fn dump(graph: &Graph, plan: &MemoryPlan) -> GraphDump {
    let nodes: Vec<NodeDump> = graph
        .nodes
        .iter()
        .enumerate()
        .map(|(index, node)| {
            let formats = match &node.op {
                Op::Linear { members, .. } => members.iter().map(|m| format!("{:?}", m.format)).collect(),
                Op::LinearPair { first, second, .. } => first
                    .members
                    .iter()
                    .chain(&second.members)
                    .map(|m| format!("{:?}", m.format))
                    .collect(),
                Op::Router { linear: Some(half), .. } => {
                    half.members.iter().map(|m| format!("{:?}", m.format)).collect()
                }
                Op::Experts { projections, .. } => projections.iter().map(|(_, f)| format!("{f:?}")).collect(),
                _ => Vec::new(),
            };
            NodeDump {
                index,
                label: node.label.clone(),
                op: node.op.name(),
                inputs: node.inputs.iter().map(|&i| graph.value(i).name.clone()).collect(),
                outputs: node.outputs.iter().map(|&o| value_dump(graph, plan, o)).collect(),
                formats,
                kernels: kernels_of(&node.op).iter().map(|k| format!("{k:?}")).collect(),
                attributes: node.op.clone(),
            }
        })
        .collect();
    let kernel_launches = nodes.iter().map(|n| n.kernels.len()).sum();
    let beside_launches = nodes.iter().filter(|n| n.attributes.runs_beside()).count();
    GraphDump {
        nodes,
        buffers: plan.buffers.clone(),
        activation_bytes: plan.total_bytes(),
        kernel_launches,
        beside_launches,
    }
}

impl GraphDump {
    /// One line per node: index, label, op, output shape/dtype/buffer, formats, kernels; the
    /// labels and op names in columns as wide as the longest.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let label_width = self.nodes.iter().map(|n| n.label.len()).max().unwrap_or(0);
        let op_width = self.nodes.iter().map(|n| n.op.len()).max().unwrap_or(0);
        for n in &self.nodes {
            let outputs: Vec<String> = n
                .outputs
                .iter()
                .map(|o| {
                    let buffer = o.buffer.map_or("state".to_string(), |b| format!("b{b}"));
                    format!("{}{:?}@{buffer}", o.dtype, o.shape)
                })
                .collect();
            let _ = write!(
                out,
                "{:>4}  {:<label_width$}  {:<op_width$}  -> {}",
                n.index,
                n.label,
                n.op,
                outputs.join(", ")
            );
            if !n.formats.is_empty() {
                let _ = write!(out, "  [{}]", n.formats.join(", "));
            }
            let beside = if n.attributes.runs_beside() {
                " beside the launch before"
            } else {
                ""
            };
            let _ = writeln!(out, "  {{{}}}{beside}", n.kernels.join(", "));
        }
        let _ = writeln!(
            out,
            "{} nodes, {} kernel launches per step (before weight splitting; {} beside the launch before them), {} activation buffers, {} activation bytes",
            self.nodes.len(),
            self.kernel_launches,
            self.beside_launches,
            self.buffers.len(),
            self.activation_bytes
        );
        out
    }

    /// The dump as pretty JSON.
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).expect("dump serializes")
    }

    /// The dataflow as a Graphviz digraph: one box per node, edges along values.
    pub fn dot(&self) -> String {
        let mut out = String::from("digraph drama {\n  rankdir=TB;\n  node [shape=box, fontname=monospace];\n");
        let mut producer = std::collections::HashMap::new();
        for n in &self.nodes {
            let shape = n.outputs.first().map(|o| format!("{:?}", o.shape)).unwrap_or_default();
            let _ = writeln!(out, "  n{} [label=\"{}\\n{} {}\"];", n.index, n.label, n.op, shape);
            for o in &n.outputs {
                producer.insert(o.name.clone(), n.index);
            }
        }
        for n in &self.nodes {
            for input in &n.inputs {
                match producer.get(input) {
                    Some(p) => {
                        let _ = writeln!(out, "  n{p} -> n{};", n.index);
                    }
                    None => {
                        let _ = writeln!(out, "  \"{input}\" [shape=ellipse];\n  \"{input}\" -> n{};", n.index);
                    }
                }
            }
        }
        out.push_str("}\n");
        out
    }
}
