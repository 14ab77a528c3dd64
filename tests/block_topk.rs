//! block_topk: GPU against the CPU reference (exact: the outputs are integers) over ties, NaN,
//! ±0, denormals, -inf masks, k > candidates, k > W and awkward widths; the CPU reference
//! itself against hand-written answers; bad attributes and inputs.

mod util;

use qsa_wgpu::gpu::Context;
use qsa_wgpu::ops::block_topk::{
    cpu, gpu, pipeline, split_applies, split_scratch_bytes, BlockTopkAttrs, BlockTopkInputs,
    BlockTopkOutputs, BlockTopkParams, OP, SHADER_SG,
};
use qsa_wgpu::ops::{run_blocking, AttrMap, Exec, TensorMap};
use qsa_wgpu::testing::Rng;
use qsa_wgpu::{DType, Tensor};
use serde_json::json;

const NEG_INF: f32 = f32::NEG_INFINITY;

/// The GPU's answer on `ctx` and the CPU reference's.
fn run_both(
    ctx: &Context,
    scores: &[f32],
    shape: [usize; 3],
    k: usize,
) -> (BlockTopkOutputs, BlockTopkOutputs) {
    let s = Tensor::from_f32(DType::F32, &shape, scores);
    let x = BlockTopkInputs { scores: &s };
    let a = BlockTopkAttrs { k };
    let want = cpu(&x, &a).unwrap();
    let got = pollster::block_on(gpu(ctx, &x, &a)).unwrap();
    (got, want)
}

/// Every case runs on the default context (rows of W <= 2048 take the subgroup variant where
/// the adapter has 8-lane subgroups), on one without subgroups (the portable kernels) and on
/// one whose wide rows take the split kernels (up to 64 rows; meant for GPUs, opt-in).
fn check(scores: &[f32], shape: [usize; 3], k: usize, what: &str) {
    check_on(&util::ctx(), scores, shape, k, what);
    check_on(
        &util::portable_ctx(),
        scores,
        shape,
        k,
        &format!("{what} (portable)"),
    );
    check_on(
        &util::split_ctx(),
        scores,
        shape,
        k,
        &format!("{what} (split)"),
    );
}

fn check_on(ctx: &Context, scores: &[f32], shape: [usize; 3], k: usize, what: &str) {
    let (got, want) = run_both(ctx, scores, shape, k);
    assert_eq!(got.block_count, want.block_count, "{what}: block_count");
    let (g, w) = (got.block_indices.to_i32(), want.block_indices.to_i32());
    if let Some(i) = (0..g.len()).find(|&i| g[i] != w[i]) {
        let failing = g.iter().zip(&w).filter(|(a, b)| a != b).count();
        panic!(
            "{what}: block_indices: {failing} of {} differ; first at row {}, slot {}: got {}, want {}",
            g.len(),
            i / k,
            i % k,
            g[i],
            w[i]
        );
    }
}

/// A row of `w` scores drawn from a few values (many ties), with NaN, ±0, denormals and -inf.
fn tied_row(rng: &mut Rng, w: usize, masked_pct: usize) -> Vec<f32> {
    const VALUES: [f32; 9] = [-1.0, 0.0, -0.0, 0.5, 2.0, 1e-45, -1e-45, f32::NAN, 3.5];
    (0..w)
        .map(|_| {
            if rng.below(100) < masked_pct {
                NEG_INF
            } else {
                VALUES[rng.below(VALUES.len())]
            }
        })
        .collect()
}

