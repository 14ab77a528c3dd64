//! The CPU step: the same step as the GPU one, composed from the CPU references over the host
//! mirrors — `nsa_compress` over the gathered windows (scattered into the mirror caches),
//! `nsa_compress_attention`, the expand port, `sparse_attention`. The registry runs
//! `nsa_compress` and `sparse_attention`; `nsa_compress_attention` is called through its
//! `reference`, the same code, because the check of a selection wants the scores it ranked.

use super::stages::select_expand_cpu;
use super::{NsaSelector, StepPlan};
use crate::error::Result;
use crate::ops::nsa_compress_attention::{
    reference, Layout, NsaCompressAttentionAttrs, NsaCompressAttentionInputs,
};
use crate::ops::{self, AttrMap, Exec, TensorMap};
use crate::tensor::{DType, Tensor};
use serde_json::json;

impl NsaSelector {
    /// The same step through the CPU references. Writes the completed windows into the host
    /// mirrors of the compressed caches; returns `out`, `cmp_out`, `topk`, `token_indices`,
    /// `token_count` and the `scores [T, N2, W]` f32 the selection ranked.
    pub fn step_cpu(&mut self, new_tokens: &[usize], query: &Tensor) -> Result<TensorMap> {
        let plan = self.query_plan(new_tokens, query)?;
        self.compress_cpu(&plan)?;
        let (cmp, scores) = self.cmp_attention_cpu(&plan, query)?;
        let mut m = self.attend_plan_cpu(&plan, query, &cmp.topk)?;
        let w = scores.len() / (plan.rows() * self.cfg.n2).max(1);
        m.insert("cmp_out".into(), cmp.out);
        m.insert("topk".into(), cmp.topk);
        m.insert(
            "scores".into(),
            Tensor::from_f32(DType::F32, &[plan.rows(), self.cfg.n2, w], &scores),
        );
        Ok(m)
    }

    /// [`extend`](NsaSelector::extend) on the CPU: the completed windows into the host mirrors.
    pub fn extend_cpu(&mut self, new_tokens: &[usize]) -> Result<()> {
        let plan = self.plan(new_tokens)?;
        self.compress_cpu(&plan)
    }

    /// The selected branch alone on the CPU, for a given selection `topk [T, N2, k]` (e.g. the
    /// GPU's, when it differs from the CPU's by a near tie): `token_indices`, `token_count`
    /// and `out`. Changes nothing.
    pub fn attend_cpu(
        &self,
        new_tokens: &[usize],
        query: &Tensor,
        topk: &Tensor,
    ) -> Result<TensorMap> {
        let plan = self.query_plan(new_tokens, query)?;
        self.attend_plan_cpu(&plan, query, topk)
    }

    /// Compresses the windows the step completes: gathers their raw rows (K, then V) from the
    /// pool mirror, runs `nsa_compress` over them (one sequence per batch entry, starting at
    /// its first new window), and writes the rows into the cache mirrors by the block table.
    fn compress_cpu(&mut self, plan: &StepPlan) -> Result<()> {
        let c = self.cfg.clone();
        let (l, es, ps) = (self.pool.layout, c.dtype.size(), c.page_size);
        for plane in 0..2 {
            let width = if plane == 0 { c.dqk } else { c.dv };
            let (mut input, mut seq_lens) = (Vec::new(), Vec::new());
            for (b, &slot) in plan.slots.iter().enumerate() {
                if plan.cmp[b] == plan.first_win[b] {
                    continue;
                }
                let first = plan.first_win[b] * c.d;
                let end = (plan.cmp[b] - 1) * c.d + c.l;
                let pages = self.pool.tables[slot].as_deref().unwrap();
                for pos in first..end {
                    for h in 0..c.n2 {
                        let at = l.offset(pages[pos / ps] as usize, plane, 0, pos % ps, h) * es;
                        input.extend_from_slice(&self.pool.data.data[at..at + width * es]);
                    }
                }
                seq_lens.push((end - first) as i32);
            }
            if seq_lens.is_empty() {
                continue;
            }
            let rows = input.len() / (c.n2 * width * es);
            let weight = if plane == 0 { &self.w_k } else { &self.w_v };
            let m = TensorMap::from([
                (
                    "input".to_string(),
                    Tensor::from_bytes(c.dtype, &[rows, c.n2, width], input)?,
                ),
                ("weight".to_string(), weight.clone()),
                (
                    "seq_lens".to_string(),
                    Tensor::from_i32(&[seq_lens.len()], &seq_lens),
                ),
            ]);
            let a = AttrMap::from([("l".to_string(), json!(c.l)), ("d".to_string(), json!(c.d))]);
            let out = cpu_op("nsa_compress", &m, &a)?.remove("out").unwrap();
            let cache = if plane == 0 {
                &mut self.cmp_key
            } else {
                &mut self.cmp_value
            };
            let row = c.n2 * width * es;
            let mut src = 0;
            for (b, &slot) in plan.slots.iter().enumerate() {
                let blocks = self.cmp_tables[slot].as_deref().unwrap();
                for i in plan.first_win[b]..plan.cmp[b] {
                    let dst = (blocks[i / c.cmp_page_size] as usize * c.cmp_page_size
                        + i % c.cmp_page_size)
                        * row;
                    cache.data[dst..dst + row].copy_from_slice(&out.data[src..src + row]);
                    src += row;
                }
            }
        }
        Ok(())
    }

