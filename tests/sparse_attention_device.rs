//! sparse_attention through the device entry points: token-list splits and their boundaries,
//! the loop limit, a pool in shards of whole pages (tokens spread over them, a bad page
//! flagged), sinks merged after the splits, head chunks and channel blocks, values narrower or
//! wider than keys (`v_head_dim`, NSA's Dqk = 192 / Dv = 128) over shards and splits, and the
//! entry points that refuse them.

mod util;

#[path = "sparse_attention/device.rs"]
mod device;
#[path = "sparse_attention/problem.rs"]
mod problem;

use device::*;
use problem::*;
use qsa_wgpu::gpu::GpuTensor;
use qsa_wgpu::ops::sparse_attention::{
    cpu, encode_attention, heads_per_pass, pack_seqs, params_kv, plan_attention, validate,
    AttentionBuffers, SparseAttentionParams, PASS_SHARDS,
};
use qsa_wgpu::testing::{attention_tol, compare, Rng};
use qsa_wgpu::{DType, Tensor};

#[test]
fn splits_and_their_boundaries() {
    // Counts on both sides of every split boundary (splits of 256 entries), 0 and 1, and W;
    // then the planned splits at Qwen's width.
    let mut rng = Rng::new(31);
    let s = shape(8, 2, 1, 64, 700);
    let counts = [0, 1, 63, 64, 255, 256, 257, 511, 512, 513, 699, 700];
    let seqs = [(800, counts.len())];
    for dt in [DType::F32, DType::BF16] {
        let mut d = data(&mut rng, &s, &seqs, dt == DType::BF16);
        for (row, &c) in counts.iter().enumerate() {
            set_count(&mut rng, &s, &mut d, row, 800 + row, c);
        }
        let order = rng.permutation(pages(&s, &d));
        let p = problem(&mut rng, dt, &s, &d, order);
        let want = cpu(&p.inputs(), &p.attrs).unwrap();
        for split_len in [Some(256), Some(512), None] {
            let run = Run {
                split_len,
                ..Default::default()
            };
            let (got, f) = run_device(&p, &run);
            assert_eq!(f, 0);
            compare(&got, &want, attention_tol(dt))
                .unwrap_or_else(|e| panic!("{dt} splits of {split_len:?}: {e}"));
        }
    }
    let s = shape(24, 2, 1, 256, 2051);
    let d = data(&mut rng, &s, &[(4000, 2)], false);
    let order = rng.permutation(pages(&s, &d));
    let p = problem(&mut rng, DType::BF16, &s, &d, order);
    let (got, _) = run_device(&p, &Run::default());
    compare(
        &got,
        &cpu(&p.inputs(), &p.attrs).unwrap(),
        attention_tol(DType::BF16),
    )
    .unwrap();
}

#[test]
fn long_lists_stay_within_the_loop_limit() {
    // One split of 5000 tokens for 12 and 15 heads per KV head at E = 192 (three and four head
    // quads per lane; 15 is heads_per_pass(192)). The subgroup pass once ran its subgroup sums
    // and maxima as loops, which llvmpipe counts toward its 65535 loop iterations per
    // invocation; past about 3000 tokens at four head quads it stopped early and gave a wrong
    // output on lavapipe (the loop model counted neither). Written out, they are no loop at all.
    let mut rng = Rng::new(5000);
    assert_eq!(heads_per_pass(192), 15);
    for h in [48, 60] {
        let s = Shape {
            ev: 128,
            ..shape(h, 4, 1, 192, 5000)
        };
        let mut d = data(&mut rng, &s, &[(5000, 1)], false);
        set_count(&mut rng, &s, &mut d, 0, 5000, 5000);
        let order = rng.permutation(pages(&s, &d));
        let p = problem(&mut rng, DType::F32, &s, &d, order);
        let want = cpu(&p.inputs(), &p.attrs).unwrap();
        for split_len in [Some(5056), None] {
            let run = Run {
                split_len,
                ..Default::default()
            };
            let (got, f) = run_device(&p, &run);
            assert_eq!(f, 0);
            compare(&got, &want, attention_tol(DType::F32))
                .unwrap_or_else(|e| panic!("H = {h}, splits of {split_len:?}: {e}"));
        }
    }
}

