//! The passes that turn the plain graph of a step ([`crate::drama3::plain`]: what the model
//! computes) into the graph the engine runs (how it runs): fusions, the linears' input
//! packing and the kernels' launch choices. Each pass is a named rewrite of the graph that
//! keeps every value's bits; each is tested on its own, and [`schedule`] runs them in
//! order, then drops the values no node uses any more and checks every node again.

mod edit;
mod fuse;
mod launch;

use crate::drama3::StepShape;
use crate::graph::{Graph, GraphError};

/// A pass: rewrites a graph in place for a step of this shape.
pub type Pass = fn(&mut Graph, &StepShape);

/// Every pass, in the order [`schedule`] runs them, with its name.
pub const PASSES: [(&str, Pass); 8] = [
    ("stack_swiglu", fuse::stack_swiglu),
    ("pair_linears", fuse::pair_linears),
    ("route_with_shared_down", fuse::route_with_shared_down),
    ("combine_into_norm", fuse::combine_into_norm),
    ("group_expert_slots", launch::group_expert_slots),
    ("expert_workgroups", launch::expert_workgroups),
    ("pack_linear_inputs", launch::pack_linear_inputs),
    ("attention_combine", launch::attention_combine),
];

/// The plain graph of a step after every pass: the graph the engine runs.
pub fn schedule(mut graph: Graph, shape: &StepShape) -> Result<Graph, GraphError> {
    for (_, pass) in PASSES {
        pass(&mut graph, shape);
    }
    edit::compact(&mut graph);
    check(&graph)?;
    Ok(graph)
}

/// The pass named `name`.
pub fn pass(name: &str) -> Option<Pass> {
    PASSES.iter().find(|(n, _)| *n == name).map(|&(_, pass)| pass)
}

pub use edit::check;
