//! Synthetic inputs with something to find: every sequence has a few "topic" spans whose raw
//! keys lean towards one direction that every query also leans towards, so their blocks score
//! high and stand out in the heat map as columns.

use qsa_wgpu::testing::Rng;

/// Query heads and channels of the Qwen3.8-Flash-Next indexer.
pub const HI: usize = 4;
pub const DI: usize = 128;

/// Synthetic data with something to find: every sequence has a few "topic" spans whose keys
/// lean towards one direction that every query also leans towards, so their blocks stand out.
pub struct Synth {
    rng: Rng,
    topic: Vec<f32>,
    spans: Vec<Vec<(usize, usize)>>,
}

impl Synth {
    pub fn new(seed: u64, lens: &[usize]) -> Synth {
        let mut rng = Rng::new(seed);
        let topic = rng.normals(DI);
        let spans = lens
            .iter()
            .map(|&len| {
                (0..4)
                    .map(|_| {
                        let start = rng.below(len.max(1));
                        (start, start + 4 + rng.below(20))
                    })
                    .collect()
            })
            .collect();
        Synth { rng, topic, spans }
    }

    /// Raw index keys `[count, Di]` of sequence `seq`'s positions `from..from + count`.
    pub fn keys(&mut self, seq: usize, from: usize, count: usize) -> Vec<f32> {
        let mut v = self.rng.normals(count * DI);
        for (i, row) in v.chunks_mut(DI).enumerate() {
            let p = from + i;
            if self.spans[seq].iter().any(|&(a, b)| (a..b).contains(&p)) {
                row.iter_mut()
                    .zip(&self.topic)
                    .for_each(|(x, u)| *x += 1.2 * u);
            }
        }
        v
    }

    /// Raw index queries `[count, Hi, Di]`.
    pub fn queries(&mut self, count: usize) -> Vec<f32> {
        let mut v = self.rng.normals(count * HI * DI);
        for row in v.chunks_mut(DI) {
            row.iter_mut()
                .zip(&self.topic)
                .for_each(|(x, u)| *x += 0.6 * u);
        }
        v
    }
}
