//! The NSA selector: one submission of compress → compressed attention → top-k → expand →
//! selected attention equals the CPU step (f32, f16, bf16; batches of several sequences with
//! 1- and 4-token steps, an idle slot, shuffled raw pages and compressed blocks); after the
//! first step no bind group is built; the compressed caches it writes equal `nsa_compress`
//! over each whole sequence; token-by-token decoding equals one 16-token step; the paper's
//! geometry; the texture copies of the compressed caches follow every window; the GPU-shaped
//! compressed-attention kernels; bad steps are refused.

mod util;

use qsa_wgpu::nsa::{check_step, select_expand_cpu, NsaConfig, NsaSelector};
use qsa_wgpu::ops::nsa_compress::{cpu as compress_cpu, NsaCompressAttrs, NsaCompressInputs};
use qsa_wgpu::ops::sparse_attention::{loop_iterations, params_kv, AttentionGeometry};
use qsa_wgpu::ops::TensorMap;
use qsa_wgpu::paged::PoolLayout;
use qsa_wgpu::testing::{compare, transform_tol, Rng};
use qsa_wgpu::{DType, Tensor};
use util::{cat, rows};

fn config(dtype: DType) -> NsaConfig {
    NsaConfig {
        n1: 8,
        n2: 2,
        dqk: 24,
        dv: 16,
        l: 8,
        d: 4,
        lsel: 16,
        k: 5,
        scale: None,
        dtype,
        page_size: 16,
        cmp_page_size: 5,
        max_len: 200,
        max_seqs: 3,
        max_step_rows: 48,
    }
}

fn layer(cfg: &NsaConfig, rng: &mut Rng, shuffled: bool) -> NsaSelector {
    layer_on(util::ctx(), cfg, rng, shuffled)
}

fn layer_on(
    ctx: std::sync::Arc<qsa_wgpu::gpu::Context>,
    cfg: &NsaConfig,
    rng: &mut Rng,
    shuffled: bool,
) -> NsaSelector {
    let pages = cfg.max_seqs * cfg.max_pages() + 1;
    let blocks = cfg.max_seqs * cfg.max_cmp_blocks() + 1;
    let order = |rng: &mut Rng, n: usize| {
        if shuffled {
            rng.permutation(n)
        } else {
            (0..n as u32).collect()
        }
    };
    let (po, bo) = (order(rng, pages), order(rng, blocks));
    let w_k = rng.tensor(cfg.dtype, &[cfg.l, cfg.n2]);
    let w_v = rng.tensor(cfg.dtype, &[cfg.l, cfg.n2]);
    NsaSelector::new(ctx, cfg.clone(), w_k, w_v, po, bo).unwrap()
}

/// Random raw K and V rows of `n` tokens.
fn kv(rng: &mut Rng, cfg: &NsaConfig, n: usize) -> (Vec<f32>, Vec<f32>) {
    (
        rng.normals(n * cfg.n2 * cfg.dqk),
        rng.normals(n * cfg.n2 * cfg.dv),
    )
}

fn gpu_step(sel: &mut NsaSelector, step: &[usize], q: &Tensor) -> TensorMap {
    let out = pollster::block_on(sel.step(step, q)).unwrap();
    pollster::block_on(out.read(&util::ctx())).unwrap()
}

/// Appends `tokens[s]` (all of them) to each slot.
fn append(sel: &mut NsaSelector, tokens: &[(Vec<f32>, Vec<f32>)]) {
    for (s, (k, v)) in tokens.iter().enumerate() {
        if !k.is_empty() {
            sel.append_kv(s, k, v).unwrap();
        }
    }
}

