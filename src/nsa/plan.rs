//! The host plan of a step, shared by the GPU and CPU paths: which slots take part, their
//! lengths before and after, the windows they complete, their page and block tables, and the
//! checks a step with queries must pass before anything is recorded.

use super::{NsaConfig, NsaSelector, OP};
use crate::error::{Error, Result};
use crate::ops::nsa_compress::windows;
use crate::ops::nsa_compress_attention::{nsel, MAX_Q_LEN};
use crate::ops::sparse_attention;
use crate::paged::PoolLayout;
use crate::tensor::Tensor;

/// The host plan of one step: the batch (slots with new tokens, in slot order) and what each
/// stage needs of it. Shared by the GPU and CPU paths.
pub(crate) struct StepPlan {
    pub slots: Vec<usize>,
    /// New tokens (query rows) per batch entry.
    pub new: Vec<usize>,
    /// Raw tokens after the step, L_b.
    pub len: Vec<usize>,
    /// Compressed tokens before the step: the first window the step completes.
    pub first_win: Vec<usize>,
    /// Compressed tokens after the step, c_b.
    pub cmp: Vec<usize>,
    /// `[B, max_pages]`, unused entries u32::MAX.
    pub page_table: Vec<u32>,
    /// `[B, max_cmp_blocks]`, unused entries u32::MAX (−1 as i32).
    pub cmp_table: Vec<u32>,
    /// Position of every query row, `[T]`.
    pub positions: Vec<i32>,
}

impl StepPlan {
    pub fn rows(&self) -> usize {
        self.positions.len()
    }

    /// First query row of each batch entry, then T.
    pub fn row_offsets(&self) -> Vec<u32> {
        offsets(&self.new)
    }

    /// Tokens of each entry cached before the step's new ones.
    pub fn cached_lengths(&self) -> Vec<u32> {
        self.len
            .iter()
            .zip(&self.new)
            .map(|(&len, &new)| (len - new) as u32)
            .collect()
    }

    /// First output row of each entry's new windows, then their total.
    pub fn win_offsets(&self) -> Vec<u32> {
        let new: Vec<usize> = (0..self.slots.len())
            .map(|b| self.cmp[b] - self.first_win[b])
            .collect();
        offsets(&new)
    }
}

fn offsets(counts: &[usize]) -> Vec<u32> {
    let mut v = vec![0u32];
    for &c in counts {
        v.push(v.last().unwrap() + c as u32);
    }
    v
}

impl NsaSelector {
    /// The plan of a step over the appended tokens: `new_tokens` holds one count per slot (0
    /// for a free slot or a sequence with nothing new).
    pub(crate) fn plan(&self, new_tokens: &[usize]) -> Result<StepPlan> {
        self.pool.check_step_counts(OP, new_tokens.len())?;
        let c = &self.cfg;
        let (mp, mc) = (c.max_pages(), c.max_cmp_blocks());
        let mut p = StepPlan {
            slots: Vec::new(),
            new: Vec::new(),
            len: Vec::new(),
            first_win: Vec::new(),
            cmp: Vec::new(),
            page_table: Vec::new(),
            cmp_table: Vec::new(),
            positions: Vec::new(),
        };
        for (s, &new) in new_tokens.iter().enumerate().filter(|(_, &n)| n > 0) {
            let len = self.len(s);
            if new > len {
                return Err(Error::input(
                    OP,
                    "new_tokens",
                    format!("slot {s}: {new} new tokens but {len} appended"),
                ));
            }
            p.slots.push(s);
            p.new.push(new);
            p.len.push(len);
            p.first_win.push(windows(len - new, c.l, c.d));
            p.cmp.push(windows(len, c.l, c.d));
            p.positions.extend((len - new..len).map(|q| q as i32));
            let blocks = self.cmp_table(s);
            p.cmp_table.extend_from_slice(blocks);
            p.cmp_table
                .resize(p.cmp_table.len() + mc - blocks.len(), u32::MAX);
        }
        p.page_table = self.pool.page_rows(&p.slots, mp, u32::MAX);
        Ok(p)
    }

    /// [`plan`](Self::plan) of a step with queries: checks what compressed attention needs of
    /// each sequence (1 … 16 new tokens, c_b ≥ 1, k ≤ nsel) and the query's shape.
    pub(crate) fn query_plan(&self, new_tokens: &[usize], query: &Tensor) -> Result<StepPlan> {
        let p = self.plan(new_tokens)?;
        let c = &self.cfg;
        if p.slots.is_empty() {
            return Err(Error::input(
                OP,
                "new_tokens",
                "a step needs at least one sequence with new tokens",
            ));
        }
        for (b, &s) in p.slots.iter().enumerate() {
            let ns = nsel(p.cmp[b].max(1), c.l, c.d, c.lsel);
            if p.new[b] > MAX_Q_LEN || p.cmp[b] == 0 || c.k > ns {
                return Err(Error::input(
                    OP,
                    "new_tokens",
                    format!(
                        "slot {s}: {} new tokens (at most {MAX_Q_LEN} per step), {} raw / {} compressed tokens, nsel {ns} (k = {} needs nsel >= k); feed shorter contexts with extend",
                        p.new[b], p.len[b], p.cmp[b], c.k
                    ),
                ));
            }
        }
        let t = p.rows();
        if t > c.max_step_rows {
            return Err(Error::input(
                OP,
                "new_tokens",
                format!("{t} query rows > max_step_rows {}", c.max_step_rows),
            ));
        }
        if query.shape != [t, c.n1, c.dqk] || query.dtype != c.dtype {
            return Err(Error::input(
                OP,
                "query",
                format!(
                    "expected [{t}, {}, {}] {}, got {:?} {}",
                    c.n1, c.dqk, c.dtype, query.shape, query.dtype
                ),
            ));
        }
        Ok(p)
    }
}

/// The selected attention's geometry for `t` rows of `n` sequences over the raw pool `layout`:
/// H = N1, Hs = N2 (Hkv = N2 from the pool), W = k·l'.
pub(crate) fn attention_geometry(
    c: &NsaConfig,
    layout: PoolLayout,
    t: usize,
    n: usize,
) -> sparse_attention::AttentionGeometry {
    sparse_attention::AttentionGeometry {
        t,
        n,
        h: c.n1,
        hs: c.n2,
        w: c.route_width(),
        layout,
        layer_idx: 0,
        max_pages: c.max_pages(),
        scale: Some(c.softmax_scale()),
        has_sinks: false,
    }
}
