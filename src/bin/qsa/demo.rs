//! `qsa demo`: a synthetic Qwen3.8-Flash-Next indexer layer (Hi = 4, Di = 128, Dr = 64, r = 4,
//! k = 512, page 128) over several sequences: a chunked prefill, then decode steps. Every step
//! appends the new raw index keys and the main attention's K/V (H = 24, Hkv = 2, E = 256) to
//! the paged pools and runs one `QsaIndexer` step on the GPU (compress → query → score → top-k
//! with the token route → sparse attention in one submission), reads the results back and
//! checks the selection against the same step composed from the CPU references, and the
//! attention output against the CPU attention over the GPU's selection (every decode row;
//! sampled prefill rows).

use qsa_wgpu::gpu::{Context, ContextOptions};
use qsa_wgpu::indexer::{AttentionConfig, IndexerConfig, QsaIndexer};
use qsa_wgpu::testing::{attention_tol, check_selection, compare, score_tol, Rng, SelectionCheck};
use qsa_wgpu::{DType, Error, Result, Tensor};
use std::time::Instant;

#[derive(clap::Args, Clone, Debug)]
pub struct DemoArgs {
    /// Sequences in the batch.
    #[arg(long, default_value_t = 3)]
    pub seqs: usize,
    /// Prefill tokens per sequence.
    #[arg(long, default_value_t = 2048)]
    pub prefill: usize,
    /// Prefill chunk size.
    #[arg(long, default_value_t = 512)]
    pub chunk: usize,
    /// Decode steps after the prefill.
    #[arg(long, default_value_t = 16)]
    pub decode: usize,
    /// Storage type: f32, f16 or bf16.
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// Where the attention stage runs: `decode` (decode steps), `all` (prefill chunks too) or
    /// `off` (the indexer only).
    #[arg(long, default_value = "decode")]
    pub attention: String,
    /// Run an NSA selector layer (the paper's geometry) instead: `demo_nsa.rs`.
    #[arg(long)]
    pub nsa: bool,
}

impl Default for DemoArgs {
    fn default() -> Self {
        DemoArgs {
            seqs: 3,
            prefill: 2048,
            chunk: 512,
            decode: 16,
            dtype: "bf16".into(),
            attention: "decode".into(),
            nsa: false,
        }
    }
}

const HI: usize = 4;
const DI: usize = 128;

/// The median of `v` (the upper one of an even count; 0 for none).
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The demos' common start: the storage type and sizes checked, then the context.
pub(crate) fn setup(
    backend: &Option<String>,
    args: &DemoArgs,
) -> Result<(DType, std::sync::Arc<Context>)> {
    let dt = DType::parse(&args.dtype)
        .filter(|d| d.is_float())
        .ok_or_else(|| {
            Error::attr(
                "demo",
                "dtype",
                format!("{:?} is not f32, f16 or bf16", args.dtype),
            )
        })?;
    if args.seqs == 0 || args.chunk == 0 {
        return Err(Error::attr("demo", "seqs/chunk", "must be >= 1"));
    }
    let ctx = Context::new_blocking(&ContextOptions {
        backends: backend.clone(),
        ..Default::default()
    })?;
    Ok((dt, ctx))
}