#[test]
fn hand_checked_tiny() {
    let nan = f32::NAN;
    // Row 0: two tied 3.0 (lower column first), then 1.0, 0.5, then the NaN; -inf is dropped.
    // Row 1: ±0 tie, denormals on both sides of it, two NaNs (by column).
    // Row 2: all -inf.
    #[rustfmt::skip]
    let scores = [
        1.0, nan, 3.0, NEG_INF, 3.0, 0.5,
        -0.0, 0.0, -1e-45, 1e-45, nan, -nan,
        NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF,
    ];
    #[rustfmt::skip]
    let cases: [(usize, &[i32], &[i32]); 3] = [
        (7, &[2, 4, 0, 5, 1, -1, -1,
              3, 0, 1, 2, 4, 5, -1,
              -1, -1, -1, -1, -1, -1, -1], &[5, 6, 0]),
        (3, &[2, 4, 0,
              3, 0, 1,
              -1, -1, -1], &[3, 3, 0]),
        (1, &[2, 3, -1], &[1, 1, 0]),
    ];
    for (k, indices, count) in cases {
        let (got, want) = run_both(&util::ctx(), &scores, [1, 3, 6], k);
        assert_eq!(
            want.block_indices,
            Tensor::from_i32(&[1, 3, k], indices),
            "cpu k={k}"
        );
        assert_eq!(
            want.block_count,
            Tensor::from_i32(&[1, 3], count),
            "cpu k={k}"
        );
        assert_eq!(got, want, "gpu k={k}");
    }
}

#[test]
fn gpu_matches_cpu_with_ties_nan_and_masks() {
    let mut rng = Rng::new(23);
    // (T, Hs, W, k, percent of -inf)
    let cases: &[(usize, usize, usize, usize, usize)] = &[
        (3, 2, 1757, 1, 0),
        (3, 2, 1757, 7, 10),
        (2, 3, 1757, 300, 50),
        (2, 2, 1757, 2048, 20),
        (2, 2, 2049, 16, 5),
        (2, 1, 2112, 64, 0),
        (4, 1, 1757, 64, 97),
        (5, 2, 3, 1, 30),
        (5, 2, 3, 5, 30),
        (3, 1, 1, 4, 50),
        (2, 2, 300, 256, 0),
        (2, 1, 513, 512, 0),
        (1, 2, 65536, 2048, 5),
        (0, 2, 5, 3, 0),
        (2, 1, 0, 4, 0),
    ];
    for &(t, hs, w, k, masked) in cases {
        let mut scores = Vec::with_capacity(t * hs * w);
        for r in 0..t * hs {
            // Every third row is fully masked except in the 100 % cases above.
            let m = if r % 3 == 2 { 100 } else { masked };
            scores.extend(tied_row(&mut rng, w, m));
        }
        check(
            &scores,
            [t, hs, w],
            k,
            &format!("ties T={t} Hs={hs} W={w} k={k} masked={masked}%"),
        );
    }
}

#[test]
fn gpu_matches_cpu_on_distinct_scores() {
    let mut rng = Rng::new(5);
    for (t, hs, w, k) in [(2, 2, 5000, 512), (1, 2, 65536, 2048), (3, 4, 1757, 100)] {
        let mut scores = rng.normals(t * hs * w);
        // A causal-style mask: row r sees only its first few columns.
        for r in 0..t * hs {
            let vis = (w * (r + 1)) / (t * hs);
            scores[r * w + vis..(r + 1) * w].fill(NEG_INF);
        }
        check(
            &scores,
            [t, hs, w],
            k,
            &format!("distinct T={t} Hs={hs} W={w} k={k}"),
        );
    }
}

#[test]
fn gpu_matches_cpu_on_sign_extremes() {
    // Values chosen to stress single radix digits: equal high bytes, extremes, all-equal rows.
    let mut rng = Rng::new(77);
    let pool = [
        f32::MAX,
        -f32::MAX,
        f32::INFINITY,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        1.0,
        1.0000001,
        0.99999994,
    ];
    let (t, hs, w, k) = (4, 2, 1000, 333);
    let mut scores: Vec<f32> = (0..t * hs * w)
        .map(|_| pool[rng.below(pool.len())])
        .collect();
    scores[..w].fill(7.0); // one all-equal row: the k lowest columns, in order
    scores[w..2 * w].fill(f32::NAN); // one all-NaN row
    check(&scores, [t, hs, w], k, "sign extremes");
}

