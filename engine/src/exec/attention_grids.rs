//! Attention's launch geometry: which rows go a workgroup per head and which by blocks of
//! heads, the workgroup counts the host writes for each kind's launch, and which launches a
//! step's recorded commands hold.

use crate::gpu::Gpu;

/// The workgroup counts of a step's two attention launches, written with each step's
/// inputs: [`drama_kernels::Kernel::Attend`]'s over the rows that go a workgroup per head,
/// [`drama_kernels::Kernel::AttendBlocks`]' over those long enough to go by blocks of heads (from
/// [`drama_kernels::ATTENTION_BLOCKS_FROM`] chunks, as `attention.wgsl`'s `by_blocks` decides),
/// each over the chunks its furthest row reaches and none where it has no row: a step's
/// attention costs what its context needs however long the session's lanes are.
#[derive(Clone)]
pub(super) struct AttentionGrids {
    /// [`drama_kernels::Kernel::Attend`]'s counts.
    pub(super) per_head: wgpu::Buffer,
    /// [`drama_kernels::Kernel::AttendBlocks`]' counts.
    pub(super) blocks: wgpu::Buffer,
    rows: u32,
    heads: u32,
    /// Query heads per block (1: no row goes by blocks, and there is no blocks launch).
    pub(super) block_heads: u32,
}

impl AttentionGrids {
    pub(super) fn new(gpu: &Gpu, rows: usize, attention: AttentionShape) -> AttentionGrids {
        let grid = |label| {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: 12,
                usage: wgpu::BufferUsages::INDIRECT | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        AttentionGrids {
            per_head: grid("attention grid"),
            blocks: grid("attention blocks grid"),
            rows: rows as u32,
            heads: attention.heads as u32,
            block_heads: attention.block_heads as u32,
        }
    }

    /// The [per-head, blocks] launches' counts for rows at `positions` of caches of
    /// `capacity` positions.
    pub(super) fn counts(&self, positions: &[u32], capacity: usize) -> [[u32; 3]; 2] {
        let [per_head, blocks] = chunks_reached(positions, capacity, self.block_heads);
        [
            [self.rows, self.heads, per_head],
            [self.rows, self.heads / self.block_heads, blocks],
        ]
    }
}

/// The chunks the furthest row at `positions` of each kind reaches, [a workgroup per head,
/// by blocks of `block_heads` heads], at most those of `capacity` positions; 0 for a kind
/// with no row.
fn chunks_reached(positions: &[u32], capacity: usize, block_heads: u32) -> [u32; 2] {
    let chunk = drama_kernels::ATTENTION_CHUNK as u32;
    let most = drama_kernels::attention_chunks(capacity) as u32;
    let mut reach = [0u32; 2];
    for &pos in positions {
        let chunks = pos / chunk + 1;
        let by_blocks = block_heads > 1 && chunks >= drama_kernels::ATTENTION_BLOCKS_FROM as u32;
        let furthest = &mut reach[usize::from(by_blocks)];
        *furthest = (*furthest).max(chunks.min(most));
    }
    reach
}

/// Which attention launches a step's recorded commands hold: those of the kinds (a
/// workgroup per head, blocks of heads) its rows take. Commands recorded ahead of a step's
/// inputs hold the last step's set, and are recorded again where the step needs another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchSet {
    attention: [bool; 2],
}

impl LaunchSet {
    /// The set for the counts last written into the [per-head, blocks] grids (none written
    /// yet: both launches).
    pub(super) fn of_written(grids: [&[u32]; 2]) -> LaunchSet {
        LaunchSet {
            attention: grids.map(|grid| grid.get(2) != Some(&0)),
        }
    }

    /// Whether the attention launches of `kind` (0: a workgroup per head, 1: blocks of
    /// heads) run.
    pub(super) fn runs(&self, kind: usize) -> bool {
        self.attention[kind]
    }
}

/// A step's attention heads: its query heads and their blocks (1 and 1 where the graph has
/// no attention).
#[derive(Clone, Copy)]
pub(super) struct AttentionShape {
    pub(super) heads: usize,
    pub(super) head_dim: usize,
    pub(super) block_heads: usize,
}

#[cfg(test)]
mod tests {
    use super::chunks_reached;
    use drama_kernels::{ATTENTION_BLOCKS_FROM, ATTENTION_CHUNK};
    use rand_core::Rng;

    /// Each attention launch reaches every chunk of each of its rows and no further, a
    /// launch with no rows reaches none, and a row goes by blocks exactly when it reaches
    /// `ATTENTION_BLOCKS_FROM` chunks and its heads make blocks.
    #[test]
    fn each_attention_launch_reaches_its_own_rows_furthest_chunk() {
        let mut rng = crate::test_support::rng("attention launches' reach");
        let first_by_blocks = ((ATTENTION_BLOCKS_FROM - 1) * ATTENTION_CHUNK) as u32;
        let capacity = 3 * ATTENTION_BLOCKS_FROM * ATTENTION_CHUNK;
        for case in 0..200 {
            let rows = 1 + rng.next_u32() % 8;
            let positions: Vec<u32> = (0..rows)
                .map(|_| match rng.next_u32() % 4 {
                    0 => first_by_blocks - 1 - rng.next_u32() % 2,
                    1 => first_by_blocks + rng.next_u32() % 2,
                    _ => rng.next_u32() % capacity as u32,
                })
                .collect();
            for block_heads in [1, 2, 4] {
                let reach = chunks_reached(&positions, capacity, block_heads);
                let mut want = [0u32; 2];
                for &pos in &positions {
                    let kind = usize::from(block_heads > 1 && pos >= first_by_blocks);
                    want[kind] = want[kind].max(pos / ATTENTION_CHUNK as u32 + 1);
                }
                assert_eq!(
                    reach, want,
                    "case {case}, positions {positions:?}, blocks of {block_heads}"
                );
            }
        }
    }
}