#[test]
fn step_equals_cpu_step_and_reuses_everything() {
    let mut rng = Rng::new(51);
    for dt in [DType::F32, DType::BF16, DType::F16] {
        let cfg = config(dt);
        let mut sel = layer(&cfg, &mut rng, true);
        for _ in 0..3 {
            sel.add_sequence().unwrap();
        }
        // A prefill through the keys-only path (GPU and CPU), then steps of 1 and 4 tokens per
        // sequence, one sequence idle in some.
        let prefill = [77, 100, 70];
        let toks: Vec<_> = prefill.iter().map(|&n| kv(&mut rng, &cfg, n)).collect();
        append(&mut sel, &toks);
        pollster::block_on(sel.extend(&prefill)).unwrap();
        sel.extend_cpu(&prefill).unwrap();
        let steps = [
            [1, 1, 1],
            [4, 1, 4],
            [4, 4, 0],
            [1, 0, 1],
            [4, 4, 4],
            [1, 4, 1],
        ];
        let mut groups = 0;
        let mut ties = 0;
        for (i, step) in steps.iter().enumerate() {
            let toks: Vec<_> = step.iter().map(|&n| kv(&mut rng, &cfg, n)).collect();
            append(&mut sel, &toks);
            let t: usize = step.iter().sum();
            let q = rng.tensor(dt, &[t, cfg.n1, cfg.dqk]);
            let got = gpu_step(&mut sel, step, &q);
            let want = sel.step_cpu(step, &q).unwrap();
            let c = check_step(&sel, step, &q, &got, &want)
                .unwrap_or_else(|e| panic!("{dt} step {i} {step:?}: {e}"));
            assert_eq!(c.rows, t * cfg.n2);
            ties += c.near_ties;
            if i == 0 {
                groups = sel.bind_groups_created();
            }
        }
        assert!(groups >= 6, "six stages, {groups} bind groups");
        assert_eq!(
            sel.bind_groups_created(),
            groups,
            "{dt}: a bind group after step 0"
        );
        eprintln!("{dt}: {ties} selection rows differ by near ties");
        // The device caches equal the host mirrors the CPU path wrote.
        let (k, v) = pollster::block_on(sel.read_cmp_cache()).unwrap();
        compare(&k, &sel.cmp_key, transform_tol(dt)).unwrap();
        compare(&v, &sel.cmp_value, transform_tol(dt)).unwrap();
    }
}

#[test]
fn compressed_cache_is_nsa_compress_of_each_sequence() {
    let mut rng = Rng::new(52);
    for dt in [DType::F32, DType::BF16] {
        let cfg = config(dt);
        let mut sel = layer(&cfg, &mut rng, true);
        sel.add_sequence().unwrap();
        sel.add_sequence().unwrap();
        // Tokens arrive in uneven calls mixing extend and steps; windows complete inside calls
        // and across their ends.
        let mut all: Vec<(Vec<f32>, Vec<f32>)> = vec![Default::default(); 2];
        for step in [[70, 3], [1, 70], [7, 1], [4, 2], [13, 9]] {
            let toks: Vec<_> = step.iter().map(|&n| kv(&mut rng, &cfg, n)).collect();
            append(&mut sel, &toks);
            for (a, t) in all.iter_mut().zip(&toks) {
                a.0.extend(&t.0);
                a.1.extend(&t.1);
            }
            if step == [70, 3] || step == [1, 70] || step == [13, 9] {
                pollster::block_on(sel.extend(&step)).unwrap();
            } else {
                let q = rng.tensor(dt, &[step.iter().sum(), cfg.n1, cfg.dqk]);
                gpu_step(&mut sel, &step, &q);
            }
        }
        let (kc, vc) = pollster::block_on(sel.read_cmp_cache()).unwrap();
        for (s, (k, v)) in all.iter().enumerate() {
            let len = sel.len(s);
            let blocks = sel.cmp_table(s).to_vec();
            for (cache, raw, width, w) in [(&kc, k, cfg.dqk, &sel.w_k), (&vc, v, cfg.dv, &sel.w_v)]
            {
                let input = Tensor::from_f32(dt, &[len, cfg.n2, width], raw);
                let lens = Tensor::from_i32(&[1], &[len as i32]);
                let x = NsaCompressInputs {
                    input: &input,
                    weight: w,
                    seq_lens: &lens,
                };
                let want = compress_cpu(&x, &NsaCompressAttrs { l: cfg.l, d: cfg.d }).unwrap();
                let windows = want.shape[0];
                assert_eq!(windows, sel.cmp_len(s));
                let row = cfg.n2 * width * dt.size();
                let mut got = Vec::new();
                for i in 0..windows {
                    let at = (blocks[i / cfg.cmp_page_size] as usize * cfg.cmp_page_size
                        + i % cfg.cmp_page_size)
                        * row;
                    got.extend_from_slice(&cache.data[at..at + row]);
                }
                let got = Tensor::from_bytes(dt, &want.shape, got).unwrap();
                compare(&got, &want, transform_tol(dt))
                    .unwrap_or_else(|e| panic!("{dt} slot {s} width {width}: {e}"));
            }
        }
    }
}

