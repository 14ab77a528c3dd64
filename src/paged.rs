//! The paged KV pool of SPEC §0: layout `[num_pages, 2, num_layers, page_size, num_kv_heads,
//! head_dim]` (plane 0 = K, plane 1 = V), pages `page_stride` elements apart, and page tables
//! that map a sequence's position `p` to page `page_table[n, p / page_size]`, row
//! `p mod page_size`.

use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

/// Geometry of a paged pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolLayout {
    pub num_pages: usize,
    pub num_layers: usize,
    pub page_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Elements from one page to the next (≥ the packed page size).
    pub page_stride: usize,
}

impl PoolLayout {
    /// A packed layout.
    pub fn packed(
        num_pages: usize,
        num_layers: usize,
        page_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        let mut l = PoolLayout {
            num_pages,
            num_layers,
            page_size,
            num_kv_heads,
            head_dim,
            page_stride: 0,
        };
        l.page_stride = l.page_elems();
        l
    }

    /// Elements of one packed page: `2 · num_layers · page_size · num_kv_heads · head_dim`.
    pub fn page_elems(&self) -> usize {
        2 * self.num_layers * self.page_size * self.num_kv_heads * self.head_dim
    }

    /// Element offset of (page, plane, layer, row, head, channel 0).
    pub fn offset(
        &self,
        page: usize,
        plane: usize,
        layer: usize,
        row: usize,
        head: usize,
    ) -> usize {
        page * self.page_stride
            + (((plane * self.num_layers + layer) * self.page_size + row) * self.num_kv_heads
                + head)
                * self.head_dim
    }

    /// Elements a tensor must hold for this layout.
    pub fn required_elems(&self) -> usize {
        if self.num_pages == 0 {
            0
        } else {
            (self.num_pages - 1) * self.page_stride + self.page_elems()
        }
    }

    /// Reads the layout of a pool tensor: rank 6 `[num_pages, 2, num_layers, page_size,
    /// num_kv_heads, head_dim]`, or rank 5 without the heads axis when `heads_optional` (the
    /// single-head indexer pool). With a `page_stride` larger than the packed page, the
    /// tensor's elements are read as consecutive pages of that stride, and `num_pages` is the
    /// number of pages whose elements all lie in the tensor (the last one need not be followed
    /// by a full stride).
    pub fn from_tensor(
        op: &'static str,
        name: &str,
        t: &Tensor,
        page_stride: Option<i64>,
        heads_optional: bool,
    ) -> Result<Self> {
        let s = &t.shape;
        let (np, two, layers, ps, heads, hd) = match s.len() {
            6 => (s[0], s[1], s[2], s[3], s[4], s[5]),
            5 if heads_optional => (s[0], s[1], s[2], s[3], 1, s[4]),
            _ => {
                return Err(Error::input(
                    op,
                    name,
                    format!(
                        "expected a pool [num_pages, 2, num_layers, page_size, num_kv_heads, head_dim], got shape {s:?}"
                    ),
                ))
            }
        };
        if two != 2 {
            return Err(Error::input(
                op,
                name,
                format!("axis 1 must be 2 (K, V planes), got {two}"),
            ));
        }
        if layers == 0 || ps == 0 || heads == 0 || hd == 0 {
            return Err(Error::input(
                op,
                name,
                format!("zero-sized axis in pool shape {s:?}"),
            ));
        }
        let mut l = PoolLayout::packed(np, layers, ps, heads, hd);
        if let Some(stride) = page_stride {
            if stride < l.page_elems() as i64 {
                return Err(Error::input(
                    op,
                    name,
                    format!(
                        "page_stride {stride} is smaller than a packed page of {} elements",
                        l.page_elems()
                    ),
                ));
            }
            l.page_stride = stride as usize;
            let total = t.numel();
            l.num_pages = if total < l.page_elems() {
                0
            } else {
                (total - l.page_elems()) / l.page_stride + 1
            };
        }
        if l.num_pages == 0 || t.numel() < l.required_elems() {
            return Err(Error::input(
                op,
                name,
                format!(
                    "pool of {} elements is too small for its layout: pages of {} elements \
                     (page_size {} × num_kv_heads {} × head_dim {} × 2 planes × {} layers) \
                     {} elements apart, {} pages",
                    t.numel(),
                    l.page_elems(),
                    l.page_size,
                    l.num_kv_heads,
                    l.head_dim,
                    l.num_layers,
                    l.page_stride,
                    l.num_pages
                ),
            ));
        }
        Ok(l)
    }
}

/// A host-side paged pool with per-sequence page tables: enough to build the inputs of the
/// paged operators and to grow sequences token by token in a decode loop.
#[derive(Clone, Debug)]
pub struct PagedPool {
    pub layout: PoolLayout,
    pub data: Tensor,
    /// Free pages, popped from the back.
    free: Vec<u32>,
    /// Page list of each live sequence (`None` once freed).
    pub tables: Vec<Option<Vec<u32>>>,
    /// Tokens held by each sequence.
    pub lengths: Vec<usize>,
}

impl PagedPool {
    /// A zeroed pool; pages are handed out in the order of `page_order` (e.g. shuffled).
    pub fn new(layout: PoolLayout, dtype: DType, page_order: Vec<u32>) -> Self {
        let layout = PoolLayout::packed(
            layout.num_pages,
            layout.num_layers,
            layout.page_size,
            layout.num_kv_heads,
            layout.head_dim,
        );
        let mut free = page_order;
        free.reverse();
        PagedPool {
            layout,
            data: Tensor::zeros(dtype, &[layout.required_elems()]),
            free,
            tables: Vec::new(),
            lengths: Vec::new(),
        }
    }

