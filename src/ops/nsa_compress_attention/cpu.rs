//! The CPU reference of `nsa_compress_attention`, written to read like SPEC §8.1 step by step:
//! per query head the logits, the softmax over the visible compressed tokens, the output with
//! `round_T(P_j)`, the per-head selection scores by Ascend's mapping (summed literally over
//! m and n), their sum over the KV head's group, the forced blocks, then the selection of
//! SPEC §0 (the `block_topk` reference, fed −inf past each batch's nsel).

use super::{validate, NsaCompressAttentionAttrs, NsaCompressAttentionInputs};
use super::{NsaCompressAttentionOutputs, Plan};
use crate::error::Result;
use crate::ops::block_topk;
use crate::tensor::{DType, Tensor};

/// The reference outputs and the aggregated selection scores `[rows, N2, W]` f32 that the
/// top-k ranked (+inf for forced blocks, −inf past a batch's nsel and on padding rows).
pub fn reference(
    x: &NsaCompressAttentionInputs,
    a: &NsaCompressAttentionAttrs,
) -> Result<(NsaCompressAttentionOutputs, Vec<f32>)> {
    let p = validate(x, a)?;
    let (q, kc, vc) = (x.query.to_f32(), x.key.to_f32(), x.value.to_f32());
    let (n1, n2, dqk, dv, w) = (p.n1, p.n2, p.dqk, p.dv, p.w);
    let g = n1 / n2;
    let mut out = vec![0f32; p.rows * n1 * dv];
    let mut agg = vec![f32::NEG_INFINITY; p.rows * n2 * w];
    // Element offset of compressed token j of batch b, KV head h2, in a cache of width `width`.
    let at = |b: usize, j: usize, h2: usize, width: usize| {
        let blk = p.table[b * p.max_blocks + j / p.page] as usize;
        (blk * p.page + j % p.page) * n2 * width + h2 * width
    };
    for r in 0..p.rows {
        let Some((b, s)) = p.locate(r) else { continue };
        let (c, ns) = (p.cmp_len[b] as usize, p.nsel[b]);
        let vis = visible_set(&p, b, s);
        for h2 in 0..n2 {
            let row = &mut agg[(r * n2 + h2) * w..][..w];
            row[..ns].fill(0.0);
            for h in h2 * g..(h2 + 1) * g {
                let qrow = &q[(r * n1 + h) * dqk..][..dqk];
                // 1. logits of the visible compressed tokens
                let x: Vec<f32> = (0..c)
                    .map(|j| {
                        let krow = &kc[at(b, j, h2, dqk)..][..dqk];
                        let dot: f32 = qrow.iter().zip(krow).map(|(a, b)| a * b).sum();
                        p.scale * dot
                    })
                    .collect();
                // 2. softmax over the visible ones, output with P rounded to T
                let m = (0..c)
                    .filter(|&j| vis[j])
                    .map(|j| x[j])
                    .fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = (0..c)
                    .map(|j| if vis[j] { (x[j] - m).exp() } else { 0.0 })
                    .collect();
                let sum: f32 = e.iter().sum();
                let prob: Vec<f32> = (0..c)
                    .map(|j| if vis[j] { e[j] / sum } else { 0.0 })
                    .collect();
                let o = &mut out[(r * n1 + h) * dv..][..dv];
                for j in (0..c).filter(|&j| vis[j]) {
                    let pj = p.dt.round(prob[j]);
                    let vrow = &vc[at(b, j, h2, dv)..][..dv];
                    for (acc, v) in o.iter_mut().zip(vrow) {
                        *acc += pj * v;
                    }
                }
                // 3.–4. per-head selection scores, summed over the group
                for (o, slot) in row[..ns].iter_mut().enumerate() {
                    *slot += ascend_score(&prob, o, p.lsel / p.d, p.l / p.d);
                }
            }
            force_blocks(&mut row[..ns]);
        }
    }
    let out = Tensor::from_f32(p.dt, &p.out_shape(), &out);
    let scores = Tensor::from_f32(DType::F32, &[p.rows, n2, w], &agg);
    let sel = block_topk::cpu(
        &block_topk::BlockTopkInputs { scores: &scores },
        &block_topk::BlockTopkAttrs { k: p.k },
    )?;
    let topk = Tensor::from_bytes(DType::I32, &p.topk_shape(), sel.block_indices.data)?;
    Ok((NsaCompressAttentionOutputs { out, topk }, agg))
}

/// The CPU reference outputs.
pub fn cpu(
    x: &NsaCompressAttentionInputs,
    a: &NsaCompressAttentionAttrs,
) -> Result<NsaCompressAttentionOutputs> {
    Ok(reference(x, a)?.0)
}

/// Which compressed tokens token s of batch b sees: j with `j·d + l − 1 ≤ p` under the causal
/// mask, all of them otherwise.
fn visible_set(p: &Plan, b: usize, s: usize) -> Vec<bool> {
    let c = p.cmp_len[b] as usize;
    if !p.causal {
        return vec![true; c];
    }
    let pos = p.sel_len[b] as i64 - p.q_len[b] as i64 + s as i64;
    (0..c).map(|j| (j * p.d + p.l) as i64 - 1 <= pos).collect()
}

/// Ascend's mapping of one head's probabilities onto selection block o:
/// `Σ_{m < S'} Σ_{n < N'} P[S'·(o+1) − m − n]`, terms outside `0 … c − 1` being 0.
pub fn ascend_score(prob: &[f32], o: usize, s_sel: usize, n_cmp: usize) -> f32 {
    let mut acc = 0f32;
    for m in 0..s_sel {
        for n in 0..n_cmp {
            let j = (s_sel * (o + 1)) as i64 - m as i64 - n as i64;
            if j >= 0 && (j as usize) < prob.len() {
                acc += prob[j as usize];
            }
        }
    }
    acc
}

/// Blocks 0, nsel − 2 and nsel − 1 (those that exist) get +inf.
pub fn force_blocks(row: &mut [f32]) {
    let ns = row.len();
    for o in [Some(0), ns.checked_sub(2), ns.checked_sub(1)]
        .into_iter()
        .flatten()
    {
        if o < ns {
            row[o] = f32::INFINITY;
        }
    }
}
