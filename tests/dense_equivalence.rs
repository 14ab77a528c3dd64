//! The end-to-end test of SPEC §7: when every query sees at most k blocks, the indexer
//! (qsa_compress_paged → qsa_prepare_query → block_score → block_topk → expand_route) followed
//! by sparse_attention equals plain dense causal GQA attention. The operators are composed by
//! name through the registry, on the GPU and on the CPU, over a ragged batch that mixes a
//! prefill, a chunk deep into a sequence and decode rows, with pages handed out shuffled; the
//! dense reference is written here from the raw K, V and queries.

mod util;

use qsa_wgpu::indexer::rotary_table;
use qsa_wgpu::ops::{run_blocking, AttrMap, Exec, TensorMap};
use qsa_wgpu::paged::{PagedPool, PoolLayout};
use qsa_wgpu::testing::{attention_tol, compare, Rng};
use qsa_wgpu::{DType, Tensor};
use serde_json::json;

const HI: usize = 4; // index heads
const DI: usize = 32; // index head dim
const DR: usize = 16; // rotary channels
const R: usize = 4; // block size
const K: usize = 16; // selected blocks: every position below K·R + R − 1 = 67 sees all its blocks
const H: usize = 8; // query heads
const HKV: usize = 2; // KV heads
const E: usize = 64; // head dim
const PAGE: usize = 8;
const MAX_BLOCKS: usize = 16;

/// (cached, new rows) per sequence: a prefill, a decode row, a chunk, a decode row at the
/// longest length (61 tokens: position 60 sees 15 blocks), a first token.
const SEQS: [(usize, usize); 5] = [(0, 37), (45, 1), (20, 8), (60, 1), (0, 1)];

