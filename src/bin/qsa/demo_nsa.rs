//! `qsa demo --nsa`: one synthetic NSA layer in the paper's geometry (N1 = 64, N2 = 4,
//! Dqk = 192, Dv = 128, l = 32, d = 16, l' = 64, k = 16) over several sequences. The prefill
//! appends raw K/V in chunks and compresses the completed windows on the GPU (`extend`, keys
//! only) and on the CPU, then checks the device's compressed caches against the CPU's. Decode
//! steps of one token per sequence, then verify steps of four (a speculative draft), each run
//! one `NsaSelector` step on the GPU — compress → compressed attention → top-k → expand →
//! selected attention, one submission — read it back and check it against the same step
//! composed from the CPU references.

use crate::demo::DemoArgs;
use qsa_wgpu::nsa::{check_step, cmp_out_tol, selection_tol, NsaConfig, NsaSelector, StepCheck};
use qsa_wgpu::testing::{attention_tol, compare, transform_tol, Rng};
use qsa_wgpu::{Error, Result};
use std::time::Instant;

/// Four-token verify steps after the decode steps.
const VERIFY_STEPS: usize = 2;

pub fn run(backend: &Option<String>, args: &DemoArgs) -> Result<()> {
    let (dt, ctx) = crate::demo::setup(backend, args)?;
    let total = args.prefill + args.decode + 4 * VERIFY_STEPS;
    let cfg = NsaConfig::paper(dt, total, args.seqs);
    println!("qsa demo --nsa: {}", ctx.describe());
    println!(
        "layer: N1={} N2={} Dqk={} Dv={} l={} d={} l'={} k={} page={}/{} {dt}; {} sequences, prefill {} in chunks of {}, {} decode steps, {VERIFY_STEPS} 4-token verify steps",
        cfg.n1, cfg.n2, cfg.dqk, cfg.dv, cfg.l, cfg.d, cfg.lsel, cfg.k, cfg.page_size,
        cfg.cmp_page_size, args.seqs, args.prefill, args.chunk, args.decode
    );
    let mut rng = Rng::new(2026);
    let pages = args.seqs * cfg.max_pages();
    let blocks = args.seqs * cfg.max_cmp_blocks();
    let (w_k, w_v) = (
        rng.tensor(dt, &[cfg.l, cfg.n2]),
        rng.tensor(dt, &[cfg.l, cfg.n2]),
    );
    let (po, bo) = (rng.permutation(pages), rng.permutation(blocks));
    let mut sel = NsaSelector::new(ctx.clone(), cfg.clone(), w_k, w_v, po, bo)?;
    for _ in 0..args.seqs {
        sel.add_sequence()?;
    }
    let (kw, vw) = (cfg.n2 * cfg.dqk, cfg.n2 * cfg.dv);
    let append = |sel: &mut NsaSelector, rng: &mut Rng, n: usize| -> Result<()> {
        for s in 0..args.seqs {
            sel.append_kv(s, &rng.normals(n * kw), &rng.normals(n * vw))?;
        }
        Ok(())
    };

    // Prefill: keys only, in chunks, on both paths; then the compressed caches must agree.
    let t0 = Instant::now();
    let mut left = args.prefill;
    let mut chunks = 0;
    while left > 0 {
        let n = left.min(args.chunk);
        append(&mut sel, &mut rng, n)?;
        let counts = vec![n; args.seqs];
        pollster::block_on(sel.extend(&counts))?;
        sel.extend_cpu(&counts)?;
        left -= n;
        chunks += 1;
    }
    let (k, v) = pollster::block_on(sel.read_cmp_cache())?;
    for (name, got, want) in [("keys", &k, &sel.cmp_key), ("values", &v, &sel.cmp_value)] {
        compare(got, want, transform_tol(dt)).map_err(|e| {
            Error::Gpu(format!(
                "prefill: the compressed {name} differ from the CPU's: {e}"
            ))
        })?;
    }
    println!(
        "prefill  {chunks:4} chunks, {} tokens/sequence, {} compressed, {:.1} s, compressed K/V caches equal the CPU's",
        sel.len(0),
        sel.cmp_len(0),
        t0.elapsed().as_secs_f64()
    );

    let mut steps = 0;
    let mut rows = 0;
    let mut step_ms = Vec::new();
    let mut agree = StepCheck::default();
    let phases = [
        ("decode", vec![1; args.decode]),
        ("verify", vec![4; VERIFY_STEPS]),
    ];
    for (phase, sizes) in phases {
        let t0 = Instant::now();
        let first = step_ms.len();
        for &n in &sizes {
            append(&mut sel, &mut rng, n)?;
            let counts = vec![n; args.seqs];
            let q = rng.tensor(dt, &[n * args.seqs, cfg.n1, cfg.dqk]);
            let g0 = Instant::now();
            let out = pollster::block_on(sel.step(&counts, &q))?;
            let got = pollster::block_on(out.read(&ctx))?;
            step_ms.push(g0.elapsed().as_secs_f64() * 1e3);
            let want = sel.step_cpu(&counts, &q)?;
            let c = check_step(&sel, &counts, &q, &got, &want).map_err(|e| {
                Error::Gpu(format!(
                    "{phase} step {steps}: the GPU differs from the CPU reference: {e}"
                ))
            })?;
            agree += c;
            steps += 1;
            rows += n * args.seqs;
        }
        println!(
            "{phase:8} {:4} steps of {} token(s)/sequence, {} tokens/sequence now, {:.1} s, GPU step median {:.1} ms, every output checked",
            sizes.len(),
            sizes.first().copied().unwrap_or(0),
            sel.len(0),
            t0.elapsed().as_secs_f64(),
            crate::demo::median(&step_ms[first..])
        );
    }
    println!(
        "summary: {} sequences, {} tokens, {steps} steps ({rows} query rows), GPU median {:.1} ms/step (submit to outputs read back); {} selection rows (query row × KV head): {} identical to the CPU reference, {} differ only by near ties (within {:?}), 0 wrong; selected-branch outputs within {:?}, compressed-branch within {:?}",
        args.seqs,
        args.seqs * sel.len(0),
        crate::demo::median(&step_ms),
        agree.rows,
        agree.exact,
        agree.near_ties,
        selection_tol(dt),
        attention_tol(dt),
        cmp_out_tol(dt)
    );
    Ok(())
}