#[test]
fn decode_loop_equals_one_16_token_step() {
    // From 67 tokens to 83 the compressed length goes 15 → 19 (windows complete inside the
    // step) while nsel stays 5, so the forced blocks, which follow the batch's nsel, agree.
    let mut rng = Rng::new(53);
    for dt in [DType::F32, DType::BF16] {
        let cfg = config(dt);
        let toks: Vec<_> = (0..2).map(|_| kv(&mut rng, &cfg, 83)).collect();
        let q: Vec<Tensor> = (0..2)
            .map(|_| rng.tensor(dt, &[16, cfg.n1, cfg.dqk]))
            .collect();
        let mut seed = Rng::new(7);
        let mut one = layer(&cfg, &mut seed, true);
        let mut seed = Rng::new(7);
        let mut inc = layer(&cfg, &mut seed, true);
        let part = |s: usize, a: usize, b: usize| {
            let (k, v) = &toks[s];
            let (kw, vw) = (cfg.n2 * cfg.dqk, cfg.n2 * cfg.dv);
            (k[a * kw..b * kw].to_vec(), v[a * vw..b * vw].to_vec())
        };
        for sel in [&mut one, &mut inc] {
            sel.add_sequence().unwrap();
            sel.add_sequence().unwrap();
            append(sel, &[part(0, 0, 67), part(1, 0, 67)]);
            pollster::block_on(sel.extend(&[67, 67])).unwrap();
            sel.extend_cpu(&[67, 67]).unwrap();
        }
        append(&mut one, &[part(0, 67, 83), part(1, 67, 83)]);
        let q16 = cat(&[q[0].clone(), q[1].clone()]);
        let whole = gpu_step(&mut one, &[16, 16], &q16);
        let whole_cpu = one.step_cpu(&[16, 16], &q16).unwrap();
        let mut parts = Vec::new();
        let mut parts_cpu = Vec::new();
        for at in 67..83 {
            append(&mut inc, &[part(0, at, at + 1), part(1, at, at + 1)]);
            let i = at - 67;
            let qa = cat(&[rows(&q[0], i, i + 1), rows(&q[1], i, i + 1)]);
            parts.push(gpu_step(&mut inc, &[1, 1], &qa));
            parts_cpu.push(inc.step_cpu(&[1, 1], &qa).unwrap());
        }
        for name in ["out", "cmp_out", "topk", "token_indices", "token_count"] {
            // Rows of the one-shot step are sequence 0's 16, then sequence 1's.
            let order = |ps: &[TensorMap]| {
                let mut v: Vec<Tensor> = ps.iter().map(|p| rows(&p[name], 0, 1)).collect();
                v.extend(ps.iter().map(|p| rows(&p[name], 1, 2)));
                cat(&v)
            };
            assert_eq!(order(&parts), whole[name], "{dt} GPU: {name}");
            assert_eq!(order(&parts_cpu), whole_cpu[name], "{dt} CPU: {name}");
        }
        let counts = whole["token_count"].to_i32();
        assert!(
            counts.iter().any(|&c| c < (cfg.k * cfg.lsel) as i32),
            "some block is clipped"
        );
    }
}

#[test]
fn paper_geometry() {
    // N1 = 64, N2 = 4, Dqk = 192, Dv = 128, l = 32, d = 16, l' = 64, k = 16 over two
    // sequences of about a thousand tokens: a decode row each, then a 4-token and a 1-token
    // step.
    let mut rng = Rng::new(54);
    let dt = DType::BF16;
    let mut cfg = NsaConfig::paper(dt, 1200, 2);
    cfg.page_size = 64;
    cfg.cmp_page_size = 16;
    // The selected branch (W = k·l' = 1024, 16 heads per KV head) fits llvmpipe's loop limit.
    let geo = AttentionGeometry {
        t: 1,
        n: 1,
        h: 64,
        hs: 4,
        w: 1024,
        layout: PoolLayout::packed(1, 1, 64, 4, 192),
        layer_idx: 0,
        max_pages: 1,
        scale: None,
        has_sinks: false,
    };
    let iters = loop_iterations(&params_kv(&geo, 192, 128).unwrap());
    assert!(iters < 40_000, "{iters}");
    let ctx = util::ctx();
    let mut sel = layer(&cfg, &mut rng, true);
    for step in paper_steps(&mut sel, &ctx, &mut rng, &cfg, &[1000, 1090]) {
        let got = step;
        // Every row starts with the forced blocks 0, nsel − 2, nsel − 1 (nsel = 16 and 17).
        let t = got["topk"].to_i32();
        assert_eq!(t[..3], [0, 14, 15]);
        assert_eq!(t[t.len() - 16..][..3], [0, 15, 16]);
        assert_eq!(got["out"].shape[1..], [64, 128]);
    }
}

