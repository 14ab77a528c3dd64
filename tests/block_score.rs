//! block_score: GPU against the CPU reference over ragged batches, Hs > 1, r = 1 (DSA) with
//! negative weights, key counts that cut visibility, widths that are multiples of nothing; the
//! chunked path equals the direct one; both tilings give identical scores at tile edges.

mod util;

use qsa_wgpu::ops::block_score::{
    cpu, dispatch_score, gpu, gpu_chunked, gpu_tiled, BlockScoreAttrs, BlockScoreInputs,
    BlockScoreParams, ScoreBuffers, Tiling,
};
use qsa_wgpu::testing::{compare, Rng, Tol};
use qsa_wgpu::{DType, Tensor};

struct Problem {
    q: Tensor,
    keys: Tensor,
    offs: Tensor,
    cache: Tensor,
    counts: Option<Tensor>,
    w: Option<Tensor>,
}

impl Problem {
    fn inputs(&self) -> BlockScoreInputs<'_> {
        BlockScoreInputs {
            index_query: &self.q,
            block_keys: &self.keys,
            row_offsets: &self.offs,
            cache_lengths: &self.cache,
            key_counts: self.counts.as_ref(),
            index_weights: self.w.as_ref(),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn problem(
    rng: &mut Rng,
    dt: DType,
    rows: &[usize],
    cached: &[usize],
    hi: usize,
    di: usize,
    w: usize,
    weights: bool,
    counts: bool,
) -> Problem {
    let n = rows.len();
    let t: usize = rows.iter().sum();
    let mut offs = vec![0u32];
    for r in rows {
        offs.push(offs.last().unwrap() + *r as u32);
    }
    Problem {
        q: rng.tensor(dt, &[t, hi, di]),
        keys: rng.tensor(dt, &[n * w, di]),
        offs: Tensor::from_u32(&[n + 1], &offs),
        cache: Tensor::from_u32(&[n], &cached.iter().map(|&c| c as u32).collect::<Vec<_>>()),
        counts: counts.then(|| {
            Tensor::from_i32(
                &[n],
                &(0..n)
                    .map(|i| (cached[i] + rows[i]).saturating_sub(rng.below(9)) as i32)
                    .collect::<Vec<_>>(),
            )
        }),
        w: weights.then(|| rng.tensor(DType::F32, &[t, hi])),
    }
}

const TOL: Tol = Tol {
    abs: 1e-4,
    rel: 1e-4,
};

#[test]
fn gpu_matches_cpu() {
    let ctx = util::ctx();
    let mut rng = Rng::new(31);
    let mut cases = 0;
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for (hi, hs) in [(4, 1), (4, 2), (8, 4), (1, 1)] {
            for r in [1, 3, 4] {
                let n = 1 + rng.below(3);
                let rows: Vec<usize> = (0..n).map(|_| [0, 1, 3, 17][rng.below(4)]).collect();
                let cached: Vec<usize> = (0..n).map(|_| rng.below(200)).collect();
                let need = (0..n).map(|i| (cached[i] + rows[i]) / r).max().unwrap();
                // W both larger and smaller than what the rows can see.
                let w = if rng.below(2) == 0 {
                    need + 1 + rng.below(70)
                } else {
                    (need / 2).max(1)
                };
                let di = [40, 128][rng.below(2)];
                let (weights, counts) = (r == 1 || rng.below(2) == 0, rng.below(2) == 0);
                let p = problem(&mut rng, dt, &rows, &cached, hi, di, w, weights, counts);
                let a = BlockScoreAttrs {
                    ratio: r,
                    num_selection_heads: hs,
                    scale: None,
                };
                let want = cpu(&p.inputs(), &a).unwrap();
                let got = pollster::block_on(gpu(&ctx, &p.inputs(), &a)).unwrap();
                compare(&got, &want, TOL).unwrap_or_else(|e| {
                    panic!("{dt} hi={hi} hs={hs} r={r} rows={rows:?} cached={cached:?} w={w}: {e}")
                });
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 36);
}

#[test]
fn masking_by_hand() {
    // One sequence, cache 5, 2 new rows, r = 2: row 0 at p = 5 sees 3 blocks, row 1 at p = 6
    // sees 3; key_counts 6 caps both at 3; W = 4, so column 3 is −inf everywhere.
    let q = Tensor::from_f32(DType::F32, &[2, 1, 2], &[1.0, 0.0, 0.0, 1.0]);
    let keys = Tensor::from_f32(
        DType::F32,
        &[4, 2],
        &[1.0, 2.0, -1.0, 3.0, 4.0, -5.0, 9.0, 9.0],
    );
    let offs = Tensor::from_u32(&[2], &[0, 2]);
    let cache = Tensor::from_u32(&[1], &[5]);
    let x = BlockScoreInputs {
        index_query: &q,
        block_keys: &keys,
        row_offsets: &offs,
        cache_lengths: &cache,
        key_counts: None,
        index_weights: None,
    };
    let a = BlockScoreAttrs {
        ratio: 2,
        num_selection_heads: 1,
        scale: Some(1.0),
    };
    let ninf = f32::NEG_INFINITY;
    let want = vec![1.0, 0.0, 4.0, ninf, 2.0, 3.0, 0.0, ninf];
    assert_eq!(cpu(&x, &a).unwrap().to_f32(), want);
    assert_eq!(
        pollster::block_on(gpu(&util::ctx(), &x, &a))
            .unwrap()
            .to_f32(),
        want
    );
}

#[test]
fn chunked_equals_direct() {
    let ctx = util::ctx();
    let mut rng = Rng::new(4);
    let p = problem(
        &mut rng,
        DType::BF16,
        &[37, 0, 20],
        &[100, 7, 300],
        4,
        128,
        1757 / 4,
        true,
        false,
    );
    let a = BlockScoreAttrs {
        ratio: 1,
        num_selection_heads: 2,
        scale: None,
    };
    let direct = pollster::block_on(gpu(&ctx, &p.inputs(), &a)).unwrap();
    for chunk in [1, 5, 56] {
        let chunked = pollster::block_on(gpu_chunked(&ctx, &p.inputs(), &a, Some(chunk))).unwrap();
        assert_eq!(chunked, direct, "chunk of {chunk} rows");
    }
    compare(&direct, &cpu(&p.inputs(), &a).unwrap(), TOL).unwrap();
}

#[test]
fn tilings_agree_at_tile_edges() {
    // Row tiles hold 24 rows and block tiles 1024 blocks: rows and widths here are multiples of
    // neither, sequences start mid-tile (one is empty), the early rows of the long-cached
    // sequence leave whole block tiles masked, chunks start mid-tile, and some widths (Di = 36
    // in f16/bf16, Di = 10) take the element-by-element path (always in one-row tiles). Keys
    // and queries read from textures (what the indexer binds) give the same scores bit for bit,
    // with and without the subgroup variant of the row tiles.
    let ctx = util::ctx();
    let mut rng = Rng::new(77);
    let rows = [30, 1, 0, 25, 49];
    let cached = [0, 13, 5, 5000, 2];
    let cases = [
        (DType::F32, 4, 1, 128, 4, false, false),
        (DType::BF16, 4, 2, 128, 4, true, true),
        (DType::F16, 8, 2, 36, 1, true, false),
        (DType::BF16, 6, 3, 36, 4, false, true),
        (DType::F32, 4, 1, 10, 3, true, true),
        (DType::F32, 1, 1, 36, 4, false, false),
    ];
    for (dt, hi, hs, di, r, weights, counts) in cases {
        let w = (5000 + 25) / r + 3;
        let p = problem(&mut rng, dt, &rows, &cached, hi, di, w, weights, counts);
        let a = BlockScoreAttrs {
            ratio: r,
            num_selection_heads: hs,
            scale: None,
        };
        let want = cpu(&p.inputs(), &a).unwrap();
        let run_with = |chunk: Option<usize>, tiling: Tiling, tex: bool| {
            pollster::block_on(gpu_tiled(&ctx, &p.inputs(), &a, chunk, Some(tiling), tex)).unwrap()
        };
        let run = |chunk, tiling| run_with(chunk, tiling, false);
        let rows_tiled = run(None, Tiling::RowTiles);
        compare(&rows_tiled, &want, TOL)
            .unwrap_or_else(|e| panic!("{dt} hi={hi} hs={hs} di={di} r={r} row tiles: {e}"));
        for (chunk, tiling) in [
            (None, Tiling::OneRow),
            (Some(7), Tiling::RowTiles),
            (Some(50), Tiling::RowTiles),
            (Some(13), Tiling::OneRow),
        ] {
            assert_eq!(
                run(chunk, tiling),
                rows_tiled,
                "{dt} hi={hi} hs={hs} di={di} r={r}: {tiling:?} in chunks of {chunk:?} rows"
            );
        }
        // From textures: row tiles take the subgroup variant where subgroups are 8 lanes (f32),
        // so they run on the portable context too.
        let portable = util::portable_ctx();
        for (chunk, tiling) in [
            (None, Tiling::RowTiles),
            (Some(7), Tiling::RowTiles),
            (Some(13), Tiling::OneRow),
        ] {
            assert_eq!(
                run_with(chunk, tiling, true),
                rows_tiled,
                "{dt} hi={hi} hs={hs} di={di} r={r}: queries and keys in textures, {tiling:?} \
                 in chunks of {chunk:?} rows"
            );
            let got = pollster::block_on(gpu_tiled(
                &portable,
                &p.inputs(),
                &a,
                chunk,
                Some(tiling),
                true,
            ))
            .unwrap();
            assert_eq!(
                got, rows_tiled,
                "{dt} hi={hi} hs={hs} di={di} r={r}: textures without subgroups, {tiling:?} \
                 in chunks of {chunk:?} rows"
            );
        }
    }
}

#[test]
fn query_and_key_buffers_must_end_on_a_word() {
    // The shader reads both in 16-byte words; a buffer of 20 bytes (5 f32 keys of one channel,
    // bound by hand rather than through GpuTensor, which pads) is refused before dispatch.
    let ctx = util::ctx();
    let buf = |size: u64| {
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    };
    let (good, odd) = (buf(32), buf(20));
    let prm = BlockScoreParams {
        rows: 1,
        n: 1,
        hi: 1,
        hs: 1,
        di: 1,
        r: 1,
        max_blocks: 5,
        ..Default::default()
    };
    let bufs = |query, keys| ScoreBuffers {
        query,
        keys,
        textures: None,
        row_offsets: &good,
        lens: &good,
        weights: None,
        scores: &good,
        flags: &good,
    };
    assert!(dispatch_score(&ctx, DType::F32, &prm, &bufs(&good, &good)).is_ok());
    for (q, k, name) in [(&odd, &good, "index_query"), (&good, &odd, "block_keys")] {
        let e = dispatch_score(&ctx, DType::F32, &prm, &bufs(q, k))
            .err()
            .unwrap_or_else(|| panic!("a {name} buffer of 20 bytes was accepted"))
            .to_string();
        assert!(e.contains(name) && e.contains("16"), "{e}");
    }
}
