//! block_topk with the fused token route (the indexer's step): the route written by the
//! top-k's last step against `expand_route`'s CPU reference applied to `block_topk`'s CPU
//! reference, over the short-row and wide-row kernels (subgroup variants and portable, and
//! the split kernels that spread a few wide rows over workgroups on GPUs), row chunks
//! (`out_base`), ratios 1 to 7 and positions whose visible blocks end anywhere in the
//! row; device flags for a negative position and for a selected block past the position; and
//! the parameter checks of a routed dispatch.

mod util;

use qsa_wgpu::gpu::{Context, GpuTensor};
use qsa_wgpu::ops::block_topk::{self, dispatch_topk, BlockTopkAttrs, BlockTopkParams, TopkRoute};
use qsa_wgpu::ops::common::{encode, read_checked};
use qsa_wgpu::ops::expand_route::{self, ExpandRouteInputs};
use qsa_wgpu::testing::Rng;
use qsa_wgpu::{DType, Tensor};

/// What the fused dispatch returns: block_indices, block_count, token_indices, token_count.
type Four = [Tensor; 4];

/// Runs the top-k with the route over `scores [t, hs, w]` and `positions [t]`, in row chunks
/// of `chunk_t` token rows (each its own dispatch over its own score buffer, as the indexer's
/// chunked score matrix), and reads the outputs back with the flag word.
fn fused(
    ctx: &Context,
    scores: &[f32],
    [t, hs, w]: [usize; 3],
    positions: &[i32],
    k: usize,
    r: usize,
    chunk_t: usize,
) -> qsa_wgpu::Result<Four> {
    let width = k * r + r - 1;
    let fill = |name: &str, shape: &[usize]| {
        GpuTensor::filled(ctx, &format!("test.{name}"), DType::I32, shape, 0x7f).unwrap()
    };
    let bi = fill("block_indices", &[t, hs, k]);
    let bc = fill("block_count", &[t, hs]);
    let ti = fill("token_indices", &[t, hs, width]);
    let tc = fill("token_count", &[t, hs]);
    let flags = GpuTensor::filled(ctx, "test.flags", DType::U32, &[1], 0).unwrap();
    let pos = GpuTensor::upload(ctx, "test.positions", &Tensor::from_i32(&[t], positions))?;
    let mut chunks = Vec::new();
    for base in (0..t).step_by(chunk_t) {
        let rows = chunk_t.min(t - base);
        let part = &scores[base * hs * w..(base + rows) * hs * w];
        let s = Tensor::from_f32(DType::F32, &[rows, hs, w], part);
        let params = BlockTopkParams {
            rows: (rows * hs) as u32,
            w: w as u32,
            k: k as u32,
            out_base: (base * hs) as u32,
            hs: hs as u32,
            r: r as u32,
            width: width as u32,
            _pad: 0,
        };
        chunks.push((GpuTensor::upload(ctx, "test.scores", &s)?, params));
    }
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let mut scratch = Vec::new();
    for (s, params) in &chunks {
        let route = TopkRoute {
            positions: &pos.buffer,
            token_indices: &ti.buffer,
            token_count: &tc.buffer,
            flags: &flags.buffer,
        };
        if block_topk::split_applies(ctx, params) {
            // The split kernels' scratch is the caller's: one per chunk here.
            let sc = block_topk::split_scratch(ctx, "test.split", params.rows, params.w)?;
            let (s, i, c) = (&s.buffer, &bi.buffer, &bc.buffer);
            for d in block_topk::dispatch_topk_split(ctx, params, s, i, c, Some(route), &sc.buffer)?
            {
                pollster::block_on(encode(ctx, &mut enc, d))?;
            }
            scratch.push(sc);
        } else {
            let d = dispatch_topk(ctx, params, &s.buffer, &bi.buffer, &bc.buffer, Some(route))?;
            pollster::block_on(encode(ctx, &mut enc, d))?;
        }
    }
    pollster::block_on(ctx.submit("test", enc))?;
    let got = pollster::block_on(read_checked(
        ctx,
        block_topk::OP,
        &[&bi, &bc, &ti, &tc],
        &flags,
    ))?;
    Ok(got.try_into().unwrap())
}

/// The CPU references in sequence: block_topk, then expand_route of its selection.
fn reference(scores: &[f32], shape: [usize; 3], positions: &[i32], k: usize, r: usize) -> Four {
    let s = Tensor::from_f32(DType::F32, &shape, scores);
    let sel = block_topk::cpu(
        &block_topk::BlockTopkInputs { scores: &s },
        &BlockTopkAttrs { k },
    )
    .unwrap();
    let pos = Tensor::from_i32(&[shape[0]], positions);
    let route = expand_route::cpu(
        &ExpandRouteInputs {
            block_indices: &sel.block_indices,
            block_count: &sel.block_count,
            positions: &pos,
        },
        r,
    )
    .unwrap();
    [
        sel.block_indices,
        sel.block_count,
        route.token_indices,
        route.token_count,
    ]
}

