//! nsa_compress_attention on hand-built cases, each checked on the CPU reference and the GPU:
//! Ascend's score mapping on a hand example, round_T(P) before V, the forced blocks for
//! nsel = 1, 2, 3, 5, the causal mask for each token of a 4-token step, a query that sees no
//! compressed token, the selection comparator itself, and the device-side flags (also for
//! entries that only a later split, or no visible token, reads).

mod util;

use qsa_wgpu::gpu::GpuTensor;
use qsa_wgpu::ops::common::{flag_word, read_checked};
use qsa_wgpu::ops::nsa_compress_attention::{
    encode_nsa_compress_attention, validate, Layout, NsaAttnTensors, Plan,
};
use qsa_wgpu::testing::{compare_selection, Tol};
use qsa_wgpu::{testing::Rng, DType, Error, Tensor};
use util::nsa::{check, Geo, Problem};

fn tiny(dt: DType, n1: usize, n2: usize, k: usize, causal: bool) -> Geo {
    Geo {
        dt,
        layout: Layout::Tnd,
        n1,
        n2,
        dqk: 1,
        dv: 1,
        page: 8,
        l: 32,
        d: 16,
        lsel: 64,
        k,
        causal,
    }
}

/// One head, Dqk = Dv = 1, q = 1, scale 1: x_j = K_j, so K_j = ln w_j gives P_j = w_j / Σ w.
fn weighted(dt: DType, w: &[f32], v: &[f32], k: usize) -> Problem {
    let mut p = Problem::new(
        &mut Rng::new(0),
        tiny(dt, 1, 1, k, false),
        &[1],
        &[w.len()],
        &[0],
    );
    p.keys[0] = w.iter().map(|x| x.ln()).collect();
    p.values[0] = v.to_vec();
    p.query = Tensor::from_f32(dt, &[1, 1, 1], &[1.0]);
    p.scale = Some(1.0);
    p.place(&mut Rng::new(1));
    p
}

#[test]
fn ascend_mapping_by_hand() {
    // l = 32, d = 16, l' = 64: S' = 4, N' = 2, so
    // score[o] = P[4o+4] + 2 (P[4o+3] + P[4o+2] + P[4o+1]) + P[4o]:
    // block o takes compressed token 4(o+1), whose window starts at raw 64(o+1), inside the
    // next selection block: Ascend's mapping is one compressed block ahead of the overlap.
    // 20 tokens: w = 1, except w4 = 1000 (blocks 0 and 1) and w13 = 50 (block 3, twice).
    let mut w = vec![1f32; 20];
    (w[4], w[13]) = (1000.0, 50.0);
    let v: Vec<f32> = (0..20).map(|j| j as f32).collect();
    let p = weighted(DType::F32, &w, &v, 6);
    let (got, want, scores, _) = check(&util::ctx(), &p, "hand mapping");
    let s = 1068.0;
    // nsel = ceil((19·16 + 32) / 64) = 6; blocks 0, 4, 5 are forced.
    let hand = [
        f32::INFINITY,
        1007.0 / s,
        8.0 / s,
        106.0 / s,
        f32::INFINITY,
        f32::INFINITY,
    ];
    for (o, (&a, &b)) in scores.iter().zip(&hand).enumerate() {
        assert!(a == b || (a - b).abs() < 1e-6, "block {o}: {a} vs {b}");
    }
    assert_eq!(want.topk.to_i32(), [0, 4, 5, 1, 3, 2]);
    assert_eq!(got.topk.to_i32(), [0, 4, 5, 1, 3, 2]);
    // out = Σ_j P_j · j = (190 + 999·4 + 49·13) / 1068.
    for o in [&got.out, &want.out] {
        let o = o.to_f32()[0];
        assert!((o - 4823.0 / s).abs() < 1e-5, "{o}");
    }
}

#[test]
fn probabilities_are_rounded_to_t_before_v() {
    // Two tokens with x = (0.00601196…, 0): P = (0.501503, 0.498497), which bf16 rounds to
    // (0.5, 0.498046875). With V = (1, −1) the output is 2^-9 = 0.001953125 exactly; without
    // the rounding it would be 0.003006.
    let mut p = weighted(DType::BF16, &[1.0, 1.0], &[1.0, -1.0], 1);
    p.keys[0] = vec![DType::BF16.round(0.006), 0.0];
    p.place(&mut Rng::new(2));
    let (got, want, ..) = check(&util::ctx(), &p, "round_T(P)");
    assert_eq!(want.out.to_f32(), [0.001953125]);
    assert_eq!(got.out.to_f32(), [0.001953125]);
}

