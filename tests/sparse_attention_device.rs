//! sparse_attention beyond the host checks: values only the GPU sees (lengths, token indices,
//! counts and page-table entries in device buffers) are clamped, skipped and flagged, never read
//! out of bounds; the llvmpipe loop budget (NSA's geometry included) and the longest split it
//! allows, for values as wide as keys or not; and a case file through `qsa run`.

mod util;

use qsa_wgpu::case::{read_tensors, Case};
use qsa_wgpu::gpu::{GpuTensor, Readback};
use qsa_wgpu::ops::common::{check_flags, read_checked};
use qsa_wgpu::ops::sparse_attention::{
    cpu, encode_attention, loop_iterations, pack_seqs, params, params_kv, validate,
    AttentionBuffers, AttentionGeometry, SparseAttentionAttrs, SparseAttentionInputs,
    SparseAttentionParams, LLVMPIPE_LOOP_BUDGET,
};
use qsa_wgpu::ops::{AttrMap, TensorMap};
use qsa_wgpu::paged::PoolLayout;
use qsa_wgpu::testing::{attention_tol, compare, Rng, ScratchDir};
use qsa_wgpu::{DType, Tensor};
use serde_json::json;

/// One sequence of 7 tokens, 5 cached, 2 new rows (positions 5 and 6); H = 2, Hkv = 1, E = 8,
/// pages of 4 (table [2, 0] into a 3-page pool), W = 4.
fn inputs(rng: &mut Rng) -> TensorMap {
    let mut m = TensorMap::new();
    m.insert("query".into(), rng.tensor(DType::F32, &[2, 2, 8]));
    m.insert(
        "kv_blocks".into(),
        rng.tensor(DType::F32, &[3, 2, 1, 4, 1, 8]),
    );
    m.insert("page_table".into(), Tensor::from_u32(&[1, 2], &[2, 0]));
    m.insert("row_offsets".into(), Tensor::from_u32(&[2], &[0, 2]));
    m.insert("cache_lengths".into(), Tensor::from_u32(&[1], &[5]));
    m.insert(
        "token_indices".into(),
        Tensor::from_i32(&[2, 1, 4], &[5, 0, 3, -1, 6, 1, 2, 4]),
    );
    m.insert("token_count".into(), Tensor::from_i32(&[2, 1], &[3, 4]));
    m.insert(
        "sinks".into(),
        Tensor::from_f32(DType::F32, &[2], &[0.5, -1.0]),
    );
    m
}

/// The device buffers' contents, editable past the host checks.
struct Raw {
    seqs: Vec<u32>,
    tokens: Vec<i32>,
    counts: Vec<i32>,
    prm: SparseAttentionParams,
}

/// Runs one dispatch over `r`; returns the flag word and the output.
fn run(m: &TensorMap, r: &Raw) -> (u32, Vec<f32>) {
    let ctx = util::ctx();
    let up = |t: &Tensor| GpuTensor::upload(&ctx, "test", t).unwrap();
    let (q, pool, sinks) = (up(&m["query"]), up(&m["kv_blocks"]), up(&m["sinks"]));
    let seqs = up(&Tensor::from_u32(&[r.seqs.len()], &r.seqs));
    let tokens = up(&Tensor::from_i32(&[r.tokens.len()], &r.tokens));
    let counts = up(&Tensor::from_i32(&[r.counts.len()], &r.counts));
    let out = GpuTensor::filled(&ctx, "out", DType::F32, &[2, 2, 8], 0xff).unwrap();
    let flags = up(&Tensor::from_u32(&[1], &[0]));
    let b = AttentionBuffers {
        query: &q.buffer,
        pool: &pool.buffer,
        seqs: &seqs.buffer,
        token_indices: &tokens.buffer,
        token_count: &counts.buffer,
        sinks: Some(&sinks.buffer),
        out: &out.buffer,
        flags: &flags.buffer,
    };
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    pollster::block_on(encode_attention(&ctx, &mut enc, DType::F32, &r.prm, &b)).unwrap();
    pollster::block_on(ctx.submit("test", enc)).unwrap();
    let got = Readback::new(&ctx, &[(&out.buffer, out.bytes()), (&flags.buffer, 4)])
        .blocking(&ctx)
        .unwrap();
    let f = u32::from_le_bytes(got[1][..4].try_into().unwrap());
    (f, bytemuck::cast_slice(&got[0]).to_vec())
}