fn attrs(list: &[(&str, serde_json::Value)]) -> AttrMap {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// Plain causal GQA attention: row t at position p, head h attends to positions 0 ..= p of its
/// sequence with KV head h / (H / Hkv), plus the sink.
fn dense(q: &[f32], kv: &[(Vec<f32>, Vec<f32>)], sinks: Option<&[f32]>) -> Vec<f32> {
    let scale = 1.0 / (E as f32).sqrt();
    let mut out = Vec::new();
    let mut t = 0;
    for (n, &(c, rows)) in SEQS.iter().enumerate() {
        let (keys, vals) = &kv[n];
        for p in c..c + rows {
            for h in 0..H {
                let kh = h / (H / HKV);
                let qr = &q[(t * H + h) * E..][..E];
                let row = |m: &[f32], j: usize| m[(j * HKV + kh) * E..][..E].to_vec();
                let z: Vec<f32> = (0..=p)
                    .map(|j| scale * qr.iter().zip(row(keys, j)).map(|(a, b)| a * b).sum::<f32>())
                    .collect();
                let sink = sinks.map(|s| s[h]);
                let m = z
                    .iter()
                    .copied()
                    .chain(sink)
                    .fold(f32::NEG_INFINITY, f32::max);
                let mut den = sink.map_or(0.0, |s| (s - m).exp());
                let mut o = vec![0f32; E];
                for (j, zj) in z.iter().enumerate() {
                    let w = (zj - m).exp();
                    den += w;
                    o.iter_mut()
                        .zip(row(vals, j))
                        .for_each(|(o, v)| *o += w * v);
                }
                out.extend(o.iter().map(|v| v / den));
            }
            t += 1;
        }
    }
    out
}

#[test]
fn indexer_plus_sparse_attention_is_dense_attention() {
    let ctx = util::ctx();
    let mut rng = Rng::new(2024);
    for (dt, hs, with_sinks) in [
        (DType::F32, 1, false),
        (DType::F32, 2, true),
        (DType::F16, 1, true),
        (DType::BF16, 2, false),
    ] {
        let n = SEQS.len();
        let t: usize = SEQS.iter().map(|s| s.1).sum();
        let lens: Vec<usize> = SEQS.iter().map(|s| s.0 + s.1).collect();
        let pages: usize = lens.iter().map(|l| l.div_ceil(PAGE)).sum::<usize>() + 2;
        let order = rng.permutation(pages);
        // Both pools get pages in one order, so they share the page table.
        let mut index_pool =
            PagedPool::new(PoolLayout::packed(pages, 1, PAGE, 1, DI), dt, order.clone());
        let mut main_pool = PagedPool::new(PoolLayout::packed(pages, 1, PAGE, HKV, E), dt, order);
        main_pool.data = rng.tensor(dt, &[main_pool.data.shape[0]]);
        let mut kv = Vec::new();
        for &len in &lens {
            let s = index_pool.add_sequence();
            index_pool.append(s, 0, 0, &rng.normals(len * DI)).unwrap();
            index_pool.commit(s, len);
            main_pool.add_sequence();
            // The reference sees the values as stored: rounded to the call's type.
            let mut rounded = || -> Vec<f32> {
                let v = rng.normals(len * HKV * E);
                Tensor::from_f32(dt, &[v.len()], &v).to_f32()
            };
            let (k, v) = (rounded(), rounded());
            main_pool.append(s, 0, 0, &k).unwrap();
            main_pool.append(s, 1, 0, &v).unwrap();
            main_pool.commit(s, len);
            kv.push((k, v));
        }
        let seq_ids: Vec<usize> = (0..n).collect();
        let max_pages = lens.iter().map(|l| l.div_ceil(PAGE)).max().unwrap();
        let table = index_pool.page_table(&seq_ids, max_pages, 0);
        assert_eq!(table, main_pool.page_table(&seq_ids, max_pages, 0));
        let cache: Vec<u32> = SEQS.iter().map(|s| s.0 as u32).collect();
        let mut offsets = vec![0u32];
        let mut positions = Vec::new();
        for &(c, rows) in &SEQS {
            offsets.push(offsets.last().unwrap() + rows as u32);
            positions.extend((c..c + rows).map(|p| p as i32));
        }
        let query = Tensor::from_f32(dt, &[t, H, E], &rng.normals(t * H * E));
        let sinks: Option<Vec<f32>> = with_sinks.then(|| rng.normals(H));
        let want = Tensor::from_f32(
            dt,
            &[t, H, E],
            &dense(&query.to_f32(), &kv, sinks.as_deref()),
        );
        let freqs = rotary_table(dt, 64, DR);
        let gamma = rng.tensor(dt, &[DI]);
        let q_norm = rng.tensor(dt, &[DI]);
        let q_raw = rng.tensor(dt, &[t, HI, DI]);
        for exec in [Exec::Gpu(&ctx), Exec::Cpu] {
            let run = |op: &str, m: TensorMap, a: AttrMap| run_blocking(op, &m, &a, exec).unwrap();
            let u32s = |v: &[u32]| Tensor::from_u32(&[v.len()], v);
            let counts: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
            let keys = run(
                "qsa_compress_paged",
                TensorMap::from([
                    ("kv_blocks".into(), index_pool.tensor()),
                    ("page_table".into(), table.clone()),
                    ("cache_lengths".into(), u32s(&cache)),
                    ("key_counts".into(), Tensor::from_i32(&[n], &counts)),
                    ("gamma".into(), gamma.clone()),
                    ("freqs_cis".into(), freqs.clone()),
                    (
                        "block_keys".into(),
                        Tensor::zeros(dt, &[n * MAX_BLOCKS, DI]),
                    ),
                ]),
                attrs(&[
                    ("ratio", json!(R)),
                    ("mode", json!("full")),
                    ("norm_weight_offset", json!(1.0)),
                ]),
            );
            let iq = run(
                "qsa_prepare_query",
                TensorMap::from([
                    ("index_query_raw".into(), q_raw.clone()),
                    ("q_norm_weight".into(), q_norm.clone()),
                    ("freqs_cis".into(), freqs.clone()),
                    ("positions".into(), Tensor::from_i32(&[t], &positions)),
                ]),
                attrs(&[("norm_weight_offset", json!(1.0))]),
            );
            let scores = run(
                "block_score",
                TensorMap::from([
                    ("index_query".into(), iq["index_query"].clone()),
                    ("block_keys".into(), keys["block_keys"].clone()),
                    ("row_offsets".into(), u32s(&offsets)),
                    ("cache_lengths".into(), u32s(&cache)),
                ]),
                attrs(&[("ratio", json!(R)), ("num_selection_heads", json!(hs))]),
            );
            let sel = run("block_topk", scores, attrs(&[("k", json!(K))]));
            let route = run(
                "expand_route",
                TensorMap::from([
                    ("block_indices".into(), sel["block_indices"].clone()),
                    ("block_count".into(), sel["block_count"].clone()),
                    ("positions".into(), Tensor::from_i32(&[t], &positions)),
                ]),
                attrs(&[("ratio", json!(R))]),
            );
            // The premise: every query gathered all of its positions.
            let got_counts = route["token_count"].to_i32();
            for (row, &p) in positions.iter().enumerate() {
                for g in 0..hs {
                    assert_eq!(got_counts[row * hs + g], p + 1, "row {row} group {g}");
                }
            }
            let mut m = TensorMap::from([
                ("query".into(), query.clone()),
                ("kv_blocks".into(), main_pool.tensor()),
                ("page_table".into(), table.clone()),
                ("row_offsets".into(), u32s(&offsets)),
                ("cache_lengths".into(), u32s(&cache)),
                ("token_indices".into(), route["token_indices"].clone()),
                ("token_count".into(), route["token_count"].clone()),
            ]);
            if let Some(s) = &sinks {
                m.insert("sinks".into(), Tensor::from_f32(DType::F32, &[H], s));
            }
            let out = run("sparse_attention", m, AttrMap::new());
            let where_ = if matches!(exec, Exec::Cpu) {
                "cpu"
            } else {
                "gpu"
            };
            compare(&out["out"], &want, attention_tol(dt))
                .unwrap_or_else(|e| panic!("{where_} {dt} hs={hs} sinks={with_sinks}: {e}"));
        }
    }
}
