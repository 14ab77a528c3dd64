//! `nsa_compress_attention` (SPEC §8.1, Ascend aclnnNsaCompressAttentionInfer): attention of
//! each query over the paged compressed K/V cache, and the NSA block selection derived from its
//! softmax. This file holds the attributes, inputs, outputs and the checked plan; `validate.rs`
//! every host-checkable rule, `cpu.rs` the reference, `gpu.rs` the GPU path (three stages,
//! `shaders/nsa_compress_attention*.wgsl`, then the `block_topk` selection over the aggregated
//! scores).

mod cpu;
mod gpu;
mod validate;

pub use cpu::{cpu, reference};
pub use gpu::{
    dispatch_nsa_compress_attention, encode_nsa_compress_attention, gpu, gpu_with_split,
    logits_subgroup_pass, loop_iterations, scratch_words, split1_for, split2_for, texture_copies,
    texture_stages, values_subgroup_pass, NsaAttnBuffers, NsaAttnTensors,
    NsaCompressAttentionParams, LOGITS_GPU, LOGITS_SG, LOGITS_SG_TEX, LOGITS_SG_W32, SPLIT1,
    SPLIT1_GPU, SPLITS2, STAGES, VALUES_GPU, VALUES_SG, VALUES_SG_TEX, VALUES_SG_W32,
};
pub use validate::validate;

use super::common::*;
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

pub const OP: &str = "nsa_compress_attention";

/// Largest Dqk (the GPU stages the query 128 channels at a time; the limit is the contract's).
pub const MAX_DQK: usize = 512;
/// Largest Dv: 16 output channels per invocation of a 64-wide workgroup covers 1024; the limit
/// is the contract's.
pub const MAX_DV: usize = 512;
/// Largest `actual_q_len` entry (Ascend's limit).
pub const MAX_Q_LEN: usize = 16;

/// Query / output layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `[T, N, D]`, the rows of batch b packed in batch order.
    Tnd,
    /// `[B, S, N, D]`, rows `s ≥ actual_q_len[b]` are padding.
    Bsnd,
}

/// Attributes of `nsa_compress_attention`.
#[derive(Clone, Debug)]
pub struct NsaCompressAttentionAttrs {
    /// N1; `None`: taken from `query`.
    pub num_heads: Option<usize>,
    /// N2; `None`: the width of `key` divided by Dqk.
    pub num_kv_heads: Option<usize>,
    /// l.
    pub compress_block_size: usize,
    /// d.
    pub compress_stride: usize,
    /// l'.
    pub select_block_size: usize,
    /// k.
    pub select_block_count: usize,
    /// `None`: 1 / sqrt(Dqk).
    pub scale: Option<f32>,
    pub layout: Layout,
    pub causal_mask: bool,
}

impl NsaCompressAttentionAttrs {
    pub fn from_map(a: &AttrMap) -> Result<Self> {
        let pos = |name: &str| -> Result<usize> {
            Ok(attr_int_in(OP, a, name, None, 1, 1 << 24)? as usize)
        };
        let opt_pos = |name: &str| -> Result<Option<usize>> {
            match attr_opt_usize(OP, a, name)? {
                Some(0) => Err(Error::attr(OP, name, "must be >= 1, got 0")),
                v => Ok(v),
            }
        };
        let (l, d, lsel) = (
            pos("compress_block_size")?,
            pos("compress_stride")?,
            pos("select_block_size")?,
        );
        if !l.is_multiple_of(d) {
            return Err(Error::attr(
                OP,
                "compress_stride",
                format!("d = {d} does not divide compress_block_size l = {l}"),
            ));
        }
        if !lsel.is_multiple_of(d) || lsel < l {
            return Err(Error::attr(
                OP,
                "select_block_size",
                format!("l' = {lsel} must be a multiple of d = {d} and >= l = {l}"),
            ));
        }
        let k = pos("select_block_count")?;
        if k > super::block_topk::MAX_K {
            return Err(Error::attr(
                OP,
                "select_block_count",
                format!("{k} exceeds {}", super::block_topk::MAX_K),
            ));
        }
        let scale = attr_opt_f32(OP, a, "scale")?;
        let layout = match attr_str(OP, a, "layout", "TND")?.as_str() {
            "TND" => Layout::Tnd,
            "BSND" => Layout::Bsnd,
            other => {
                return Err(Error::attr(
                    OP,
                    "layout",
                    format!("must be \"TND\" or \"BSND\", got {other:?}"),
                ))
            }
        };
        Ok(NsaCompressAttentionAttrs {
            num_heads: opt_pos("num_heads")?,
            num_kv_heads: opt_pos("num_kv_heads")?,
            compress_block_size: l,
            compress_stride: d,
            select_block_size: lsel,
            select_block_count: k,
            scale,
            layout,
            causal_mask: attr_bool(OP, a, "causal_mask", false)?,
        })
    }
}