/// Two sequences of `prefill` tokens on a paper-geometry layer, then a decode step of both and
/// a step of 4 + 1 tokens, each checked against the CPU step; the GPU outputs of the two steps.
fn paper_steps(
    sel: &mut NsaSelector,
    ctx: &qsa_wgpu::gpu::Context,
    rng: &mut Rng,
    cfg: &NsaConfig,
    prefill: &[usize; 2],
) -> Vec<TensorMap> {
    sel.add_sequence().unwrap();
    sel.add_sequence().unwrap();
    let toks: Vec<_> = prefill.iter().map(|&n| kv(rng, cfg, n)).collect();
    append(sel, &toks);
    pollster::block_on(sel.extend(prefill)).unwrap();
    sel.extend_cpu(prefill).unwrap();
    let mut outs = Vec::new();
    for step in [[1, 1], [4, 1]] {
        let toks: Vec<_> = step.iter().map(|&n| kv(rng, cfg, n)).collect();
        append(sel, &toks);
        let q = rng.tensor(cfg.dtype, &[step.iter().sum(), cfg.n1, cfg.dqk]);
        let out = pollster::block_on(sel.step(&step, &q)).unwrap();
        let got = pollster::block_on(out.read(ctx)).unwrap();
        let want = sel.step_cpu(&step, &q).unwrap();
        check_step(sel, &step, &q, &got, &want).unwrap_or_else(|e| panic!("{step:?}: {e}"));
        outs.push(got);
    }
    outs
}

#[test]
fn cache_texture_copies_follow_every_window() {
    // The paper's geometry on the default context, whose compressed attention reads texture
    // copies of the compressed caches where the context reads such copies, against a layer
    // that reads the cache buffers: a prefill, then query steps of which the first and the last
    // complete a window in both sequences (a window ends at every 16th raw token: 1007 + 1 and
    // 1100 + 4 reach 1008 and 1104; 1009 + 8 and 1105 + 15 pass 1016 and reach 1120), so that
    // those steps read rows only their own copies put in the textures. Both layers equal the
    // CPU step, and each other bit for bit.
    let ctx = util::ctx();
    let buffers = util::buffer_ctx();
    let dt = DType::F32;
    let mut cfg = NsaConfig::paper(dt, 1300, 2);
    cfg.page_size = 64;
    cfg.cmp_page_size = 16;
    let mut sels = Vec::new();
    for c in [&ctx, &buffers] {
        let mut rng = Rng::new(58);
        let mut sel = layer_on((*c).clone(), &cfg, &mut rng, true);
        sel.add_sequence().unwrap();
        sel.add_sequence().unwrap();
        let prefill = [1007, 1100];
        let toks: Vec<_> = prefill.iter().map(|&n| kv(&mut rng, &cfg, n)).collect();
        append(&mut sel, &toks);
        pollster::block_on(sel.extend(&prefill)).unwrap();
        sel.extend_cpu(&prefill).unwrap();
        sels.push((sel, rng, (*c).clone()));
    }
    for step in [[1, 4], [1, 1], [8, 15]] {
        let mut outs = Vec::new();
        for (sel, rng, c) in sels.iter_mut() {
            let toks: Vec<_> = step.iter().map(|&n| kv(rng, &cfg, n)).collect();
            append(sel, &toks);
            let q = rng.tensor(dt, &[step.iter().sum(), cfg.n1, cfg.dqk]);
            let out = pollster::block_on(sel.step(&step, &q)).unwrap();
            let got = pollster::block_on(out.read(c)).unwrap();
            let want = sel.step_cpu(&step, &q).unwrap();
            check_step(sel, &step, &q, &got, &want).unwrap_or_else(|e| panic!("{step:?}: {e}"));
            outs.push(got);
        }
        for name in ["cmp_out", "topk", "out"] {
            assert!(
                outs[0][name].data == outs[1][name].data,
                "{step:?}: {name} from the texture copies and from the buffers differ"
            );
        }
    }
    use qsa_wgpu::ops::nsa_compress_attention::{LOGITS_SG_TEX, VALUES_SG_TEX};
    let (k, v) = qsa_wgpu::ops::nsa_compress_attention::texture_stages(&ctx, dt, 192, 128);
    assert_eq!(ctx.cache.built(LOGITS_SG_TEX), k);
    assert_eq!(ctx.cache.built(VALUES_SG_TEX), v);
    assert!(!buffers.cache.built(LOGITS_SG_TEX) && !buffers.cache.built(VALUES_SG_TEX));
    if !k {
        eprintln!("{}: no texture copies read here", ctx.describe());
    }
}

