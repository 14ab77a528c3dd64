//! The step's optional attention stage: one submission of compress → query → score → top-k →
//! expand → sparse attention equals the same step composed from the CPU references; when every
//! query sees at most k blocks it equals dense causal GQA attention over the raw K/V, in a
//! decode loop as in a prefill; no bind group is built after the first step; misuse is a typed
//! error.

mod util;

use qsa_wgpu::indexer::{AttentionConfig, IndexerConfig, QsaIndexer};
use qsa_wgpu::ops::TensorMap;
use qsa_wgpu::testing::{attention_tol, compare, Rng};
use qsa_wgpu::{DType, Tensor};

const H: usize = 8;
const HKV: usize = 2;
const E: usize = 64;

fn config(dtype: DType, k: usize, hs: usize, sinks: Option<Vec<f32>>) -> IndexerConfig {
    IndexerConfig {
        hi: 4,
        di: 32,
        dr: 16,
        r: 4,
        k,
        hs,
        page_size: 16,
        dtype,
        epsilon: 1e-6,
        k_norm_offset: 1.0,
        q_norm_offset: 1.0,
        scale: None,
        max_len: 192,
        max_seqs: 3,
        max_step_tokens: 128,
        score_chunk_rows: None,
        pool_shard_pages: None,
        attention: Some(AttentionConfig {
            h: H,
            hkv: HKV,
            e: E,
            scale: None,
            sinks,
        }),
    }
}

fn layer(cfg: &IndexerConfig, rng: &mut Rng) -> QsaIndexer {
    let k_norm = rng.tensor(cfg.dtype, &[cfg.di]);
    let q_norm = rng.tensor(cfg.dtype, &[cfg.di]);
    let pages = cfg.max_seqs * cfg.max_len.div_ceil(cfg.page_size);
    let mut ix = QsaIndexer::new(
        util::ctx(),
        cfg.clone(),
        k_norm,
        q_norm,
        rng.permutation(pages),
    )
    .unwrap();
    for _ in 0..cfg.max_seqs {
        ix.add_sequence().unwrap();
    }
    ix
}

/// The raw data of every token of every sequence, kept to build the dense reference.
#[derive(Default)]
struct History {
    k: Vec<Vec<f32>>, // per sequence: [len, Hkv, E]
    v: Vec<Vec<f32>>,
}

/// Appends `counts` new tokens (index keys, K, V) and returns the step's raw index queries and
/// attention queries.
fn feed(
    ix: &mut QsaIndexer,
    rng: &mut Rng,
    hist: &mut History,
    counts: &[usize],
) -> (Tensor, Tensor) {
    let dt = ix.cfg.dtype;
    hist.k.resize(counts.len(), Vec::new());
    hist.v.resize(counts.len(), Vec::new());
    for (s, &c) in counts.iter().enumerate() {
        ix.append_keys(s, &rng.normals(c * 32)).unwrap();
        // Round K/V to the layer's type first, so the dense reference sees what the pool holds.
        let k = Tensor::from_f32(dt, &[c * HKV * E], &rng.normals(c * HKV * E)).to_f32();
        let v = Tensor::from_f32(dt, &[c * HKV * E], &rng.normals(c * HKV * E)).to_f32();
        ix.append_kv(s, &k, &v).unwrap();
        hist.k[s].extend(&k);
        hist.v[s].extend(&v);
    }
    let t: usize = counts.iter().sum();
    (rng.tensor(dt, &[t, 4, 32]), rng.tensor(dt, &[t, H, E]))
}

fn gpu(ix: &mut QsaIndexer, counts: &[usize], qi: &Tensor, q: &Tensor) -> TensorMap {
    let out = pollster::block_on(ix.step_with_attention(counts, qi, q)).unwrap();
    pollster::block_on(out.read(&util::ctx())).unwrap()
}

