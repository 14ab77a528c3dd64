//! sparse_attention's pass variants on the same problems: where the adapter has fixed-size
//! subgroups (lavapipe) the partial pass is the subgroup variant (32-byte or 16-byte words) and
//! a second context with subgroups disabled runs the tiled pass; the routing stage's subgroup
//! and generic kernels word for word; non-finite scores by hand and a poisoning token through
//! the splits.

mod util;

#[path = "sparse_attention/device.rs"]
mod device;
#[path = "sparse_attention/problem.rs"]
mod problem;

use device::*;
use problem::*;
use qsa_wgpu::gpu::{Context, Readback};
use qsa_wgpu::ops::sparse_attention::{
    cpu, dispatch_attention, gpu, params_kv, plan_attention, route_subgroup_pass,
    subgroup_rows_full, subgroup_slots, subgroup_words, validate, ROUTE, ROUTE_SG, SG_QUADS,
    SUBGROUP_PASS, SUBGROUP_PASS_W32,
};
use qsa_wgpu::paged::PoolLayout;
use qsa_wgpu::testing::{attention_tol, compare, Rng};
use qsa_wgpu::{DType, Tensor};

#[test]
fn subgroup_and_tiled_partial_passes_agree() {
    // The same problems through the subgroup pass (where the adapter has one subgroup size) in
    // 32-byte words (where it has 64-bit integers) and in 16-byte words, and through the tiled
    // pass (subgroups disabled): Qwen's group, 16 heads of E = 64 (four head quads, two quads
    // per lane), values narrower than keys, a padded head quad, sinks, rows on 16 but not 32
    // bytes, rows on neither, odd E.
    let ctx = util::ctx();
    let Some(size) = ctx.caps.subgroup_size else {
        eprintln!(
            "no fixed subgroup size on {}: the tiled pass only",
            ctx.describe()
        );
        return;
    };
    let tiled = util::portable_ctx();
    assert!(tiled.caps.subgroup_size.is_none());
    let narrow = util::narrow_ctx();
    assert!(!narrow.caps.wide_loads);
    let mut rng = Rng::new(0x59);
    let mut nsa = shape(32, 2, 2, 192, 90);
    nsa.ev = 128;
    // How each shape's rows are read by the subgroup pass: (shader, quads per load W) with
    // the context's loads and with 16-byte ones.
    let mut words = Vec::new();
    // And whether every lane's slots lie inside the rows (no load masks), likewise.
    let mut full = Vec::new();
    for (dt, s, sinks) in [
        (DType::F32, shape(24, 2, 1, 256, 2051), false),
        (DType::BF16, shape(24, 2, 1, 256, 600), true),
        (DType::F16, shape(16, 1, 1, 64, 300), false),
        (DType::F32, nsa, true),
        (DType::BF16, shape(12, 2, 1, 72, 130), false),
        (DType::BF16, shape(10, 1, 2, 60, 50), false),
        (DType::F32, shape(8, 8, 1, 37, 130), true),
    ] {
        let d = data(&mut rng, &s, &[(2100, 1), (0, 3), (700, 2)], sinks);
        let order = rng.permutation(pages(&s, &d));
        // NaN wherever no sequence wrote: a load past a row's live channels (the next row of
        // a sequence's last position, a page no sequence uses) would turn an output into NaN.
        let p = problem_in(&mut rng, dt, &s, &d, order, Some(f32::NAN));
        let want = cpu(&p.inputs(), &p.attrs).unwrap();
        // The subgroup context really plans the subgroup pass for this shape.
        let v = validate(&p.inputs(), &p.attrs).unwrap();
        let prm = params_kv(&v.geo, v.e, v.ev).unwrap();
        let plan = plan_attention(&ctx, &prm, prm.num_pages as usize, 1 << 26, 1 << 26).unwrap();
        assert!(
            plan.steps.iter().all(|st| st.params.sg == size),
            "{s:?}: subgroup pass not planned"
        );
        let sp = &plan.steps[0].params;
        let (wide, narrow_w) = (
            subgroup_words(ctx.caps.wide_loads, dt, sp),
            subgroup_words(false, dt, sp),
        );
        full.push((
            subgroup_rows_full(sp, wide.1),
            subgroup_rows_full(sp, narrow_w.1),
        ));
        words.push((wide, narrow_w));
        let mut outs = Vec::new();
        for c in [&ctx, &narrow, &tiled] {
            let got = pollster::block_on(gpu(c, &p.inputs(), &p.attrs)).unwrap();
            compare(&got, &want, attention_tol(dt)).unwrap_or_else(|e| {
                panic!(
                    "{dt} {s:?} sinks={sinks} subgroups={:?} wide loads={}: {e}",
                    c.caps.subgroup_size, c.caps.wide_loads
                )
            });
            outs.push(got);
        }
        // The two word widths change only the order of each dot product's terms.
        compare(&outs[0], &outs[1], attention_tol(dt))
            .unwrap_or_else(|e| panic!("{dt} {s:?}: 32-byte against 16-byte words: {e}"));
    }
    // Every way of reading rows was taken, and only the pipelines they need were built.
    let narrow_words: Vec<u32> = words.iter().map(|w| w.1 .1).collect();
    assert_eq!(
        narrow_words,
        [1, 2, 2, 1, 2, 1, 1],
        "16-byte words: W per shape"
    );
    let wide = words.iter().filter(|w| w.0 .0 == SUBGROUP_PASS_W32).count();
    assert_eq!(wide, if ctx.caps.wide_loads { 4 } else { 0 });
    // Which rows need no load masks depends on the subgroup size (a lane's slots cover
    // 4 · W · SG channels); pinned for llvmpipe's 8 lanes and NVIDIA's 32 (the H200 run).
    let narrow_full: Vec<bool> = full.iter().map(|f| f.1).collect();
    let wide_full: Vec<bool> = full.iter().map(|f| f.0).collect();
    let pinned: Option<([bool; 7], [bool; 7])> = match size {
        8 => Some((
            [true, true, true, true, false, false, false],
            [true, true, false, true, false, false, false],
        )),
        32 => Some((
            [true, true, false, false, false, false, false],
            [true, false, false, false, false, false, false],
        )),
        _ => None,
    };
    if let Some((narrow_pin, wide_pin)) = pinned {
        assert_eq!(
            narrow_full, narrow_pin,
            "{size} lanes, 16-byte words: rows full"
        );
        if ctx.caps.wide_loads {
            assert_eq!(
                wide_full, wide_pin,
                "{size} lanes, 32-byte words: rows full"
            );
        }
    }
    // At any size, some shapes take the masked loads.
    assert!(narrow_full.contains(&false));
    if ctx.caps.wide_loads {
        let wide_w: Vec<u32> = words.iter().map(|w| w.0 .1).collect();
        assert_eq!(wide_w, [2, 4, 4, 2, 2, 1, 1], "32-byte words: W per shape");
    }
    assert_eq!(ctx.cache.built(SUBGROUP_PASS_W32), ctx.caps.wide_loads);
    assert!(ctx.cache.built(SUBGROUP_PASS));
    assert!(!narrow.cache.built(SUBGROUP_PASS_W32));
    assert!(!tiled.cache.built(SUBGROUP_PASS) && !tiled.cache.built(SUBGROUP_PASS_W32));
}

