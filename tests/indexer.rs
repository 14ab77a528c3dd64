//! The orchestrated step: one submission of compress → query → score → top-k → expand equals
//! the composition of the CPU operators over chunked prefills and decode rows mixed in a
//! ragged batch; after the first step no bind group (hence no pipeline) is built; the chunked
//! score path equals the direct one; a decode loop selects what a one-shot prefill selects;
//! the order of the pool's pages changes nothing; freed slots are reused; scoring from the
//! texture copies of the queries and block keys gives what scoring from the buffers gives.

mod util;

use qsa_wgpu::gpu::Context;
use qsa_wgpu::indexer::{IndexerConfig, QsaIndexer, FUSED_QUERY_PAIRS};
use qsa_wgpu::ops::qsa_prepare_query::{shader as query_shader, QsaPrepareQueryParams, SHADER_VEC};
use qsa_wgpu::ops::TensorMap;
use qsa_wgpu::testing::{check_selection, score_tol, Rng};
use qsa_wgpu::{DType, Tensor};
use std::sync::Arc;
use util::{cat, rows};

const NAMES: [&str; 4] = [
    "block_indices",
    "block_count",
    "token_indices",
    "token_count",
];

fn config(dtype: DType, hs: usize, k: usize) -> IndexerConfig {
    IndexerConfig {
        hi: 4,
        di: 40,
        dr: 16,
        r: 4,
        k,
        hs,
        page_size: 16,
        dtype,
        epsilon: 1e-6,
        k_norm_offset: 1.0,
        q_norm_offset: 0.0,
        scale: None,
        max_len: 400,
        max_seqs: 3,
        max_step_tokens: 160,
        score_chunk_rows: None,
        pool_shard_pages: None,
        attention: None,
    }
}

fn layer(cfg: &IndexerConfig, seed: u64, pages: Vec<u32>) -> QsaIndexer {
    layer_on(util::ctx(), cfg, seed, pages)
}

/// [`layer`] on the given context.
fn layer_on(ctx: Arc<Context>, cfg: &IndexerConfig, seed: u64, pages: Vec<u32>) -> QsaIndexer {
    let mut rng = Rng::new(seed);
    let k_norm = rng.tensor(cfg.dtype, &[cfg.di]);
    let q_norm = rng.tensor(cfg.dtype, &[cfg.di]);
    QsaIndexer::new(ctx, cfg.clone(), k_norm, q_norm, pages).unwrap()
}

fn pages(cfg: &IndexerConfig) -> usize {
    cfg.max_seqs * cfg.max_len.div_ceil(cfg.page_size)
}

/// Runs one GPU step and reads it back.
fn gpu_step(ix: &mut QsaIndexer, step: &[usize], q: &Tensor) -> TensorMap {
    let out = pollster::block_on(ix.step(step, q)).unwrap();
    pollster::block_on(out.read(&util::ctx())).unwrap()
}

/// Runs one GPU step on `ctx`'s layer and reads back its outputs and its scores (the step
/// must fit one score chunk), for comparing two layers bit for bit.
fn step_with_scores(ix: &mut QsaIndexer, ctx: &Context, step: &[usize], q: &Tensor) -> TensorMap {
    let out = pollster::block_on(ix.step(step, q)).unwrap();
    let mut got = pollster::block_on(out.read(ctx)).unwrap();
    let scores = out.scores.as_ref().expect("one score chunk");
    got.insert(
        "scores".into(),
        pollster::block_on(scores.read(ctx)).unwrap(),
    );
    got
}

/// Keys `[tokens, Di]` (as f32 rows) and raw queries `[tokens, Hi, Di]` of one sequence.
fn sequence(rng: &mut Rng, cfg: &IndexerConfig, tokens: usize) -> (Vec<f32>, Tensor) {
    (
        rng.normals(tokens * cfg.di),
        rng.tensor(cfg.dtype, &[tokens, cfg.hi, cfg.di]),
    )
}

