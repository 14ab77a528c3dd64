//! A decode loop a user can copy: one QSA indexer layer (Qwen3.8-Flash-Next geometry) serving
//! two sequences — a prefill, decode steps, one sequence ending and a new one taking its slot.
//! In a model, the raw index keys and queries come from the layer's projections; here they are
//! random. Run with `cargo run --release --example decode_loop`.

use qsa_wgpu::gpu::{Context, ContextOptions};
use qsa_wgpu::indexer::{IndexerConfig, QsaIndexer};
use qsa_wgpu::testing::Rng;
use qsa_wgpu::{DType, Result};

fn main() -> Result<()> {
    let ctx = Context::new_blocking(&ContextOptions::default())?;
    println!("adapter: {}", ctx.describe());
    let (max_len, max_seqs) = (4096, 2);
    let cfg = IndexerConfig::qwen(DType::BF16, max_len, max_seqs);
    let mut rng = Rng::new(7);
    let (k_norm, q_norm) = (
        rng.tensor(cfg.dtype, &[cfg.di]),
        rng.tensor(cfg.dtype, &[cfg.di]),
    );
    // Pages in any order: the pool hands them out as sequences grow.
    let pages = max_seqs * max_len.div_ceil(cfg.page_size);
    let mut layer = QsaIndexer::new(
        ctx.clone(),
        cfg.clone(),
        k_norm,
        q_norm,
        (0..pages as u32).collect(),
    )?;

    let a = layer.add_sequence()?;
    let b = layer.add_sequence()?;
    // One step: append each sequence's new raw keys, then run the step with one count per slot.
    let mut step = |layer: &mut QsaIndexer, counts: &[usize]| -> Result<()> {
        for (slot, &n) in counts.iter().enumerate().filter(|(_, &n)| n > 0) {
            layer.append_keys(slot, &rng.normals(n * cfg.di))?;
        }
        let rows: usize = counts.iter().sum();
        let q_raw = rng.tensor(cfg.dtype, &[rows, cfg.hi, cfg.di]);
        let out = pollster::block_on(layer.step(counts, &q_raw))?;
        // `out.token_indices` / `out.token_count` are GPU buffers an attention kernel can bind;
        // reading them back is optional.
        let sel = pollster::block_on(out.read(&ctx))?;
        let count = sel["token_count"].to_i32();
        println!(
            "step {counts:?}: {rows} rows, last row attends to {} tokens",
            count.last().copied().unwrap_or(0)
        );
        Ok(())
    };
    step(&mut layer, &[1000, 600])?; // prefill chunks
    step(&mut layer, &[1000, 1])?; // a's second chunk, b decodes
    for _ in 0..3 {
        step(&mut layer, &[1, 1])?; // decode
    }
    layer.free_sequence(b)?; // b ends; its pages return to the pool
    let c = layer.add_sequence()?; // and its slot is reused
    assert_eq!(c, b);
    step(&mut layer, &[1, 300])?;
    println!(
        "sequence {a} holds {} tokens, {c} holds {}",
        layer.len(a),
        layer.len(c)
    );
    Ok(())
}