#[test]
fn widest_rows_and_column_65535() {
    let w = 65536;
    let mut scores = vec![1.0f32; 3 * w]; // row 0: all equal, so columns 0 .. k-1
    scores[w..2 * w].fill(NEG_INF); // row 1: only the last and the first column
    scores[2 * w - 1] = 2.0;
    scores[w] = 1.0;
    scores[2 * w..].fill(f32::NAN); // row 2: all NaN but one number; the last column masked
    scores[2 * w + 40000] = -5.0;
    scores[3 * w - 1] = NEG_INF;
    let k = 2048;
    let (got, want) = run_both(&util::ctx(), &scores, [1, 3, w], k);
    let mut expect = vec![-1; 3 * k];
    for (s, v) in expect[..k].iter_mut().enumerate() {
        *v = s as i32;
    }
    expect[k] = 65535;
    expect[k + 1] = 0;
    expect[2 * k] = 40000;
    for (s, v) in expect[2 * k + 1..].iter_mut().enumerate() {
        *v = s as i32;
    }
    assert_eq!(
        want.block_indices,
        Tensor::from_i32(&[1, 3, k], &expect),
        "cpu"
    );
    assert_eq!(
        want.block_count,
        Tensor::from_i32(&[1, 3], &[2048, 2, 2048]),
        "cpu"
    );
    assert_eq!(got, want, "gpu");
}

/// Rows of W >= 16 k (decode over a long context) first try a threshold taken from 512 sampled
/// columns (every W / 512-th) and fall back to the radix select when it keeps fewer than k or
/// more than 2048 keys: both ways must give the contract's answer.
#[test]
fn wide_rows_sampled_threshold_and_its_fallbacks() {
    let mut rng = Rng::new(0x5a3e);
    let w = 32768;
    let stride = w / 512;
    let mut rows: Vec<(&str, Vec<f32>)> = Vec::new();
    // Distinct values: the sampled threshold holds.
    rows.push(("distinct", rng.normals(w)));
    // Few values, NaN, ±0, denormals: ties at the threshold; most rows keep > 2048 keys.
    rows.push(("tied", tied_row(&mut rng, w, 10)));
    // All equal: the sampled threshold keeps every column (> 2048): radix select.
    rows.push(("all equal", vec![0.25; w]));
    // The sampled columns hold the largest values: the threshold keeps only ~20 keys (< k).
    let mut adv = rng.normals(w);
    for (c, x) in adv.iter_mut().enumerate() {
        if c % stride == 0 {
            *x += 100.0;
        }
    }
    rows.push(("sampled columns largest", adv));
    // The sampled columns hold the smallest values: the threshold keeps nearly every column.
    let mut low = rng.normals(w);
    for (c, x) in low.iter_mut().enumerate() {
        if c % stride == 0 {
            *x -= 100.0;
        }
    }
    rows.push(("sampled columns smallest", low));
    // 700 scattered candidates, the rest masked: the sample sees too few (threshold 0).
    let mut sparse = vec![NEG_INF; w];
    for _ in 0..700 {
        sparse[rng.below(w)] = rng.normals(1)[0];
    }
    rows.push(("sparse", sparse));
    // A causal-style row: only the first 20000 columns are candidates.
    let mut causal = rng.normals(w);
    causal[20000..].fill(NEG_INF);
    rows.push(("first 20000", causal));
    for k in [1, 64, 512] {
        for (what, row) in &rows {
            check(row, [1, 1, w], k, &format!("{what}, W = {w}, k = {k}"));
        }
    }
    // Several rows at once, and the widest W.
    let all: Vec<f32> = rows.iter().flat_map(|(_, r)| r.iter().copied()).collect();
    check(&all, [rows.len(), 1, w], 512, "all rows in one call");
    let wide = rng.normals(65536);
    check(&wide, [1, 1, 65536], 512, "W = 65536, k = 512");
    check(
        &wide,
        [1, 1, 65536],
        4096 / 2,
        "W = 65536, k = 2048 (radix only)",
    );
}

