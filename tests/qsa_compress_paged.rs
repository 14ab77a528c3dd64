//! qsa_compress_paged: GPU against the CPU reference over shuffled page tables whose unused
//! pages hold garbage, both modes, rope and norm on and off; and the device-side flags.

mod util;

use qsa_wgpu::ops::qsa_compress_paged::{
    cpu, gpu, CompressMode, QsaCompressAttrs, QsaCompressInputs,
};
use qsa_wgpu::paged::{PagedPool, PoolLayout};
use qsa_wgpu::testing::{compare, transform_tol, Rng};
use qsa_wgpu::{DType, Tensor};

struct Problem {
    pool: Tensor,
    table: Tensor,
    cache: Tensor,
    counts: Tensor,
    gamma: Option<Tensor>,
    freqs: Option<Tensor>,
    keys: Tensor,
}

impl Problem {
    fn inputs(&self) -> QsaCompressInputs<'_> {
        QsaCompressInputs {
            kv_blocks: &self.pool,
            page_table: &self.table,
            cache_lengths: &self.cache,
            key_counts: &self.counts,
            gamma: self.gamma.as_ref(),
            freqs_cis: self.freqs.as_ref(),
            block_keys: &self.keys,
        }
    }
}

/// Sequences of `counts` keys, `cached` of them before the step, in a pool of `layers` layers
/// whose pages are handed out shuffled; every page starts as garbage.
#[allow(clippy::too_many_arguments)]
fn problem(
    rng: &mut Rng,
    dt: DType,
    cached: &[usize],
    counts: &[usize],
    di: usize,
    dr: usize,
    norm: bool,
    r: usize,
    page: usize,
    layers: usize,
    layer: usize,
) -> Problem {
    let n = counts.len();
    let pages: usize = counts.iter().map(|c| c.div_ceil(page)).sum::<usize>() + 3;
    let layout = PoolLayout::packed(pages, layers, page, 1, di);
    let mut pool = PagedPool::new(layout, dt, rng.permutation(pages));
    pool.data = rng.tensor(dt, &[layout.required_elems()]);
    let mut seqs = Vec::new();
    for &c in counts {
        let s = pool.add_sequence();
        let keys = rng.normals(c * di);
        pool.append(s, 0, layer, &keys).unwrap();
        pool.commit(s, c);
        seqs.push(s);
    }
    let max_pages = counts.iter().map(|c| c.div_ceil(page)).max().unwrap() + 2;
    let max_blocks = counts.iter().map(|c| c / r).max().unwrap() + 1;
    let positions = counts.iter().max().unwrap() + 5;
    Problem {
        pool: pool.tensor(),
        table: pool.page_table(&seqs, max_pages, 0xdead_beef),
        cache: Tensor::from_u32(&[n], &cached.iter().map(|&v| v as u32).collect::<Vec<_>>()),
        counts: Tensor::from_i32(&[n], &counts.iter().map(|&v| v as i32).collect::<Vec<_>>()),
        gamma: norm.then(|| rng.tensor(dt, &[di])),
        freqs: (dr > 0).then(|| rng.tensor(dt, &[positions, dr])),
        keys: rng.tensor(dt, &[n * max_blocks, di]),
    }
}