#[test]
fn subgroup_slots_fit_and_cover_every_quad() {
    // The subgroup pass gives lane l's slot j the quad (j / W)·SG·W + l·W + j % W
    // (common/attention_sg.wgsl). For every row width the pass accepts (d ≤ 4·SG_QUADS·SG),
    // every subgroup size it runs at and every word width: at most SG_QUADS slots, in whole
    // words, and every quad of the row held by exactly one (lane, slot).
    for sg in [4u32, 8, 16, 32, 64] {
        for w in [1u32, 2, 4] {
            for d in 1..=4 * SG_QUADS * sg {
                let slots = subgroup_slots(d, sg, w);
                assert!(slots <= SG_QUADS, "sg {sg} w {w} d {d}: {slots} slots");
                assert_eq!(slots % w, 0, "sg {sg} w {w} d {d}: slots in whole words");
                let quads = d.div_ceil(4);
                let mut held = vec![0u32; (slots * sg) as usize];
                for l in 0..sg {
                    for j in 0..slots {
                        let q = (j / w) * sg * w + l * w + j % w;
                        held[q as usize] += 1;
                    }
                }
                assert!(
                    held.iter().all(|&n| n == 1),
                    "sg {sg} w {w} d {d}: a quad twice"
                );
                assert!(quads <= slots * sg, "sg {sg} w {w} d {d}: quads left over");
            }
        }
    }
}

