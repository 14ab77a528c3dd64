//! sparse_attention: GPU against the CPU reference for f32/f16/bf16 — Qwen3.8-Flash-Next's GQA
//! shape at the full 2051-token width, MHA, Hs > 1 splitting KV groups, groups that take several
//! passes, odd E and W, ragged batches mixing prefill and decode rows, multi-layer strided pools
//! with shuffled pages whose unused memory is garbage; sinks; empty rows; a hand-checked case.
//! The device entry points are tested in sparse_attention_device.rs (splits, shards, sinks,
//! head chunks, value widths) and sparse_attention_passes.rs (the subgroup, tiled and routing
//! variants, non-finite scores).

mod util;

#[path = "sparse_attention/problem.rs"]
mod problem;

use problem::*;
use qsa_wgpu::ops::sparse_attention::{cpu, gpu, heads_per_pass};
use qsa_wgpu::testing::{attention_tol, compare, Rng};
use qsa_wgpu::{DType, Tensor};

#[test]
fn qwen_gqa_full_width() {
    // H = 24, Hkv = 2, E = 256, Hs = 1, W = k·r + r − 1 = 2051: decode rows past 2051 tokens
    // (the list is full), a prefill chunk from 0, a two-row chunk deep into a sequence.
    let mut rng = Rng::new(71);
    assert_eq!(heads_per_pass(256), 12, "a Qwen group must take one pass");
    let s = shape(24, 2, 1, 256, 2051);
    for (dt, sinks) in [
        (DType::F32, false),
        (DType::F32, true),
        (DType::F16, true),
        (DType::BF16, false),
    ] {
        check(&mut rng, dt, &s, &[(2100, 1), (0, 5), (3000, 2)], sinks);
    }
}

#[test]
fn shapes_gpu_matches_cpu() {
    let mut rng = Rng::new(5);
    let dts = [DType::F32, DType::F16, DType::BF16];
    let mut shapes = vec![
        shape(8, 8, 1, 64, 130),   // MHA
        shape(24, 2, 3, 128, 67),  // Hs = 3: each KV group meets two selection groups
        shape(16, 4, 2, 72, 35),   // selection group of two KV heads, E not a multiple of 64
        shape(12, 3, 2, 66, 9),    // KV head 1 straddles both selection groups; E % 4 = 2
        shape(64, 1, 4, 256, 100), // 16 heads per segment: passes of 12 + 4
        shape(64, 2, 1, 128, 77),  // 32 heads per segment: passes of 16 + 16
        shape(4, 2, 2, 3, 5),      // tiny E
        shape(6, 2, 1, 520, 40),   // three channel quads per invocation, a 3-head pass
        shape(10, 1, 2, 300, 50),  // passes of 5 heads: a padded head quad
    ];
    shapes.push(Shape {
        layers: 3,
        layer: 2,
        stride_mul: 2,
        page: 7,
        ..shape(6, 2, 3, 40, 70)
    });
    for (i, s) in shapes.iter().enumerate() {
        for (j, dt) in dts.iter().enumerate() {
            let seqs = [
                (rng.below(300), 1),
                (0, 17),
                (50 + rng.below(200), 4),
                (31, 0),
                (rng.below(90), 1),
            ];
            check(&mut rng, *dt, s, &seqs, (i + j) % 2 == 0);
        }
    }
}

#[test]
fn shuffled_pages_give_identical_output() {
    let ctx = util::ctx();
    let mut rng = Rng::new(9);
    let s = shape(12, 2, 2, 64, 90);
    let d = data(&mut rng, &s, &[(70, 3), (0, 20), (200, 1)], true);
    let n = pages(&s, &d);
    let a = problem(&mut rng, DType::BF16, &s, &d, (0..n as u32).collect());
    let order = rng.permutation(n);
    let b = problem(&mut rng, DType::BF16, &s, &d, order);
    assert_ne!(a.table, b.table);
    let ga = pollster::block_on(gpu(&ctx, &a.inputs(), &a.attrs)).unwrap();
    let gb = pollster::block_on(gpu(&ctx, &b.inputs(), &b.attrs)).unwrap();
    assert_eq!(ga, gb, "page order changed the GPU result");
    let (ca, cb) = (
        cpu(&a.inputs(), &a.attrs).unwrap(),
        cpu(&b.inputs(), &b.attrs).unwrap(),
    );
    assert_eq!(ca, cb, "page order changed the CPU result");
    compare(&ga, &ca, attention_tol(DType::BF16)).unwrap();
}

#[test]
fn empty_rows_are_zero() {
    let ctx = util::ctx();
    let mut rng = Rng::new(10);
    let s = shape(8, 2, 2, 40, 11);
    for sinks in [false, true] {
        let mut d = data(&mut rng, &s, &[(5, 2), (0, 3)], sinks);
        d.counts.iter_mut().for_each(|c| *c = 0);
        let order = rng.permutation(pages(&s, &d));
        let p = problem(&mut rng, DType::F16, &s, &d, order);
        let zero = Tensor::zeros(DType::F16, &[5, 8, 40]);
        assert_eq!(cpu(&p.inputs(), &p.attrs).unwrap(), zero);
        let got = pollster::block_on(gpu(&ctx, &p.inputs(), &p.attrs)).unwrap();
        assert_eq!(got.to_f32(), zero.to_f32(), "sinks={sinks}");
    }
}

#[test]
fn by_hand() {
    // One head, E = 2, scale 1, tokens [1, 0] of position 1: q·K = [0, 1] for tokens 1, 0.
    // Without a sink out = (e·V0 + V1) / (e + 1); with sink 0 the denominator gains e^0 = 1.
    let q = Tensor::from_f32(DType::F32, &[1, 1, 2], &[1.0, 0.0]);
    // Pool [1 page, 2 planes, 1 layer, 2 rows, 1 head, 2]: K0 = (1, 0), K1 = (0, 5); V0 = (1, 2),
    // V1 = (3, 4).
    let pool = Tensor::from_f32(
        DType::F32,
        &[1, 2, 1, 2, 1, 2],
        &[1.0, 0.0, 0.0, 5.0, 1.0, 2.0, 3.0, 4.0],
    );
    let hand = Hand::new([1, 0, -1]);
    let sink = Tensor::from_f32(DType::F32, &[1], &[0.0]);
    let a = Hand::attrs();
    let e = std::f32::consts::E;
    for (sinks, extra) in [(None, 0.0), (Some(&sink), 1.0)] {
        let x = hand.inputs(&q, &pool, sinks);
        let den = e + 1.0 + extra;
        let want = [(e + 3.0) / den, (2.0 * e + 4.0) / den];
        let c = cpu(&x, &a).unwrap().to_f32();
        let g = pollster::block_on(gpu(&util::ctx(), &x, &a))
            .unwrap()
            .to_f32();
        for i in 0..2 {
            assert!((c[i] - want[i]).abs() < 1e-6, "cpu {c:?} want {want:?}");
            assert!((g[i] - want[i]).abs() < 1e-6, "gpu {g:?} want {want:?}");
        }
    }
}
