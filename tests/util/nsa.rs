//! nsa_compress_attention problems for the tests: logical compressed K/V per batch, scattered
//! into a paged cache through a shuffled block table (every cache row that holds no token is
//! NaN, so a stray read cannot pass), and the GPU-against-CPU check of both outputs.

use qsa_wgpu::gpu::Context;
use qsa_wgpu::ops::nsa_compress_attention::{
    gpu_with_split, reference, Layout, NsaCompressAttentionAttrs, NsaCompressAttentionInputs,
    NsaCompressAttentionOutputs,
};
use qsa_wgpu::testing::{compare, compare_selection, Rng, Tol};
use qsa_wgpu::{DType, Tensor};

/// The call's geometry and attributes.
#[derive(Clone, Debug)]
pub struct Geo {
    pub dt: DType,
    pub layout: Layout,
    pub n1: usize,
    pub n2: usize,
    pub dqk: usize,
    pub dv: usize,
    pub page: usize,
    pub l: usize,
    pub d: usize,
    pub lsel: usize,
    pub k: usize,
    pub causal: bool,
}

/// One call: lengths, the query, the logical cache and its paged placement.
pub struct Problem {
    pub geo: Geo,
    pub q_len: Vec<usize>,
    pub cmp: Vec<usize>,
    pub sel: Vec<usize>,
    /// S of BSND (ignored for TND).
    pub seq: usize,
    pub scale: Option<f32>,
    pub query: Tensor,
    /// Per batch `[c_b, N2·D]`, values already rounded to T.
    pub keys: Vec<Vec<f32>>,
    pub values: Vec<Vec<f32>>,
    pub key: Tensor,
    pub value: Tensor,
    pub block_table: Tensor,
    pub q_len_t: Tensor,
    pub cmp_t: Tensor,
    pub sel_t: Tensor,
}

fn normals(rng: &mut Rng, dt: DType, n: usize) -> Vec<f32> {
    (0..n).map(|_| dt.round(rng.normal())).collect()
}

impl Problem {
    pub fn new(rng: &mut Rng, geo: Geo, q_len: &[usize], cmp: &[usize], sel: &[usize]) -> Self {
        let seq = *q_len.iter().max().unwrap();
        Self::with_seq(rng, geo, q_len, cmp, sel, seq)
    }

    pub fn with_seq(
        rng: &mut Rng,
        geo: Geo,
        q_len: &[usize],
        cmp: &[usize],
        sel: &[usize],
        seq: usize,
    ) -> Self {
        let b = cmp.len();
        let query = match geo.layout {
            Layout::Tnd => rng.tensor(geo.dt, &[q_len.iter().sum(), geo.n1, geo.dqk]),
            Layout::Bsnd => rng.tensor(geo.dt, &[b, seq, geo.n1, geo.dqk]),
        };
        let keys = cmp
            .iter()
            .map(|&c| normals(rng, geo.dt, c * geo.n2 * geo.dqk))
            .collect();
        let values = cmp
            .iter()
            .map(|&c| normals(rng, geo.dt, c * geo.n2 * geo.dv))
            .collect();
        let ints = |v: &[usize]| {
            Tensor::from_i32(&[v.len()], &v.iter().map(|&x| x as i32).collect::<Vec<_>>())
        };
        let mut p = Problem {
            q_len_t: ints(q_len),
            cmp_t: ints(cmp),
            sel_t: ints(sel),
            geo,
            q_len: q_len.to_vec(),
            cmp: cmp.to_vec(),
            sel: sel.to_vec(),
            seq,
            scale: None,
            query,
            keys,
            values,
            key: Tensor::zeros(DType::F32, &[0]),
            value: Tensor::zeros(DType::F32, &[0]),
            block_table: Tensor::zeros(DType::I32, &[0]),
        };
        p.place(rng);
        p
    }

