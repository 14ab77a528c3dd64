//! The dispatch of `sparse_attention`: the shader's constants and uniform block, the
//! geometry they derive from, the device buffers it binds and [`encode_attention`].

use super::OP;
use crate::error::{Error, Result};
use crate::gpu::{Context, PipelineKey};
use crate::ops::common::{check_di, encode, Dispatch, MAX_D};
use crate::paged::PoolLayout;
use crate::tensor::{DType, Tensor};

/// Tokens per tile and invocations per workgroup (`TK` in the WGSL).
pub const TILE: usize = 64;
/// f32 words of the shader's workgroup array (`SH`): one pass holds the queries, tile scores
/// and softmax state of [`heads_per_pass`] heads.
pub const SHARED_WORDS: usize = 4000;
/// vec4 accumulators per invocation (`ACC`).
pub const ACC_QUADS: usize = 16;
/// Largest head dim E (one pass must hold at least one head).
pub const MAX_E: usize = MAX_D;
/// llvmpipe (Mesa's CPU driver, behind lavapipe and its GL) ends every loop of an invocation
/// once 65535 iterations of all its loops have run; the shader would then stop early.
pub const LLVMPIPE_LOOP_LIMIT: u64 = 65535;
/// The share of [`LLVMPIPE_LOOP_LIMIT`] a call may use on llvmpipe by [`loop_iterations`].
pub const LLVMPIPE_LOOP_BUDGET: u64 = 60000;

/// Channel quads each invocation owns in the V step.
fn quads_per_lane(e: usize) -> usize {
    e.div_ceil(4).div_ceil(TILE)
}

/// Query heads one pass of a workgroup serves; a pass reads each gathered K and V row once, so
/// a group of up to this many heads reads them once (12 at E = 256, 16 at E <= 128).
pub fn heads_per_pass(e: usize) -> usize {
    heads_per_pass_kv(e, e)
}

/// [`heads_per_pass`] for queries and keys of E channels and values of Ev channels (15 at
/// NSA's E = 192, Ev = 128).
pub fn heads_per_pass_kv(e: usize, ev: usize) -> usize {
    let e4 = e.div_ceil(4) * 4;
    (SHARED_WORDS / (e4 + TILE + 3)).min(ACC_QUADS / quads_per_lane(ev))
}

/// Loop iterations one invocation runs at most, as llvmpipe counts them (a loop of n
/// iterations costs n + 1; the extra TK per tile was measured on Mesa 22.3), for the llvmpipe
/// check of [`encode_attention`].
pub fn loop_iterations(p: &SparseAttentionParams) -> u64 {
    let (e4, hc, tk) = (p.e.div_ceil(4) as u64 * 4, p.hc.max(1) as u64, TILE as u64);
    let (nq, nhq) = (quads_per_lane(p.v_dim() as usize) as u64, hc.div_ceil(4));
    let (gsz, ssz) = ((p.h / p.hkv.max(1)) as u64, (p.h / p.hs.max(1)) as u64);
    let passes = gsz.min(ssz).div_ceil(hc);
    let scores = (e4 / 4 + 1) + e4 / 4 * (nhq + 1) + (hc + 1);
    let softmax = 2 * (tk + 1);
    let values = (hc * nq + 1) + (tk + 1) + tk * ((nq + 1) + nq * (nhq + 1));
    let tile = scores + softmax + values + tk + 8;
    let tiles = (p.w as u64).div_ceil(tk);
    let pass = (tiles + 1) + tiles * tile + (hc * e4 / tk + 1) + (hc + 1) * (nq + 2);
    passes * pass + (passes + 1) + 64
}

/// Shape of one dispatch; [`params`] derives the uniform block from it.
#[derive(Clone, Copy, Debug)]
pub struct AttentionGeometry {
    /// Query rows T.
    pub t: usize,
    /// Sequences N.
    pub n: usize,
    /// Query heads H.
    pub h: usize,
    /// Selection groups Hs.
    pub hs: usize,
    /// Token slots per (row, group): the last axis W of `token_indices`.
    pub w: usize,
    /// The main pool; its `num_kv_heads` is Hkv and its `head_dim` is E ([`params`]), or
    /// max(E, Ev) ([`params_kv`]).
    pub layout: PoolLayout,
    pub layer_idx: usize,
    /// Columns of the page table.
    pub max_pages: usize,
    /// `None`: 1 / sqrt(E).
    pub scale: Option<f32>,
    pub has_sinks: bool,
}