#[test]
fn step_equals_cpu_composition_and_reuses_everything() {
    let mut rng = Rng::new(12);
    for hs in [1, 2] {
        let cfg = config(DType::F32, hs, 8);
        let mut ix = layer(&cfg, 5, rng.permutation(pages(&cfg)));
        for _ in 0..3 {
            ix.add_sequence().unwrap();
        }
        // Prefill chunks of different sizes per sequence, then decode rows (one sequence idle).
        let steps: Vec<Vec<usize>> = vec![
            vec![37, 64, 5],
            vec![64, 0, 61],
            vec![1, 1, 1],
            vec![1, 0, 1],
            vec![2, 1, 1],
        ];
        let mut groups = 0;
        for (i, step) in steps.iter().enumerate() {
            for (s, &cnt) in step.iter().enumerate() {
                ix.append_keys(s, &rng.normals(cnt * 40)).unwrap();
            }
            let t: usize = step.iter().sum();
            let q = rng.tensor(DType::F32, &[t, 4, 40]);
            let got = gpu_step(&mut ix, step, &q);
            let want = ix.step_cpu(step, &q).unwrap();
            for name in NAMES {
                assert_eq!(got[name], want[name], "hs={hs} step {i}: {name}");
            }
            if i == 0 {
                groups = ix.bind_groups_created();
            }
        }
        // A layer looks a pipeline up only when it builds a bind group, so no pipeline is
        // built for it after step 0 either. (The context-wide pipeline count would also see
        // the tests running beside this one.)
        assert!(groups > 0);
        assert_eq!(
            ix.bind_groups_created(),
            groups,
            "a bind group was built after step 0"
        );
    }
}

#[test]
fn chunked_scores_equal_direct() {
    let mut rng = Rng::new(21);
    let direct_cfg = config(DType::BF16, 2, 16);
    let chunked_cfg = IndexerConfig {
        score_chunk_rows: Some(7),
        ..direct_cfg.clone()
    };
    let order = rng.permutation(pages(&direct_cfg));
    let mut direct = layer(&direct_cfg, 8, order.clone());
    let mut chunked = layer(&chunked_cfg, 8, order);
    for ix in [&mut direct, &mut chunked] {
        ix.add_sequence().unwrap();
        ix.add_sequence().unwrap();
    }
    for step in [[150, 3], [1, 90], [1, 1]] {
        let keys: Vec<Vec<f32>> = step.iter().map(|&c| rng.normals(c * 40)).collect();
        let q = rng.tensor(DType::BF16, &[step.iter().sum(), 4, 40]);
        let mut outs = Vec::new();
        for ix in [&mut direct, &mut chunked] {
            for (s, k) in keys.iter().enumerate() {
                ix.append_keys(s, k).unwrap();
            }
            outs.push(gpu_step(ix, &step, &q));
        }
        for name in NAMES {
            assert_eq!(outs[0][name], outs[1][name], "step {step:?}: {name}");
        }
    }
}

#[test]
fn decode_loop_selects_what_one_shot_prefill_selects() {
    let mut rng = Rng::new(33);
    for dtype in [DType::F32, DType::BF16] {
        let cfg = config(dtype, 1, 12);
        let len = 150;
        let (keys, q) = sequence(&mut rng, &cfg, len);
        let order = rng.permutation(pages(&cfg));
        let mut one = layer(&cfg, 2, order.clone());
        one.add_sequence().unwrap();
        one.append_keys(0, &keys).unwrap();
        let whole = gpu_step(&mut one, &[len], &q);

        let mut inc = layer(&cfg, 2, order);
        inc.add_sequence().unwrap();
        let prefix = 61;
        let mut parts = Vec::new();
        let mut at = 0;
        for n in std::iter::once(prefix).chain(std::iter::repeat_n(1, len - prefix)) {
            inc.append_keys(0, &keys[at * cfg.di..(at + n) * cfg.di])
                .unwrap();
            parts.push(gpu_step(&mut inc, &[n], &rows(&q, at, at + n)));
            at += n;
        }
        for name in NAMES {
            let joined = cat(&parts.iter().map(|p| p[name].clone()).collect::<Vec<_>>());
            assert_eq!(joined, whole[name], "{dtype}: {name}");
        }
        assert!(whole["block_count"].to_i32().contains(&12));
    }
}