#[test]
fn sharded_pool_matches_one_buffer() {
    // Pages shuffled over the pool, so each row's tokens spread over the shards; up to 45
    // shards, shards that do not divide the pool, a strided multi-layer pool. Through the
    // context's partial pass, and through the subgroup pass in 16-byte words and the tiled pass
    // (each dispatch of the subgroup pass takes up to four shards, the tiled pass one).
    let narrow = util::narrow_ctx();
    let tiled = util::portable_ctx();
    let mut counts = Vec::new();
    let mut rng = Rng::new(32);
    let strided = Shape {
        layers: 2,
        layer: 1,
        stride_mul: 2,
        page: 8,
        ..shape(6, 2, 3, 40, 90)
    };
    for (dt, s) in [
        (DType::F32, shape(8, 2, 2, 64, 300)),
        (DType::F16, strided),
        (DType::BF16, shape(24, 2, 1, 256, 520)),
    ] {
        let d = data(&mut rng, &s, &[(400, 2), (0, 30), (250, 1)], true);
        let order = rng.permutation(pages(&s, &d));
        let p = problem(&mut rng, dt, &s, &d, order);
        let want = cpu(&p.inputs(), &p.attrs).unwrap();
        let (one, f) = run_device(&p, &Run::default());
        assert_eq!(f, 0);
        compare(&one, &want, attention_tol(dt)).unwrap();
        for sp in [2, 3, 7, 20] {
            for split_len in [None, Some(256)] {
                let run = Run {
                    shard_pages: Some(sp),
                    split_len,
                    ..Default::default()
                };
                let (got, f) = run_device(&p, &run);
                assert_eq!(f, 0, "{dt} shards of {sp}");
                compare(&got, &want, attention_tol(dt))
                    .unwrap_or_else(|e| panic!("{dt} {s:?} shards of {sp}: {e}"));
                compare(&got, &one, attention_tol(dt))
                    .unwrap_or_else(|e| panic!("{dt} shards of {sp} vs one buffer: {e}"));
            }
            for c in [&narrow, &tiled] {
                let run = Run {
                    shard_pages: Some(sp),
                    ctx: Some(c.clone()),
                    ..Default::default()
                };
                let (got, f) = run_device(&p, &run);
                let sub = c.caps.subgroup_size;
                assert_eq!(f, 0, "{dt} shards of {sp}, subgroups {sub:?}");
                compare(&got, &want, attention_tol(dt)).unwrap_or_else(|e| {
                    panic!("{dt} {s:?} shards of {sp}, subgroups {sub:?}: {e}")
                });
            }
        }
        // The partial dispatches: the subgroup pass takes the shards four at a time, the tiled
        // pass one at a time (some pools with a last dispatch of fewer than four).
        let prm = {
            let v = validate(&p.inputs(), &p.attrs).unwrap();
            params_kv(&v.geo, v.e, v.ev).unwrap()
        };
        for c in [util::ctx(), narrow.clone(), tiled.clone()] {
            for sp in [2, 3, 7, 20] {
                let plan = plan_attention(&c, &prm, sp, 1 << 26, 1 << 26).unwrap();
                let shards = (prm.num_pages as usize).div_ceil(sp);
                let starts: Vec<usize> = plan
                    .steps
                    .iter()
                    .filter(|st| st.shader == "sparse_attention")
                    .map(|st| st.shard)
                    .collect();
                let step = if plan.steps[0].params.sg != 0 {
                    PASS_SHARDS
                } else {
                    1
                };
                let want: Vec<usize> = (0..shards).step_by(step).collect();
                assert_eq!(starts, want, "{dt} shards of {sp}");
                counts.push(shards);
            }
        }
    }
    assert!(
        counts
            .iter()
            .any(|&n| n > PASS_SHARDS && n % PASS_SHARDS != 0),
        "{counts:?}"
    );
    assert!(counts.iter().any(|&n| n < PASS_SHARDS), "{counts:?}");
}

#[test]
fn sharded_pool_flags_a_bad_page() {
    let mut rng = Rng::new(33);
    let s = shape(4, 1, 1, 32, 200);
    let d = data(&mut rng, &s, &[(300, 2)], false);
    let np = pages(&s, &d);
    let order = rng.permutation(np);
    let p = problem(&mut rng, DType::F32, &s, &d, order);
    // seqs = [row_offsets (2) | cache_lengths (1) | table]: column 0 of the table past the pool.
    let run = Run {
        shard_pages: Some(4),
        seqs: Some(|v| v[3] = 1 << 20),
        ..Default::default()
    };
    let (got, f) = run_device(&p, &run);
    assert_eq!(f, 8, "flags {f:#x}");
    assert!(
        got.to_f32().iter().all(|v| v.is_finite()),
        "an output was left unwritten"
    );
}