#[test]
fn gpu_shaped_kernels_step() {
    // The selector on a context that runs the GPU-shaped logits and values kernels: the paper's
    // group over two sequences of over 256 compressed tokens (two logits workgroups), decode
    // and 4-token steps equal the CPU step.
    let ctx = util::gpu_nsa_ctx();
    let mut rng = Rng::new(57);
    let dt = DType::BF16;
    let mut cfg = NsaConfig::paper(dt, 4500, 2);
    cfg.page_size = 64;
    cfg.cmp_page_size = 16;
    let mut sel = layer_on(ctx.clone(), &cfg, &mut rng, true);
    let outs = paper_steps(&mut sel, &ctx, &mut rng, &cfg, &[1500, 4200]);
    assert_eq!(outs.len(), 2);
    assert!(ctx
        .cache
        .built(qsa_wgpu::ops::nsa_compress_attention::LOGITS_GPU));
}

#[test]
fn check_accepts_near_ties_and_rejects_wrong_outputs() {
    // Zero keys: every visible compressed token gets the same probability, so the interior
    // selection blocks tie exactly and the top-k takes them by index (0, nsel−2, nsel−1, 1,
    // 2). A GPU that ordered blocks 1 and 2 the other way is right, and its selected branch
    // is checked against the CPU over its own selection.
    let mut rng = Rng::new(56);
    let cfg = config(DType::F32);
    let mut sel = layer(&cfg, &mut rng, true);
    sel.add_sequence().unwrap();
    let k0 = vec![0.0; 90 * cfg.n2 * cfg.dqk];
    sel.append_kv(0, &k0, &rng.normals(90 * cfg.n2 * cfg.dv))
        .unwrap();
    pollster::block_on(sel.extend(&[89])).unwrap();
    sel.extend_cpu(&[89]).unwrap();
    let q = rng.tensor(DType::F32, &[1, cfg.n1, cfg.dqk]);
    let got = gpu_step(&mut sel, &[1], &q);
    let want = sel.step_cpu(&[1], &q).unwrap();
    assert_eq!(
        check_step(&sel, &[1], &q, &got, &want).unwrap().near_ties,
        0
    );
    let top = want["topk"].to_i32();
    assert_eq!(top[3..5], [1, 2]);
    let sc = want["scores"].to_f32();
    assert_eq!(sc[1], sc[2]);
    let mut swapped = top.clone();
    swapped.swap(3, 4);
    let swapped = Tensor::from_i32(&want["topk"].shape, &swapped);
    let mut alt = sel.attend_cpu(&[1], &q, &swapped).unwrap();
    alt.insert("topk".into(), swapped);
    alt.insert("cmp_out".into(), got["cmp_out"].clone());
    let c = check_step(&sel, &[1], &q, &alt, &want).unwrap();
    assert_eq!((c.rows, c.near_ties), (2, 1));
    // Wrong outputs are caught: the selected or compressed branch off by 0.05 in one element,
    // a repeated block, a token count off by one.
    let bump = |t: &Tensor| {
        let mut v = t.to_f32();
        v[7] += 0.05;
        Tensor::from_f32(t.dtype, &t.shape, &v)
    };
    let mut bad = got.clone();
    bad.insert("out".into(), bump(&got["out"]));
    let e = check_step(&sel, &[1], &q, &bad, &want).unwrap_err();
    assert!(e.starts_with("out"), "{e}");
    let mut bad = got.clone();
    bad.insert("cmp_out".into(), bump(&got["cmp_out"]));
    let e = check_step(&sel, &[1], &q, &bad, &want).unwrap_err();
    assert!(e.starts_with("cmp_out"), "{e}");
    let mut bad = got.clone();
    let mut t = top.clone();
    t[4] = t[3];
    bad.insert("topk".into(), Tensor::from_i32(&want["topk"].shape, &t));
    let e = check_step(&sel, &[1], &q, &bad, &want).unwrap_err();
    assert!(e.contains("repeated"), "{e}");
    let mut bad = got.clone();
    let mut c = got["token_count"].to_i32();
    c[1] -= 1;
    bad.insert("token_count".into(), Tensor::from_i32(&[1, 2], &c));
    let e = check_step(&sel, &[1], &q, &bad, &want).unwrap_err();
    assert!(e.contains("token_count"), "{e}");
}

