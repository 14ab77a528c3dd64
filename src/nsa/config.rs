//! The configuration of an NSA selector: the layer's geometry, its numerics and the sizes its
//! buffers are allocated for, with the rules they must follow.

use super::OP;
use crate::error::{Error, Result};
use crate::ops::block_topk;
use crate::ops::nsa_compress::windows;
use crate::ops::nsa_compress_attention::{nsel, MAX_DQK, MAX_DV, MAX_Q_LEN};
use crate::tensor::DType;

/// Geometry and numerics of one NSA layer's selection path.
#[derive(Clone, Debug)]
pub struct NsaConfig {
    /// Query heads N1.
    pub n1: usize,
    /// KV heads N2 (divides N1).
    pub n2: usize,
    pub dqk: usize,
    pub dv: usize,
    /// Compression window l.
    pub l: usize,
    /// Compression stride d.
    pub d: usize,
    /// Selection block l'.
    pub lsel: usize,
    /// Selected blocks per KV head k.
    pub k: usize,
    /// Softmax scale of both branches. `None`: 1 / sqrt(Dqk).
    pub scale: Option<f32>,
    pub dtype: DType,
    /// Raw tokens per page of the raw pool.
    pub page_size: usize,
    /// Compressed tokens per block of the compressed caches (P).
    pub cmp_page_size: usize,
    /// Longest sequence (raw tokens).
    pub max_len: usize,
    /// Sequences served at once.
    pub max_seqs: usize,
    /// Most query rows (new tokens of all sequences) in one step; sizes the step's buffers.
    pub max_step_rows: usize,
}

impl NsaConfig {
    /// The NSA paper's geometry: N1 = 64, N2 = 4, Dqk = 192, Dv = 128, l = 32, d = 16,
    /// l' = 64, k = 16; pages of 128 raw and 128 compressed tokens; up to 16 query rows per
    /// sequence and step.
    pub fn paper(dtype: DType, max_len: usize, max_seqs: usize) -> Self {
        NsaConfig {
            n1: 64,
            n2: 4,
            dqk: 192,
            dv: 128,
            l: 32,
            d: 16,
            lsel: 64,
            k: 16,
            scale: None,
            dtype,
            page_size: 128,
            cmp_page_size: 128,
            max_len,
            max_seqs,
            max_step_rows: MAX_Q_LEN * max_seqs,
        }
    }

    /// Channels of a raw pool row per head: max(Dqk, Dv).
    pub fn pool_dim(&self) -> usize {
        self.dqk.max(self.dv)
    }

    /// Page-table columns of one sequence.
    pub fn max_pages(&self) -> usize {
        self.max_len.div_ceil(self.page_size)
    }

    /// Compressed tokens of the longest sequence.
    pub fn max_cmp(&self) -> usize {
        windows(self.max_len, self.l, self.d)
    }

    /// Block-table columns of one sequence's compressed cache.
    pub fn max_cmp_blocks(&self) -> usize {
        self.max_cmp().div_ceil(self.cmp_page_size).max(1)
    }

    /// Widest selection row: nsel of the longest sequence.
    pub fn max_nsel(&self) -> usize {
        nsel(self.max_cmp().max(1), self.l, self.d, self.lsel)
    }

    /// Token slots of a selection row: k · l'.
    pub fn route_width(&self) -> usize {
        self.k * self.lsel
    }

    /// Softmax scale.
    pub fn softmax_scale(&self) -> f32 {
        self.scale.unwrap_or(1.0 / (self.dqk as f32).sqrt())
    }

    pub(super) fn check(&self) -> Result<()> {
        let bad = |name: &str, msg: String| Err(Error::input(OP, name, msg));
        if self.n2 == 0 || !self.n1.is_multiple_of(self.n2) {
            return bad(
                "config.n2",
                format!("N2 = {} must divide N1 = {}", self.n2, self.n1),
            );
        }
        if !(1..=MAX_DQK).contains(&self.dqk) || !(1..=MAX_DV).contains(&self.dv) {
            return bad(
                "config.dqk",
                format!(
                    "Dqk = {} and Dv = {} must be in 1..={MAX_DQK} / 1..={MAX_DV}",
                    self.dqk, self.dv
                ),
            );
        }
        let (l, d, lsel) = (self.l, self.d, self.lsel);
        if d == 0 || !l.is_multiple_of(d) || !lsel.is_multiple_of(d) || lsel < l {
            return bad(
                "config.l",
                format!("need d | l, d | l', l' >= l; got l = {l}, d = {d}, l' = {lsel}"),
            );
        }
        if self.k == 0 || self.k > block_topk::MAX_K || self.max_nsel() > block_topk::MAX_W {
            return bad(
                "config.k",
                format!(
                    "k = {} must be in 1..={}, nsel = {} at most {}",
                    self.k,
                    block_topk::MAX_K,
                    self.max_nsel(),
                    block_topk::MAX_W
                ),
            );
        }
        let zero = [
            self.page_size,
            self.cmp_page_size,
            self.max_len,
            self.max_seqs,
            self.max_step_rows,
        ];
        if zero.contains(&0) {
            return bad(
                "config",
                "page sizes, max_len, max_seqs and max_step_rows must be positive".into(),
            );
        }
        let odd = |w: usize| !(self.n2 * w).is_multiple_of(2);
        if !self.dtype.is_float() || (self.dtype != DType::F32 && (odd(self.dqk) || odd(self.dv))) {
            return bad(
                "config.dtype",
                format!(
                    "{}: a float type, and for 16-bit types N2·Dqk and N2·Dv even (rows of whole words)",
                    self.dtype
                ),
            );
        }
        Ok(())
    }
}