#[test]
fn device_side_bad_values_are_flagged() {
    let m = inputs(&mut Rng::new(2));
    let x = SparseAttentionInputs::from_map(&m).unwrap();
    let a = SparseAttentionAttrs::from_map(&AttrMap::new()).unwrap();
    let plan = validate(&x, &a).unwrap();
    let good = Raw {
        seqs: pack_seqs(&plan.offsets, &plan.cache, &plan.table)
            .to_i32()
            .into_iter()
            .map(|v| v as u32)
            .collect(),
        tokens: x.token_indices.to_i32(),
        counts: x.token_count.to_i32(),
        prm: params(&plan.geo).unwrap(),
    };
    let (f, out) = run(&m, &good);
    assert_eq!(f, 0);
    let want = cpu(&x, &a).unwrap();
    compare(
        &Tensor::from_f32(DType::F32, &[2, 2, 8], &out),
        &want,
        attention_tol(DType::F32),
    )
    .unwrap();

    type Edit = fn(&mut Raw);
    let cases: [(&str, Edit, u32); 7] = [
        ("token past its position", |r| r.tokens[0] = 6, 32),
        ("negative token", |r| r.tokens[5] = -3, 32),
        ("page >= num_pages", |r| r.seqs[3] = 99, 8),
        (
            "page column >= max_pages",
            |r| {
                r.prm.max_pages = 1;
                r.seqs.pop();
            },
            4,
        ),
        // Clamped to W, the count then takes in row 0's padding slot −1: two flags.
        ("count > W", |r| r.counts[0] = 5, 128 | 32),
        ("negative count", |r| r.counts[1] = -1, 128),
        ("row outside row_offsets", |r| r.seqs[1] = 1, 1),
    ];
    for (what, edit, bit) in cases {
        let mut r = Raw {
            seqs: good.seqs.clone(),
            tokens: good.tokens.clone(),
            counts: good.counts.clone(),
            prm: good.prm,
        };
        edit(&mut r);
        let (f, out) = run(&m, &r);
        assert_eq!(f, bit, "{what}: flags {f:#x}");
        assert!(
            out.iter().all(|v| v.is_finite()),
            "{what}: an output was left unwritten or not finite: {out:?}"
        );
        let e = check_flags("sparse_attention", f).unwrap_err().to_string();
        assert!(
            e.contains("sparse_attention") && e.contains("device-side"),
            "{e}"
        );
    }
    let e = check_flags("sparse_attention", 128)
        .unwrap_err()
        .to_string();
    assert!(e.contains("token count"), "{e}");
}