#[test]
fn expand_clips_blocks_to_the_position() {
    // Blocks of 4 at position 9: block 2 keeps 8, 9; block 3 is past p; −1 is skipped.
    let topk = Tensor::from_i32(&[1, 1, 4], &[2, 0, 3, -1]);
    let (tok, cnt) = select_expand_cpu(&topk, &[9], 4).unwrap();
    assert_eq!(cnt.to_i32(), [6]);
    let mut want = vec![8, 9, 0, 1, 2, 3];
    want.resize(16, -1);
    assert_eq!(tok.to_i32(), want);
}

#[test]
fn bad_steps_are_refused() {
    let mut rng = Rng::new(55);
    let cfg = config(DType::F32);
    let mut sel = layer(&cfg, &mut rng, false);
    sel.add_sequence().unwrap();
    sel.add_sequence().unwrap();
    let toks: Vec<_> = [30, 80].iter().map(|&n| kv(&mut rng, &cfg, n)).collect();
    append(&mut sel, &toks);
    pollster::block_on(sel.extend(&[30, 80])).unwrap();
    let q = |t: usize| Tensor::zeros(DType::F32, &[t, cfg.n1, cfg.dqk]);
    #[track_caller]
    fn err(r: qsa_wgpu::Result<()>) -> String {
        r.expect_err("refused").to_string()
    }
    // Slot 0 holds 30 tokens: 6 compressed, nsel 2 < k = 5.
    let e = err(pollster::block_on(sel.step(&[1, 1], &q(2))).map(|_| ()));
    assert!(e.contains("slot 0") && e.contains("nsel"), "{e}");
    let toks = vec![kv(&mut rng, &cfg, 50), kv(&mut rng, &cfg, 17)];
    append(&mut sel, &toks);
    let e = err(pollster::block_on(sel.step(&[1, 17], &q(18))).map(|_| ()));
    assert!(e.contains("slot 1") && e.contains("at most 16"), "{e}");
    let e = err(pollster::block_on(sel.step(&[1, 1], &q(3))).map(|_| ()));
    assert!(e.contains("query"), "{e}");
    let e = err(pollster::block_on(sel.step(&[1], &q(1))).map(|_| ()));
    assert!(e.contains("one count per slot"), "{e}");
    let e = err(pollster::block_on(sel.step(&[0, 0], &q(0))).map(|_| ()));
    assert!(e.contains("at least one"), "{e}");
    let e = err(sel.append_kv(0, &[0.0; 48], &[0.0; 31]));
    assert!(e.contains("rows"), "{e}");
    sel.free_sequence(1).unwrap();
    assert!(sel.free_sequence(1).is_err());
    assert!(sel.append_kv(1, &[0.0; 48], &[0.0; 32]).is_err());
    let bad = NsaConfig {
        lsel: 10,
        ..config(DType::F32)
    };
    let e = err(NsaSelector::new(
        util::ctx(),
        bad,
        Tensor::zeros(DType::F32, &[8, 2]),
        Tensor::zeros(DType::F32, &[8, 2]),
        (0..100).collect(),
        (0..100).collect(),
    )
    .map(|_| ()));
    assert!(e.contains("l'"), "{e}");
}

#[test]
fn demo_runs() {
    // `qsa demo --nsa`, small: one sequence, a two-chunk prefill, a decode and two verify steps.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qsa"))
        .args([
            "demo",
            "--nsa",
            "--seqs",
            "1",
            "--prefill",
            "1100",
            "--chunk",
            "700",
        ])
        .args(["--decode", "1", "--dtype", "f16"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "prefill",
        "decode",
        "verify",
        "summary: 1 sequences, 1109 tokens, 3 steps",
    ] {
        assert!(text.contains(line), "{line:?} missing from\n{text}");
    }
}