#[test]
fn forced_blocks_for_small_and_large_nsel() {
    // (compressed tokens, nsel, k, expected selection or its start)
    let cases: [(usize, usize, usize, &[i32]); 6] = [
        (1, 1, 1, &[0]),
        (3, 1, 1, &[0]),
        (4, 2, 2, &[0, 1]),
        (4, 2, 1, &[0]),
        (8, 3, 3, &[0, 1, 2]),
        (17, 5, 3, &[0, 3, 4]),
    ];
    let ctx = util::ctx();
    let mut rng = Rng::new(17);
    for (c, nsel, k, start) in cases {
        let mut geo = tiny(DType::F32, 4, 2, k, false);
        (geo.dqk, geo.dv) = (8, 8);
        let p = Problem::new(&mut rng, geo, &[2], &[c], &[0]);
        assert_eq!(validate(&p.inputs(), &p.attrs()).unwrap().nsel, [nsel]);
        let (got, ..) = check(&ctx, &p, &format!("c = {c}"));
        for row in got.topk.to_i32().chunks(k) {
            assert_eq!(
                &row[..start.len()],
                start,
                "c = {c}, nsel = {nsel}, k = {k}"
            );
        }
    }
}

#[test]
fn causal_mask_for_each_token_of_a_4_token_step() {
    // L = 641 raw tokens, c = 39 compressed (window j covers raw 16j … 16j + 31), a 4-token
    // step at p = 637 … 640: window 38 (raw 608 … 639) is hidden from the first two tokens.
    // Each token must equal a mask-free call that holds just the compressed tokens it sees.
    let ctx = util::ctx();
    let mut rng = Rng::new(44);
    let mut geo = tiny(DType::F16, 6, 2, 4, true);
    (geo.dqk, geo.dv, geo.page) = (16, 12, 5);
    let main = Problem::new(
        &mut rng,
        geo.clone(),
        &[4, 1],
        &[39, 20],
        &[641, 20 * 16 + 16],
    );
    let plan = validate(&main.inputs(), &main.attrs()).unwrap();
    let vis: Vec<usize> = (0..4).map(|s| plan.visible(0, s)).collect();
    assert_eq!(vis, [38, 38, 39, 39]);
    let (full, ..) = check(&ctx, &main, "causal step");
    let (out, topk) = (full.out.to_f32(), full.topk.to_i32());
    geo.causal = false;
    for (s, &c) in vis.iter().enumerate() {
        let mut one = Problem::new(&mut rng, geo.clone(), &[1], &[c], &[0]);
        one.query = Tensor::from_f32(
            DType::F16,
            &[1, 6, 16],
            &main.query.to_f32()[s * 96..][..96],
        );
        one.keys[0] = main.keys[0][..c * 32].to_vec();
        one.values[0] = main.values[0][..c * 24].to_vec();
        one.place(&mut rng);
        let (alone, ..) = check(&ctx, &one, &format!("token {s} alone"));
        assert_eq!(alone.out.to_f32(), out[s * 72..][..72], "out of token {s}");
        assert_eq!(alone.topk.to_i32(), topk[s * 8..][..8], "topk of token {s}");
    }
}

#[test]
fn a_query_that_sees_nothing() {
    // p = 0 and 1 < l − 1: no compressed token is visible. The output is 0; every selection
    // score is 0, so the selection is the forced blocks, then the lowest indices.
    let ctx = util::ctx();
    let mut rng = Rng::new(8);
    let mut geo = tiny(DType::BF16, 4, 1, 5, true);
    (geo.dqk, geo.dv) = (8, 8);
    let p = Problem::new(&mut rng, geo, &[2], &[40], &[2]);
    let (got, ..) = check(&ctx, &p, "sees nothing");
    assert!(got.out.to_f32().iter().all(|&v| v == 0.0));
    assert_eq!(got.topk.to_i32(), [0, 9, 10, 1, 2, 0, 9, 10, 1, 2]);
}

