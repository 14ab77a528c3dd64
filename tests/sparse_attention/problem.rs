//! sparse_attention tests: the problem builder shared by the test binaries: a call's
//! geometry (`Shape`), its logical content (`Data`: queries, K and V rows, token lists,
//! sinks) and its tensors (`Problem`) in a garbage-filled pool of shuffled, optionally
//! strided pages; `check`, GPU against the CPU reference; and `Hand`, the fixed inputs of the
//! by-hand cases.
#![allow(dead_code)]

use qsa_wgpu::ops::sparse_attention::{cpu, gpu, SparseAttentionAttrs, SparseAttentionInputs};
use qsa_wgpu::paged::{PagedPool, PoolLayout};
use qsa_wgpu::testing::{attention_tol, compare, Rng};
use qsa_wgpu::{DType, Tensor};

/// Geometry of one problem.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub h: usize,
    pub hkv: usize,
    pub hs: usize,
    pub e: usize,
    pub w: usize,
    pub page: usize,
    pub layers: usize,
    pub layer: usize,
    /// Pages `stride_mul` packed pages apart.
    pub stride_mul: usize,
    /// Value channels Ev; the pool's head_dim is max(E, Ev), the rest of each row garbage.
    pub ev: usize,
}

impl Shape {
    /// Channels of a pool row per head.
    pub fn dp(&self) -> usize {
        self.e.max(self.ev)
    }
}

pub fn shape(h: usize, hkv: usize, hs: usize, e: usize, w: usize) -> Shape {
    Shape {
        h,
        hkv,
        hs,
        e,
        w,
        page: 16,
        layers: 1,
        layer: 0,
        stride_mul: 1,
        ev: e,
    }
}

/// Logical content of a call: queries, each sequence's K and V rows, token lists, sinks.
pub struct Data {
    pub seqs: Vec<(usize, usize)>,
    pub q: Vec<f32>,
    pub kv: Vec<(Vec<f32>, Vec<f32>)>,
    pub tokens: Vec<i32>,
    pub counts: Vec<i32>,
    pub sinks: Option<Vec<f32>>,
}

/// `seqs` holds (cached, new rows) per sequence. Each (row, group) gathers a random subset of
/// 0 ..= p in random order (often the full W); the slots past its count hold junk.
pub fn data(rng: &mut Rng, s: &Shape, seqs: &[(usize, usize)], sinks: bool) -> Data {
    let rows: usize = seqs.iter().map(|x| x.1).sum();
    let width = s.hkv * s.dp();
    let kv = seqs
        .iter()
        .map(|&(c, r)| (rng.normals((c + r) * width), rng.normals((c + r) * width)))
        .collect();
    let mut tokens = vec![0i32; rows * s.hs * s.w];
    let mut counts = vec![0i32; rows * s.hs];
    let mut t = 0;
    for &(c, r) in seqs {
        for p in c..c + r {
            for g in 0..s.hs {
                let most = s.w.min(p + 1);
                let cnt = if rng.below(2) == 0 {
                    most
                } else {
                    rng.below(most + 1)
                };
                let perm = rng.permutation(p + 1);
                let row = &mut tokens[(t * s.hs + g) * s.w..][..s.w];
                for (j, slot) in row.iter_mut().enumerate() {
                    *slot = if j < cnt {
                        perm[j] as i32
                    } else {
                        [-1, i32::MAX, (p + 1 + rng.below(99)) as i32][rng.below(3)]
                    };
                }
                counts[t * s.hs + g] = cnt as i32;
            }
            t += 1;
        }
    }
    let sinks = sinks.then(|| {
        let mut v: Vec<f32> = (0..s.h).map(|_| 2.0 * rng.normal()).collect();
        v[0] = f32::NEG_INFINITY;
        v
    });
    Data {
        seqs: seqs.to_vec(),
        q: rng.normals(rows * s.h * s.e),
        kv,
        tokens,
        counts,
        sinks,
    }
}

/// One call's tensors.
pub struct Problem {
    pub query: Tensor,
    pub pool: Tensor,
    pub table: Tensor,
    pub offsets: Tensor,
    pub cache: Tensor,
    pub tokens: Tensor,
    pub counts: Tensor,
    pub sinks: Option<Tensor>,
    pub attrs: SparseAttentionAttrs,
}

impl Problem {
    pub fn inputs(&self) -> SparseAttentionInputs<'_> {
        SparseAttentionInputs {
            query: &self.query,
            kv_blocks: &self.pool,
            page_table: &self.table,
            row_offsets: &self.offsets,
            cache_lengths: &self.cache,
            token_indices: &self.tokens,
            token_count: &self.counts,
            sinks: self.sinks.as_ref(),
        }
    }
}

/// Lays `d` out in a garbage-filled pool whose pages are handed out in `order` (a permutation
/// of `pages(s, d)`), `s.stride_mul` packed pages apart.
pub fn problem(rng: &mut Rng, dt: DType, s: &Shape, d: &Data, order: Vec<u32>) -> Problem {
    problem_in(rng, dt, s, d, order, None)
}

