//! The RoPE table the attention kernels read.

/// The cos/sin table the GPU uses: entry pos * half + i = (cos, sin) of pos * theta^(-2i/d),
/// computed in f64 and rounded once to f32.
pub fn rope_table(positions: usize, head_dim: usize, theta: f64) -> Vec<[f32; 2]> {
    let half = head_dim / 2;
    (0..positions)
        .flat_map(|pos| {
            (0..half).map(move |i| {
                let angle = pos as f64 * theta.powf(-2.0 * i as f64 / head_dim as f64);
                [angle.cos() as f32, angle.sin() as f32]
            })
        })
        .collect()
}
