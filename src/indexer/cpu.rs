//! The CPU step: the same step as the GPU one, composed operator by operator through the CPU
//! references (the registry of `crate::ops`), over the host mirrors of the pool and the block
//! keys.

use super::QsaIndexer;
use crate::error::Result;
use crate::ops::{self, Exec, TensorMap};
use crate::tensor::Tensor;

impl QsaIndexer {
    /// The same step through the CPU references, composed operator by operator. Updates the
    /// host mirror of the block keys; returns the four outputs and the
    /// `scores` they were selected from.
    pub fn step_cpu(
        &mut self,
        new_tokens: &[usize],
        index_query_raw: &Tensor,
    ) -> Result<TensorMap> {
        let c = self.cfg.clone();
        let (offsets, cache, positions, table) = self.step_tensors(new_tokens)?;
        let n = cache.len();
        let t = positions.len();
        let counts: Vec<i32> = offsets
            .windows(2)
            .zip(&cache)
            .map(|(o, c)| (c + o[1] - o[0]) as i32)
            .collect();
        let rows_used = n * self.max_blocks;
        let mut keys = self.block_keys.clone();
        keys.shape = vec![self.cfg.max_seqs * self.max_blocks, c.di];
        let used = Tensor::from_bytes(
            c.dtype,
            &[rows_used, c.di],
            keys.data[..rows_used * c.di * c.dtype.size()].to_vec(),
        )?;
        let j = |v: serde_json::Value| v;
        let mut m = TensorMap::new();
        m.insert("kv_blocks".into(), self.pool.tensor());
        m.insert("page_table".into(), table);
        m.insert("cache_lengths".into(), Tensor::from_u32(&[n], &cache));
        m.insert("key_counts".into(), Tensor::from_i32(&[n], &counts));
        m.insert("gamma".into(), self.k_norm.clone());
        m.insert("freqs_cis".into(), self.freqs.clone());
        m.insert("block_keys".into(), used);
        let a = [
            ("ratio", j(c.r.into())),
            ("epsilon", j(c.epsilon.into())),
            ("norm_weight_offset", j(c.k_norm_offset.into())),
        ];
        let a = a.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let new_keys = ops::run_blocking("qsa_compress_paged", &m, &a, Exec::Cpu)?
            .remove("block_keys")
            .unwrap();
        let nb = new_keys.data.len();
        self.block_keys.data[..nb].copy_from_slice(&new_keys.data);

        let mut m = TensorMap::new();
        m.insert("index_query_raw".into(), index_query_raw.clone());
        m.insert("q_norm_weight".into(), self.q_norm.clone());
        m.insert("freqs_cis".into(), self.freqs.clone());
        m.insert("positions".into(), Tensor::from_i32(&[t], &positions));
        let a = [
            ("epsilon", j(c.epsilon.into())),
            ("norm_weight_offset", j(c.q_norm_offset.into())),
        ];
        let a = a.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let q = ops::run_blocking("qsa_prepare_query", &m, &a, Exec::Cpu)?
            .remove("index_query")
            .unwrap();

        let mut m = TensorMap::new();
        m.insert("index_query".into(), q);
        m.insert("block_keys".into(), new_keys);
        m.insert("row_offsets".into(), Tensor::from_u32(&[n + 1], &offsets));
        m.insert("cache_lengths".into(), Tensor::from_u32(&[n], &cache));
        let mut a: crate::ops::AttrMap = [
            ("ratio", j(c.r.into())),
            ("num_selection_heads", j(c.hs.into())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        if let Some(s) = c.scale {
            a.insert("scale".into(), j(s.into()));
        }
        let scores = ops::run_blocking("block_score", &m, &a, Exec::Cpu)?
            .remove("scores")
            .unwrap();
        let scores_kept = scores.clone();
        let m = TensorMap::from([("scores".to_string(), scores)]);
        let a = [("k".to_string(), j(c.k.into()))].into_iter().collect();
        let mut sel = ops::run_blocking("block_topk", &m, &a, Exec::Cpu)?;
        let mut m = TensorMap::new();
        m.insert("block_indices".into(), sel["block_indices"].clone());
        m.insert("block_count".into(), sel["block_count"].clone());
        m.insert("positions".into(), Tensor::from_i32(&[t], &positions));
        let a = [("ratio".to_string(), j(c.r.into()))].into_iter().collect();
        let route = ops::run_blocking("expand_route", &m, &a, Exec::Cpu)?;
        sel.extend(route);
        sel.insert("scores".into(), scores_kept);
        Ok(sel)
    }
}