pub fn run(backend: &Option<String>, args: &DemoArgs) -> Result<()> {
    if args.nsa {
        return crate::demo_nsa::run(backend, args);
    }
    let (dt, ctx) = setup(backend, args)?;
    let total = (args.prefill + args.decode).max(1);
    let mut cfg = IndexerConfig::qwen(dt, total, args.seqs);
    cfg.max_step_tokens = args.chunk.min(total) * args.seqs;
    let (attn_prefill, attn_decode) = match args.attention.as_str() {
        "all" => (true, true),
        "decode" => (false, true),
        "off" => (false, false),
        other => {
            return Err(Error::attr(
                "demo",
                "attention",
                format!("{other:?} is not all, decode or off"),
            ))
        }
    };
    let attn = attn_decode.then(AttentionConfig::qwen);
    cfg.attention = attn.clone();
    println!("qsa demo: {}", ctx.describe());
    println!(
        "layer: Hi={} Di={} Dr={} r={} k={} page={} {dt}; {} sequences, prefill {} in chunks of {}, {} decode steps",
        cfg.hi, cfg.di, cfg.dr, cfg.r, cfg.k, cfg.page_size, args.seqs, args.prefill, args.chunk, args.decode
    );
    if let Some(a) = &attn {
        println!(
            "attention: H={} Hkv={} E={} over the selected tokens, in {} steps",
            a.h,
            a.hkv,
            a.e,
            if attn_prefill { "all" } else { "decode" }
        );
    }
    let pages = args.seqs * total.div_ceil(cfg.page_size);
    let mut rng = Rng::new(2026);
    let k_norm = rng.tensor(dt, &[DI]);
    let q_norm = rng.tensor(dt, &[DI]);
    let mut ix = QsaIndexer::new(ctx.clone(), cfg, k_norm, q_norm, rng.permutation(pages))?;
    for _ in 0..args.seqs {
        ix.add_sequence()?;
    }
    let tol = score_tol(dt);

    let mut steps = 0;
    let mut tokens = 0;
    let mut step_ms = Vec::new();
    let mut agree = SelectionCheck::default();
    let mut attn_rows = 0;
    let mut chunks = Vec::new();
    let mut left = args.prefill;
    while left > 0 {
        chunks.push(left.min(args.chunk));
        left -= left.min(args.chunk);
    }
    for (phase, sizes) in [("prefill", chunks), ("decode", vec![1; args.decode])] {
        let t0 = Instant::now();
        let first = step_ms.len();
        for &step in &sizes {
            for s in 0..args.seqs {
                ix.append_keys(s, &rng.normals(step * DI))?;
                if let Some(a) = &attn {
                    let w = step * a.hkv * a.e;
                    ix.append_kv(s, &rng.normals(w), &rng.normals(w))?;
                }
            }
            let rows = step * args.seqs;
            let q_raw = rng.tensor(dt, &[rows, HI, DI]);
            let with_attention = if phase == "decode" {
                attn_decode
            } else {
                attn_prefill
            };
            let query = attn
                .as_ref()
                .filter(|_| with_attention)
                .map(|a| rng.tensor(dt, &[rows, a.h, a.e]));
            let counts = vec![step; args.seqs];
            let g0 = Instant::now();
            let out = match &query {
                Some(q) => pollster::block_on(ix.step_with_attention(&counts, &q_raw, q))?,
                None => pollster::block_on(ix.step(&counts, &q_raw))?,
            };
            let got = pollster::block_on(out.read(&ctx))?;
            step_ms.push(g0.elapsed().as_secs_f64() * 1e3);
            if let Some(q) = &query {
                // Every row of a decode step; in a prefill chunk each sequence's first, middle
                // and last row (the CPU attention of a whole chunk would dominate the run).
                let picked: Vec<usize> = if step == 1 {
                    (0..rows).collect()
                } else {
                    (0..args.seqs)
                        .flat_map(|s| [s * step, s * step + step / 2, s * step + step - 1])
                        .collect()
                };
                let want = ix.attention_cpu(&counts, &got, q, &picked)?;
                let all = got["out"].to_f32();
                let w = want.shape[1] * want.shape[2];
                let mine: Vec<f32> = picked
                    .iter()
                    .flat_map(|&r| all[r * w..(r + 1) * w].to_vec())
                    .collect();
                let mine = Tensor::from_f32(dt, &want.shape, &mine);
                compare(&mine, &want, attention_tol(dt)).map_err(|e| {
                    Error::Gpu(format!(
                        "{phase} step {steps}: attention differs from the CPU reference: {e}"
                    ))
                })?;
                attn_rows += picked.len();
            }
            let want = ix.step_cpu(&counts, &q_raw)?;
            let c = check_selection(&got, &want, tol).map_err(|e| {
                Error::Gpu(format!(
                    "{phase} step {steps}: the selection differs from the CPU reference: {e}"
                ))
            })?;
            agree.rows += c.rows;
            agree.exact += c.exact;
            agree.near_ties += c.near_ties;
            steps += 1;
            tokens += rows;
        }
        println!(
            "{phase:8} {:4} steps, {} tokens/sequence now, {:.1} s, GPU step median {:.2} ms, every selection checked",
            sizes.len(),
            ix.len(0),
            t0.elapsed().as_secs_f64(),
            median(&step_ms[first..])
        );
    }
    let step_median = median(&step_ms);
    println!(
        "summary: {} sequences, {tokens} tokens, {steps} steps, GPU median {step_median:.2} ms/step (submit to results read back); {} selection rows: {} identical to the CPU reference, {} differ only by near ties (within {:?}), 0 wrong",
        args.seqs, agree.rows, agree.exact, agree.near_ties, tol
    );
    if attn.is_some() {
        println!(
            "attention: {attn_rows} rows checked against the CPU attention over the GPU's selection, all within {:?}",
            attention_tol(dt)
        );
    }
    Ok(())
}