#[test]
fn llvmpipe_loop_budget() {
    let geo = |h: usize, hkv: usize, e: usize, w: usize| AttentionGeometry {
        t: 1,
        n: 1,
        h,
        hs: 1,
        w,
        layout: PoolLayout::packed(1, 1, 16, hkv, e),
        layer_idx: 0,
        max_pages: 1,
        scale: None,
        has_sinks: false,
    };
    // Splits keep every workgroup within the budget, whatever the width: Qwen3.8-Flash-Next's,
    // a 64-head group, and very long lists at the largest E.
    for (h, hkv, e, w) in [
        (24, 2, 256, 2051),
        (64, 1, 256, 2051),
        (4, 1, 2048, 200_000),
    ] {
        let p = params(&geo(h, hkv, e, w)).unwrap();
        assert!(loop_iterations(&p) <= LLVMPIPE_LOOP_BUDGET, "{p:?}");
        assert!(p.max_split_len() >= 256, "{p:?}");
    }
    // NSA's selected branch: H = 64, Hkv = Hs = N2 = 4, E = Dqk = 192, Ev = Dv = 128 over a
    // pool of Dp = 192, W = k·l' = 1024. Its whole list fits one split within the budget, for
    // one decode row (many short splits) or a full step.
    let nsa = |t: usize| {
        let g = AttentionGeometry {
            t,
            hs: 4,
            w: 1024,
            layout: PoolLayout::packed(1, 1, 64, 4, 192),
            ..geo(64, 4, 192, 1024)
        };
        params_kv(&g, 192, 128).unwrap()
    };
    for t in [1, 4, 64] {
        let p = nsa(t);
        assert_eq!((p.e, p.v_dim(), p.pool_dim(), p.phases), (192, 128, 192, 4));
        assert!(loop_iterations(&p) <= LLVMPIPE_LOOP_BUDGET, "{p:?}");
        assert!(p.max_split_len() >= 1024, "{p:?}");
    }
    let mut whole = nsa(1);
    whole.split_len = 1024;
    whole.splits = 1;
    assert!(
        loop_iterations(&whole) <= LLVMPIPE_LOOP_BUDGET / 10,
        "{whole:?}"
    );
    let long = params(&geo(4, 1, 2048, 200_000)).unwrap();
    assert!(long.splits > 1 && (long.split_len as usize) <= long.max_split_len());
    // One split over the whole long list is past it.
    let mut wide = long;
    wide.split_len = (200_000u32).div_ceil(256) * 256;
    wide.splits = 1;
    assert!(loop_iterations(&wide) > LLVMPIPE_LOOP_BUDGET);
    let ctx = util::ctx();
    if !ctx.caps.llvmpipe {
        eprintln!("not llvmpipe ({}): no budget to check", ctx.describe());
        return;
    }
    let tiny = GpuTensor::filled(&ctx, "tiny", DType::U32, &[4], 0).unwrap();
    let b = AttentionBuffers {
        query: &tiny.buffer,
        pool: &tiny.buffer,
        seqs: &tiny.buffer,
        token_indices: &tiny.buffer,
        token_count: &tiny.buffer,
        sinks: None,
        out: &tiny.buffer,
        flags: &tiny.buffer,
    };
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let e = pollster::block_on(encode_attention(&ctx, &mut enc, DType::F32, &wide, &b))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sparse_attention") && e.contains("token_indices") && e.contains("llvmpipe"),
        "{e}"
    );
}

/// A split as long as the budget allows still covers its whole list on the device (llvmpipe
/// would stop a loop early, and the output would differ from the CPU's): keys and values of one
/// width, NSA's keys of 192 channels with values of 128, values wider than keys.
#[test]
fn longest_split_covers_its_list() {
    for (e, ev) in [(64, 64), (192, 128), (24, 300)] {
        longest_split(e, ev);
    }
}