#[test]
fn selection_comparator_rejects_real_differences() {
    let inf = f32::INFINITY;
    let scores = [inf, 5.0, 1.0, 0.9999999, 3.0, inf, 0.2, 0.1, 0.3, 0.0];
    let want = Tensor::from_i32(&[2, 4], &[0, 1, 4, 2, 0, 3, 1, -1]);
    let tol = Tol {
        abs: 1e-6,
        rel: 1e-5,
    };
    let cmp = |g: &[i32]| compare_selection(&Tensor::from_i32(&[2, 4], g), &want, &scores, 5, tol);
    assert_eq!(cmp(&[0, 1, 4, 2, 0, 3, 1, -1]), Ok(0));
    assert_eq!(
        cmp(&[0, 1, 4, 3, 0, 3, 1, -1]),
        Ok(1),
        "a near tie may flip"
    );
    for bad in [
        [0, 4, 1, 2, 0, 3, 1, -1],  // 5.0 and 3.0 swapped
        [1, 0, 4, 2, 0, 3, 1, -1],  // a forced block out of place
        [0, 1, 4, 4, 0, 3, 1, -1],  // repeated
        [0, 1, 4, -1, 0, 3, 1, -1], // a slot left unused
        [0, 1, 4, 2, 0, 3, 1, 2],   // padding filled
        [0, 1, 4, 7, 0, 3, 1, -1],  // out of range
        [0, 1, 4, 2, 0, 1, 3, -1],  // 0.3 and 0.2 swapped
    ] {
        assert!(cmp(&bad).is_err(), "{bad:?} must be rejected");
    }
}

#[test]
fn device_values_out_of_range_raise_flags() {
    // Through the encode API the lengths and the block table are device buffers: a block past
    // the cache or a length past the plan's maxima skips the row and raises a flag.
    let mut rng = Rng::new(23);
    let mut geo = tiny(DType::F32, 2, 1, 2, true);
    (geo.dqk, geo.dv) = (8, 4);
    let p = Problem::new(&mut rng, geo, &[2], &[30], &[30 * 16 + 16]);
    let plan = validate(&p.inputs(), &p.attrs()).unwrap();
    let table = plan.table_words();
    let mut bad_table = table.clone();
    bad_table[1] = plan.num_blocks as u32;
    let mut bad_lens = plan.lens();
    bad_lens[1] = plan.c_max as u32 + 1;
    expect_flags(
        &p,
        &plan,
        DType::F32,
        vec![
            (table.clone(), plan.lens(), None),
            (bad_table, plan.lens(), Some("page-table entry")),
            (table, bad_lens, Some("NSA")),
        ],
    );
}

/// Runs `plan` through the encode API once per (block table, lengths) case, over zeroed
/// device buffers, and checks that each succeeds (`None`) or raises a flag whose message holds
/// the needle.
fn expect_flags(
    p: &Problem,
    plan: &Plan,
    dt: DType,
    cases: Vec<(Vec<u32>, Vec<u32>, Option<&str>)>,
) {
    let ctx = util::ctx();
    let up = |t: &Tensor| GpuTensor::upload(&ctx, "test", t).unwrap();
    let u32s = |v: &[u32]| up(&Tensor::from_u32(&[v.len()], v));
    let (q, k, v) = (up(&p.query), up(&p.key), up(&p.value));
    let t = NsaAttnTensors::new(&ctx, plan, false).unwrap();
    for (tab, lens, needle) in cases {
        let (tab, lens, flags) = (u32s(&tab), u32s(&lens), flag_word(&ctx).unwrap());
        let bufs = t.buffers(
            &q.buffer,
            &k.buffer,
            &v.buffer,
            &tab.buffer,
            &lens.buffer,
            &flags.buffer,
        );
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        pollster::block_on(encode_nsa_compress_attention(
            &ctx,
            &mut enc,
            dt,
            &plan.params(),
            &bufs,
        ))
        .unwrap();
        pollster::block_on(ctx.submit("test", enc)).unwrap();
        let got = pollster::block_on(read_checked(
            &ctx,
            "nsa_compress_attention",
            &[&t.out],
            &flags,
        ));
        match (needle, got) {
            (None, Ok(_)) => {}
            (Some(n), Err(Error::Device { msg, .. })) => assert!(msg.contains(n), "{msg}"),
            (n, other) => panic!("expected {n:?}, got {other:?}"),
        }
    }
}

