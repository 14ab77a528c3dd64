//! nsa_compress_attention: GPU against the CPU reference for every storage type and both
//! layouts over random geometries (ragged actual_q_len up to 16, causal mask on and off,
//! Dqk ≠ Dv, odd cache-block sizes, several (l, d, l')), the paper geometry at a few thousand
//! raw tokens, G = 1 and G = 128, wide heads, a shuffled block table, BSND padding rows,
//! lengths around the GPU's split and tile sizes, and every stage-2 split; the subgroup variants
//! of the logits and values stages (from buffers and from texture copies) against the portable
//! kernels; a texture copy too small for its buffer refused; the GPU-shaped kernels.

mod util;

use qsa_wgpu::gpu::{Context, ContextOptions};
use qsa_wgpu::ops::nsa_compress_attention::NsaCompressAttentionParams;
use qsa_wgpu::ops::nsa_compress_attention::{
    logits_subgroup_pass, nsel, values_subgroup_pass, Layout, LOGITS_GPU, LOGITS_SG, LOGITS_SG_TEX,
    LOGITS_SG_W32, VALUES_GPU, VALUES_SG, VALUES_SG_TEX, VALUES_SG_W32,
};
use qsa_wgpu::testing::Rng;
use qsa_wgpu::DType;
use util::nsa::{check, check_split, Geo, Problem};

const TND: Layout = Layout::Tnd;
const BSND: Layout = Layout::Bsnd;

/// Raw lengths consistent with c compressed tokens (the windows end inside the sequence),
/// and never shorter than the query step.
fn raw_len(rng: &mut Rng, c: usize, l: usize, d: usize, q: usize) -> usize {
    ((c - 1) * d + l + rng.below(d)).max(q)
}

/// One problem of a table of cases at l = 32, d = 16, l' = 64, k = min(nsel, 16): raw
/// lengths `sel` per batch (empty: (c − 1)·16 + 33 each, every window complete).
struct Case {
    dt: DType,
    layout: Layout,
    heads: (usize, usize),
    dims: (usize, usize),
    page: usize,
    q_len: &'static [usize],
    cmp: &'static [usize],
    sel: &'static [usize],
    causal: bool,
}

/// Runs each case on `ctx` against the CPU.
fn check_cases(ctx: &Context, rng: &mut Rng, cases: &[Case]) {
    for c in cases {
        let min_nsel = c.cmp.iter().map(|&n| nsel(n, 32, 16, 64)).min().unwrap();
        let geo = Geo {
            dt: c.dt,
            layout: c.layout,
            n1: c.heads.0,
            n2: c.heads.1,
            dqk: c.dims.0,
            dv: c.dims.1,
            page: c.page,
            l: 32,
            d: 16,
            lsel: 64,
            k: min_nsel.min(16),
            causal: c.causal,
        };
        let sel: Vec<usize> = if c.sel.is_empty() {
            c.cmp.iter().map(|&n| (n - 1) * 16 + 32 + 1).collect()
        } else {
            c.sel.to_vec()
        };
        let what = format!("{geo:?} q_len={:?} cmp={:?}", c.q_len, c.cmp);
        let p = Problem::new(rng, geo, c.q_len, c.cmp, &sel);
        check(ctx, &p, &what);
    }
}