#[test]
fn rows_wider_than_one_selection() {
    // W > 65536 (DSA's r = 1 over a long context): the row is selected in chunks of at most
    // 65536 columns whose k best are merged (src/ops/block_topk_chunks.rs). Ties across chunk
    // boundaries, NaN, ±0 and -inf; the best columns in the padded last chunk, in the first,
    // or spread; fewer candidates than k; W = 131072 (two whole chunks) and 140003 (three,
    // the last padded).
    let mut rng = Rng::new(0x3c);
    let w = 140_003;
    let tied: Vec<f32> = (0..2).flat_map(|_| tied_row(&mut rng, w, 20)).collect();
    for k in [2048, 100, 1] {
        check(&tied, [1, 2, w], k, &format!("tied rows, W = {w}, k = {k}"));
    }
    // Every score equal: the k lowest columns.
    check(
        &vec![1.0; 70_001],
        [1, 1, 70_001],
        2048,
        "all equal, W = 70001",
    );
    // Rising scores: the best are the last columns, in the padded chunk; falling: the first.
    let rising: Vec<f32> = (0..w).map(|c| c as f32).collect();
    check(&rising, [1, 1, w], 512, "rising, W = 140003");
    let falling: Vec<f32> = (0..w).map(|c| -(c as f32)).collect();
    check(&falling, [1, 1, w], 512, "falling, W = 140003");
    // Few candidates (fewer than k in all, some chunks with none) and NaN only at the end.
    let mut sparse = vec![NEG_INF; w];
    for _ in 0..700 {
        sparse[rng.below(70_000)] = rng.normal();
    }
    sparse[w - 50..].fill(f32::NAN);
    check(&sparse, [1, 1, w], 2048, "fewer candidates than k");
    // A DSA decode row at 128K tokens, with a prefill-like batch of rows.
    let dsa = rng.normals(3 * 131_072);
    check(&dsa, [3, 1, 131_072], 2048, "W = 131072, k = 2048");
}

#[test]
fn more_rows_than_one_grid_dimension() {
    // 65,600 rows > 65,535 workgroups per dimension: the dispatch is split over x and y. Rows
    // are tiny because each workgroup costs ~0.1 ms on lavapipe whatever its row.
    let mut rng = Rng::new(3);
    let (t, hs, w, k) = (32_800, 2, 3, 3);
    let limit = util::ctx().limits.max_compute_workgroups_per_dimension as usize;
    assert!(
        t * hs > limit,
        "{} rows fit one grid dimension of {limit}",
        t * hs
    );
    let scores: Vec<f32> = (0..t * hs * w)
        .flat_map(|_| tied_row(&mut rng, 1, 20))
        .collect();
    check(&scores, [t, hs, w], k, "65,600 rows");
}

/// Rows with exactly k, k ± 1 (and fewer, and all) candidates, widths that are not multiples of
/// the 256-invocation workgroup, and the block-causal shape of a prefill: the count path, the
/// radix path, and the column-ordered compaction across invocation chunks.
#[test]
fn candidates_around_k_and_ragged_widths() {
    let mut rng = Rng::new(0x70c4);
    for (w, k) in [
        (2048, 512),
        (2049, 16),
        (2112, 700),
        (1000, 300),
        (2500, 700),
        (257, 64),
        (300, 299),
    ] {
        let counts = [0, 1, k - 1, k, k + 1, w / 2, w - 1, w];
        let (t, hs) = (counts.len(), 2);
        let mut scores = vec![NEG_INF; t * hs * w];
        for (r, row) in scores.chunks_mut(w).enumerate() {
            let n = counts[r / hs].min(w);
            // Head 0: candidates at the front (block-causal); head 1: scattered and tied.
            if r % hs == 0 {
                for x in &mut row[..n] {
                    *x = rng.below(1 << 16) as f32 / 64.0 - 500.0;
                }
            } else {
                let (mut c, mut have) = (0, 0);
                while have < n {
                    c = (c + 1 + rng.below(7)) % w;
                    if row[c] == NEG_INF {
                        row[c] = rng.below(5) as f32;
                        have += 1;
                    }
                }
            }
        }
        check(&scores, [t, hs, w], k, &format!("W = {w}, k = {k}"));
    }
}