    /// `nsa_compress_attention` (causal, TND) over the cache mirrors: its outputs and the
    /// aggregated selection scores `[T·N2, W]`.
    fn cmp_attention_cpu(
        &self,
        plan: &StepPlan,
        query: &Tensor,
    ) -> Result<(
        ops::nsa_compress_attention::NsaCompressAttentionOutputs,
        Vec<f32>,
    )> {
        let c = &self.cfg;
        let nb = plan.slots.len();
        let ints = |v: &[usize]| {
            let v: Vec<i32> = v.iter().map(|&x| x as i32).collect();
            Tensor::from_i32(&[v.len()], &v)
        };
        let table: Vec<i32> = plan.cmp_table.iter().map(|&x| x as i32).collect();
        let table = Tensor::from_i32(&[nb, c.max_cmp_blocks()], &table);
        let (q_len, cmp, sel) = (ints(&plan.new), ints(&plan.cmp), ints(&plan.len));
        let x = NsaCompressAttentionInputs {
            query,
            key: &self.cmp_key,
            value: &self.cmp_value,
            block_table: &table,
            actual_q_len: Some(&q_len),
            actual_cmp_kv_len: &cmp,
            actual_sel_kv_len: Some(&sel),
        };
        let a = NsaCompressAttentionAttrs {
            num_heads: Some(c.n1),
            num_kv_heads: Some(c.n2),
            compress_block_size: c.l,
            compress_stride: c.d,
            select_block_size: c.lsel,
            select_block_count: c.k,
            scale: Some(c.softmax_scale()),
            layout: Layout::Tnd,
            causal_mask: true,
        };
        reference(&x, &a)
    }

    /// Expand and `sparse_attention` for the selection `topk`.
    fn attend_plan_cpu(&self, plan: &StepPlan, query: &Tensor, topk: &Tensor) -> Result<TensorMap> {
        let c = &self.cfg;
        let nb = plan.slots.len();
        let (tokens, count) = select_expand_cpu(topk, &plan.positions, c.lsel)?;
        let cached = plan.cached_lengths();
        let rows = plan.row_offsets();
        let mut m = TensorMap::from([
            ("query".to_string(), query.clone()),
            ("kv_blocks".to_string(), self.pool.tensor()),
            (
                "page_table".to_string(),
                Tensor::from_u32(&[nb, c.max_pages()], &plan.page_table),
            ),
            (
                "row_offsets".to_string(),
                Tensor::from_u32(&[nb + 1], &rows),
            ),
            (
                "cache_lengths".to_string(),
                Tensor::from_u32(&[nb], &cached),
            ),
            ("token_indices".to_string(), tokens),
            ("token_count".to_string(), count),
        ]);
        let a = AttrMap::from([
            ("scale".to_string(), json!(c.softmax_scale())),
            ("v_head_dim".to_string(), json!(c.dv)),
        ]);
        let out = cpu_op("sparse_attention", &m, &a)?.remove("out").unwrap();
        let mut take = |name: &str| (name.to_string(), m.remove(name).unwrap());
        Ok(TensorMap::from([
            ("out".to_string(), out),
            take("token_indices"),
            take("token_count"),
        ]))
    }
}

/// Runs a CPU reference through the registry. The CPU path never waits on anything, so the
/// future completes on its first poll (also in the browser, where nothing may block).
fn cpu_op(op: &str, m: &TensorMap, a: &AttrMap) -> Result<TensorMap> {
    futures::executor::block_on(ops::run(op, m, a, Exec::Cpu))
}