/// Dense causal GQA attention of the step's rows over each sequence's whole history.
fn dense(
    hist: &History,
    lens: &[usize],
    counts: &[usize],
    q: &Tensor,
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    let q = q.to_f32();
    let scale = 1.0 / (E as f32).sqrt();
    let mut out = Vec::new();
    let mut t = 0;
    for (s, &c) in counts.iter().enumerate() {
        for p in lens[s] - c..lens[s] {
            for h in 0..H {
                let kh = h / (H / HKV);
                let qr = &q[(t * H + h) * E..][..E];
                let row = |m: &[f32], j: usize| m[(j * HKV + kh) * E..][..E].to_vec();
                let z: Vec<f32> = (0..=p)
                    .map(|j| {
                        scale
                            * qr.iter()
                                .zip(row(&hist.k[s], j))
                                .map(|(a, b)| a * b)
                                .sum::<f32>()
                    })
                    .collect();
                let sink = sinks.map(|x| x[h]);
                let m = z
                    .iter()
                    .copied()
                    .chain(sink)
                    .fold(f32::NEG_INFINITY, f32::max);
                let mut den = sink.map_or(0.0, |x| (x - m).exp());
                let mut o = vec![0f32; E];
                for (j, zj) in z.iter().enumerate() {
                    let w = (zj - m).exp();
                    den += w;
                    o.iter_mut()
                        .zip(row(&hist.v[s], j))
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
fn attention_step_equals_cpu_step() {
    let mut rng = Rng::new(81);
    for (dt, hs, sinks) in [
        (DType::F32, 1, None),
        (
            DType::F32,
            2,
            Some(vec![0.5, -1.0, 2.0, 0.0, 1.0, -3.0, 0.25, 4.0]),
        ),
    ] {
        // k = 5: long rows really select.
        let cfg = config(dt, 5, hs, sinks);
        let mut ix = layer(&cfg, &mut rng);
        let mut hist = History::default();
        let mut groups = 0;
        for (i, counts) in [[60, 37, 5], [1, 40, 1], [1, 1, 1], [2, 1, 0]]
            .iter()
            .enumerate()
        {
            let (qi, q) = feed(&mut ix, &mut rng, &mut hist, counts);
            let got = gpu(&mut ix, counts, &qi, &q);
            let want = ix.step_cpu_with_attention(counts, &qi, &q).unwrap();
            for name in ["block_indices", "token_indices", "token_count"] {
                assert_eq!(got[name], want[name], "{dt} hs {hs} step {i}: {name}");
            }
            compare(&got["out"], &want["out"], attention_tol(dt))
                .unwrap_or_else(|e| panic!("{dt} hs {hs} step {i}: out: {e}"));
            // The stage alone on some rows, over the GPU's selection.
            let t: usize = counts.iter().sum();
            let rows = [0, t / 2, t - 1];
            let part = ix.attention_cpu(counts, &got, &q, &rows).unwrap();
            let row = H * E;
            let all = got["out"].to_f32();
            let picked: Vec<f32> = rows
                .iter()
                .flat_map(|&r| all[r * row..][..row].to_vec())
                .collect();
            compare(
                &Tensor::from_f32(dt, &[3, H, E], &picked),
                &part,
                attention_tol(dt),
            )
            .unwrap_or_else(|e| panic!("{dt} hs {hs} step {i}: rows {rows:?}: {e}"));
            if i == 0 {
                groups = ix.bind_groups_created();
            }
        }
        assert_eq!(
            ix.bind_groups_created(),
            groups,
            "a bind group after step 0"
        );
    }
}

#[test]
fn with_every_block_selected_it_is_dense_attention() {
    let mut rng = Rng::new(82);
    for dt in [DType::F32, DType::F16, DType::BF16] {
        let sinks = (dt == DType::F16).then(|| (0..H).map(|h| h as f32 - 3.0).collect::<Vec<_>>());
        // k = 48 = max_len / r: every visible block is selected.
        let cfg = config(dt, 48, 2, sinks.clone());
        let mut ix = layer(&cfg, &mut rng);
        let mut hist = History::default();
        // A chunked prefill, then a decode loop; the dense reference covers every row.
        let steps: Vec<[usize; 3]> =
            vec![[50, 17, 1], [30, 0, 64], [1, 1, 1], [1, 1, 1], [3, 1, 1]];
        for (i, counts) in steps.iter().enumerate() {
            let (qi, q) = feed(&mut ix, &mut rng, &mut hist, counts);
            let got = gpu(&mut ix, counts, &qi, &q);
            let lens: Vec<usize> = (0..3).map(|s| ix.len(s)).collect();
            let want = dense(&hist, &lens, counts, &q, sinks.as_deref());
            let want = Tensor::from_f32(dt, &got["out"].shape, &want);
            compare(&got["out"], &want, attention_tol(dt))
                .unwrap_or_else(|e| panic!("{dt} step {i}: {e}"));
        }
    }
}

#[test]
fn misuse_is_a_typed_error() {
    let mut rng = Rng::new(83);
    let cfg = config(DType::F32, 4, 1, None);
    let mut ix = layer(&cfg, &mut rng);
    ix.append_keys(0, &rng.normals(10 * 32)).unwrap();
    // K/V past the index keys.
    let e = ix
        .append_kv(0, &vec![0.0; 11 * HKV * E], &vec![0.0; 11 * HKV * E])
        .unwrap_err();
    assert!(e.to_string().contains("qsa_indexer"), "{e}");
    // A step whose K/V do not cover the keys.
    ix.append_kv(0, &vec![0.0; 9 * HKV * E], &vec![0.0; 9 * HKV * E])
        .unwrap();
    let qi = Tensor::zeros(DType::F32, &[10, 4, 32]);
    let q = Tensor::zeros(DType::F32, &[10, H, E]);
    let e = pollster::block_on(ix.step_with_attention(&[10, 0, 0], &qi, &q)).err();
    assert!(format!("{e:?}").contains("K/V of 9"), "{e:?}");
    // A wrong query shape.
    ix.append_kv(0, &vec![0.0; HKV * E], &vec![0.0; HKV * E])
        .unwrap();
    let bad = Tensor::zeros(DType::F32, &[10, H, E + 1]);
    assert!(pollster::block_on(ix.step_with_attention(&[10, 0, 0], &qi, &bad)).is_err());
    // A layer without attention.
    let plain = IndexerConfig {
        attention: None,
        ..cfg
    };
    let mut ix = layer(&plain, &mut rng);
    ix.append_keys(0, &rng.normals(32)).unwrap();
    assert!(ix.append_kv(0, &[0.0; HKV * E], &[0.0; HKV * E]).is_err());
    let qi = Tensor::zeros(DType::F32, &[1, 4, 32]);
    let q = Tensor::zeros(DType::F32, &[1, H, E]);
    assert!(pollster::block_on(ix.step_with_attention(&[1, 0, 0], &qi, &q)).is_err());
}

#[test]
fn tiny_pool_shards_give_the_same_step() {
    // pool_shard_pages = 1 and 2: every KV page in its own (or a pair's) storage buffer, pages
    // handed out shuffled, so one row's tokens spread over many shards; the step must equal the
    // CPU twin over the host mirror, and dense attention when every block is selected.
    let mut rng = Rng::new(84);
    for (dt, shard_pages, k) in [(DType::F32, 1, 5), (DType::BF16, 2, 48)] {
        let cfg = IndexerConfig {
            pool_shard_pages: Some(shard_pages),
            ..config(
                dt,
                k,
                1,
                Some(vec![0.5, -1.0, 2.0, 0.0, 1.0, -3.0, 0.25, 4.0]),
            )
        };
        let sinks = cfg.attention.as_ref().unwrap().sinks.clone();
        let mut ix = layer(&cfg, &mut rng);
        let mut hist = History::default();
        let mut groups = 0;
        for (i, counts) in [[60, 37, 5], [1, 40, 1], [1, 1, 1], [33, 1, 2]]
            .iter()
            .enumerate()
        {
            let (qi, q) = feed(&mut ix, &mut rng, &mut hist, counts);
            let got = gpu(&mut ix, counts, &qi, &q);
            let want = ix.step_cpu_with_attention(counts, &qi, &q).unwrap();
            assert_eq!(got["token_indices"], want["token_indices"], "step {i}");
            compare(&got["out"], &want["out"], attention_tol(dt))
                .unwrap_or_else(|e| panic!("{dt} shards of {shard_pages} step {i}: {e}"));
            if k == 48 {
                let lens: Vec<usize> = (0..3).map(|s| ix.len(s)).collect();
                let dense = dense(&hist, &lens, counts, &q, sinks.as_deref());
                let dense = Tensor::from_f32(dt, &got["out"].shape, &dense);
                compare(&got["out"], &dense, attention_tol(dt))
                    .unwrap_or_else(|e| panic!("{dt} step {i}: dense: {e}"));
            }
            if i == 0 {
                groups = ix.bind_groups_created();
            }
        }
        assert_eq!(
            ix.bind_groups_created(),
            groups,
            "a bind group after step 0"
        );
    }
}