/// Inputs of `nsa_compress_attention`.
pub struct NsaCompressAttentionInputs<'a> {
    pub query: &'a Tensor,
    pub key: &'a Tensor,
    pub value: &'a Tensor,
    pub block_table: &'a Tensor,
    pub actual_q_len: Option<&'a Tensor>,
    pub actual_cmp_kv_len: &'a Tensor,
    pub actual_sel_kv_len: Option<&'a Tensor>,
}

impl<'a> NsaCompressAttentionInputs<'a> {
    pub fn from_map(m: &'a TensorMap) -> Result<Self> {
        Ok(NsaCompressAttentionInputs {
            query: req(OP, m, "query")?,
            key: req(OP, m, "key")?,
            value: req(OP, m, "value")?,
            block_table: req(OP, m, "block_table")?,
            actual_q_len: opt(m, "actual_q_len"),
            actual_cmp_kv_len: req(OP, m, "actual_cmp_kv_len")?,
            actual_sel_kv_len: opt(m, "actual_sel_kv_len"),
        })
    }
}

/// Outputs of `nsa_compress_attention`.
#[derive(Clone, Debug, PartialEq)]
pub struct NsaCompressAttentionOutputs {
    /// `[T, N1, Dv]` or `[B, S, N1, Dv]` T; padding rows 0.
    pub out: Tensor,
    /// `[T, N2, k]` or `[B, S, N2, k]` i32; padding rows −1.
    pub topk: Tensor,
}

impl NsaCompressAttentionOutputs {
    pub fn into_map(self) -> TensorMap {
        TensorMap::from([
            ("out".to_string(), self.out),
            ("topk".to_string(), self.topk),
        ])
    }
}

/// Selection blocks of a batch with `c` compressed tokens: `ceil(((c − 1)·d + l) / l')`.
pub fn nsel(c: usize, l: usize, d: usize, lsel: usize) -> usize {
    ((c.max(1) - 1) * d + l).div_ceil(lsel)
}

/// The checked geometry of one call.
pub struct Plan {
    pub dt: DType,
    pub layout: Layout,
    pub batches: usize,
    /// S of BSND (0 for TND).
    pub seq: usize,
    /// Query rows: T, or B·S.
    pub rows: usize,
    pub n1: usize,
    pub n2: usize,
    pub dqk: usize,
    pub dv: usize,
    /// Compressed tokens per cache block (P).
    pub page: usize,
    pub num_blocks: usize,
    /// Columns of `block_table`.
    pub max_blocks: usize,
    pub l: usize,
    pub d: usize,
    pub lsel: usize,
    pub k: usize,
    pub scale: f32,
    pub causal: bool,
    pub q_len: Vec<u32>,
    pub cmp_len: Vec<u32>,
    /// Raw lengths L_b (0 where absent; only read with the causal mask).
    pub sel_len: Vec<u32>,
    /// First row of each batch, then the row count: `[B + 1]`.
    pub q_start: Vec<u32>,
    pub table: Vec<i64>,
    pub nsel: Vec<usize>,
    /// Largest c_b (row stride of the GPU's probability scratch).
    pub c_max: usize,
    /// Largest nsel (row width of the selection scores).
    pub w: usize,
}

impl Plan {
    /// Batch and in-batch index of query row `r`; `None` for a BSND padding row.
    pub fn locate(&self, r: usize) -> Option<(usize, usize)> {
        let (b, s) = match self.layout {
            Layout::Bsnd => (r / self.seq, r % self.seq),
            Layout::Tnd => {
                let b = self.q_start.partition_point(|&o| o as usize <= r) - 1;
                (b, r - self.q_start[b] as usize)
            }
        };
        (s < self.q_len[b] as usize).then_some((b, s))
    }

    /// Compressed tokens that token s of batch b sees: a prefix `0 … vis − 1`.
    pub fn visible(&self, b: usize, s: usize) -> usize {
        let c = self.cmp_len[b] as usize;
        if !self.causal {
            return c;
        }
        let p = self.sel_len[b] as usize - self.q_len[b] as usize + s;
        if p + 1 < self.l {
            0
        } else {
            c.min((p + 1 - self.l) / self.d + 1)
        }
    }

    /// Shape of `out`.
    pub fn out_shape(&self) -> Vec<usize> {
        match self.layout {
            Layout::Tnd => vec![self.rows, self.n1, self.dv],
            Layout::Bsnd => vec![self.batches, self.seq, self.n1, self.dv],
        }
    }

    /// Shape of `topk`.
    pub fn topk_shape(&self) -> Vec<usize> {
        match self.layout {
            Layout::Tnd => vec![self.rows, self.n2, self.k],
            Layout::Bsnd => vec![self.batches, self.seq, self.n2, self.k],
        }
    }

    /// The block table as the shaders read it: `[B, max_blocks]` u32.
    pub fn table_words(&self) -> Vec<u32> {
        self.table.iter().map(|&v| v as u32).collect()
    }

    /// The shader's `[4·B + 1]` lengths buffer: q_len, cmp_kv_len, sel_kv_len, q_start.
    pub fn lens(&self) -> Vec<u32> {
        [&self.q_len, &self.cmp_len, &self.sel_len, &self.q_start]
            .into_iter()
            .flatten()
            .copied()
            .collect()
    }
}
