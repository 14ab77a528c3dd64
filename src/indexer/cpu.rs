//! The CPU step: the same step as the GPU one, composed operator by operator through the CPU
//! references (the registry of `crate::ops`), over the host mirrors of the pool and the block
//! keys.

use super::QsaIndexer;
use crate::error::Result;
use crate::ops::{self, AttrMap, TensorMap};
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
        let q = ops::run_cpu("qsa_prepare_query", &m, &a)?
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
        let scores = ops::run_cpu("block_score", &m, &a)?
            .remove("scores")
            .unwrap();
        let scores_kept = scores.clone();
        let m = TensorMap::from([("scores".to_string(), scores)]);
        let a = [("k".to_string(), j(c.k.into()))].into_iter().collect();
        let mut sel = ops::run_cpu("block_topk", &m, &a)?;
        let mut m = TensorMap::new();
        m.insert("block_indices".into(), sel["block_indices"].clone());
        m.insert("block_count".into(), sel["block_count"].clone());
        m.insert("positions".into(), Tensor::from_i32(&[t], &positions));
        let a = [("ratio".to_string(), j(c.r.into()))].into_iter().collect();
        let route = ops::run_cpu("expand_route", &m, &a)?;
        sel.extend(route);
        sel.insert("scores".into(), scores_kept);
        Ok(sel)
    }

    /// [`step_with_attention`](QsaIndexer::step_with_attention) on the CPU: the step, then
    /// `sparse_attention` over its selection and the host mirror of the KV pool; returns the
    /// step's outputs, its `scores` and `out`.
    pub fn step_cpu_with_attention(
        &mut self,
        new_tokens: &[usize],
        index_query_raw: &Tensor,
        query: &Tensor,
    ) -> Result<TensorMap> {
        if self.kv.is_none() {
            return Err(crate::Error::input(
                super::OP,
                "query",
                "the layer was configured without attention".to_string(),
            ));
        }
        self.check_kv_complete()?;
        let mut sel = self.step_cpu(new_tokens, index_query_raw)?;
        let rows: Vec<usize> = (0..sel["token_count"].shape[0]).collect();
        let out = self.attention_cpu(new_tokens, &sel, query, &rows)?;
        sel.insert("out".into(), out);
        Ok(sel)
    }

    /// The attention stage alone on the CPU, for some rows of the step just taken: `sel` holds
    /// the step's `token_indices` and `token_count` (e.g. the GPU's, read back), `query` is the
    /// step's `[T, H, E]`, `rows` the row numbers to compute. Returns `[rows.len(), H, E]`.
    /// Call it before the next step (positions come from the sequences' current lengths).
    pub fn attention_cpu(
        &self,
        new_tokens: &[usize],
        sel: &TensorMap,
        query: &Tensor,
        rows: &[usize],
    ) -> Result<Tensor> {
        let Some(kv) = self.kv.as_ref() else {
            return Err(crate::Error::input(
                super::OP,
                "query",
                "the layer was configured without attention".to_string(),
            ));
        };
        let (offsets, _, positions, table) = self.step_tensors(new_tokens)?;
        let pick = |t: &Tensor, name: &str| -> Result<Tensor> {
            let row: usize = t.shape[1..].iter().product::<usize>() * t.dtype.size();
            let mut data = Vec::with_capacity(rows.len() * row);
            for &r in rows {
                if (r + 1) * row > t.data.len() {
                    return Err(crate::Error::input(super::OP, name, format!("no row {r}")));
                }
                data.extend_from_slice(&t.data[r * row..(r + 1) * row]);
            }
            let mut shape = t.shape.clone();
            shape[0] = rows.len();
            Tensor::from_bytes(t.dtype, &shape, data)
        };
        let get = |name: &str| {
            sel.get(name)
                .ok_or_else(|| crate::Error::input(super::OP, name, "missing".to_string()))
        };
        // Each picked row becomes a one-row sequence at its position, with its page table.
        let mp = self.max_pages;
        let mut tab = Vec::new();
        let mut cache = Vec::new();
        for &r in rows {
            let s = offsets.partition_point(|&o| o as usize <= r) - 1;
            cache.push(positions[r] as u32);
            tab.extend_from_slice(&table[s * mp..(s + 1) * mp]);
        }
        let n = rows.len();
        let mut m = TensorMap::new();
        m.insert("query".into(), pick(query, "query")?);
        m.insert("kv_blocks".into(), kv.tensor());
        m.insert("page_table".into(), Tensor::from_u32(&[n, mp], &tab));
        let offs: Vec<u32> = (0..=n as u32).collect();
        m.insert("row_offsets".into(), Tensor::from_u32(&[n + 1], &offs));
        m.insert("cache_lengths".into(), Tensor::from_u32(&[n], &cache));
        m.insert(
            "token_indices".into(),
            pick(get("token_indices")?, "token_indices")?,
        );
        m.insert(
            "token_count".into(),
            pick(get("token_count")?, "token_count")?,
        );
        if let Some(s) = &kv.cfg.sinks {
            m.insert(
                "sinks".into(),
                Tensor::from_f32(crate::DType::F32, &[s.len()], s),
            );
        }
        let mut a = AttrMap::new();
        if let Some(s) = kv.cfg.scale {
            a.insert("scale".into(), s.into());
        }
        Ok(ops::run_cpu("sparse_attention", &m, &a)?
            .remove("out")
            .unwrap())
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
        m.insert(
            "page_table".into(),
            Tensor::from_u32(&[n, self.max_pages], &table),
        );
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
        let new_keys = ops::run_cpu("qsa_compress_paged", &m, &a)?
            .remove("block_keys")
            .unwrap();
        self.block_keys.data[..bytes].copy_from_slice(&new_keys.data);
        Ok(new_keys)
    }
}