#[test]
fn sinks_are_merged_after_the_splits() {
    // Sinks −inf, far above and far below every score, 0, with lists over several splits,
    // an empty row and a one-token row.
    let mut rng = Rng::new(34);
    let s = shape(8, 2, 2, 48, 600);
    let mut d = data(&mut rng, &s, &[(700, 4)], true);
    d.sinks = Some(vec![
        f32::NEG_INFINITY,
        60.0,
        -60.0,
        0.0,
        3.0,
        f32::NEG_INFINITY,
        30.0,
        -2.0,
    ]);
    set_count(&mut rng, &s, &mut d, 1, 701, 0);
    set_count(&mut rng, &s, &mut d, 2, 702, 1);
    set_count(&mut rng, &s, &mut d, 3, 703, 600);
    for dt in [DType::F32, DType::F16] {
        let order = rng.permutation(pages(&s, &d));
        let p = problem(&mut rng, dt, &s, &d, order);
        let want = cpu(&p.inputs(), &p.attrs).unwrap();
        for run in Run::plain_and_split(5) {
            let (got, _) = run_device(&p, &run);
            compare(&got, &want, attention_tol(dt)).unwrap_or_else(|e| panic!("{dt}: {e}"));
            // The empty row is 0 for every head, sink or not.
            let row = &got.to_f32()[8 * 48..2 * 8 * 48];
            assert!(row.iter().all(|&v| v == 0.0), "{dt}: empty row {row:?}");
        }
    }
}

#[test]
fn head_chunks_and_channel_blocks() {
    // 40 heads in one group (four chunks of ten), 20 heads per segment with Hs = 2, and
    // E = 1032 (three channel blocks of the V step), over several splits.
    let mut rng = Rng::new(35);
    for (dt, s) in [
        (DType::F32, shape(40, 1, 1, 256, 600)),
        (DType::BF16, shape(40, 1, 2, 128, 300)),
        (DType::F16, shape(6, 2, 1, 1032, 300)),
    ] {
        let d = data(&mut rng, &s, &[(620, 2), (0, 3)], true);
        let order = rng.permutation(pages(&s, &d));
        let p = problem(&mut rng, dt, &s, &d, order);
        let want = cpu(&p.inputs(), &p.attrs).unwrap();
        for split_len in [None, Some(256)] {
            let run = Run {
                split_len,
                ..Default::default()
            };
            let (got, f) = run_device(&p, &run);
            assert_eq!(f, 0);
            compare(&got, &want, attention_tol(dt))
                .unwrap_or_else(|e| panic!("{dt} {s:?} splits {split_len:?}: {e}"));
        }
    }
}

#[test]
fn value_width_differs_from_key_width() {
    // NSA's selected branch (H = 64, Hkv = Hs = 4, Dqk = 192, Dv = 128: 15 heads at most per
    // workgroup, so two chunks of 8 per KV head), values wider than keys, several quads per lane on either side, and a strided
    // multi-layer pool. The channels past E in K rows and past Ev in V rows are garbage.
    let mut rng = Rng::new(192);
    assert_eq!(heads_per_pass(192), 15);
    let nsa = Shape {
        ev: 128,
        ..shape(64, 4, 4, 192, 300)
    };
    let shapes = [
        nsa,
        Shape {
            ev: 72,
            ..shape(6, 2, 3, 40, 70)
        },
        Shape {
            ev: 300,
            ..shape(8, 2, 1, 24, 33)
        },
        Shape {
            ev: 5,
            layers: 2,
            layer: 1,
            stride_mul: 2,
            page: 7,
            ..shape(12, 3, 2, 66, 19)
        },
    ];
    let dts = [DType::BF16, DType::F32, DType::F16];
    for (i, s) in shapes.iter().enumerate() {
        let dt = dts[i % 3];
        check(&mut rng, dt, s, &[(700, 1), (0, 9), (90, 4)], i % 2 == 1);
    }
    // The output has Ev channels; a pool whose head_dim is not max(E, Ev) is refused.
    let s = Shape {
        ev: 40,
        ..shape(4, 2, 2, 24, 8)
    };
    let d = data(&mut rng, &s, &[(10, 2)], false);
    let order = rng.permutation(pages(&s, &d));
    let mut p = problem(&mut rng, DType::F32, &s, &d, order);
    assert_eq!(cpu(&p.inputs(), &p.attrs).unwrap().shape, vec![2, 4, 40]);
    for bad in [Some(8), Some(32), None] {
        p.attrs.v_head_dim = bad;
        let e = cpu(&p.inputs(), &p.attrs).unwrap_err().to_string();
        assert!(e.contains("kv_blocks") && e.contains("head_dim"), "{e}");
    }
}