#[test]
fn gpu_matches_cpu() {
    let ctx = util::ctx();
    let mut rng = Rng::new(814);
    let mut cases = 0;
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for layout in [TND, BSND] {
            for (l, d, lsel) in [(32, 16, 64), (16, 16, 16), (4, 2, 12), (6, 3, 6)] {
                let b = 1 + rng.below(3);
                let q_len: Vec<usize> = (0..b).map(|_| [1, 2, 4, 16][rng.below(4)]).collect();
                let cmp: Vec<usize> = (0..b).map(|_| 1 + rng.below(120)).collect();
                let sel: Vec<usize> = (0..b)
                    .map(|i| raw_len(&mut rng, cmp[i], l, d, q_len[i]))
                    .collect();
                let min_nsel = cmp.iter().map(|&c| nsel(c, l, d, lsel)).min().unwrap();
                let (n2, g) = ([1, 2, 3][rng.below(3)], [1, 2, 5][rng.below(3)]);
                let geo = Geo {
                    dt,
                    layout,
                    n1: n2 * g,
                    n2,
                    dqk: [24, 40][rng.below(2)],
                    dv: [16, 8, 33][rng.below(3)],
                    page: [5, 16, 7][rng.below(3)],
                    l,
                    d,
                    lsel,
                    k: 1 + rng.below(min_nsel),
                    causal: rng.below(2) == 0,
                };
                let what = format!("{geo:?} q_len={q_len:?} cmp={cmp:?} sel={sel:?}");
                let p = Problem::new(&mut rng, geo, &q_len, &cmp, &sel);
                check(&ctx, &p, &what);
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 24);
}

fn paper(dt: DType, layout: Layout) -> Geo {
    Geo {
        dt,
        layout,
        n1: 64,
        n2: 4,
        dqk: 192,
        dv: 128,
        page: 128,
        l: 32,
        d: 16,
        lsel: 64,
        k: 16,
        causal: true,
    }
}

#[test]
fn paper_geometry() {
    // N1 = 64, N2 = 4 (G = 16), Dqk = 192, Dv = 128, l = 32, d = 16, l' = 64, k = 16 over
    // 2,990 and 2,110 raw tokens (185 and 130 compressed tokens, 47 and 33 selection blocks):
    // a decode row and a 4-token step.
    let ctx = util::ctx();
    let mut rng = Rng::new(64);
    let sel = [2990, 2110];
    let cmp: Vec<usize> = sel.iter().map(|&s| (s - 32) / 16 + 1).collect();
    assert_eq!(cmp, [185, 130]);
    for (dt, layout) in [(DType::BF16, TND), (DType::F32, BSND)] {
        let p = Problem::new(&mut rng, paper(dt, layout), &[1, 4], &cmp, &sel);
        let (got, _, _, swaps) = check(&ctx, &p, &format!("paper {dt} {layout:?}"));
        let rows = if layout == TND { 5 } else { 8 };
        assert_eq!(got.topk.numel(), rows * 4 * 16);
        let t = got.topk.to_i32();
        // Every used row starts with the forced blocks 0, nsel − 2, nsel − 1.
        assert_eq!(t[..3], [0, 45, 46]);
        let last_row = if layout == TND { 4 } else { 7 };
        assert_eq!(t[last_row * 64..][..3], [0, 31, 32]);
        eprintln!("paper {dt} {layout:?}: {swaps} near-tie swaps");
    }
}

#[test]
fn group_sizes_and_head_widths() {
    // G = 1, G = 128 (twice), and heads past one channel per invocation: Dv up to the
    // 512 limit (four output channels each), Dqk up to 512.
    let ctx = util::ctx();
    let mut rng = Rng::new(128);
    let shapes = [
        (3, 3, 48, 20),
        (128, 1, 16, 8),
        (256, 2, 8, 12),
        (4, 2, 136, 300),
        (2, 1, 512, 512),
    ];
    for (n1, n2, dqk, dv) in shapes {
        for dt in [DType::F32, DType::BF16] {
            let geo = Geo {
                dt,
                layout: TND,
                n1,
                n2,
                dqk,
                dv,
                page: 16,
                l: 32,
                d: 16,
                lsel: 64,
                k: 5,
                causal: true,
            };
            let cmp = [40, 77];
            let sel = [40 * 16 + 16 + 3, 77 * 16 + 16];
            let p = Problem::new(&mut rng, geo, &[2, 3], &cmp, &sel);
            check(&ctx, &p, &format!("N1={n1} N2={n2} {dt}"));
        }
    }
}

#[test]
fn shuffled_block_table_gives_same_result() {
    let ctx = util::ctx();
    let mut rng = Rng::new(3);
    for layout in [TND, BSND] {
        let mut geo = paper(DType::F16, layout);
        (geo.n1, geo.n2, geo.dqk, geo.dv, geo.page, geo.k) = (8, 2, 32, 24, 6, 4);
        let cmp = [50, 19, 31];
        let sel = [50 * 16 + 16, 19 * 16 + 16, 31 * 16 + 16];
        let mut p = Problem::new(&mut rng, geo, &[3, 1, 4], &cmp, &sel);
        let (first, ..) = check(&ctx, &p, "first placement");
        let table = p.block_table.clone();
        p.place(&mut rng);
        assert_ne!(p.block_table, table, "the permutation should change");
        let (second, ..) = check(&ctx, &p, "second placement");
        assert_eq!(
            first, second,
            "{layout:?}: outputs depend on the block placement"
        );
    }
}

#[test]
fn bsnd_padding_rows_are_zero_and_unselected() {
    let ctx = util::ctx();
    let mut rng = Rng::new(11);
    let mut geo = paper(DType::BF16, BSND);
    (geo.n1, geo.n2, geo.dqk, geo.dv, geo.page, geo.k) = (6, 3, 24, 16, 8, 3);
    geo.causal = false;
    let q_len = [2, 5, 1];
    let p = Problem::with_seq(&mut rng, geo, &q_len, &[20, 33, 11], &[0, 0, 0], 5);
    let (got, want, ..) = check(&ctx, &p, "bsnd padding");
    let (out, topk) = (got.out.to_f32(), got.topk.to_i32());
    assert_eq!(got.out.shape, vec![3, 5, 6, 16]);
    for (b, &q) in q_len.iter().enumerate() {
        for s in 0..5 {
            let r = b * 5 + s;
            let o = &out[r * 6 * 16..][..6 * 16];
            let t = &topk[r * 3 * 3..][..3 * 3];
            if s >= q {
                assert!(
                    o.iter().all(|&v| v == 0.0),
                    "row {r}: padding out must be 0"
                );
                assert!(
                    t.iter().all(|&v| v == -1),
                    "row {r}: padding topk must be -1"
                );
            } else {
                assert!(o.iter().all(|v| v.is_finite() && *v != 0.0), "row {r}");
                assert!(t.iter().all(|&v| v >= 0), "row {r}");
            }
        }
    }
    assert_eq!(got.topk, want.topk);
}

#[test]
fn splits_and_tiles() {
    // The GPU cuts each row's visible compressed tokens into splits (1024 tokens for the
    // logits, 2048 for the values, tiles of 128) and the query heads into chunks of 16:
    // lengths just past and short of those sizes, c = 1, a causal step whose rows see only part
    // of the cache (later splits hold no visible token), G = 1 and G = 128 over several splits,
    // a query staged in two rounds (Dqk = 136), and K/V rows read 16 bytes at a time or not.
    let ctx = util::ctx();
    let mut rng = Rng::new(1025);
    let cases = [
        // c = 1, just past a logits split, just past a values split; G = 4.
        Case {
            dt: DType::F32,
            layout: TND,
            heads: (8, 2),
            dims: (16, 12),
            page: 100,
            q_len: &[2, 1, 3],
            cmp: &[1, 1025, 2049],
            sel: &[0, 0, 0],
            causal: false,
        },
        // G = 128; the two rows of the step see 1500 of 2100 tokens.
        Case {
            dt: DType::BF16,
            layout: TND,
            heads: (128, 1),
            dims: (8, 8),
            page: 128,
            q_len: &[2],
            cmp: &[2100],
            sel: &[1500 * 16 + 31],
            causal: true,
        },
        // G = 1, a 16-token causal step, rows not read 16 bytes at a time.
        Case {
            dt: DType::F16,
            layout: BSND,
            heads: (3, 3),
            dims: (20, 10),
            page: 7,
            q_len: &[16, 3],
            cmp: &[1100, 300],
            sel: &[1100 * 16 + 16, 300 * 16 + 16],
            causal: true,
        },
        // G = 128 in two KV heads, Dqk = 136 staged in two rounds, one token short of a split.
        Case {
            dt: DType::BF16,
            layout: BSND,
            heads: (256, 2),
            dims: (136, 40),
            page: 64,
            q_len: &[1, 2],
            cmp: &[1023, 2047],
            sel: &[0, 0],
            causal: false,
        },
        // Dv = 40 in f32: the last channel tile of the values stage is partial.
        Case {
            dt: DType::F32,
            layout: TND,
            heads: (32, 2),
            dims: (24, 40),
            page: 128,
            q_len: &[1],
            cmp: &[2300],
            sel: &[2300 * 16 + 16],
            causal: true,
        },
    ];
    check_cases(&ctx, &mut rng, &cases);
}

#[test]
fn long_cache() {
    // The paper's group (G = 16, Dqk = 192): the one-pass kernel this replaced was refused on
    // llvmpipe past 896 compressed tokens (its loop limit). The staged kernel bounds each
    // invocation's loops by its splits, so 1024 and 4096 compressed tokens run and match the
    // CPU on every adapter; the modelled bound stays far under the budget.
    use qsa_wgpu::ops::nsa_compress_attention::{loop_iterations, validate};
    use qsa_wgpu::ops::sparse_attention::LLVMPIPE_LOOP_BUDGET;
    let ctx = util::ctx();
    let mut rng = Rng::new(65);
    let mut geo = paper(DType::F32, TND);
    (geo.n1, geo.n2, geo.causal, geo.k) = (16, 1, false, 16);
    for c in [1024, 4096] {
        let p = Problem::new(&mut rng, geo.clone(), &[1], &[c], &[(c - 1) * 16 + 32]);
        let prm = validate(&p.inputs(), &p.attrs()).unwrap().params();
        let iters = loop_iterations(&prm);
        assert!(iters * 10 < LLVMPIPE_LOOP_BUDGET, "c = {c}: {iters}");
        check(&ctx, &p, &format!("c = {c}"));
    }
    // Past about 808K compressed tokens (page 1) the model would refuse on llvmpipe.
    let p = Problem::new(&mut rng, geo.clone(), &[1], &[64], &[63 * 16 + 32]);
    let mut prm = validate(&p.inputs(), &p.attrs()).unwrap().params();
    (prm.c_max, prm.w, prm.page) = (1 << 20, 1 << 18, 1);
    assert!(loop_iterations(&prm) > LLVMPIPE_LOOP_BUDGET);
}

#[test]
fn subgroup_and_portable_kernels_agree() {
    // The logits and values stages' subgroup variants (8-lane subgroups, 16-byte rows; values:
    // Dv of 8 channel tiles) and the portable kernels (subgroups disabled) on the same
    // problems, both against the CPU: the paper's group of 16, a partial head chunk (G = 5, and
    // G = 20: a full chunk and a partial one), Dqk not a multiple of the 32-channel query
    // chunk, Dv = 120 (a last channel tile of 8), every storage type, several splits. Where
    // the adapter has 64-bit integers the variants read rows of a multiple of 32 bytes in
    // 32-byte words: those must give the 16-byte word variants' results bit for bit.
    let ctx = Context::new_blocking(&ContextOptions::default()).unwrap();
    if !logits_subgroup_pass(ctx.caps.subgroup_size, true) {
        eprintln!(
            "no 8-lane subgroups on {}: the portable kernels only",
            ctx.describe()
        );
        return;
    }
    // The variants from buffers, in 32-byte and 16-byte words; the default context reads
    // texture copies of K and V where it reads such copies.
    let wide = util::buffer_ctx();
    let narrow = Context::new_blocking(&ContextOptions {
        disable_textures: true,
        disable_wide_loads: true,
        ..Default::default()
    })
    .unwrap();
    assert!(!narrow.caps.wide_loads && !wide.caps.textures);
    let portable = util::portable_ctx();
    assert!(!logits_subgroup_pass(portable.caps.subgroup_size, true));
    assert!(!values_subgroup_pass(
        portable.caps.subgroup_size,
        true,
        128
    ));
    let mut rng = Rng::new(0x5b);
    let shapes = [
        (DType::F32, 64, 4, 192, 128, [185, 1300]),
        (DType::BF16, 64, 4, 192, 128, [2100, 90]),
        (DType::F16, 10, 2, 40, 16, [300, 33]),
        (DType::F32, 20, 1, 36, 24, [77, 1030]),
        (DType::BF16, 40, 2, 72, 8, [64, 500]),
        (DType::F32, 24, 2, 64, 120, [1500, 70]),
        (DType::BF16, 16, 1, 48, 120, [2300, 40]),
    ];
    let (mut values_variant, mut wide_logits, mut wide_values) = (0, 0, 0);
    for (dt, n1, n2, dqk, dv, cmp) in shapes {
        let geo = Geo {
            dt,
            layout: TND,
            n1,
            n2,
            dqk,
            dv,
            page: 64,
            l: 32,
            d: 16,
            lsel: 64,
            k: 4,
            causal: true,
        };
        assert!(
            (dqk * dt.size()).is_multiple_of(16),
            "{geo:?} must take the logits variant"
        );
        let v16 = (dv * dt.size()).is_multiple_of(16);
        if values_subgroup_pass(ctx.caps.subgroup_size, v16, dv as u32) {
            values_variant += 1;
            wide_values += usize::from((dv * dt.size()).is_multiple_of(32));
        }
        wide_logits += usize::from((dqk * dt.size()).is_multiple_of(32));
        let sel = [cmp[0] * 16 + 16 + 1, cmp[1] * 16 + 16];
        let name = format!("{geo:?} cmp={cmp:?}");
        let p = Problem::new(&mut rng, geo, &[1, 3], &cmp, &sel);
        let mut outs = Vec::new();
        for c in [&ctx, &wide, &narrow, &portable] {
            let what = format!(
                "{name} subgroups={:?} wide={} textures={}",
                c.caps.subgroup_size, c.caps.wide_loads, c.caps.textures
            );
            outs.push(check(c, &p, &what).0);
        }
        for (i, other) in ["32-byte words", "16-byte words"].iter().enumerate() {
            let o = &outs[i + 1];
            assert!(
                outs[0].out.data == o.out.data && outs[0].topk.data == o.topk.data,
                "{name}: the default variants and those reading {other} differ"
            );
        }
    }
    assert_eq!(values_variant, 4, "shapes that take the values variant");
    assert_eq!(
        (wide_logits, wide_values),
        (4, 3),
        "shapes with 32-byte rows"
    );
    for (shader, narrow_shader, tex) in [
        (LOGITS_SG_W32, LOGITS_SG, LOGITS_SG_TEX),
        (VALUES_SG_W32, VALUES_SG, VALUES_SG_TEX),
    ] {
        assert_eq!(wide.cache.built(shader), wide.caps.wide_loads, "{shader}");
        assert!(!narrow.cache.built(shader), "{shader} without wide loads");
        assert!(narrow.cache.built(narrow_shader), "{narrow_shader}");
        // Every shape takes the logits variant, so the default context reads K's copy where
        // it reads copies, and V's where a shape takes the values variant.
        assert_eq!(ctx.cache.built(tex), ctx.caps.textures, "{tex}");
        assert!(
            !wide.cache.built(tex) && !narrow.cache.built(tex),
            "{tex} without textures"
        );
    }
    if !ctx.caps.textures {
        eprintln!("no texture copies on {}", ctx.describe());
    }
    if !ctx.caps.wide_loads {
        eprintln!(
            "no 64-bit integers on {}: 16-byte words only",
            ctx.describe()
        );
    }
}

#[test]
fn stage2_splits_agree() {
    // Every stage-2 split (2048, 4096 and 8192 tokens per values workgroup: a GPU's and a CPU
    // adapter's choices) against the CPU, at lengths just past each split and short of the
    // largest, in f32 and bf16; two query rows of two KV heads. A split the shaders do not
    // take is refused before anything runs, and the adapter's own choice is one that fits.
    use qsa_wgpu::ops::nsa_compress_attention::{
        gpu_with_split, loop_iterations, split2_for, validate, SPLITS2,
    };
    use qsa_wgpu::ops::sparse_attention::LLVMPIPE_LOOP_BUDGET;
    let ctx = util::ctx();
    let mut rng = Rng::new(0x52);
    for (dt, cmp) in [(DType::F32, [2049, 8300]), (DType::BF16, [4097, 7000])] {
        let mut geo = paper(dt, TND);
        (geo.n1, geo.n2, geo.k) = (32, 2, 16);
        let sel: Vec<usize> = cmp.iter().map(|&c| (c - 1) * 16 + 32).collect();
        let p = Problem::new(&mut rng, geo, &[1, 1], &cmp, &sel);
        for split in SPLITS2 {
            check_split(&ctx, &p, &format!("{dt:?} split {split}"), Some(split));
        }
        let prm = validate(&p.inputs(), &p.attrs()).unwrap().params();
        let chosen = split2_for(&ctx, &prm);
        assert!(SPLITS2.contains(&chosen), "{chosen}");
        let fits = |s: u32| {
            let q = NsaCompressAttentionParams { split2: s, ..prm };
            !(ctx.caps.llvmpipe && loop_iterations(&q) > LLVMPIPE_LOOP_BUDGET)
        };
        assert!(fits(chosen), "{chosen}");
        if ctx.info.device_type != wgpu::DeviceType::Cpu {
            assert_eq!(chosen, 2048);
        }
        let err = pollster::block_on(gpu_with_split(&ctx, &p.inputs(), &p.attrs(), Some(1024)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("split2 = 1024"), "{err}");
    }
}

#[test]
fn gpu_shaped_kernels_match_cpu() {
    // The GPU-shaped logits and values kernels (a context that asks for them) against the CPU:
    // every storage type, K rows read 16 bytes at a time and element by element; lengths
    // around their splits (256 tokens a logits workgroup; a values workgroup per part of 2048,
    // 4096 or 8192 tokens) and c = 1; G = 1, 5, 16 and 128 (eight head chunks); Dqk = 136 (two
    // staging rounds); Dv from 8 (64 parts a split) to 300 and 512 (two blocks of 256
    // channels); a causal step whose rows see part of the cache; BSND padding rows; every
    // stage-2 split. The default context never builds them.
    use qsa_wgpu::ops::nsa_compress_attention::{split1_for, SPLIT1, SPLIT1_GPU, SPLITS2};
    let ctx = util::gpu_nsa_ctx();
    assert!(ctx.caps.gpu_nsa, "{}", ctx.describe());
    assert_eq!(split1_for(&ctx), SPLIT1_GPU);
    let mut rng = Rng::new(0x69);
    let cases = [
        // The paper's group; c = 1, just past a logits split, just past a values split.
        Case {
            dt: DType::F32,
            layout: TND,
            heads: (32, 2),
            dims: (192, 128),
            page: 64,
            q_len: &[2, 1, 1],
            cmp: &[1, 257, 2049],
            sel: &[],
            causal: false,
        },
        Case {
            dt: DType::BF16,
            layout: TND,
            heads: (64, 4),
            dims: (192, 128),
            page: 128,
            q_len: &[1],
            cmp: &[1300],
            sel: &[],
            causal: true,
        },
        // G = 128 (eight head chunks), rows that see part of the cache.
        Case {
            dt: DType::BF16,
            layout: TND,
            heads: (128, 1),
            dims: (8, 8),
            page: 128,
            q_len: &[2],
            cmp: &[600],
            sel: &[],
            causal: true,
        },
        // G = 1, f16 rows read element by element (Dqk = 20, Dv = 10), BSND padding.
        Case {
            dt: DType::F16,
            layout: BSND,
            heads: (3, 3),
            dims: (20, 10),
            page: 7,
            q_len: &[16, 3],
            cmp: &[300, 40],
            sel: &[],
            causal: true,
        },
        // Dqk = 136 staged in two rounds, Dv = 300 in two blocks, one token short of a split.
        Case {
            dt: DType::BF16,
            layout: BSND,
            heads: (10, 2),
            dims: (136, 300),
            page: 64,
            q_len: &[1, 2],
            cmp: &[255, 511],
            sel: &[],
            causal: false,
        },
        // f16 rows read 16 bytes at a time (Dqk = 48), a partial head chunk (G = 20).
        Case {
            dt: DType::F16,
            layout: TND,
            heads: (40, 2),
            dims: (48, 120),
            page: 32,
            q_len: &[3],
            cmp: &[520],
            sel: &[],
            causal: true,
        },
        // Dv = 512 (two parts a split), f32 rows read element by element (Dqk = 33).
        Case {
            dt: DType::F32,
            layout: TND,
            heads: (16, 1),
            dims: (33, 512),
            page: 16,
            q_len: &[1],
            cmp: &[700],
            sel: &[],
            causal: true,
        },
    ];
    check_cases(&ctx, &mut rng, &cases);
    // Every stage-2 split, lengths just past each.
    let mut geo = paper(DType::F32, TND);
    (geo.n1, geo.n2, geo.k) = (32, 2, 16);
    let cmp = [2049, 4100];
    let sel: Vec<usize> = cmp.iter().map(|&c| (c - 1) * 16 + 32).collect();
    let p = Problem::new(&mut rng, geo, &[1, 1], &cmp, &sel);
    for split in SPLITS2 {
        check_split(&ctx, &p, &format!("split {split}"), Some(split));
    }
    assert!(ctx.cache.built(LOGITS_GPU) && ctx.cache.built(VALUES_GPU));
    let plain = util::ctx();
    assert!(!plain.caps.gpu_nsa);
    assert_eq!(split1_for(&plain), SPLIT1);
    assert!(!plain.cache.built(LOGITS_GPU) && !plain.cache.built(VALUES_GPU));
}

/// A problem's inputs on the device for a direct `dispatch_nsa_compress_attention` (lengths and
/// flags zero: nothing is run), with the call's tensors.
struct Uploaded {
    t: qsa_wgpu::ops::nsa_compress_attention::NsaAttnTensors,
    up: [qsa_wgpu::gpu::GpuTensor; 6],
}

impl Uploaded {
    fn new(ctx: &Context, p: &Problem, plan: &qsa_wgpu::ops::nsa_compress_attention::Plan) -> Self {
        let up = |t: &qsa_wgpu::Tensor| qsa_wgpu::gpu::GpuTensor::upload(ctx, "t", t).unwrap();
        let t =
            qsa_wgpu::ops::nsa_compress_attention::NsaAttnTensors::new(ctx, plan, false).unwrap();
        let zeros = qsa_wgpu::Tensor::from_u32(&[4], &[0; 4]);
        let flag = qsa_wgpu::Tensor::from_u32(&[1], &[0]);
        let up = [&p.query, &p.key, &p.value, &p.block_table, &zeros, &flag].map(up);
        Uploaded { t, up }
    }

    fn buffers(&self) -> qsa_wgpu::ops::nsa_compress_attention::NsaAttnBuffers<'_> {
        let b = |i: usize| &self.up[i].buffer;
        self.t.buffers(b(0), b(1), b(2), b(3), b(4), b(5))
    }
}

#[test]
fn a_split1_the_kernels_do_not_take_is_refused() {
    // Parameters made for one context's logits kernel, recorded on the other's: refused before
    // anything runs, naming the split.
    use qsa_wgpu::ops::nsa_compress_attention::{
        dispatch_nsa_compress_attention, validate, SPLIT1, SPLIT1_GPU,
    };
    let mut rng = Rng::new(0x6a);
    let mut geo = paper(DType::F32, TND);
    (geo.n1, geo.n2, geo.k) = (16, 1, 4);
    let p = Problem::new(&mut rng, geo, &[1], &[300], &[299 * 16 + 32]);
    for (ctx, wrong) in [(util::ctx(), SPLIT1_GPU), (util::gpu_nsa_ctx(), SPLIT1)] {
        let plan = validate(&p.inputs(), &p.attrs()).unwrap();
        let mut prm = plan.params().for_adapter(&ctx);
        prm.split1 = wrong;
        let u = Uploaded::new(&ctx, &p, &plan);
        let b = u.buffers();
        let sel = prm.topk_params();
        let err = match dispatch_nsa_compress_attention(&ctx, plan.dt, &prm, &sel, &b) {
            Ok(_) => panic!("split1 = {wrong} was taken"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains(&format!("split1 = {wrong}")) && err.contains("nsa_compress_attention"),
            "{err}"
        );
    }
}

#[test]
fn a_texture_copy_smaller_than_its_buffer_is_refused() {
    // A copy of K that holds fewer words than the K buffer (a caller that sized it for another
    // cache): refused before anything is recorded, naming the input and both sizes.
    use qsa_wgpu::gpu::WordTexture;
    use qsa_wgpu::ops::nsa_compress_attention::{
        dispatch_nsa_compress_attention, texture_stages, validate,
    };
    let ctx = util::ctx();
    let geo = paper(DType::F32, TND);
    if !texture_stages(&ctx, geo.dt, geo.dqk, geo.dv).0 {
        eprintln!(
            "{}: the logits stage reads no texture copies here",
            ctx.describe()
        );
        return;
    }
    let mut rng = Rng::new(0x6b);
    let p = Problem::new(&mut rng, geo, &[1], &[300], &[299 * 16 + 32]);
    let plan = validate(&p.inputs(), &p.attrs()).unwrap();
    let prm = plan.params().for_adapter(&ctx);
    let u = Uploaded::new(&ctx, &p, &plan);
    let key_bytes = u.up[1].buffer.size();
    let small = WordTexture::new(&ctx, "small", key_bytes - 16).unwrap();
    let whole = WordTexture::new(&ctx, "whole", key_bytes).unwrap();
    let sel = prm.topk_params();
    for (tex, ok) in [(&small, false), (&whole, true)] {
        let b = u.buffers().with_textures(Some(tex), None);
        match dispatch_nsa_compress_attention(&ctx, plan.dt, &prm, &sel, &b) {
            Ok(d) => {
                assert!(ok, "a copy of {} words was taken", tex.words());
                assert_eq!(d[0].1.key.shader, LOGITS_SG_TEX);
                assert_eq!(d[0].1.textures.len(), 1);
            }
            Err(e) => {
                let e = e.to_string();
                assert!(!ok, "{e}");
                let need = key_bytes.to_string();
                assert!(e.contains("key_tex") && e.contains(&need), "{e}");
            }
        }
    }
}