/// Score rows as the indexer's: finite (ties, NaN, ±0, some -inf holes) on the blocks visible
/// at each row's position, -inf past them.
fn rows(rng: &mut Rng, [t, hs, w]: [usize; 3], positions: &[i32], r: usize) -> Vec<f32> {
    const VALUES: [f32; 8] = [-1.0, 0.0, -0.0, 0.5, 2.0, 1e-45, f32::NAN, 3.5];
    let mut s = Vec::with_capacity(t * hs * w);
    for &p in positions.iter().take(t) {
        let vis = (p.max(0) as usize + 1) / r;
        for _ in 0..hs {
            for c in 0..w {
                s.push(if c >= vis || rng.below(10) == 0 {
                    f32::NEG_INFINITY
                } else if rng.below(2) == 0 {
                    VALUES[rng.below(VALUES.len())]
                } else {
                    rng.below(1 << 20) as f32 / 7.0
                });
            }
        }
    }
    s
}

fn check(ctx: &Context, shape: [usize; 3], k: usize, r: usize, chunk_t: usize, seed: u64) {
    let [t, _, w] = shape;
    let mut rng = Rng::new(seed);
    // Positions whose visible blocks end anywhere in the row: none visible, a few, all.
    let positions: Vec<i32> = (0..t)
        .map(|i| match i % 4 {
            0 => rng.below(r) as i32,
            1 => (w * r - 1 - rng.below(r)) as i32,
            _ => rng.below(w * r) as i32,
        })
        .collect();
    let scores = rows(&mut rng, shape, &positions, r);
    let want = reference(&scores, shape, &positions, k, r);
    let got = fused(ctx, &scores, shape, &positions, k, r, chunk_t).unwrap();
    let what = format!(
        "{shape:?} k={k} r={r} chunks of {chunk_t} rows, kernel {:?}",
        block_topk::pipeline(w as u32, k as u32, ctx.caps.subgroup_size)
    );
    for (i, name) in [
        "block_indices",
        "block_count",
        "token_indices",
        "token_count",
    ]
    .iter()
    .enumerate()
    {
        let (g, x) = (got[i].to_i32(), want[i].to_i32());
        if let Some(j) = (0..g.len()).find(|&j| g[j] != x[j]) {
            panic!(
                "{what}: {name} differs first at element {j}: got {}, want {}",
                g[j], x[j]
            );
        }
    }
}

#[test]
fn fused_route_matches_topk_then_expand() {
    for ctx in [util::ctx(), util::portable_ctx(), util::split_ctx()] {
        // Short rows (row_sg / main), with k > visible blocks in many rows, in chunks.
        for r in [1, 3, 4, 7] {
            check(&ctx, [9, 2, 300], 16, r, 4, 100 + r as u64);
        }
        check(&ctx, [5, 1, 2049], 16, 4, 5, 7);
        check(&ctx, [3, 1, 600], 2048, 2, 2, 8);
        // Wide rows (wide_sg / wide): the sampled threshold, a decode row's geometry.
        check(&ctx, [4, 1, 4096], 64, 4, 3, 9);
        check(&ctx, [1, 1, 32768], 512, 4, 1, 10);
    }
}

#[test]
fn the_kernels_under_test() {
    // The cases above reach both short-row and both wide-row kernels where the adapter has
    // 8-lane subgroups (lavapipe, llvmpipe GL), and the portable ones on the portable context.
    let sg = util::ctx().caps.subgroup_size;
    let names = [(300, 16), (2049, 16), (4096, 64), (32768, 512)]
        .map(|(w, k)| block_topk::pipeline(w, k, sg).1);
    if sg == Some(8) {
        assert_eq!(names, ["row_sg", "row_sg", "wide_sg", "wide_sg"]);
    }
    let portable = [(300, 16), (2049, 16), (4096, 64), (32768, 512)]
        .map(|(w, k)| block_topk::pipeline(w, k, None).1);
    assert_eq!(portable, ["main", "wide", "wide", "wide"]);
}

