//! Every host-checkable rule of SPEC §8.1 for `nsa_compress_attention`, turned into a
//! [`Plan`]: shapes, types, attributes, lengths, block-table entries and k ≤ nsel.

use super::{nsel, Layout, NsaCompressAttentionAttrs, NsaCompressAttentionInputs, Plan};
use super::{MAX_DQK, MAX_DV, MAX_Q_LEN, OP};
use crate::error::{Error, Result};
use crate::ops::block_topk;
use crate::ops::common::*;
use crate::tensor::Tensor;

/// A per-batch length input: B entries, B being the length of `actual_cmp_kv_len`.
fn lengths(name: &str, t: &Tensor, b: usize) -> Result<Vec<u32>> {
    let why = format!("one per batch: actual_cmp_kv_len has B = {b}");
    shape_because(OP, name, t, &[b], Some(&why))?;
    uints(OP, name, t)
}

/// Every host-checkable rule of SPEC §8.1 (block-table entries included: they are host data).
pub fn validate(x: &NsaCompressAttentionInputs, a: &NsaCompressAttentionAttrs) -> Result<Plan> {
    let dt = float_type(OP, "query", x.query)?;
    let want_rank = if a.layout == Layout::Tnd { 3 } else { 4 };
    let qs = rank(OP, "query", x.query, want_rank)?;
    let (n1, dqk) = (qs[want_rank - 2], qs[want_rank - 1]);
    if n1 == 0 || !(1..=MAX_DQK).contains(&dqk) {
        return Err(Error::input(
            OP,
            "query",
            format!("shape {qs:?}: N1 must be >= 1 and Dqk in 1..={MAX_DQK}"),
        ));
    }
    if let Some(h) = a.num_heads.filter(|&h| h != n1) {
        return Err(Error::attr(
            OP,
            "num_heads",
            format!("{h} differs from the query's N1 = {n1}"),
        ));
    }
    float_of(OP, "key", x.key, dt)?;
    float_of(OP, "value", x.value, dt)?;
    let &[num_blocks, page, kw] = rank(OP, "key", x.key, 3)? else {
        unreachable!()
    };
    let &[vb, vp, vw] = rank(OP, "value", x.value, 3)? else {
        unreachable!()
    };
    if num_blocks == 0 || page == 0 {
        return Err(Error::input(
            OP,
            "key",
            format!("zero-sized axis in shape {:?}", x.key.shape),
        ));
    }
    if (vb, vp) != (num_blocks, page) {
        return Err(Error::input(
            OP,
            "value",
            format!(
                "shape {:?} does not match key's [{num_blocks}, {page}, _]",
                x.value.shape
            ),
        ));
    }
    let n2 = a.num_kv_heads.unwrap_or(kw / dqk);
    if n2 == 0 || kw != n2 * dqk {
        return Err(Error::input(
            OP,
            "key",
            format!("last axis {kw} is not N2 · Dqk with N2 = {n2}, Dqk = {dqk}"),
        ));
    }
    if !n1.is_multiple_of(n2) {
        return Err(Error::attr(
            OP,
            "num_kv_heads",
            format!("N2 = {n2} does not divide N1 = {n1}"),
        ));
    }
    let dv = vw / n2;
    if !vw.is_multiple_of(n2) || !(1..=MAX_DV).contains(&dv) {
        return Err(Error::input(
            OP,
            "value",
            format!("last axis {vw} is not N2 · Dv with N2 = {n2}, Dv in 1..={MAX_DV}"),
        ));
    }
    rank(OP, "actual_cmp_kv_len", x.actual_cmp_kv_len, 1)?;
    let cmp_len = uints(OP, "actual_cmp_kv_len", x.actual_cmp_kv_len)?;
    let batches = cmp_len.len();
    if batches == 0 {
        return Err(Error::input(OP, "actual_cmp_kv_len", "holds no batch"));
    }
    let q_len = match x.actual_q_len {
        Some(t) => lengths("actual_q_len", t, batches)?,
        None => vec![1; batches],
    };
    if let Some((b, v)) = q_len
        .iter()
        .enumerate()
        .find(|(_, &v)| v == 0 || v as usize > MAX_Q_LEN)
    {
        return Err(Error::input(
            OP,
            "actual_q_len",
            format!("batch {b}: {v} is outside 1..={MAX_Q_LEN}"),
        ));
    }
    let mut q_start = vec![0u32];
    for &q in &q_len {
        q_start.push(q_start.last().unwrap() + q);
    }
    let (rows, seq) = match a.layout {
        Layout::Tnd => {
            let (t, sum) = (qs[0], *q_start.last().unwrap() as usize);
            if t != sum {
                return Err(Error::input(
                    OP,
                    "actual_q_len",
                    format!("sums to {sum} rows, query has T = {t}"),
                ));
            }
            (t, 0)
        }
        Layout::Bsnd => {
            let (qb, s) = (qs[0], qs[1]);
            if qb != batches {
                return Err(Error::input(
                    OP,
                    "query",
                    format!("has {qb} batches, actual_cmp_kv_len has {batches}"),
                ));
            }
            if let Some(b) = (0..batches).find(|&b| q_len[b] as usize > s) {
                return Err(Error::input(
                    OP,
                    "actual_q_len",
                    format!("batch {b}: {} exceeds S = {s}", q_len[b]),
                ));
            }
            q_start = (0..=batches).map(|b| (b * s) as u32).collect();
            (batches * s, s)
        }
    };
    let sel_len = match x.actual_sel_kv_len {
        Some(t) => lengths("actual_sel_kv_len", t, batches)?,
        None if a.causal_mask => {
            return Err(Error::input(
                OP,
                "actual_sel_kv_len",
                "required input is missing (causal_mask is on)",
            ))
        }
        None => vec![0; batches],
    };
    let &[tb, max_blocks] = rank(OP, "block_table", x.block_table, 2)? else {
        unreachable!()
    };
    if tb != batches {
        return Err(Error::input(
            OP,
            "block_table",
            format!("has {tb} rows for {batches} batches"),
        ));
    }
    let table = ints(OP, "block_table", x.block_table)?;
    let (l, d, lsel, k) = (
        a.compress_block_size,
        a.compress_stride,
        a.select_block_size,
        a.select_block_count,
    );
    let mut nsels = Vec::with_capacity(batches);
    for b in 0..batches {
        let c = cmp_len[b] as usize;
        if c == 0 || c > 1 << 24 {
            return Err(Error::input(
                OP,
                "actual_cmp_kv_len",
                format!("batch {b}: {c} is outside 1..=2^24"),
            ));
        }
        let cols = c.div_ceil(page);
        if cols > max_blocks {
            return Err(Error::input(
                OP,
                "block_table",
                format!("batch {b}: {c} compressed tokens need {cols} columns, the table has {max_blocks}"),
            ));
        }
        for col in 0..cols {
            let e = table[b * max_blocks + col];
            if e < 0 || e as usize >= num_blocks {
                return Err(Error::input(
                    OP,
                    "block_table",
                    format!("batch {b}, column {col}: block {e} is outside 0..{num_blocks}"),
                ));
            }
        }
        if a.causal_mask && sel_len[b] < q_len[b] {
            return Err(Error::input(
                OP,
                "actual_sel_kv_len",
                format!("batch {b}: {} < actual_q_len {}", sel_len[b], q_len[b]),
            ));
        }
        let ns = nsel(c, l, d, lsel);
        if k > ns {
            return Err(Error::attr(
                OP,
                "select_block_count",
                format!("k = {k} exceeds nsel = {ns} of batch {b} ({c} compressed tokens)"),
            ));
        }
        nsels.push(ns);
    }
    let w = *nsels.iter().max().unwrap();
    if w > block_topk::MAX_W {
        return Err(Error::input(
            OP,
            "actual_cmp_kv_len",
            format!("{w} selection blocks exceed {}", block_topk::MAX_W),
        ));
    }
    Ok(Plan {
        dt,
        layout: a.layout,
        batches,
        seq,
        rows,
        n1,
        n2,
        dqk,
        dv,
        page,
        num_blocks,
        max_blocks,
        l,
        d,
        lsel,
        k,
        scale: a.scale.unwrap_or(1.0 / (dqk as f32).sqrt()),
        causal: a.causal_mask,
        q_len,
        cmp_len: cmp_len.clone(),
        sel_len,
        q_start,
        table,
        nsel: nsels,
        c_max: *cmp_len.iter().max().unwrap() as usize,
        w,
    })
}