/// Runs only the routing stage of `p` on `ctx`, the pool in shards of `sp` pages, with the
/// device's lists and counts replaced by `lists` (device data past the host checks) and the
/// `seqs` image edited by `edit`: the routes buffer's words and the flag word.
fn route_only(
    ctx: &Context,
    p: &Problem,
    lists: (&Tensor, &Tensor),
    sp: usize,
    edit: fn(&mut Vec<u32>),
) -> (Vec<u32>, u32) {
    let run = Run {
        seqs: Some(edit),
        ..Default::default()
    };
    let u = upload(ctx, p, &run, Some(lists));
    let sh = Shards::new(ctx, p, &u, sp);
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let mut n = 0;
    for (step, d) in dispatch_attention(ctx, u.dt, &sh.plan, &sh.buffers(&u)).unwrap() {
        if step.shader == ROUTE {
            pollster::block_on(qsa_wgpu::ops::common::encode(ctx, &mut enc, d)).unwrap();
            n += 1;
        }
    }
    assert_eq!(n, 1, "one chunk of rows, one routing dispatch");
    pollster::block_on(ctx.submit("test", enc)).unwrap();
    let got = Readback::new(ctx, &[(&sh.routes, sh.routes.size()), (&u.flags.buffer, 4)])
        .blocking(ctx)
        .unwrap();
    let words = got[0]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (words, flag_of(&got[1]))
}

/// The routing stage's subgroup variant (8-lane subgroups, at most 8 pool shards) against the
/// generic kernel (subgroups disabled): the routes buffer word for word and the same flags, over
/// 1, 2, 4, 5 and 8 shards and 9 (which both contexts route with the generic kernel), lists with
/// bad tokens among the counted ones, counts past W and below 0, a page-table entry past the
/// pool, and rows whose lists are full, partial or empty.
#[test]
fn subgroup_and_generic_routes_agree() {
    let ctx = util::ctx();
    if ctx.caps.subgroup_size != Some(8) {
        eprintln!(
            "no 8-lane subgroups on {}: the generic route only",
            ctx.describe()
        );
        return;
    }
    let generic = util::portable_ctx();
    let mut rng = Rng::new(0x2077e);
    let s = shape(4, 1, 2, 32, 300);
    let d = data(&mut rng, &s, &[(700, 3), (0, 2), (300, 1)], false);
    let np = pages(&s, &d);
    let order = rng.permutation(np);
    let p = problem(&mut rng, DType::F32, &s, &d, order);
    // The device's lists: row 0, group 1 full, with bad tokens among the counted ones
    // (negative, past the row's position); row 1 with a count past W, then one below 0; row 3
    // (the second sequence's first row, position 0) with nothing but its own token.
    let w = s.w;
    let (mut tokens, mut counts) = (d.tokens.clone(), d.counts.clone());
    counts[1] = w as i32;
    for (j, bad) in [(0usize, -5i32), (17, 703), (299, i32::MIN)] {
        tokens[w + j] = bad;
    }
    counts[2] = w as i32 + 7;
    counts[3] = -2;
    counts[6] = 1;
    tokens[6 * w] = 0;
    let tokens = Tensor::from_i32(&p.tokens.shape, &tokens);
    let counts = Tensor::from_i32(&p.counts.shape, &counts);
    let none: fn(&mut Vec<u32>) = |_| {};
    // seqs = [row_offsets (4) | cache_lengths (3) | table]: the first sequence's column 5 past
    // the pool.
    let bad_page: fn(&mut Vec<u32>) = |v| v[7 + 5] = 1 << 20;
    let mut variant = Vec::new();
    for (sp, edit) in [
        (np, none),
        (np.div_ceil(2), none),
        (np.div_ceil(4), bad_page),
        (np.div_ceil(5), none),
        (np.div_ceil(8), none),
        (np.div_ceil(8), bad_page),
        (np.div_ceil(9), none),
    ] {
        let shards = np.div_ceil(sp);
        let (want, wf) = route_only(&generic, &p, (&tokens, &counts), sp, edit);
        let (got, gf) = route_only(&ctx, &p, (&tokens, &counts), sp, edit);
        assert_eq!(gf, wf, "{shards} shards: flags");
        assert_ne!(
            wf, 0,
            "the lists hold bad entries: some flag must be raised"
        );
        if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
            panic!(
                "{shards} shards: routes word {i}: got {}, want {}",
                got[i], want[i]
            );
        }
        let v = validate(&p.inputs(), &p.attrs).unwrap();
        let mut prm = params_kv(&v.geo, v.e, v.ev).unwrap();
        prm.shards = shards as u32;
        variant.push(route_subgroup_pass(ctx.caps.subgroup_size, &prm));
    }
    assert_eq!(variant, [true, true, true, true, true, true, false]);
    assert!(ctx.cache.built(ROUTE_SG) && !generic.cache.built(ROUTE_SG));
}

