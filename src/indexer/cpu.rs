//! The CPU step: the same step as the GPU one, composed operator by operator through the CPU
//! references (the registry of `crate::ops`), over the host mirrors of the pool and the block
//! keys.

use super::QsaIndexer;
use crate::error::Result;
use crate::ops::{self, AttrMap, Exec, TensorMap};
use crate::tensor::Tensor;

impl QsaIndexer {
    /// The same step through the CPU references, composed operator by operator. Updates the
    /// host mirror of the block keys; returns the four outputs and the `scores` they were
    /// selected from.
    pub fn step_cpu(
        &mut self,
        new_tokens: &[usize],
        index_query_raw: &Tensor,
    ) -> Result<TensorMap> {
        let c = self.cfg.clone();
        let (offsets, cache, positions, _) = self.step_tensors(new_tokens)?;
        let n = cache.len();
        let t = positions.len();
        let j = |v: serde_json::Value| v;
        let new_keys = self.compress_cpu(new_tokens)?;

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
        let q = cpu_op("qsa_prepare_query", &m, &a)?
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
        let scores = cpu_op("block_score", &m, &a)?.remove("scores").unwrap();
        let scores_kept = scores.clone();
        let m = TensorMap::from([("scores".to_string(), scores)]);
        let a = [("k".to_string(), j(c.k.into()))].into_iter().collect();
        let mut sel = cpu_op("block_topk", &m, &a)?;
        let mut m = TensorMap::new();
        m.insert("block_indices".into(), sel["block_indices"].clone());
        m.insert("block_count".into(), sel["block_count"].clone());
        m.insert("positions".into(), Tensor::from_i32(&[t], &positions));
        let a = [("ratio".to_string(), j(c.r.into()))].into_iter().collect();
        let route = cpu_op("expand_route", &m, &a)?;
        sel.extend(route);
        sel.insert("scores".into(), scores_kept);
        Ok(sel)
    }

    /// [`extend`](QsaIndexer::extend) on the CPU: compresses the blocks the appended keys
    /// complete into the host mirror of the block keys.
    pub fn extend_cpu(&mut self, new_tokens: &[usize]) -> Result<()> {
        self.compress_cpu(new_tokens).map(|_| ())
    }

    /// The compress stage on the CPU; returns the block keys of the step's slots.
    fn compress_cpu(&mut self, new_tokens: &[usize]) -> Result<Tensor> {
        let c = &self.cfg;
        let (offsets, cache, _, table) = self.step_tensors(new_tokens)?;
        let n = cache.len();
        let counts: Vec<i32> = offsets
            .windows(2)
            .zip(&cache)
            .map(|(o, c)| (c + o[1] - o[0]) as i32)
            .collect();
        let bytes = n * self.max_blocks * c.di * c.dtype.size();
        let used = Tensor::from_bytes(
            c.dtype,
            &[n * self.max_blocks, c.di],
            self.block_keys.data[..bytes].to_vec(),
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
        let new_keys = cpu_op("qsa_compress_paged", &m, &a)?
            .remove("block_keys")
            .unwrap();
        self.block_keys.data[..bytes].copy_from_slice(&new_keys.data);
        Ok(new_keys)
    }
}

/// Runs a CPU reference through the registry. The CPU path never waits on anything, so the
/// future completes on its first poll (also in the browser, where nothing may block).
fn cpu_op(op: &str, m: &TensorMap, a: &AttrMap) -> Result<TensorMap> {
    futures::executor::block_on(ops::run(op, m, a, Exec::Cpu))
}