    /// Scatters the logical cache through a fresh random block permutation (2 spare blocks,
    /// one spare table column holding −1).
    pub fn place(&mut self, rng: &mut Rng) {
        let g = &self.geo;
        let cols: Vec<usize> = self.cmp.iter().map(|c| c.div_ceil(g.page)).collect();
        let nb = cols.iter().sum::<usize>() + 2;
        let mb = cols.iter().max().unwrap() + 1;
        let perm = rng.permutation(nb);
        let (kw, vw) = (g.n2 * g.dqk, g.n2 * g.dv);
        let mut kc = vec![f32::NAN; nb * g.page * kw];
        let mut vc = vec![f32::NAN; nb * g.page * vw];
        let mut table = vec![-1i32; cols.len() * mb];
        let mut next = 0;
        for (b, &nc) in cols.iter().enumerate() {
            for col in 0..nc {
                let blk = perm[next] as usize;
                next += 1;
                table[b * mb + col] = blk as i32;
                for row in 0..g.page {
                    let j = col * g.page + row;
                    if j < self.cmp[b] {
                        let dst = blk * g.page + row;
                        kc[dst * kw..][..kw].copy_from_slice(&self.keys[b][j * kw..][..kw]);
                        vc[dst * vw..][..vw].copy_from_slice(&self.values[b][j * vw..][..vw]);
                    }
                }
            }
        }
        self.key = Tensor::from_f32(g.dt, &[nb, g.page, kw], &kc);
        self.value = Tensor::from_f32(g.dt, &[nb, g.page, vw], &vc);
        self.block_table = Tensor::from_i32(&[cols.len(), mb], &table);
    }

    pub fn inputs(&self) -> NsaCompressAttentionInputs<'_> {
        NsaCompressAttentionInputs {
            query: &self.query,
            key: &self.key,
            value: &self.value,
            block_table: &self.block_table,
            actual_q_len: Some(&self.q_len_t),
            actual_cmp_kv_len: &self.cmp_t,
            actual_sel_kv_len: self.geo.causal.then_some(&self.sel_t),
        }
    }

    pub fn attrs(&self) -> NsaCompressAttentionAttrs {
        let g = &self.geo;
        NsaCompressAttentionAttrs {
            num_heads: Some(g.n1),
            num_kv_heads: Some(g.n2),
            compress_block_size: g.l,
            compress_stride: g.d,
            select_block_size: g.lsel,
            select_block_count: g.k,
            scale: self.scale,
            layout: g.layout,
            causal_mask: g.causal,
        }
    }
}

/// Tolerance of `out`: f32 noise, or about one unit in the last place of T.
pub fn out_tol(dt: DType) -> Tol {
    qsa_wgpu::testing::weighted_sum_tol(dt)
}

/// Near-tie tolerance of the selection scores: f32 sums of f32 probabilities in every type.
pub const SCORE_TOL: Tol = Tol {
    abs: 1e-6,
    rel: 2e-5,
};

/// Runs both paths, compares them, and returns (GPU, CPU, the CPU's scores) and the number
/// of accepted near-tie differences.
pub fn check(
    ctx: &Context,
    p: &Problem,
    what: &str,
) -> (
    NsaCompressAttentionOutputs,
    NsaCompressAttentionOutputs,
    Vec<f32>,
    usize,
) {
    check_split(ctx, p, what, None)
}

/// [`check`] with the GPU's stage-2 split given (`None`: the adapter's choice).
pub fn check_split(
    ctx: &Context,
    p: &Problem,
    what: &str,
    split2: Option<u32>,
) -> (
    NsaCompressAttentionOutputs,
    NsaCompressAttentionOutputs,
    Vec<f32>,
    usize,
) {
    let (x, a) = (p.inputs(), p.attrs());
    let (want, scores) = reference(&x, &a).unwrap_or_else(|e| panic!("{what}: cpu: {e}"));
    let got = pollster::block_on(gpu_with_split(ctx, &x, &a, split2))
        .unwrap_or_else(|e| panic!("{what}: gpu: {e}"));
    compare(&got.out, &want.out, out_tol(p.geo.dt)).unwrap_or_else(|e| panic!("{what}: out: {e}"));
    let w = scores.len() / (p.query.numel() / p.geo.n1 / p.geo.dqk * p.geo.n2);
    let swaps = compare_selection(&got.topk, &want.topk, &scores, w, SCORE_TOL)
        .unwrap_or_else(|e| panic!("{what}: topk: {e}"));
    (got, want, scores, swaps)
}