#[test]
fn value_width_over_shards_and_splits() {
    // Values of their own width through the device entry points: NSA's selected branch at its
    // full width W = k·l' = 1024 (H = 64, Hkv = Hs = 4, E = 192, Ev = 128: chunks of 8 heads,
    // four phases), values wider than keys with two channel blocks (Ev = 1032 > 512), odd Ev,
    // a strided multi-layer pool; pools in shards, lists in several splits.
    let mut rng = Rng::new(193);
    let shapes = [
        (
            DType::BF16,
            Shape {
                ev: 128,
                ..shape(64, 4, 4, 192, 1024)
            },
        ),
        (
            DType::F32,
            Shape {
                ev: 1032,
                ..shape(6, 2, 1, 40, 300)
            },
        ),
        (
            DType::F16,
            Shape {
                ev: 9,
                layers: 2,
                layer: 1,
                stride_mul: 2,
                page: 8,
                ..shape(12, 3, 2, 66, 290)
            },
        ),
    ];
    for (dt, s) in shapes {
        let d = data(&mut rng, &s, &[(1100, 1), (300, 2)], true);
        let order = rng.permutation(pages(&s, &d));
        let p = problem(&mut rng, dt, &s, &d, order);
        let want = cpu(&p.inputs(), &p.attrs).unwrap();
        assert_eq!(want.shape, vec![3, s.h, s.ev]);
        for run in Run::plain_and_split(7) {
            let (got, f) = run_device(&p, &run);
            assert_eq!(f, 0, "{dt} {s:?}");
            compare(&got, &want, attention_tol(dt))
                .unwrap_or_else(|e| panic!("{dt} {s:?} shards {:?}: {e}", run.shard_pages));
        }
    }
}

#[test]
fn value_width_refused_by_the_device_entry_points() {
    // params_kv takes only a pool whose head_dim is max(E, Ev); a uniform block whose pool rows
    // cannot hold E or Ev channels, or a pool buffer too small for its Dp-channel rows, is
    // refused before anything is recorded.
    let ctx = util::ctx();
    let mut rng = Rng::new(194);
    let s = Shape {
        ev: 40,
        ..shape(4, 2, 2, 24, 8)
    };
    let d = data(&mut rng, &s, &[(10, 2)], false);
    let order = rng.permutation(pages(&s, &d));
    let p = problem(&mut rng, DType::F32, &s, &d, order);
    let x = p.inputs();
    let plan = validate(&x, &p.attrs).unwrap();
    for (e, ev) in [(24, 24), (24, 32), (48, 40), (24, 48)] {
        let err = params_kv(&plan.geo, e, ev).unwrap_err().to_string();
        assert!(err.contains("head_dim"), "E = {e}, Ev = {ev}: {err}");
    }
    let prm = params_kv(&plan.geo, 24, 40).unwrap();
    assert_eq!((prm.e, prm.v_dim(), prm.pool_dim()), (24, 40, 40));
    let up = |t: &Tensor| GpuTensor::upload(&ctx, "test", t).unwrap();
    let query = up(x.query);
    let seqs = up(&pack_seqs(&plan.offsets, &plan.cache, &plan.table));
    let (tokens, counts) = (up(x.token_indices), up(x.token_count));
    let out = GpuTensor::filled(&ctx, "out", DType::F32, &[2, 4, 40], 0).unwrap();
    let flags = up(&Tensor::from_u32(&[1], &[0]));
    let whole = up(x.kv_blocks);
    // The same pool cut to rows of E channels: too small for Dp = 40.
    let l = plan.geo.layout;
    let short = Tensor::from_bytes(
        DType::F32,
        &[l.num_pages * l.page_stride * 24 / 40],
        x.kv_blocks.data[..l.num_pages * l.page_stride * 24 / 40 * 4].to_vec(),
    )
    .unwrap();
    let short = up(&short);
    let bad_dp = SparseAttentionParams { dp: 32, ..prm };
    for (prm, pool, what) in [
        (bad_dp, &whole, "cannot hold"),
        (prm, &short, "the call needs"),
    ] {
        let b = AttentionBuffers {
            query: &query.buffer,
            pool: &pool.buffer,
            seqs: &seqs.buffer,
            token_indices: &tokens.buffer,
            token_count: &counts.buffer,
            sinks: None,
            out: &out.buffer,
            flags: &flags.buffer,
        };
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        let err = pollster::block_on(encode_attention(&ctx, &mut enc, DType::F32, &prm, &b))
            .unwrap_err()
            .to_string();
        assert!(err.contains("kv_blocks") && err.contains(what), "{err}");
    }
}