#[test]
fn negative_position_and_invisible_block_raise_the_flag() {
    let ctx = util::ctx();
    let (k, r) = (4, 4);
    // A negative position: the row gets no tokens, and the step an error.
    let scores = vec![1.0, 2.0, f32::NEG_INFINITY, f32::NEG_INFINITY];
    let e = fused(&ctx, &scores, [1, 1, 4], &[-1], k, r, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("block_topk") && e.contains("token index"), "{e}");
    // Position 9 sees blocks 0 and 1; a finite score at block 2 gets selected and is flagged.
    let scores = vec![1.0, 2.0, 3.0, f32::NEG_INFINITY];
    let e = fused(&ctx, &scores, [1, 1, 4], &[9], k, r, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("block_topk") && e.contains("token index"), "{e}");
    // The same scores at position 11 see all three: no flag, the route as expand_route's.
    let got = fused(&ctx, &scores, [1, 1, 4], &[11], k, r, 1).unwrap();
    assert_eq!(got, reference(&scores, [1, 1, 4], &[11], k, r));
}

#[test]
fn routed_dispatch_checks_its_parameters() {
    let ctx = util::ctx();
    let buf = |name: &str, n: usize| {
        GpuTensor::filled(&ctx, &format!("test.{name}"), DType::I32, &[n], 0).unwrap()
    };
    let (scores, bi, bc) = (buf("scores", 2 * 64), buf("bi", 2 * 4), buf("bc", 2));
    let (pos, ti, tc, fl) = (buf("pos", 1), buf("ti", 2 * 19), buf("tc", 2), buf("fl", 1));
    let good = BlockTopkParams {
        rows: 2,
        w: 64,
        k: 4,
        out_base: 0,
        hs: 2,
        r: 4,
        width: 19,
        _pad: 0,
    };
    let route = || TopkRoute {
        positions: &pos.buffer,
        token_indices: &ti.buffer,
        token_count: &tc.buffer,
        flags: &fl.buffer,
    };
    let run = |p: &BlockTopkParams, rt: Option<TopkRoute>| {
        dispatch_topk(&ctx, p, &scores.buffer, &bi.buffer, &bc.buffer, rt)
            .err()
            .map(|e| e.to_string())
    };
    assert_eq!(run(&good, Some(route())), None);
    let cases: [(BlockTopkParams, bool, &str); 7] = [
        (
            BlockTopkParams {
                r: 65,
                width: 4 * 65 + 64,
                ..good
            },
            true,
            "exceeds 64",
        ),
        (BlockTopkParams { width: 18, ..good }, true, "width"),
        (BlockTopkParams { hs: 3, ..good }, true, "hs"),
        (BlockTopkParams { hs: 0, ..good }, true, "hs"),
        (good, false, "without the route's buffers"),
        (
            BlockTopkParams {
                r: 0,
                width: 0,
                ..good
            },
            true,
            "r >= 1",
        ),
        (
            BlockTopkParams {
                r: 5,
                width: 24,
                ..good
            },
            true,
            "token_indices",
        ),
    ];
    for (p, with_route, needle) in cases {
        let e = run(&p, with_route.then(route)).expect(needle);
        assert!(
            e.contains("block_topk") && e.contains(needle),
            "{needle}: {e}"
        );
    }
    // Without a route, the route's parameters stay zero.
    let plain = BlockTopkParams {
        r: 0,
        hs: 0,
        width: 5,
        ..good
    };
    let e = run(&plain, None).expect("width without a route");
    assert!(e.contains("width"), "{e}");
}

#[test]
fn split_dispatch_checks_its_parameters() {
    let ctx = util::split_ctx();
    let buf = |name: &str, n: usize| {
        GpuTensor::filled(&ctx, &format!("test.{name}"), DType::I32, &[n], 0).unwrap()
    };
    let (w, k) = (4096usize, 64usize);
    let (scores, bi, bc) = (buf("scores", 2 * w), buf("bi", 2 * k), buf("bc", 2));
    let need = block_topk::split_scratch_bytes(2, w as u32) as usize;
    let (good_scratch, small) = (buf("scratch", need / 4), buf("small", need / 8));
    let p = BlockTopkParams {
        rows: 2,
        w: w as u32,
        k: k as u32,
        ..Default::default()
    };
    let run = |p: &BlockTopkParams, sc: &GpuTensor| {
        block_topk::dispatch_topk_split(
            &ctx,
            p,
            &scores.buffer,
            &bi.buffer,
            &bc.buffer,
            None,
            &sc.buffer,
        )
        .err()
        .map(|e| e.to_string())
    };
    assert_eq!(run(&p, &good_scratch), None);
    let e = run(&p, &small).expect("small scratch");
    assert!(
        e.contains("block_topk") && e.contains("split scratch"),
        "{e}"
    );
    let e = run(&BlockTopkParams { k: 512, ..p }, &good_scratch).expect("not wide");
    assert!(e.contains("block_topk") && e.contains("wide rows"), "{e}");
    // The single dispatch's checks hold too.
    let e = run(&BlockTopkParams { rows: 3, ..p }, &good_scratch).expect("3 rows");
    assert!(e.contains("block_topk") && e.contains("scores"), "{e}");
}