#[test]
fn page_order_and_pool_shards_change_nothing() {
    let mut rng = Rng::new(44);
    let cfg = config(DType::F16, 1, 10);
    let n = pages(&cfg);
    let orders = [
        (0..n as u32).collect::<Vec<_>>(),
        (0..n as u32).rev().collect(),
        rng.permutation(n),
    ];
    // The last layer also splits its device pool in shards of 4 pages.
    let sharded = IndexerConfig {
        pool_shard_pages: Some(4),
        ..cfg.clone()
    };
    let mut layers: Vec<QsaIndexer> = orders
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let mut ix = layer(if i == 2 { &sharded } else { &cfg }, 3, o.clone());
            ix.add_sequence().unwrap();
            ix.add_sequence().unwrap();
            ix
        })
        .collect();
    for step in [[70, 33], [1, 1], [20, 1]] {
        let keys: Vec<Vec<f32>> = step.iter().map(|&c| rng.normals(c * 40)).collect();
        let q = rng.tensor(DType::F16, &[step.iter().sum(), 4, 40]);
        let outs: Vec<TensorMap> = layers
            .iter_mut()
            .map(|ix| {
                for (s, k) in keys.iter().enumerate() {
                    ix.append_keys(s, k).unwrap();
                }
                gpu_step(ix, &step, &q)
            })
            .collect();
        for name in NAMES {
            assert_eq!(outs[0][name], outs[1][name], "{step:?}: {name}");
            assert_eq!(outs[0][name], outs[2][name], "{step:?}: {name}");
        }
    }
}

#[test]
fn freed_slots_are_reused() {
    let mut rng = Rng::new(55);
    let cfg = config(DType::F32, 1, 6);
    let mut ix = layer(&cfg, 9, rng.permutation(pages(&cfg)));
    for _ in 0..3 {
        ix.add_sequence().unwrap();
    }
    assert!(ix.add_sequence().is_err(), "max_seqs is 3");
    let mut run = |ix: &mut QsaIndexer, step: &[usize]| {
        for (s, &c) in step.iter().enumerate().filter(|(_, &c)| c > 0) {
            ix.append_keys(s, &rng.normals(c * 40)).unwrap();
        }
        let q = rng.tensor(DType::F32, &[step.iter().sum(), 4, 40]);
        let got = gpu_step(ix, step, &q);
        let want = ix.step_cpu(step, &q).unwrap();
        for name in NAMES {
            assert_eq!(got[name], want[name], "{step:?}: {name}");
        }
    };
    run(&mut ix, &[40, 50, 30]);
    ix.free_sequence(1).unwrap();
    assert!(ix.free_sequence(1).is_err());
    assert!(ix.append_keys(1, &[0.0; 40]).is_err());
    run(&mut ix, &[1, 0, 1]);
    assert_eq!(ix.add_sequence().unwrap(), 1, "the freed slot comes back");
    assert_eq!(ix.len(1), 0);
    run(&mut ix, &[1, 27, 1]);
    run(&mut ix, &[1, 1, 1]);
    let err = pollster::block_on(ix.step(&[1, 1], &Tensor::zeros(DType::F32, &[2, 4, 40])));
    assert!(err.is_err(), "a step needs one count per slot");
}

#[test]
fn extend_then_decode_and_truncate_then_redo() {
    let mut rng = Rng::new(66);
    let cfg = IndexerConfig {
        pool_shard_pages: Some(3),
        ..config(DType::BF16, 1, 9)
    };
    let (keys, q) = sequence(&mut rng, &cfg, 140);
    let order = rng.permutation(pages(&cfg));
    // Reference: every token through full steps.
    let mut full = layer(&cfg, 4, order.clone());
    full.add_sequence().unwrap();
    full.append_keys(0, &keys[..120 * 40]).unwrap();
    gpu_step(&mut full, &[120], &rows(&q, 0, 120));
    // The same context through a keys-only extend, on the GPU and on the CPU.
    let mut ext = layer(&cfg, 4, order);
    ext.add_sequence().unwrap();
    ext.append_keys(0, &keys[..120 * 40]).unwrap();
    pollster::block_on(ext.extend(&[120])).unwrap();
    ext.extend_cpu(&[120]).unwrap();
    for at in 120..140 {
        let qa = rows(&q, at, at + 1);
        for ix in [&mut full, &mut ext] {
            ix.append_keys(0, &keys[at * 40..(at + 1) * 40]).unwrap();
        }
        let want = gpu_step(&mut full, &[1], &qa);
        let got = gpu_step(&mut ext, &[1], &qa);
        let cpu = ext.step_cpu(&[1], &qa).unwrap();
        for name in NAMES {
            assert_eq!(got[name], want[name], "position {at}: {name}");
        }
        check_selection(&got, &cpu, score_tol(DType::BF16)).unwrap();
        // Roll the token back and run it again: the same selection, the same pages.
        let pages_before = ext.pool.tables[0].clone();
        ext.truncate(0, at).unwrap();
        ext.append_keys(0, &keys[at * 40..(at + 1) * 40]).unwrap();
        assert_eq!(ext.pool.tables[0], pages_before);
        let again = gpu_step(&mut ext, &[1], &qa);
        for name in NAMES {
            assert_eq!(again[name], got[name], "redo at {at}: {name}");
        }
    }
    assert!(ext.truncate(0, 500).is_err());
}

