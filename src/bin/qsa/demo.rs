//! `qsa demo`: a synthetic Qwen3.8-Flash-Next indexer layer (Hi = 4, Di = 128, Dr = 64, r = 4,
//! page 128) over several sequences: a chunked prefill, then decode steps. Every step appends
//! the new raw index keys to the paged pool, compresses the completed blocks and prepares the
//! index queries on the GPU, and checks both against the CPU reference.

use qsa_wgpu::gpu::{Context, ContextOptions};
use qsa_wgpu::ops::qsa_compress_paged::{
    self as compress, CompressMode, QsaCompressAttrs, QsaCompressInputs,
};
use qsa_wgpu::ops::qsa_prepare_query::{
    self as query, QsaPrepareQueryAttrs, QsaPrepareQueryInputs,
};
use qsa_wgpu::paged::{PagedPool, PoolLayout};
use qsa_wgpu::testing::{compare, transform_tol, Rng};
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
}

impl Default for DemoArgs {
    fn default() -> Self {
        DemoArgs {
            seqs: 3,
            prefill: 2048,
            chunk: 512,
            decode: 16,
            dtype: "bf16".into(),
        }
    }
}

const HI: usize = 4;
const DI: usize = 128;
const DR: usize = 64;
const R: usize = 4;
const PAGE: usize = 128;

/// Rotary table of the model: row p holds (cos, sin) pairs of position p.
fn freqs_cis(dt: DType, positions: usize) -> Tensor {
    let mut v = Vec::with_capacity(positions * DR);
    for p in 0..positions {
        for i in 0..DR / 2 {
            let inv = 1e7f64.powf(-(2.0 * i as f64) / DR as f64);
            let a = p as f64 * inv;
            v.push(a.cos() as f32);
            v.push(a.sin() as f32);
        }
    }
    Tensor::from_f32(dt, &[positions, DR], &v)
}

pub fn run(backend: &Option<String>, args: &DemoArgs) -> Result<()> {
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
    })?;
    println!("qsa demo: {} ", ctx.describe());
    println!(
        "layer: Hi={HI} Di={DI} Dr={DR} r={R} page={PAGE} {dt}; {} sequences, prefill {} in chunks of {}, {} decode steps",
        args.seqs, args.prefill, args.chunk, args.decode
    );
    let total = args.prefill + args.decode;
    let pages_per_seq = total.div_ceil(PAGE);
    let num_pages = args.seqs * pages_per_seq;
    let mut rng = Rng::new(2026);
    let layout = PoolLayout::packed(num_pages, 1, PAGE, 1, DI);
    let mut pool = PagedPool::new(layout, dt, rng.permutation(num_pages));
    let seqs: Vec<usize> = (0..args.seqs).map(|_| pool.add_sequence()).collect();
    let freqs = freqs_cis(dt, total);
    let gamma = rng.tensor(dt, &[DI]);
    let q_norm = rng.tensor(dt, &[DI]);
    let max_blocks = total / R;
    let mut block_keys = Tensor::zeros(dt, &[args.seqs * max_blocks, DI]);
    let tol = transform_tol(dt);

    let mut steps = 0;
    let mut tokens = 0;
    let mut gpu_ms = Vec::new();
    let mut checked = 0usize;
    let mut phases: Vec<(&str, Vec<usize>)> = Vec::new();
    let mut left = args.prefill;
    let mut chunks = Vec::new();
    while left > 0 {
        chunks.push(left.min(args.chunk));
        left -= left.min(args.chunk);
    }
    phases.push(("prefill", chunks));
    phases.push(("decode", vec![1; args.decode]));
    for (phase, sizes) in phases {
        let t0 = Instant::now();
        for &step in &sizes {
            let cached: Vec<u32> = seqs.iter().map(|&s| pool.lengths[s] as u32).collect();
            for &s in &seqs {
                pool.append(s, 0, 0, &rng.normals(step * DI))?;
                pool.commit(s, step);
            }
            let counts: Vec<i32> = seqs.iter().map(|&s| pool.lengths[s] as i32).collect();
            let table = pool.page_table(&seqs, pages_per_seq, u32::MAX);
            let pool_t = pool.tensor();
            let cache_t = Tensor::from_u32(&[args.seqs], &cached);
            let counts_t = Tensor::from_i32(&[args.seqs], &counts);
            let x = QsaCompressInputs {
                kv_blocks: &pool_t,
                page_table: &table,
                cache_lengths: &cache_t,
                key_counts: &counts_t,
                gamma: Some(&gamma),
                freqs_cis: Some(&freqs),
                block_keys: &block_keys,
            };
            let a = QsaCompressAttrs {
                ratio: R,
                rotary_dim: Some(DR),
                epsilon: 1e-6,
                norm_weight_offset: 1.0,
                layer_idx: 0,
                page_stride: None,
                mode: CompressMode::Incremental,
            };
            let rows = step * args.seqs;
            let q_raw = rng.tensor(dt, &[rows, HI, DI]);
            let positions: Vec<i32> = (0..args.seqs)
                .flat_map(|n| {
                    (0..step)
                        .map(|j| (cached[n] as usize + j) as i32)
                        .collect::<Vec<_>>()
                })
                .collect();
            let pos_t = Tensor::from_i32(&[rows], &positions);
            let qx = QsaPrepareQueryInputs {
                index_query_raw: &q_raw,
                q_norm_weight: Some(&q_norm),
                rope_cos: None,
                rope_sin: None,
                freqs_cis: Some(&freqs),
                positions: Some(&pos_t),
            };
            let qa = QsaPrepareQueryAttrs {
                epsilon: 1e-6,
                norm_weight_offset: 1.0,
                rotary_dim: Some(DR),
            };
            let g0 = Instant::now();
            let got_keys = pollster::block_on(compress::gpu(&ctx, &x, &a))?;
            let got_q = pollster::block_on(query::gpu(&ctx, &qx, &qa))?;
            gpu_ms.push(g0.elapsed().as_secs_f64() * 1e3);
            let want_keys = compress::cpu(&x, &a)?;
            let want_q = query::cpu(&qx, &qa)?;
            compare(&got_keys, &want_keys, tol).map_err(|e| {
                Error::Gpu(format!(
                    "{phase} step {steps}: block keys differ from the CPU reference: {e}"
                ))
            })?;
            compare(&got_q, &want_q, tol).map_err(|e| {
                Error::Gpu(format!(
                    "{phase} step {steps}: index queries differ from the CPU reference: {e}"
                ))
            })?;
            checked += got_keys.numel() + got_q.numel();
            block_keys = want_keys;
            steps += 1;
            tokens += rows;
        }
        println!(
            "{phase:8} {} steps, {} tokens/sequence now, {:.1} s, all steps match the CPU reference",
            sizes.len(),
            pool.lengths[seqs[0]],
            t0.elapsed().as_secs_f64()
        );
    }
    gpu_ms.sort_by(|a, b| a.total_cmp(b));
    let median = gpu_ms.get(gpu_ms.len() / 2).copied().unwrap_or(0.0);
    println!(
        "summary: {} sequences, {tokens} tokens, {steps} steps, GPU median {median:.2} ms/step (uploads included), {checked} values checked, agreement 100%",
        args.seqs
    );
    Ok(())
}