/// Uniform parameters; layout checked against the WGSL struct by a test.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SparseAttentionParams {
    pub t: u32,
    pub n: u32,
    pub h: u32,
    pub hkv: u32,
    pub hs: u32,
    pub e: u32,
    pub w: u32,
    pub parts: u32,
    pub hc: u32,
    pub page_size: u32,
    pub page_stride: u32,
    pub num_pages: u32,
    pub max_pages: u32,
    pub k_off: u32,
    pub v_off: u32,
    pub has_sinks: u32,
    pub scale: f32,
    /// Value and output channels Ev; 0 means E.
    pub ev: u32,
    /// Channels of one pool row per head, max(E, Ev); 0 means E.
    pub dp: u32,
    pub _pad2: u32,
}

impl SparseAttentionParams {
    /// Workgroups of one dispatch: T · Hkv · parts.
    pub fn groups(&self) -> u32 {
        self.t * self.hkv * self.parts
    }

    /// Ev (E when `ev` is 0).
    pub fn v_dim(&self) -> u32 {
        if self.ev == 0 {
            self.e
        } else {
            self.ev
        }
    }

    /// Channels of a pool row per head (E when `dp` is 0).
    pub fn pool_dim(&self) -> u32 {
        if self.dp == 0 {
            self.e
        } else {
            self.dp
        }
    }
}

/// The uniform block of a dispatch, with the rules the shader relies on: Hkv and Hs divide
/// H, E ≤ [`MAX_E`], and every element index fits in u32. Queries, keys, values and the
/// output all have the pool's `head_dim` channels.
pub fn params(g: &AttentionGeometry) -> Result<SparseAttentionParams> {
    params_kv(g, g.layout.head_dim, g.layout.head_dim)
}

/// [`params`] for queries and keys of `e` channels and values (and the output) of `ev`
/// channels, read from a pool whose `head_dim` is max(E, Ev): K in the first E channels of its
/// row, V in the first Ev (NSA's Dqk = 192, Dv = 128; MLA-style caches).
pub fn params_kv(g: &AttentionGeometry, e: usize, ev: usize) -> Result<SparseAttentionParams> {
    let l = g.layout;
    let (h, hkv, hs) = (g.h, l.num_kv_heads, g.hs);
    check_di(OP, "query", e)?;
    check_di(OP, "v_head_dim", ev)?;
    if e.max(ev) != l.head_dim {
        return Err(Error::input(
            OP,
            "kv_blocks",
            format!("head_dim {} must be max(E = {e}, Ev = {ev})", l.head_dim),
        ));
    }
    if h == 0 || hkv == 0 || hs == 0 || h % hkv != 0 || h % hs != 0 {
        return Err(Error::input(
            OP,
            "query",
            format!("H = {h} must be a multiple of Hkv = {hkv} and of Hs = {hs}"),
        ));
    }
    let fits = |name: &str, elems: usize| -> Result<u32> {
        u32::try_from(elems)
            .map_err(|_| Error::input(OP, name, format!("{elems} elements exceed u32 addressing")))
    };
    fits("kv_blocks", l.required_elems())?;
    fits("query", g.t * h * e.max(ev))?;
    fits("token_indices", g.t * hs * g.w)?;
    fits("page_table", 2 * g.n + 1 + g.n * g.max_pages)?;
    let (gsz, ssz) = (h / hkv, h / hs);
    let parts = (0..hkv)
        .map(|kh| ((kh + 1) * gsz - 1) / ssz - kh * gsz / ssz + 1)
        .max()
        .unwrap_or(1);
    fits("query", g.t * hkv * parts)?;
    Ok(SparseAttentionParams {
        t: g.t as u32,
        n: g.n as u32,
        h: h as u32,
        hkv: hkv as u32,
        hs: hs as u32,
        e: e as u32,
        w: g.w as u32,
        parts: parts as u32,
        hc: heads_per_pass_kv(e, ev) as u32,
        page_size: l.page_size as u32,
        page_stride: l.page_stride as u32,
        num_pages: l.num_pages as u32,
        max_pages: g.max_pages as u32,
        k_off: l.offset(0, 0, g.layer_idx, 0, 0) as u32,
        v_off: l.offset(0, 1, g.layer_idx, 0, 0) as u32,
        has_sinks: g.has_sinks as u32,
        scale: g.scale.unwrap_or(1.0 / (e as f32).sqrt()),
        ev: ev as u32,
        dp: l.head_dim as u32,
        _pad2: 0,
    })
}

/// The `seqs` buffer image: `row_offsets [N+1]`, then `cache_lengths [N]`, then the page table
/// `[N, max_pages]`, all u32.
pub fn pack_seqs(offsets: &[u32], cache: &[u32], table: &[u32]) -> Tensor {
    let v: Vec<u32> = offsets.iter().chain(cache).chain(table).copied().collect();
    Tensor::from_u32(&[v.len()], &v)
}