#[test]
fn texture_copies_change_nothing() {
    // Block rows of 32 words (Di = 128 f32) and 1024 blocks per slot: a slot's keys span four
    // texture rows of 8192 texels, the prefill's copy crosses row boundaries and the decode
    // steps copy single blocks in the middle of a row. Both layers must agree bit for bit, in
    // the selections and in the scores they chose from.
    let mut rng = Rng::new(91);
    let cfg = IndexerConfig {
        hi: 4,
        di: 128,
        dr: 32,
        max_len: 4096,
        max_seqs: 2,
        max_step_tokens: 1100,
        ..config(DType::F32, 2, 64)
    };
    let order = rng.permutation(pages(&cfg));
    let buffer_ctx = util::buffer_ctx();
    let mut tex = layer(&cfg, 8, order.clone());
    let mut buf = layer_on(buffer_ctx.clone(), &cfg, 8, order);
    let (k0, q0) = sequence(&mut rng, &cfg, 1040);
    let (k1, q1) = sequence(&mut rng, &cfg, 36);
    let mut at = [0usize; 2];
    for ix in [&mut tex, &mut buf] {
        ix.add_sequence().unwrap();
        ix.add_sequence().unwrap();
    }
    // A ragged prefill (1000 + 30 rows), then decode rows of both sequences.
    let mut steps: Vec<[usize; 2]> = vec![[1000, 30]];
    steps.extend((0..6).map(|_| [1, 1]));
    for step in steps {
        let qs = cat(&[
            rows(&q0, at[0], at[0] + step[0]),
            rows(&q1, at[1], at[1] + step[1]),
        ]);
        for ix in [&mut tex, &mut buf] {
            ix.append_keys(0, &k0[at[0] * cfg.di..(at[0] + step[0]) * cfg.di])
                .unwrap();
            ix.append_keys(1, &k1[at[1] * cfg.di..(at[1] + step[1]) * cfg.di])
                .unwrap();
        }
        let want = step_with_scores(&mut buf, &buffer_ctx, &step, &qs);
        let got = step_with_scores(&mut tex, &util::ctx(), &step, &qs);
        for name in NAMES.iter().chain(["scores"].iter()) {
            assert_eq!(got[*name], want[*name], "step {step:?} at {at:?}: {name}");
        }
        at[0] += step[0];
        at[1] += step[1];
    }
}