fn longest_split(e: usize, ev: usize) {
    let mut rng = Rng::new(12);
    let (h, dp) = (4, e.max(ev));
    let geo = |w: usize, pages: usize| AttentionGeometry {
        t: 1,
        n: 1,
        h,
        hs: 1,
        w,
        layout: PoolLayout::packed(pages, 1, 16, 1, dp),
        layer_idx: 0,
        max_pages: pages,
        scale: None,
        has_sinks: false,
    };
    let longest = params_kv(&geo(64, 4), e, ev).unwrap().max_split_len() / 256 * 256;
    let w = longest + 1000;
    let layout = PoolLayout::packed(w.div_ceil(16), 1, 16, 1, dp);
    let mut m = TensorMap::new();
    m.insert("query".into(), rng.tensor(DType::BF16, &[1, h, e]));
    m.insert(
        "kv_blocks".into(),
        rng.tensor(DType::BF16, &[layout.num_pages, 2, 1, 16, 1, dp]),
    );
    let table: Vec<u32> = (0..layout.num_pages as u32).rev().collect();
    m.insert(
        "page_table".into(),
        Tensor::from_u32(&[1, table.len()], &table),
    );
    m.insert("row_offsets".into(), Tensor::from_u32(&[2], &[0, 1]));
    m.insert(
        "cache_lengths".into(),
        Tensor::from_u32(&[1], &[w as u32 - 1]),
    );
    let tokens: Vec<i32> = rng.permutation(w).iter().map(|&v| v as i32).collect();
    m.insert(
        "token_indices".into(),
        Tensor::from_i32(&[1, 1, w], &tokens),
    );
    m.insert("token_count".into(), Tensor::from_i32(&[1, 1], &[w as i32]));
    let x = SparseAttentionInputs::from_map(&m).unwrap();
    let mut a = SparseAttentionAttrs::from_map(&AttrMap::new()).unwrap();
    a.v_head_dim = (ev != e).then_some(ev);
    let plan = validate(&x, &a).unwrap();
    let mut prm = params_kv(&plan.geo, plan.e, plan.ev).unwrap();
    prm.split_len = longest as u32;
    prm.splits = 2;
    assert!(loop_iterations(&prm) <= LLVMPIPE_LOOP_BUDGET, "{prm:?}");
    let ctx = util::ctx();
    let up = |t: &Tensor| GpuTensor::upload(&ctx, "test", t).unwrap();
    let (q, pool) = (up(&m["query"]), up(&m["kv_blocks"]));
    let seqs = up(&pack_seqs(&plan.offsets, &plan.cache, &plan.table));
    let (tok, cnt) = (up(&m["token_indices"]), up(&m["token_count"]));
    let out = GpuTensor::filled(&ctx, "out", DType::BF16, &[1, h, ev], 0xff).unwrap();
    let flags = up(&Tensor::from_u32(&[1], &[0]));
    let b = AttentionBuffers {
        query: &q.buffer,
        pool: &pool.buffer,
        seqs: &seqs.buffer,
        token_indices: &tok.buffer,
        token_count: &cnt.buffer,
        sinks: None,
        out: &out.buffer,
        flags: &flags.buffer,
    };
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    pollster::block_on(encode_attention(&ctx, &mut enc, DType::BF16, &prm, &b)).unwrap();
    pollster::block_on(ctx.submit("test", enc)).unwrap();
    let got = pollster::block_on(read_checked(&ctx, "sparse_attention", &[&out], &flags))
        .unwrap()
        .remove(0);
    compare(&got, &cpu(&x, &a).unwrap(), attention_tol(DType::BF16))
        .unwrap_or_else(|err| panic!("E = {e}, Ev = {ev}, splits of {longest}: {err}"));
}

#[test]
fn case_file_through_cli() {
    let dir = ScratchDir::new("attention-cli");
    let mut m = inputs(&mut Rng::new(6));
    let bf = |t: &Tensor| Tensor::from_f32(DType::BF16, &t.shape, &t.to_f32());
    for name in ["query", "kv_blocks"] {
        let t = bf(&m[name]);
        m.insert(name.into(), t);
    }
    let case = Case {
        op: "sparse_attention".into(),
        attrs: AttrMap::from([
            ("scale".to_string(), json!(0.3)),
            ("layer_idx".to_string(), json!(0)),
        ]),
        inputs: m.clone(),
    };
    let path = dir.file("case.safetensors");
    std::fs::write(&path, case.to_bytes().unwrap()).unwrap();
    let mut outs = Vec::new();
    for cpu_flag in [false, true] {
        let out = dir.file(&format!("out-{cpu_flag}.safetensors"));
        let mut args = vec!["run", path.to_str().unwrap(), "-o", out.to_str().unwrap()];
        if cpu_flag {
            args.push("--cpu");
        }
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_qsa"))
            .args(&args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let t = read_tensors(&std::fs::read(&out).unwrap()).unwrap();
        assert_eq!(t.keys().collect::<Vec<_>>(), ["out"]);
        outs.push(t["out"].clone());
    }
    assert_eq!(outs[0].shape, vec![2, 2, 8]);
    assert_eq!(outs[0].dtype, DType::BF16);
    compare(&outs[0], &outs[1], attention_tol(DType::BF16)).unwrap();
    let x = SparseAttentionInputs::from_map(&m).unwrap();
    let a = SparseAttentionAttrs::from_map(&case.attrs).unwrap();
    assert_eq!(outs[1], cpu(&x, &a).unwrap());
}