/// Device buffers of one attention dispatch. Float buffers hold the call's type T (f16/bf16
/// packed two per word), integer buffers i32/u32 words.
pub struct AttentionBuffers<'a> {
    /// `[T, H, E]` T.
    pub query: &'a wgpu::Buffer,
    /// The main pool, `[num_pages, 2, layers, page_size, Hkv, Dp]` T (Dp = max(E, Ev)), pages
    /// `page_stride` apart.
    pub pool: &'a wgpu::Buffer,
    /// [`pack_seqs`]: row_offsets, cache_lengths, page table.
    pub seqs: &'a wgpu::Buffer,
    /// `[T, Hs, W]` i32.
    pub token_indices: &'a wgpu::Buffer,
    /// `[T, Hs]` i32.
    pub token_count: &'a wgpu::Buffer,
    /// `[H]` f32, or `None` (then `params.has_sinks` must be 0).
    pub sinks: Option<&'a wgpu::Buffer>,
    /// `[T, H, Ev]` T, every element written.
    pub out: &'a wgpu::Buffer,
    /// The flag word (`shaders/common/flags.wgsl`); read with [`read_checked`].
    pub flags: &'a wgpu::Buffer,
}

/// Describes one attention dispatch. Buffers too small for `prm` are an error here,
/// before anything is recorded; device values (lengths, tokens, pages) are checked by the
/// shader and reported through `b.flags`.
pub fn dispatch_attention<'a>(
    ctx: &'a Context,
    dt: DType,
    prm: &'a SparseAttentionParams,
    b: &AttentionBuffers<'a>,
) -> Result<Dispatch<'a>> {
    let d = format!("{} {}", ctx.info.name, ctx.info.driver).to_lowercase();
    if d.contains("llvmpipe") && loop_iterations(prm) > LLVMPIPE_LOOP_BUDGET {
        return Err(Error::input(
            OP,
            "token_indices",
            format!(
                "W = {} with E = {} and {} heads per KV group needs up to {} loop iterations per invocation; llvmpipe stops loops after {LLVMPIPE_LOOP_LIMIT}",
                prm.w, prm.e, prm.h / prm.hkv.max(1), loop_iterations(prm)
            ),
        ));
    }
    if !dt.is_float() || (prm.has_sinks != 0) != b.sinks.is_some() {
        return Err(Error::input(
            OP,
            "sinks",
            format!(
                "type {dt} / has_sinks {} / sinks buffer mismatch",
                prm.has_sinks
            ),
        ));
    }
    let es = dt.size() as u64;
    let (t, h, e, n) = (prm.t as u64, prm.h as u64, prm.e as u64, prm.n as u64);
    let (ev, dp) = (prm.v_dim() as u64, prm.pool_dim() as u64);
    if ev > dp || e > dp {
        return Err(Error::input(
            OP,
            "kv_blocks",
            format!("pool rows of {dp} channels cannot hold E = {e} and Ev = {ev}"),
        ));
    }
    let rows = t * prm.hs as u64;
    let pool_need = (prm.num_pages as u64).saturating_sub(1) * prm.page_stride as u64
        + prm.v_off as u64
        + prm.page_size as u64 * prm.hkv as u64 * dp;
    let mut need = vec![
        ("query", b.query, t * h * e * es),
        ("kv_blocks", b.pool, pool_need * es),
        ("seqs", b.seqs, (2 * n + 1 + n * prm.max_pages as u64) * 4),
        ("token_indices", b.token_indices, rows * prm.w as u64 * 4),
        ("token_count", b.token_count, rows * 4),
        ("out", b.out, t * h * ev * es),
    ];
    if let Some(s) = b.sinks {
        need.push(("sinks", s, h * 4));
    }
    for (name, buf, bytes) in need {
        ctx.check_binding_size(OP, name, bytes)?;
        if buf.size() < bytes {
            return Err(Error::input(
                OP,
                name,
                format!("buffer holds {} bytes, the call needs {bytes}", buf.size()),
            ));
        }
    }
    Ok(Dispatch {
        key: PipelineKey::new(OP, "main").with("T_KIND", dt.shader_kind()),
        params: bytemuck::bytes_of(prm),
        buffers: vec![
            b.query,
            b.pool,
            b.seqs,
            b.token_indices,
            b.token_count,
            b.sinks.unwrap_or(&ctx.dummy),
            b.out,
            b.flags,
        ],
        groups: prm.groups(),
    })
}

/// Records the dispatch of [`dispatch_attention`] with a fresh bind group.
pub async fn encode_attention(
    ctx: &Context,
    enc: &mut wgpu::CommandEncoder,
    dt: DType,
    prm: &SparseAttentionParams,
    b: &AttentionBuffers<'_>,
) -> Result<()> {
    encode(ctx, enc, dispatch_attention(ctx, dt, prm, b)?).await
}