#[test]
fn one_row_scores_change_nothing() {
    // A context that scores every row in one-row tiles (a ragged prefill included, which the
    // default context scores in 24-row tiles): the layers agree bit for bit, in the selections
    // and in the scores, over a prefill and decode rows of two sequences.
    let mut rng = Rng::new(93);
    let cfg = IndexerConfig {
        max_step_tokens: 300,
        ..config(DType::BF16, 2, 16)
    };
    use qsa_wgpu::ops::block_score::Tiling;
    let one_row = util::one_row_ctx();
    assert!(one_row.caps.one_row_scores && !util::ctx().caps.one_row_scores);
    // The prefill's 280 rows of 2 sequences: row tiles by default, one-row tiles here.
    assert_eq!(Tiling::for_context(&util::ctx(), 280, 2), Tiling::RowTiles);
    assert_eq!(Tiling::for_context(&one_row, 280, 2), Tiling::OneRow);
    let order = rng.permutation(pages(&cfg));
    let mut tiled = layer(&cfg, 9, order.clone());
    let mut rowwise = layer_on(one_row.clone(), &cfg, 9, order);
    let (k0, q0) = sequence(&mut rng, &cfg, 260);
    let (k1, q1) = sequence(&mut rng, &cfg, 40);
    for ix in [&mut tiled, &mut rowwise] {
        ix.add_sequence().unwrap();
        ix.add_sequence().unwrap();
    }
    let mut at = [0usize; 2];
    let mut steps: Vec<[usize; 2]> = vec![[250, 30]];
    steps.extend((0..4).map(|_| [1, 1]));
    for step in steps {
        let qs = cat(&[
            rows(&q0, at[0], at[0] + step[0]),
            rows(&q1, at[1], at[1] + step[1]),
        ]);
        for ix in [&mut tiled, &mut rowwise] {
            ix.append_keys(0, &k0[at[0] * cfg.di..(at[0] + step[0]) * cfg.di])
                .unwrap();
            ix.append_keys(1, &k1[at[1] * cfg.di..(at[1] + step[1]) * cfg.di])
                .unwrap();
        }
        let want = step_with_scores(&mut tiled, &util::ctx(), &step, &qs);
        let got = step_with_scores(&mut rowwise, &one_row, &step, &qs);
        for name in NAMES.iter().chain(["scores"].iter()) {
            assert_eq!(got[*name], want[*name], "step {step:?} at {at:?}: {name}");
        }
        at[0] += step[0];
        at[1] += step[1];
    }
}

#[test]
fn split_topk_changes_nothing() {
    // Rows of W = 4096 blocks and k = 64 are wide: on a context told to split them the decode
    // steps' few rows take the split kernels, two dispatches in slots of their own (the
    // stage `topk_part` where the adapter can time stages), and a step of more than 64 rows
    // the one-workgroup kernel. Both layers must agree bit for bit, in the selections and in the scores. With
    // ~3000 cached tokens the sampled threshold holds; with 40 it cannot (too few sampled
    // candidates), and the merge falls back to the whole `wide` kernel.
    let mut rng = Rng::new(92);
    let cfg = IndexerConfig {
        max_len: 16384,
        max_seqs: 2,
        max_step_tokens: 100,
        ..config(DType::F32, 2, 64)
    };
    assert!(qsa_wgpu::ops::block_topk::wide(4096, 64));
    let split_ctx = util::split_ctx();
    let order = rng.permutation(pages(&cfg));
    let mut plain = layer(&cfg, 9, order.clone());
    let mut split = layer_on(split_ctx.clone(), &cfg, 9, order);
    let cached = [3000, 40];
    let seqs: Vec<(Vec<f32>, Tensor)> = cached
        .iter()
        .map(|&n| sequence(&mut rng, &cfg, n + 8 + 60))
        .collect();
    for ix in [&mut plain, &mut split] {
        for (s, &n) in cached.iter().enumerate() {
            ix.add_sequence().unwrap();
            ix.append_keys(s, &seqs[s].0[..n * cfg.di]).unwrap();
        }
        pollster::block_on(ix.extend(&cached)).unwrap();
    }
    let mut at = cached;
    // Decode rows of both sequences (4 score rows: split), then a step of 2 × 30 rows (120
    // score rows: one workgroup per row), then decode again.
    let mut steps: Vec<[usize; 2]> = (0..4).map(|_| [1, 1]).collect();
    steps.push([30, 30]);
    steps.extend((0..4).map(|_| [1, 1]));
    for step in steps {
        let qs = cat(&[
            rows(&seqs[0].1, at[0], at[0] + step[0]),
            rows(&seqs[1].1, at[1], at[1] + step[1]),
        ]);
        for ix in [&mut plain, &mut split] {
            for s in 0..2 {
                let keys = &seqs[s].0[at[s] * cfg.di..(at[s] + step[s]) * cfg.di];
                ix.append_keys(s, keys).unwrap();
            }
        }
        let want = step_with_scores(&mut plain, &util::ctx(), &step, &qs);
        let timed = split.set_timing(true);
        let got = step_with_scores(&mut split, &split_ctx, &step, &qs);
        for name in NAMES.iter().chain(["scores"].iter()) {
            assert_eq!(got[*name], want[*name], "step {step:?} at {at:?}: {name}");
        }
        if timed {
            let stages = pollster::block_on(split.stage_times()).unwrap().unwrap();
            let parted = stages.iter().any(|(name, _)| *name == "topk_part");
            assert_eq!(parted, step[0] == 1, "step {step:?}: stages {stages:?}");
        }
        at[0] += step[0];
        at[1] += step[1];
    }
}