    /// Starts an empty sequence and returns its id: the lowest freed slot, else a new one.
    pub fn add_sequence(&mut self) -> usize {
        if let Some(s) = self.tables.iter().position(|t| t.is_none()) {
            self.tables[s] = Some(Vec::new());
            self.lengths[s] = 0;
            return s;
        }
        self.tables.push(Some(Vec::new()));
        self.lengths.push(0);
        self.tables.len() - 1
    }

    /// [`PagedPool::add_sequence`] for a layer of at most `max_seqs` live sequences: past
    /// that, an input error of operator `op`.
    pub fn add_sequence_within(&mut self, op: &'static str, max_seqs: usize) -> Result<usize> {
        let live = self.tables.iter().filter(|t| t.is_some()).count();
        if live >= max_seqs {
            return Err(Error::input(
                op,
                "sequences",
                format!("already {live} of max_seqs {max_seqs}"),
            ));
        }
        Ok(self.add_sequence())
    }

    /// Checks that a step of operator `op` gives one new-token count per slot (`counts`).
    pub fn check_step_counts(&self, op: &'static str, counts: usize) -> Result<()> {
        let slots = self.tables.len();
        if counts != slots {
            return Err(Error::input(
                op,
                "new_tokens",
                format!(
                    "a step takes one count per slot (0 for a free slot): got {counts} for {slots} slots"
                ),
            ));
        }
        Ok(())
    }

    /// Returns a sequence's pages to the free list.
    pub fn free_sequence(&mut self, seq: usize) {
        if let Some(pages) = self.tables.get_mut(seq).and_then(|t| t.take()) {
            self.free.extend(pages.into_iter().rev());
            self.lengths[seq] = 0;
        }
    }

    /// Shortens sequence `seq` to its first `len` tokens (a rejected draft, a rolled-back
    /// turn); pages past the new end go back to the free list.
    pub fn truncate(&mut self, seq: usize, len: usize) {
        let ps = self.layout.page_size;
        if let Some(Some(pages)) = self.tables.get_mut(seq) {
            if len < self.lengths[seq] {
                self.lengths[seq] = len;
                let keep = len.div_ceil(ps);
                self.free.extend(pages.drain(keep..).rev());
            }
        }
    }

    /// Appends `tokens` rows of `[num_kv_heads · head_dim]` values (as f32, rounded to the
    /// pool type) to plane `plane`, layer `layer` of sequence `seq`, growing its page table.
    pub fn append(&mut self, seq: usize, plane: usize, layer: usize, rows: &[f32]) -> Result<()> {
        let l = self.layout;
        let w = l.num_kv_heads * l.head_dim;
        let count = rows.len() / w;
        let start = self.lengths[seq];
        self.reserve(seq, start + count)?;
        let table = self.tables[seq].as_ref().unwrap().clone();
        let es = self.data.dtype.size();
        for t in 0..count {
            let pos = start + t;
            let page = table[pos / l.page_size] as usize;
            let off = l.offset(page, plane, layer, pos % l.page_size, 0);
            let src = Tensor::from_f32(self.data.dtype, &[w], &rows[t * w..(t + 1) * w]);
            self.data.data[off * es..(off + w) * es].copy_from_slice(&src.data);
        }
        Ok(())
    }

    /// Marks `count` more tokens as held by `seq` (after every plane/layer was appended).
    pub fn commit(&mut self, seq: usize, count: usize) {
        self.lengths[seq] += count;
    }

    /// Makes sure `seq` has pages for `len` tokens.
    pub fn reserve(&mut self, seq: usize, len: usize) -> Result<()> {
        let need = len.div_ceil(self.layout.page_size);
        let table = self.tables[seq].as_mut().ok_or_else(|| {
            Error::input(
                "paged_pool",
                "sequence",
                format!("sequence {seq} was freed"),
            )
        })?;
        while table.len() < need {
            let page = self.free.pop().ok_or_else(|| {
                Error::input(
                    "paged_pool",
                    "pages",
                    format!("out of pages (pool has {})", self.layout.num_pages),
                )
            })?;
            table.push(page);
        }
        Ok(())
    }

    /// Page tables of `seqs` as a `[N, max_pages]` u32 tensor, unused entries `fill` (a freed
    /// sequence has none).
    pub fn page_table(&self, seqs: &[usize], max_pages: usize, fill: u32) -> Tensor {
        let v = self.page_rows(seqs, max_pages, fill);
        Tensor::from_u32(&[seqs.len(), max_pages], &v)
    }

    /// The values of [`PagedPool::page_table`], row after row.
    pub fn page_rows(&self, seqs: &[usize], max_pages: usize, fill: u32) -> Vec<u32> {
        let mut v = vec![fill; seqs.len() * max_pages];
        for (i, &s) in seqs.iter().enumerate() {
            let pages = self.tables.get(s).and_then(|t| t.as_deref()).unwrap_or(&[]);
            for (j, &p) in pages.iter().enumerate().take(max_pages) {
                v[i * max_pages + j] = p;
            }
        }
        v
    }

    /// The pool as the rank-6 tensor the operators take (pages packed, so with
    /// `page_stride` equal to the packed page size).
    pub fn tensor(&self) -> Tensor {
        let l = self.layout;
        let mut t = self.data.clone();
        t.shape = vec![
            l.num_pages,
            2,
            l.num_layers,
            l.page_size,
            l.num_kv_heads,
            l.head_dim,
        ];
        t
    }
}