/// [`problem`] whose pool garbage (every element no sequence wrote) is `fill` where given,
/// random otherwise.
pub fn problem_in(
    rng: &mut Rng,
    dt: DType,
    s: &Shape,
    d: &Data,
    order: Vec<u32>,
    fill: Option<f32>,
) -> Problem {
    let np = order.len();
    let layout = PoolLayout::packed(np, s.layers, s.page, s.hkv, s.dp());
    let mut pool = PagedPool::new(layout, dt, order);
    let n = layout.required_elems();
    pool.data = match fill {
        Some(v) => Tensor::from_f32(dt, &[n], &vec![v; n]),
        None => rng.tensor(dt, &[n]),
    };
    let mut ids = Vec::new();
    for (k, v) in &d.kv {
        let id = pool.add_sequence();
        pool.append(id, 0, s.layer, k).unwrap();
        pool.append(id, 1, s.layer, v).unwrap();
        pool.commit(id, k.len() / (s.hkv * s.dp()));
        ids.push(id);
    }
    let max_pages = d
        .seqs
        .iter()
        .map(|x| (x.0 + x.1).div_ceil(s.page))
        .max()
        .unwrap()
        + 1;
    let pe = layout.page_elems();
    let mut pool_t = pool.tensor();
    if s.stride_mul > 1 {
        let mut strided = rng.tensor(dt, &[np * s.stride_mul * pe]);
        let es = dt.size();
        for i in 0..np {
            let dst = i * s.stride_mul * pe * es;
            strided.data[dst..dst + pe * es]
                .copy_from_slice(&pool_t.data[i * pe * es..][..pe * es]);
        }
        strided.shape = vec![np * s.stride_mul, 2, s.layers, s.page, s.hkv, s.dp()];
        pool_t = strided;
    }
    let rows: usize = d.seqs.iter().map(|x| x.1).sum();
    let mut offs = vec![0u32];
    for x in &d.seqs {
        offs.push(offs.last().unwrap() + x.1 as u32);
    }
    let cache: Vec<u32> = d.seqs.iter().map(|x| x.0 as u32).collect();
    Problem {
        query: Tensor::from_f32(dt, &[rows, s.h, s.e], &d.q),
        pool: pool_t,
        table: pool.page_table(&ids, max_pages, 0xdead_beef),
        offsets: Tensor::from_u32(&[offs.len()], &offs),
        cache: Tensor::from_u32(&[cache.len()], &cache),
        tokens: Tensor::from_i32(&[rows, s.hs, s.w], &d.tokens),
        counts: Tensor::from_i32(&[rows, s.hs], &d.counts),
        sinks: d
            .sinks
            .as_ref()
            .map(|v| Tensor::from_f32(DType::F32, &[s.h], v)),
        attrs: SparseAttentionAttrs {
            scale: None,
            layer_idx: s.layer,
            page_stride: (s.stride_mul > 1).then_some((s.stride_mul * pe) as i64),
            v_head_dim: (s.ev != s.e).then_some(s.ev),
        },
    }
}

pub fn pages(s: &Shape, d: &Data) -> usize {
    d.seqs
        .iter()
        .map(|x| (x.0 + x.1).div_ceil(s.page))
        .sum::<usize>()
        + 3
}

/// Builds a problem with shuffled pages and checks GPU against CPU.
pub fn check(rng: &mut Rng, dt: DType, s: &Shape, seqs: &[(usize, usize)], sinks: bool) {
    let d = data(rng, s, seqs, sinks);
    let order = rng.permutation(pages(s, &d));
    let p = problem(rng, dt, s, &d, order);
    let want = cpu(&p.inputs(), &p.attrs).unwrap();
    let got = pollster::block_on(gpu(&crate::util::ctx(), &p.inputs(), &p.attrs)).unwrap();
    compare(&got, &want, attention_tol(dt))
        .unwrap_or_else(|e| panic!("{dt} {s:?} seqs={seqs:?} sinks={sinks}: {e}"));
}

/// The fixed inputs of the by-hand cases: one sequence of two tokens (one page), one query row
/// at position 1 whose list is `tokens` (two counted, W = 3), scale 1.
pub struct Hand {
    pub table: Tensor,
    pub offs: Tensor,
    pub cache: Tensor,
    pub tok: Tensor,
    pub cnt: Tensor,
}

impl Hand {
    pub fn new(tokens: [i32; 3]) -> Hand {
        Hand {
            table: Tensor::from_u32(&[1, 1], &[0]),
            offs: Tensor::from_u32(&[2], &[0, 1]),
            cache: Tensor::from_u32(&[1], &[1]),
            tok: Tensor::from_i32(&[1, 1, 3], &tokens),
            cnt: Tensor::from_i32(&[1, 1], &[2]),
        }
    }

    pub fn inputs<'a>(
        &'a self,
        query: &'a Tensor,
        kv_blocks: &'a Tensor,
        sinks: Option<&'a Tensor>,
    ) -> SparseAttentionInputs<'a> {
        SparseAttentionInputs {
            query,
            kv_blocks,
            page_table: &self.table,
            row_offsets: &self.offs,
            cache_lengths: &self.cache,
            token_indices: &self.tok,
            token_count: &self.cnt,
            sinks,
        }
    }

    pub fn attrs() -> SparseAttentionAttrs {
        SparseAttentionAttrs {
            scale: Some(1.0),
            layer_idx: 0,
            page_stride: None,
            v_head_dim: None,
        }
    }
}