#[test]
fn non_finite_scores_by_hand() {
    // One head, E = 2, scale 1, the list [0, 1] (both tokens of position 1), V0 = (1, 2) and
    // V1 = (3, 4). docs/operators.md: a NaN or +inf score makes the head NaN; a score of -inf
    // weighs 0; with no finite score and no sink the head is 0 (as an empty list), with a sink
    // 0 too (nothing is weighed against it). Through the subgroup pass (where the adapter has
    // one subgroup size) and the tiled pass.
    let (nan, big) = (f32::NAN, 1.0e30);
    #[allow(clippy::type_complexity)]
    let cases: [(&str, [f32; 2], [f32; 4], Option<[f32; 2]>); 4] = [
        ("a NaN key", [1.0, 0.0], [nan, 0.0, 0.0, 5.0], None),
        ("a score of +inf", [big, 0.0], [1.0e10, 0.0, 0.0, 5.0], None),
        (
            "every score -inf",
            [big, 0.0],
            [-1.0e10, 0.0, -1.0e10, 0.0],
            Some([0.0, 0.0]),
        ),
        (
            "one score -inf",
            [big, 0.0],
            [-1.0e10, 0.0, 0.0, 5.0],
            Some([3.0, 4.0]),
        ),
    ];
    let hand = Hand::new([0, 1, -1]);
    let sink = Tensor::from_f32(DType::F32, &[1], &[0.5]);
    let a = Hand::attrs();
    let ctxs = [util::ctx(), util::portable_ctx()];
    for (what, q, k, want) in cases {
        let q = Tensor::from_f32(DType::F32, &[1, 1, 2], &q);
        let pool = Tensor::from_f32(
            DType::F32,
            &[1, 2, 1, 2, 1, 2],
            &[k[0], k[1], k[2], k[3], 1.0, 2.0, 3.0, 4.0],
        );
        for sinks in [None, Some(&sink)] {
            let x = hand.inputs(&q, &pool, sinks);
            let c = cpu(&x, &a).unwrap().to_f32();
            match want {
                None => assert!(c.iter().all(|v| v.is_nan()), "{what}: cpu {c:?}"),
                Some(w) if sinks.is_none() => assert_eq!(c, w, "{what}: cpu"),
                Some(_) => assert!(c.iter().all(|v| v.is_finite()), "{what}: cpu {c:?}"),
            }
            for ctx in &ctxs {
                let g = pollster::block_on(gpu(ctx, &x, &a)).unwrap();
                let cpu_t = cpu(&x, &a).unwrap();
                compare(&g, &cpu_t, attention_tol(DType::F32)).unwrap_or_else(|e| {
                    panic!(
                        "{what}, sink {}, subgroups {:?}: {e}",
                        sinks.is_some(),
                        ctx.caps.subgroup_size
                    )
                });
            }
        }
    }
}

#[test]
fn a_poisoning_token_in_one_split() {
    // A full decode list over several splits and pool shards, one token's key NaN in KV head
    // 0: the heads of KV head 0 are NaN, those of KV head 1 as without it; on the device the
    // NaN travels through that split's record to the combine.
    let mut rng = Rng::new(0x4e);
    let s = shape(12, 2, 1, 64, 600);
    let d = data(&mut rng, &s, &[(2100, 1)], false);
    let order = rng.permutation(pages(&s, &d));
    let mut p = problem(&mut rng, DType::F32, &s, &d, order);
    let tok = d.tokens[300] as usize;
    let layout = PoolLayout::packed(p.pool.shape[0], s.layers, s.page, s.hkv, s.dp());
    let page = p.table.to_i64()[tok / s.page] as usize;
    let at = layout.offset(page, 0, s.layer, tok % s.page, 0) + 5;
    let mut v = p.pool.to_f32();
    v[at] = f32::NAN;
    p.pool = Tensor::from_f32(DType::F32, &p.pool.shape, &v);
    let want = cpu(&p.inputs(), &p.attrs).unwrap();
    let w = want.to_f32();
    let head = |h: usize| &w[h * s.ev..][..s.ev];
    assert!((0..6).all(|h| head(h).iter().all(|x| x.is_nan())));
    assert!((6..12).all(|h| head(h).iter().all(|x| x.is_finite())));
    let runs = [
        Run::default(),
        Run {
            split_len: Some(64),
            ..Default::default()
        },
        Run {
            split_len: Some(128),
            shard_pages: Some(40),
            ..Default::default()
        },
        Run {
            split_len: Some(64),
            ctx: Some(util::portable_ctx()),
            ..Default::default()
        },
    ];
    for (i, run) in runs.iter().enumerate() {
        let (got, flags) = run_device(&p, run);
        assert_eq!(flags, 0);
        compare(&got, &want, attention_tol(DType::F32)).unwrap_or_else(|e| panic!("run {i}: {e}"));
    }
}