#[test]
fn bad_entries_past_the_first_split_raise_flags() {
    // The GPU works in splits of the compressed tokens; a bad block-table entry that only a
    // later split reads (token 2600 of 3000), or that no visible token reads (the causal rows
    // see 2000 tokens), must still raise the page flag, as must a length past the plan's.
    let mut rng = Rng::new(2600);
    let mut geo = tiny(DType::BF16, 4, 2, 4, true);
    (geo.dqk, geo.dv, geo.page) = (16, 8, 128);
    let p = Problem::new(&mut rng, geo, &[2], &[3000], &[2000 * 16 + 16]);
    let plan = validate(&p.inputs(), &p.attrs()).unwrap();
    assert_eq!(plan.visible(0, 1), 2000);
    let table = plan.table_words();
    let with_entry = |col: usize| {
        let mut t = table.clone();
        t[col] = plan.num_blocks as u32 + 5;
        t
    };
    let mut long = plan.lens();
    long[1] = plan.c_max as u32 + 3;
    expect_flags(
        &p,
        &plan,
        DType::BF16,
        vec![
            (table.clone(), plan.lens(), None),
            (
                with_entry(2600 / 128),
                plan.lens(),
                Some("page-table entry"),
            ),
            (
                with_entry(2999 / 128),
                plan.lens(),
                Some("page-table entry"),
            ),
            (table.clone(), long, Some("NSA")),
        ],
    );
}

#[test]
fn case_file_round_trip() {
    // SPEC §9: inputs under their contract names, attributes as JSON text ("\"BSND\"",
    // "true"); the named outputs of CPU and GPU agree.
    use qsa_wgpu::case::Case;
    use qsa_wgpu::ops::{run_blocking, Exec};
    let mut rng = Rng::new(90);
    let mut geo = tiny(DType::F16, 4, 2, 3, true);
    (geo.dqk, geo.dv, geo.layout) = (16, 8, Layout::Bsnd);
    let p = Problem::new(
        &mut rng,
        geo,
        &[3, 1],
        &[25, 12],
        &[25 * 16 + 16, 12 * 16 + 20],
    );
    let x = p.inputs();
    let mut inputs = qsa_wgpu::ops::TensorMap::new();
    for (name, t) in [
        ("query", x.query),
        ("key", x.key),
        ("value", x.value),
        ("block_table", x.block_table),
        ("actual_q_len", x.actual_q_len.unwrap()),
        ("actual_cmp_kv_len", x.actual_cmp_kv_len),
        ("actual_sel_kv_len", x.actual_sel_kv_len.unwrap()),
    ] {
        inputs.insert(name.to_string(), t.clone());
    }
    let mut md = std::collections::HashMap::new();
    md.insert("op".to_string(), "nsa_compress_attention".to_string());
    for (k, v) in [
        ("num_kv_heads", "2"),
        ("compress_block_size", "32"),
        ("compress_stride", "16"),
        ("select_block_size", "64"),
        ("select_block_count", "3"),
        ("layout", "\"BSND\""),
        ("causal_mask", "true"),
    ] {
        md.insert(k.to_string(), v.to_string());
    }
    let bytes = qsa_wgpu::case::serialize(&inputs, Some(md)).unwrap();
    let case = Case::from_bytes(&bytes).unwrap();
    let run = |exec| run_blocking(&case.op, &case.inputs, &case.attrs, exec).unwrap();
    let (cpu, gpu) = (run(Exec::Cpu), run(Exec::Gpu(&util::ctx())));
    assert_eq!(cpu.keys().collect::<Vec<_>>(), ["out", "topk"]);
    assert_eq!(cpu["topk"].shape, vec![2, 3, 2, 3]);
    assert_eq!(cpu["topk"], gpu["topk"]);
    qsa_wgpu::testing::compare(&gpu["out"], &cpu["out"], util::nsa::out_tol(DType::F16)).unwrap();
}