/// The select may stop with up to 128 extra keys in the last bucket (ranks past k dropped), but
/// never with more than 2048 in all: small k, k near the limit, coarse and fine values.
#[test]
fn overshooting_buckets_near_k_and_the_limit() {
    let mut rng = Rng::new(0x5ac);
    for (w, k, coarse) in [
        (2048, 5, false),
        (4096, 2000, false),
        (4096, 2000, true),
        (3000, 1, true),
    ] {
        let scores: Vec<f32> = (0..2 * w)
            .map(|_| {
                if coarse {
                    (rng.below(300) as f32) * 0.125
                } else {
                    rng.below(1 << 24) as f32 * 1e-3
                }
            })
            .collect();
        check(
            &scores,
            [2, 1, w],
            k,
            &format!("W = {w}, k = {k}, coarse {coarse}"),
        );
    }
}

/// One value everywhere: the order is the columns' order, across every invocation's chunk.
#[test]
fn all_tied_rows_keep_column_order() {
    // 2049 and 2112: short rows (`row_sg`) with more tied winners than MAX_K.
    for (w, k) in [
        (3000, 700),
        (2048, 2048),
        (2049, 16),
        (2112, 2048),
        (65536, 2048),
        (777, 5),
    ] {
        let scores = vec![1.5f32; 2 * w];
        check(
            &scores,
            [1, 2, w],
            k,
            &format!("all tied, W = {w}, k = {k}"),
        );
    }
}

/// Which kernel a row shape takes: the subgroup variants only on 8-lane subgroups (so the
/// cases above reach them on lavapipe and the portable kernels through `portable_ctx`): short
/// rows (W <= 2112) and wide ones; rows between take the portable `main` everywhere.
#[test]
fn kernel_choice() {
    assert_eq!(pipeline(2048, 512, Some(8)), (SHADER_SG, "row_sg"));
    assert_eq!(pipeline(1, 1, Some(8)), (SHADER_SG, "row_sg"));
    assert_eq!(pipeline(2048, 128, Some(8)), (SHADER_SG, "row_sg"));
    assert_eq!(pipeline(2049, 16, Some(8)), (SHADER_SG, "row_sg"));
    assert_eq!(pipeline(2112, 512, Some(8)), (SHADER_SG, "row_sg"));
    assert_eq!(pipeline(2113, 512, Some(8)), (OP, "main"));
    assert_eq!(pipeline(2048, 512, None), (OP, "main"));
    assert_eq!(pipeline(2048, 512, Some(32)), (OP, "main"));
    assert_eq!(pipeline(2048, 128, None), (OP, "wide"));
    assert_eq!(pipeline(32768, 512, Some(8)), (SHADER_SG, "wide_sg"));
    assert_eq!(pipeline(32768, 512, None), (OP, "wide"));
    assert_eq!(pipeline(4096, 512, Some(8)), (OP, "main"));
}

/// Which selections the split kernels take: wide rows, at most 64 of them, on a context told
/// to split.
#[test]
fn split_choice() {
    let p = |rows, w, k| BlockTopkParams {
        rows,
        w,
        k,
        ..Default::default()
    };
    let split = util::split_ctx();
    assert!(split.caps.split_topk);
    assert!(split_applies(&split, &p(1, 32768, 512)));
    assert!(split_applies(&split, &p(64, 4096, 64)));
    assert!(!split_applies(&split, &p(65, 4096, 64)), "too many rows");
    assert!(!split_applies(&split, &p(1, 2048, 512)), "not wide");
    assert!(!split_applies(&split, &p(1, 32768, 1024)), "k > 512");
    // Only when asked for.
    assert!(!split_applies(&util::ctx(), &p(1, 32768, 512)));
    // Each part holds PART_W columns, a row's keys and columns and its parts' counts.
    assert_eq!(split_scratch_bytes(2, 32768), 2 * (2 * 32768 + 32) * 4);
    assert_eq!(split_scratch_bytes(1, 4097), (2 * 4097 + 5) * 4);
}

/// A block-causal prefill: row p has (p + 1) / 4 candidates in front, the rest -inf.
#[test]
fn block_causal_prefill_rows() {
    let mut rng = Rng::new(0xb10c);
    let (t, w, k) = (1200, 512, 128);
    let mut scores = vec![NEG_INF; t * w];
    for (p, row) in scores.chunks_mut(w).enumerate() {
        for x in &mut row[..((p + 1) / 4).min(w)] {
            *x = rng.below(1000) as f32 * 0.25;
        }
    }
    check(&scores, [t, 1, w], k, "block-causal prefill");
}