#[test]
fn gpu_matches_cpu() {
    let ctx = util::ctx();
    let mut rng = Rng::new(21);
    let mut cases = 0;
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for (di, dr) in [(40, 0), (72, 32), (128, 64)] {
            for mode in [CompressMode::Incremental, CompressMode::Full] {
                for step in [1, 3, 17, 130] {
                    let r = [2, 4, 4, 5][rng.below(4)];
                    let n = 1 + rng.below(3);
                    let cached: Vec<usize> = (0..n).map(|_| rng.below(300)).collect();
                    let counts: Vec<usize> = cached.iter().map(|c| c + step).collect();
                    let norm = rng.below(3) != 0;
                    let (layers, layer) = (2, rng.below(2));
                    let page = [16, 7, 128][rng.below(3)];
                    let p = problem(
                        &mut rng, dt, &cached, &counts, di, dr, norm, r, page, layers, layer,
                    );
                    let a = QsaCompressAttrs {
                        ratio: r,
                        rotary_dim: (dr > 0).then_some(dr),
                        epsilon: 1e-6,
                        norm_weight_offset: rng.below(2) as f32,
                        layer_idx: layer,
                        page_stride: None,
                        mode,
                    };
                    let want = cpu(&p.inputs(), &a).unwrap();
                    let got = pollster::block_on(gpu(&ctx, &p.inputs(), &a)).unwrap();
                    compare(&got, &want, transform_tol(dt)).unwrap_or_else(|e| {
                        panic!("{dt} di={di} dr={dr} {mode:?} step={step} r={r} page={page}: {e}")
                    });
                    // Rows outside the written range keep their exact input bits.
                    let es = dt.size();
                    let max_blocks = p.keys.shape[0] / n;
                    for s in 0..n {
                        let first = if mode == CompressMode::Full {
                            0
                        } else {
                            cached[s] / r
                        };
                        let untouched =
                            (s * max_blocks + counts[s] / r).max(s * max_blocks + first);
                        let lo = untouched * di * es;
                        let hi = (s + 1) * max_blocks * di * es;
                        assert_eq!(
                            got.data[lo..hi],
                            p.keys.data[lo..hi],
                            "rows past the last block were changed"
                        );
                    }
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, 72);
}

#[test]
fn large_ratios() {
    // Ratios past one row per invocation of the workgroup (64) up to the largest (512): the
    // block's rows are resolved in several rounds. Pages shorter and longer than a block.
    let ctx = util::ctx();
    let mut rng = Rng::new(0x52);
    for (dt, r, page, di, dr) in [
        (DType::F32, 64, 32, 40, 16),
        (DType::F32, 65, 100, 72, 0),
        (DType::BF16, 200, 64, 128, 64),
        (DType::F16, 512, 512, 40, 8),
        (DType::F32, 512, 48, 24, 0),
    ] {
        for mode in [CompressMode::Incremental, CompressMode::Full] {
            let cached = [rng.below(3 * r), 0];
            let counts = [cached[0] + r + rng.below(2 * r), 2 * r + 1];
            let p = problem(&mut rng, dt, &cached, &counts, di, dr, true, r, page, 1, 0);
            let a = QsaCompressAttrs {
                ratio: r,
                rotary_dim: (dr > 0).then_some(dr),
                epsilon: 1e-6,
                norm_weight_offset: 1.0,
                layer_idx: 0,
                page_stride: None,
                mode,
            };
            let want = cpu(&p.inputs(), &a).unwrap();
            let got = pollster::block_on(gpu(&ctx, &p.inputs(), &a)).unwrap();
            compare(&got, &want, transform_tol(dt))
                .unwrap_or_else(|e| panic!("{dt} r={r} page={page} {mode:?}: {e}"));
        }
    }
}

#[test]
fn page_stride_and_layers() {
    let ctx = util::ctx();
    let mut rng = Rng::new(3);
    let (di, page, layers, r) = (40, 8, 3, 4);
    let packed = 2 * layers * page * di;
    // 6 packed pages' worth of elements read with a stride of two packed pages: 3 pages.
    let pool = rng.tensor(DType::F32, &[6, 2, layers, page, 1, di]);
    let table = Tensor::from_u32(&[1, 3], &[2, 0, 1]);
    let p = Problem {
        pool,
        table,
        cache: Tensor::from_u32(&[1], &[0]),
        counts: Tensor::from_i32(&[1], &[23]),
        gamma: None,
        freqs: None,
        keys: rng.tensor(DType::F32, &[6, di]),
    };
    let a = QsaCompressAttrs {
        ratio: r,
        rotary_dim: None,
        epsilon: 1e-6,
        norm_weight_offset: 0.0,
        layer_idx: 2,
        page_stride: Some(2 * packed as i64),
        mode: CompressMode::Incremental,
    };
    let want = cpu(&p.inputs(), &a).unwrap();
    // Block 0 by hand: mean of positions 0..4 of page 2, layer 2, plane K.
    let pool = p.pool.to_f32();
    let base = 2 * 2 * packed + (2 * page) * di;
    let expect0: Vec<f32> = (0..di)
        .map(|c| (0..4).map(|j| pool[base + j * di + c]).sum::<f32>() / 4.0)
        .collect();
    assert_eq!(&want.to_f32()[..di], &expect0[..]);
    let got = pollster::block_on(gpu(&ctx, &p.inputs(), &a)).unwrap();
    compare(&got, &want, transform_tol(DType::F32)).unwrap();
    // Page 3 would be past the 3 pages the strided pool holds.
    let bad = Tensor::from_u32(&[1, 3], &[3, 0, 1]);
    let p2 = Problem { table: bad, ..p };
    let e = cpu(&p2.inputs(), &a).unwrap_err().to_string();
    assert!(
        e.contains("qsa_compress_paged") && e.contains("page_table") && e.contains("page 3"),
        "{e}"
    );
}

/// Page-table entries and lengths are device data in a decode loop: a bad entry must be
/// clamped in the shader and reported through the flag word, never read out of bounds.
#[test]
fn device_side_bad_values_are_flagged() {
    use qsa_wgpu::gpu::{GpuTensor, Readback};
    use qsa_wgpu::ops::common::check_flags;
    use qsa_wgpu::ops::qsa_compress_paged::{encode_compress, params, validate, CompressBuffers};
    let ctx = util::ctx();
    let mut rng = Rng::new(8);
    let p = problem(&mut rng, DType::F32, &[0], &[40], 40, 0, false, 4, 16, 1, 0);
    let a = QsaCompressAttrs {
        ratio: 4,
        rotary_dim: None,
        epsilon: 1e-6,
        norm_weight_offset: 0.0,
        layer_idx: 0,
        page_stride: None,
        mode: CompressMode::Full,
    };
    let plan = validate(&p.inputs(), &a).unwrap();
    let prm = params(&plan, &a, false);
    let run = |table: Vec<u32>, lens: Vec<u32>| -> (u32, Tensor) {
        let up = |t: &Tensor| GpuTensor::upload(&ctx, "t", t).unwrap();
        let pool = up(&p.pool);
        let table = up(&Tensor::from_u32(&[table.len()], &table));
        let lens = up(&Tensor::from_u32(&[lens.len()], &lens));
        let keys = up(&p.keys);
        let flags = up(&Tensor::from_u32(&[1], &[0]));
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        let b = CompressBuffers {
            pool: &pool.buffer,
            page_table: &table.buffer,
            lens: &lens.buffer,
            gamma: None,
            freqs: None,
            block_keys: &keys.buffer,
            flags: &flags.buffer,
        };
        pollster::block_on(encode_compress(&ctx, &mut enc, DType::F32, &prm, &b)).unwrap();
        pollster::block_on(ctx.submit("test", enc)).unwrap();
        let got = Readback::new(&ctx, &[(&keys.buffer, keys.bytes()), (&flags.buffer, 4)])
            .blocking(&ctx)
            .unwrap();
        (
            u32::from_le_bytes(got[1][..4].try_into().unwrap()),
            Tensor::from_bytes(DType::F32, &p.keys.shape, got[0].clone()).unwrap(),
        )
    };
    let good = plan.table.clone();
    let (f, _) = run(good.clone(), vec![0, 40]);
    assert_eq!(f, 0);
    let mut bad = good.clone();
    bad[1] = 1_000_000;
    let (f, keys) = run(bad, vec![0, 40]);
    assert_eq!(f & 8, 8, "page >= num_pages must raise FLAG_PAGE");
    // Blocks of the bad page (positions 16..32 → blocks 4..8) are skipped, not garbage.
    assert_eq!(
        keys.data[4 * 40 * 4..8 * 40 * 4],
        p.keys.data[4 * 40 * 4..8 * 40 * 4]
    );
    let e = check_flags("qsa_compress_paged", f)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("qsa_compress_paged") && e.contains("page-table entry"),
        "{e}"
    );
    let (f, _) = run(good.clone(), vec![10, 5]);
    assert_eq!(
        f & 1,
        1,
        "key_counts < cache_lengths must raise FLAG_LENGTHS"
    );
    let (f, _) = run(good, vec![0, 4000]);
    assert_ne!(f & (2 | 4), 0, "lengths past the buffers must be flagged");
}
