//! The graph: values and nodes in topological order, built through [`GraphBuilder`], which
//! checks every op's inputs and infers its outputs as nodes are added.

use serde::Serialize;

use crate::ir::{DType, Op, Value, ValueId, ValueKind};

/// One operation applied to values.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Node {
    /// The op and its attributes.
    pub op: Op,
    /// Input values.
    pub inputs: Vec<ValueId>,
    /// Output values.
    pub outputs: Vec<ValueId>,
    /// Readable label (`layers.3.q_proj`).
    pub label: String,
}

/// A static op graph for one step shape.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Graph {
    /// Every value.
    pub values: Vec<Value>,
    /// Nodes in execution order.
    pub nodes: Vec<Node>,
    /// Values the host reads after a step (logits, traced activations).
    pub outputs: Vec<ValueId>,
}

/// An op whose inputs do not fit it: a builder bug, reported with the node's label.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("node {label} ({op}): {problem}")]
pub struct GraphError {
    /// The node.
    pub label: String,
    /// The op name.
    pub op: &'static str,
    /// What does not fit.
    pub problem: String,
}

impl Graph {
    /// A value by id.
    pub fn value(&self, id: ValueId) -> &Value {
        &self.values[id.0]
    }

    /// The id of the value named `name`.
    pub fn find(&self, name: &str) -> Option<ValueId> {
        self.values.iter().position(|v| v.name == name).map(ValueId)
    }
}

/// Adds values and nodes, validating each node against its op's rules.
#[derive(Debug, Default)]
pub struct GraphBuilder {
    graph: Graph,
}

impl GraphBuilder {
    /// Declares a value written by the host or held by the session.
    pub fn input(&mut self, name: &str, shape: Vec<usize>, dtype: DType, kind: ValueKind) -> ValueId {
        self.graph.values.push(Value {
            name: name.to_string(),
            shape,
            dtype,
            kind,
        });
        ValueId(self.graph.values.len() - 1)
    }

    /// Adds a node; its outputs are inferred (and its inputs checked) by [`infer`].
    pub fn node(&mut self, label: &str, op: Op, inputs: &[ValueId]) -> Result<Vec<ValueId>, GraphError> {
        let input_values: Vec<&Value> = inputs.iter().map(|&i| self.graph.value(i)).collect();
        let outputs = crate::infer::infer(&op, &input_values).map_err(|problem| GraphError {
            label: label.to_string(),
            op: op.name(),
            problem,
        })?;
        let ids = outputs
            .into_iter()
            .enumerate()
            .map(|(index, (shape, dtype))| {
                let suffix = if index == 0 { String::new() } else { format!(".{index}") };
                self.graph.values.push(Value {
                    name: format!("{label}{suffix}"),
                    shape,
                    dtype,
                    kind: ValueKind::Activation,
                });
                ValueId(self.graph.values.len() - 1)
            })
            .collect::<Vec<_>>();
        self.graph.nodes.push(Node {
            op,
            inputs: inputs.to_vec(),
            outputs: ids.clone(),
            label: label.to_string(),
        });
        Ok(ids)
    }

    /// Adds a node with a single output.
    pub fn node1(&mut self, label: &str, op: Op, inputs: &[ValueId]) -> Result<ValueId, GraphError> {
        Ok(self.node(label, op, inputs)?[0])
    }

    /// Marks a value as read by the host after the step.
    pub fn output(&mut self, value: ValueId) {
        if !self.graph.outputs.contains(&value) {
            self.graph.outputs.push(value);
        }
    }

    /// Shape of a value already in the graph.
    pub fn shape(&self, id: ValueId) -> Vec<usize> {
        self.graph.value(id).shape.clone()
    }

    /// The graph built so far.
    pub fn peek(&self) -> &Graph {
        &self.graph
    }

    /// The finished graph.
    pub fn finish(self) -> Graph {
        self.graph
    }
}