fn attrs(pairs: &[(&str, serde_json::Value)]) -> AttrMap {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

#[test]
fn attributes_and_registry() {
    let k = |a: &AttrMap| BlockTopkAttrs::from_map(a).map(|a| a.k);
    assert_eq!(k(&attrs(&[("k", json!(16))])).unwrap(), 16);
    assert_eq!(
        k(&attrs(&[
            ("token_budget", json!(2048)),
            ("ratio", json!(4))
        ]))
        .unwrap(),
        512
    );
    // The registry runs it by name and names both outputs.
    let m = TensorMap::from([(
        "scores".to_string(),
        Tensor::from_f32(DType::F32, &[1, 1, 4], &[0.0, 2.0, NEG_INF, 1.0]),
    )]);
    let a = attrs(&[("k", json!(3))]);
    let cpu_out = run_blocking("block_topk", &m, &a, Exec::Cpu).unwrap();
    let gpu_out = run_blocking("block_topk", &m, &a, Exec::Gpu(&util::ctx())).unwrap();
    assert_eq!(
        cpu_out["block_indices"],
        Tensor::from_i32(&[1, 1, 3], &[1, 3, 0])
    );
    assert_eq!(cpu_out["block_count"], Tensor::from_i32(&[1, 1], &[3]));
    assert_eq!(gpu_out, cpu_out);
}

#[test]
fn bad_inputs_name_the_operator() {
    let ok = Tensor::zeros(DType::F32, &[2, 1, 8]);
    let bad_cases: Vec<(&str, Tensor, AttrMap)> = vec![
        ("k = 0", ok.clone(), attrs(&[("k", json!(0))])),
        ("k < 0", ok.clone(), attrs(&[("k", json!(-3))])),
        ("k too large", ok.clone(), attrs(&[("k", json!(2049))])),
        ("k not an integer", ok.clone(), attrs(&[("k", json!(1.5))])),
        ("no k", ok.clone(), attrs(&[])),
        (
            "k and token_budget",
            ok.clone(),
            attrs(&[
                ("k", json!(4)),
                ("token_budget", json!(16)),
                ("ratio", json!(4)),
            ]),
        ),
        (
            "token_budget without ratio",
            ok.clone(),
            attrs(&[("token_budget", json!(16))]),
        ),
        (
            "token_budget < ratio",
            ok.clone(),
            attrs(&[("token_budget", json!(3)), ("ratio", json!(4))]),
        ),
        (
            "f16 scores",
            Tensor::zeros(DType::F16, &[2, 1, 8]),
            attrs(&[("k", json!(4))]),
        ),
        (
            "i32 scores",
            Tensor::zeros(DType::I32, &[2, 1, 8]),
            attrs(&[("k", json!(4))]),
        ),
        (
            "rank 2",
            Tensor::zeros(DType::F32, &[2, 8]),
            attrs(&[("k", json!(4))]),
        ),
        (
            "rank 4",
            Tensor::zeros(DType::F32, &[1, 2, 1, 8]),
            attrs(&[("k", json!(4))]),
        ),
        (
            "W too wide for the chunks' merged row (33 chunks · k = 2048 > 65536)",
            Tensor::zeros(DType::F32, &[1, 1, 32 * 65536 + 1]),
            attrs(&[("k", json!(2048))]),
        ),
    ];
    let ctx = util::ctx();
    for (what, scores, a) in bad_cases {
        let m = TensorMap::from([("scores".to_string(), scores)]);
        for exec in [Exec::Cpu, Exec::Gpu(&ctx)] {
            let e = run_blocking("block_topk", &m, &a, exec)
                .expect_err(what)
                .to_string();
            assert!(e.starts_with("block_topk: "), "{what}: {e}");
        }
    }
    let e = run_blocking(
        "block_topk",
        &TensorMap::new(),
        &attrs(&[("k", json!(4))]),
        Exec::Cpu,
    )
    .expect_err("missing scores")
    .to_string();
    assert!(e.contains("block_topk") && e.contains("scores"), "{e}");
}
