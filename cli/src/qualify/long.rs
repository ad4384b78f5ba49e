//! One utterance long enough that its last rows take attention by blocks of a key/value
//! head's query heads, in a launch of its own over grids the host writes each step
//! (`docs/contract.md` §10): its logits from the first such row against the FP64 reference,
//! and the rows on each side of that length stepped again one at a time against the whole
//! utterance's bits.

use std::time::Instant;

use anyhow::Result;
use drama_engine::session::Engine;
use drama_kernels::{ATTENTION_BLOCKS_FROM, ATTENTION_CHUNK};
use drama_reference::ops::Rounding;
use drama_reference::{ReferenceModel, forced_routes, rel_l2};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

use super::Plant;
use super::exact::differing_bits;
use super::model::{HIDDEN_LIMIT, Utterance};
use super::receipt::{Check, Measured};

/// The checks' names: against the reference, and one row a step against the whole.
const NAMES: [&str; 2] = ["reference.long-context", "exact.long-context-steps"];

/// Rows stepped again one at a time on each side of the first row by blocks.
const STEPPED: usize = 3;

/// The two checks on `engine` (a generated tiny checkpoint, whose heads go by blocks of two).
pub fn checks(engine: &Engine, seed: u64, plant: &Plant) -> Vec<Check> {
    let started = Instant::now();
    match run(engine, seed, plant) {
        Ok(measured) => {
            let seconds = started.elapsed().as_secs_f64() / 2.0;
            NAMES
                .iter()
                .zip(measured)
                .map(|(name, m)| Check::measured(name, m, seconds))
                .collect()
        }
        Err(e) => vec![
            Check::run(NAMES[0], || Err(e)),
            Check::skipped(NAMES[1], "the long utterance did not run"),
        ],
    }
}

/// The utterance in one step, the rows around the first by blocks again one a step, and
/// the logits from that row on against the reference.
fn run(engine: &Engine, seed: u64, plant: &Plant) -> Result<[Measured; 2]> {
    let c = &engine.checkpoint.config;
    // The first position whose row reaches the blocks' count of chunks.
    let first_by_blocks = (ATTENTION_BLOCKS_FROM - 1) * ATTENTION_CHUNK;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x4C4F_4E47);
    let utterance = Utterance::random(c, &mut rng, 9, first_by_blocks + ATTENTION_CHUNK);
    let rows = &utterance.rows;
    let mut session = utterance.session(engine)?;
    let mut whole = session.step(rows, true)?;

    // The rows around the first by blocks again, one a step, over the caches the whole
    // step wrote: each step writes its row's key and value again, the same bits if it
    // computes them as the whole step did.
    let (start, end) = (first_by_blocks - STEPPED, first_by_blocks + STEPPED);
    let mut stepped = Vec::new();
    for row in &rows[start..end] {
        stepped.extend(session.step(std::slice::from_ref(row), false)?.logits);
    }
    plant.corrupt(NAMES[1], &mut stepped);
    let v = c.speech.audio_vocab_size;
    let differing = differing_bits(&stepped, &whole.logits[start * v..end * v]);

    // The reference follows the GPU's expert choices, which the model checks compare: this
    // check is about attention.
    let chosen = whole.routes.iter().map(|r| r.as_ref().map(|(ids, _)| ids.as_slice()));
    let forced = forced_routes(chosen, c.num_experts_per_tok);
    let reference = ReferenceModel::load(&engine.checkpoint);
    let want = reference.forward_routed(&utterance.reference_inputs(&reference), Rounding::Contract, &forced);
    let from = first_by_blocks * v;
    plant.corrupt(NAMES[0], &mut whole.logits[from..]);
    let error = rel_l2(&whole.logits[from..], &want.logits[from..]);
    Ok([
        Measured::new(
            error,
            HIDDEN_LIMIT,
            format!(
                "logits rel-L2 of positions {first_by_blocks}-{} (by blocks of heads) vs the contract-rounding FP64 reference on the GPU's routes",
                rows.len() - 1
            ),
        ),
        Measured::exact(
            differing,
            format!(
                "logits of positions {start}-{} stepped again one row a step vs in one step of {} rows",
                end - 1,
                rows.len()
            ),
        ),
    ])
}