#[test]
fn fused_prepare_changes_nothing() {
    // The compress of a step's blocks and the preparation of its index queries run as one
    // dispatch where the adapter allows it, the query's word kernel applies (Di = 40) and the
    // query is one workgroup (decode rows), else as two (a context told not to fuse; Di = 42
    // in f32, where the element kernel runs; the prefill chunks here). Each
    // workgroup runs its own operator's code, so the layers must agree bit for bit, in the
    // selections and in the scores, over prefill chunks and decode rows of two sequences,
    // with the device pool in one shard or several (the fused dispatch then takes the first
    // shard's compress). Where the adapter can time stages they show which ran.
    let mut rng = Rng::new(71);
    let unfused_ctx = util::unfused_ctx();
    assert!(!unfused_ctx.caps.fused_prepare);
    let cases = [
        (DType::F32, 40, None),
        (DType::BF16, 40, None),
        (DType::F32, 40, Some(5)),
        (DType::F32, 42, None),
    ];
    for (dtype, di, shard_pages) in cases {
        let cfg = IndexerConfig {
            di,
            pool_shard_pages: shard_pages,
            ..config(dtype, 2, 8)
        };
        // The fused dispatch runs the query's word kernel only, where the layer's step picks it.
        let qp = QsaPrepareQueryParams {
            di: di as u32,
            dr: cfg.dr as u32,
            rope_mode: 2,
            ..Default::default()
        };
        let words = query_shader(dtype, &qp) == SHADER_VEC;
        let fuses = util::ctx().caps.fused_prepare && words;
        let order = rng.permutation(pages(&cfg));
        let mut fused = layer(&cfg, 4, order.clone());
        let mut split = layer_on(unfused_ctx.clone(), &cfg, 4, order);
        let seqs: Vec<(Vec<f32>, Tensor)> = (0..2).map(|_| sequence(&mut rng, &cfg, 90)).collect();
        for ix in [&mut fused, &mut split] {
            ix.add_sequence().unwrap();
            ix.add_sequence().unwrap();
        }
        let mut at = [0, 0];
        for step in [[37, 5], [20, 40], [1, 1], [1, 0], [1, 1], [0, 1]] {
            let qs = cat(&[
                rows(&seqs[0].1, at[0], at[0] + step[0]),
                rows(&seqs[1].1, at[1], at[1] + step[1]),
            ]);
            let mut outs = Vec::new();
            for (ix, ctx) in [(&mut fused, util::ctx()), (&mut split, unfused_ctx.clone())] {
                for s in 0..2 {
                    ix.append_keys(s, &seqs[s].0[at[s] * di..(at[s] + step[s]) * di])
                        .unwrap();
                }
                let timed = ix.set_timing(true);
                let got = step_with_scores(ix, &ctx, &step, &qs);
                if timed {
                    let stages = pollster::block_on(ix.stage_times()).unwrap().unwrap();
                    let has = |n: &str| stages.iter().any(|(name, _)| *name == n);
                    let rows = step[0] + step[1];
                    let one = fuses && ctx.caps.fused_prepare && rows * cfg.hi <= FUSED_QUERY_PAIRS;
                    assert_eq!(has("compress_query"), one, "{dtype} Di {di}: {stages:?}");
                    assert_eq!(has("query"), !one, "{dtype} Di {di}: {stages:?}");
                }
                outs.push(got);
            }
            for name in NAMES.iter().chain(["scores"].iter()) {
                assert_eq!(
                    outs[0][*name], outs[1][*name],
                    "{dtype} Di {di}, step {step:?} at {at:?}: {name}"
                );
            }
            at[0] += step[0];
            at[1] += step[1];
        }
    }
}
