//! `block_score` (SPEC §4): ReLU-summed index scores of the visible blocks of each query row,
//! −inf for the blocks it may not see. Shader: `shaders/block_score.wgsl`, with two tilings
//! ([`Tiling`]) that give identical scores. A score matrix larger than the adapter's binding
//! limit is computed in row chunks, each read back in turn. The queries and block keys are
//! read from storage buffers, or from [`WordTexture`] copies of them
//! (`shaders/block_score_tex.wgsl`, same scores bit for bit), which the indexer keeps because
//! texel fetches are the faster loads on llvmpipe (docs/perf.md).

use super::common::*;
use crate::error::{Error, Result};
use crate::gpu::{Context, GpuTensor, PipelineKey, WordTexture};
use crate::tensor::{DType, Tensor};

/// The kernels from the texture copies for subgroups of 8 lanes (`block_score_tex_sg.wgsl`;
/// row tiles in f32, one-row tiles in every type): the query words every lane needs are
/// fetched once per subgroup and handed on by shuffles, the same scores bit for bit.
pub const TEX_SG: &str = "block_score_tex_sg";

pub const OP: &str = "block_score";

/// Attributes of `block_score`.
#[derive(Clone, Debug)]
pub struct BlockScoreAttrs {
    pub ratio: usize,
    pub num_selection_heads: usize,
    /// `None`: 1 / sqrt(Di).
    pub scale: Option<f32>,
}

impl BlockScoreAttrs {
    pub fn from_map(a: &AttrMap) -> Result<Self> {
        let ratio = attr_int_in(OP, a, "ratio", None, 1, 1 << 20)?;
        let hs = attr_int(OP, a, "num_selection_heads", Some(1))?;
        if hs < 1 {
            return Err(Error::attr(
                OP,
                "num_selection_heads",
                format!("must be >= 1, got {hs}"),
            ));
        }
        let scale = attr_opt_f32(OP, a, "scale")?;
        Ok(BlockScoreAttrs {
            ratio: ratio as usize,
            num_selection_heads: hs as usize,
            scale,
        })
    }
}

/// Inputs of `block_score`.
pub struct BlockScoreInputs<'a> {
    pub index_query: &'a Tensor,
    pub block_keys: &'a Tensor,
    pub row_offsets: &'a Tensor,
    pub cache_lengths: &'a Tensor,
    pub key_counts: Option<&'a Tensor>,
    pub index_weights: Option<&'a Tensor>,
}

impl<'a> BlockScoreInputs<'a> {
    pub fn from_map(m: &'a TensorMap) -> Result<Self> {
        Ok(BlockScoreInputs {
            index_query: req(OP, m, "index_query")?,
            block_keys: req(OP, m, "block_keys")?,
            row_offsets: req(OP, m, "row_offsets")?,
            cache_lengths: req(OP, m, "cache_lengths")?,
            key_counts: opt(m, "key_counts"),
            index_weights: opt(m, "index_weights"),
        })
    }
}

/// The checked geometry of one call.
pub struct Plan {
    pub dt: DType,
    pub t: usize,
    pub hi: usize,
    pub hs: usize,
    pub di: usize,
    pub n: usize,
    pub max_blocks: usize,
    pub scale: f32,
    pub offsets: Vec<u32>,
    pub cache: Vec<u32>,
    /// Key counts after defaulting to `cache_lengths + rows`.
    pub counts: Vec<u32>,
}

impl Plan {
    /// Sequence and position of row `t`.
    pub fn locate(&self, t: usize) -> (usize, usize) {
        let n = self.offsets.partition_point(|&o| o as usize <= t) - 1;
        (n, self.cache[n] as usize + t - self.offsets[n] as usize)
    }

    /// Visible blocks of row `t`.
    pub fn vis(&self, t: usize, r: usize) -> usize {
        let (n, p) = self.locate(t);
        ((p + 1) / r)
            .min(self.counts[n] as usize / r)
            .min(self.max_blocks)
    }
}

/// Checks ragged-batch descriptors (SPEC §0): `row_offsets [N+1]` starting at 0, non-decreasing,
/// ending at `t`; `cache_lengths [N]`. Returns (offsets, cache lengths).
pub fn ragged(
    op: &'static str,
    row_offsets: &Tensor,
    cache_lengths: &Tensor,
    t: usize,
) -> Result<(Vec<u32>, Vec<u32>)> {
    rank(op, "cache_lengths", cache_lengths, 1)?;
    let cache = uints(op, "cache_lengths", cache_lengths)?;
    let n = cache.len();
    let why = format!("cache_lengths holds {n} sequences");
    shape_because(op, "row_offsets", row_offsets, &[n + 1], Some(&why))?;
    let offs = uints(op, "row_offsets", row_offsets)?;
    if offs[0] != 0 {
        return Err(Error::input(
            op,
            "row_offsets",
            format!("row_offsets[0] is {}, must be 0", offs[0]),
        ));
    }
    if offs[n] as usize != t {
        return Err(Error::input(
            op,
            "row_offsets",
            format!("row_offsets[{n}] is {}, must be T = {t}", offs[n]),
        ));
    }
    for i in 0..n {
        if offs[i + 1] < offs[i] {
            return Err(Error::input(
                op,
                "row_offsets",
                format!("decreases at {}: {} < {}", i + 1, offs[i + 1], offs[i]),
            ));
        }
        let end = cache[i] as u64 + (offs[i + 1] - offs[i]) as u64;
        if end > u32::MAX as u64 / 2 {
            return Err(Error::input(
                op,
                "cache_lengths",
                format!("sequence {i}: {} is too large", cache[i]),
            ));
        }
    }
    Ok((offs, cache))
}

/// Every host-checkable rule of SPEC §4.
pub fn validate(x: &BlockScoreInputs, a: &BlockScoreAttrs) -> Result<Plan> {
    let dt = float_type(OP, "index_query", x.index_query)?;
    let &[t, hi, di] = rank(OP, "index_query", x.index_query, 3)? else {
        unreachable!()
    };
    if hi == 0 || di == 0 {
        return Err(Error::input(
            OP,
            "index_query",
            format!("zero-sized axis in shape {:?}", x.index_query.shape),
        ));
    }
    if hi % a.num_selection_heads != 0 {
        return Err(Error::attr(
            OP,
            "num_selection_heads",
            format!("{} does not divide Hi = {hi}", a.num_selection_heads),
        ));
    }
    float_of(OP, "block_keys", x.block_keys, dt)?;
    let &[rows, kdi] = rank(OP, "block_keys", x.block_keys, 2)? else {
        unreachable!()
    };
    if kdi != di {
        return Err(Error::input(
            OP,
            "block_keys",
            format!("has {kdi} channels, index_query has Di = {di}"),
        ));
    }
    let (offsets, cache) = ragged(OP, x.row_offsets, x.cache_lengths, t)?;
    let n = cache.len();
    if n > 0 && !rows.is_multiple_of(n) {
        return Err(Error::input(
            OP,
            "block_keys",
            format!("{rows} rows do not split evenly over N = {n} sequences"),
        ));
    }
    let max_blocks = rows.checked_div(n).unwrap_or(0);
    let counts = match x.key_counts {
        Some(kc) => {
            shape_is(OP, "key_counts", kc, &[n])?;
            uints(OP, "key_counts", kc)?
        }
        None => (0..n)
            .map(|i| cache[i] + offsets[i + 1] - offsets[i])
            .collect(),
    };
    if let Some(w) = x.index_weights {
        if w.dtype != DType::F32 {
            return Err(Error::input(
                OP,
                "index_weights",
                format!("dtype {} must be f32", w.dtype),
            ));
        }
        shape_is(OP, "index_weights", w, &[t, hi])?;
    }
    let scale = a.scale.unwrap_or(1.0 / (di as f32).sqrt());
    Ok(Plan {
        dt,
        t,
        hi,
        hs: a.num_selection_heads,
        di,
        n,
        max_blocks,
        scale,
        offsets,
        cache,
        counts,
    })
}

/// The CPU reference: `scores [T, Hs, max_blocks]` f32.
pub fn cpu(x: &BlockScoreInputs, a: &BlockScoreAttrs) -> Result<Tensor> {
    let p = validate(x, a)?;
    let (q, k) = (x.index_query.to_f32(), x.block_keys.to_f32());
    let w = x.index_weights.map(|t| t.to_f32());
    let (di, hi, hs, wb) = (p.di, p.hi, p.hs, p.max_blocks);
    let gsize = hi / hs;
    let mut out = vec![f32::NEG_INFINITY; p.t * hs * wb];
    for t in 0..p.t {
        let (n, _) = p.locate(t);
        for b in 0..p.vis(t, a.ratio) {
            let krow = &k[(n * wb + b) * di..][..di];
            for g in 0..hs {
                let mut acc = 0f32;
                for h in g * gsize..(g + 1) * gsize {
                    let qrow = &q[(t * hi + h) * di..][..di];
                    let mut dot = 0f32;
                    for c in 0..di {
                        dot += qrow[c] * krow[c];
                    }
                    let wt = w.as_ref().map_or(1.0, |w| w[t * hi + h]);
                    acc += wt * dot.max(0.0);
                }
                out[(t * hs + g) * wb + b] = p.scale * acc;
            }
        }
    }
    Ok(Tensor::from_f32(DType::F32, &[p.t, hs, wb], &out))
}

/// Uniform parameters; layout checked against the WGSL struct by a test.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockScoreParams {
    pub t_total: u32,
    pub row_base: u32,
    pub rows: u32,
    pub n: u32,
    pub hi: u32,
    pub hs: u32,
    pub di: u32,
    pub r: u32,
    pub max_blocks: u32,
    pub has_counts: u32,
    pub has_weights: u32,
    pub scale: f32,
}

/// How the shader tiles the score matrix; both tilings compute every score with the same
/// operations in the same order, so they give identical results and differ only in speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tiling {
    /// Workgroups of 24 rows × 1024 blocks (entry point `row_tiles`): each block key is read
    /// once for 24 rows. For prefill.
    RowTiles,
    /// Workgroups of one row × 1024 blocks (entry point `one_row`): no row of another sequence
    /// or past the chunk rides along. For decode.
    OneRow,
}

/// Rows per workgroup of [`Tiling::RowTiles`] and blocks per workgroup of both tilings (the
/// shader's `TR` and `TB`).
const TILE_ROWS: u32 = 24;
const TILE_BLOCKS: u32 = 1024;

impl Tiling {
    /// The faster tiling for `rows` rows over `n` sequences: one-row tiles while the sequences
    /// average at most 8 rows (a 24-row tile would then mostly carry rows of other sequences,
    /// each taking its own pass), row tiles beyond.
    pub fn for_rows(rows: u32, n: u32) -> Tiling {
        if rows as u64 <= 8 * n.max(1) as u64 {
            Tiling::OneRow
        } else {
            Tiling::RowTiles
        }
    }

    /// [`Tiling::for_rows`], or [`Tiling::OneRow`] always where the context asks for it
    /// ([`Capabilities::one_row_scores`](crate::gpu::Capabilities::one_row_scores)).
    pub fn for_context(ctx: &Context, rows: u32, n: u32) -> Tiling {
        if ctx.caps.one_row_scores {
            Tiling::OneRow
        } else {
            Tiling::for_rows(rows, n)
        }
    }

    /// The other tiling.
    pub fn other(self) -> Tiling {
        match self {
            Tiling::RowTiles => Tiling::OneRow,
            Tiling::OneRow => Tiling::RowTiles,
        }
    }

    fn entry(self) -> &'static str {
        match self {
            Tiling::RowTiles => "row_tiles",
            Tiling::OneRow => "one_row",
        }
    }
}

/// Device buffers of one score dispatch.
pub struct ScoreBuffers<'a> {
    pub query: &'a wgpu::Buffer,
    pub keys: &'a wgpu::Buffer,
    /// [`WordTexture`]s equal to `query` and `keys` (where read): when given, the shader
    /// reads them instead.
    pub textures: Option<[&'a wgpu::TextureView; 2]>,
    pub row_offsets: &'a wgpu::Buffer,
    /// `[2, N]` u32: cache_lengths, then key_counts (used when `has_counts`).
    pub lens: &'a wgpu::Buffer,
    pub weights: Option<&'a wgpu::Buffer>,
    pub scores: &'a wgpu::Buffer,
    pub flags: &'a wgpu::Buffer,
}

/// Describes one score dispatch over rows `prm.row_base .. + prm.rows` (recorded by the
/// `encode_` wrapper below or an orchestrator), tiled as [`Tiling::for_context`] chooses.
pub fn dispatch_score<'a>(
    ctx: &'a Context,
    dt: DType,
    prm: &'a BlockScoreParams,
    b: &'a ScoreBuffers<'a>,
) -> Result<Dispatch<'a>> {
    dispatch_score_tiled(ctx, dt, prm, b, Tiling::for_context(ctx, prm.rows, prm.n))
}

/// [`dispatch_score`] with the tiling given (rows that do not start on a 16-byte word, i.e.
/// Di not a multiple of 4 for f32 or of 8 for f16/bf16, always take [`Tiling::OneRow`]).
pub fn dispatch_score_tiled<'a>(
    ctx: &'a Context,
    dt: DType,
    prm: &'a BlockScoreParams,
    b: &'a ScoreBuffers<'a>,
    tiling: Tiling,
) -> Result<Dispatch<'a>> {
    // The shader reads rows in 16-byte words, so both buffers must end on one (GpuTensor pads
    // every buffer so).
    for (name, buf) in [("index_query", b.query), ("block_keys", b.keys)] {
        if !buf.size().is_multiple_of(16) && b.textures.is_none() {
            return Err(Error::input(
                OP,
                name,
                format!(
                    "buffer holds {} bytes; block_score reads it in 16-byte words, so its \
                     size must be a multiple of 16",
                    buf.size()
                ),
            ));
        }
    }
    // Rows that start on a 16-byte word (4 f32 or 8 f16/bf16 channels) are read a word at a
    // time; other widths element by element, and then always in one-row tiles: the row-tile
    // kernel would take LLVM-based drivers many seconds to compile for a rare shape.
    let word = if dt == DType::F32 { 4 } else { 8 };
    let vec = prm.di.is_multiple_of(word);
    let tiling = if vec { tiling } else { Tiling::OneRow };
    let row_tiles = match tiling {
        Tiling::RowTiles => prm.rows.div_ceil(TILE_ROWS),
        Tiling::OneRow => prm.rows,
    };
    let groups = row_tiles as u64 * prm.max_blocks.div_ceil(TILE_BLOCKS) as u64;
    let groups = u32::try_from(groups).map_err(|_| {
        Error::input(
            OP,
            "scores",
            format!(
                "{} rows × {} blocks need more than 2^32 workgroups",
                prm.rows, prm.max_blocks
            ),
        )
    })?;
    // Bindings 1 and 2: the query and key buffers, or their texture copies.
    let (shader, mut buffers, textures) = match b.textures {
        // Row tiles in f32 only: in bf16 they measured ~12 % slower on lavapipe (~10 % faster
        // in f32); one-row tiles ~5 % faster in f32, no slower in bf16 (alternating binaries).
        // Rows that do not start on a word (VEC = 0) gather elements: not this variant.
        Some(t)
            if (tiling == Tiling::OneRow || dt == DType::F32)
                && vec
                && ctx.caps.subgroup_size == Some(8) =>
        {
            (TEX_SG, vec![], Vec::from(t))
        }
        Some(t) => ("block_score_tex", vec![], Vec::from(t)),
        None => (OP, vec![b.query, b.keys], vec![]),
    };
    buffers.extend([
        b.row_offsets,
        b.lens,
        b.weights.unwrap_or(&ctx.dummy),
        b.scores,
        b.flags,
    ]);
    Ok(Dispatch {
        key: PipelineKey::new(shader, tiling.entry())
            .with("T_KIND", dt.shader_kind())
            .with("VEC", vec as u32),
        params: bytemuck::bytes_of(prm),
        buffers,
        textures,
        groups,
    })
}

/// Records the dispatch of [`dispatch_score`] with a fresh bind group.
pub async fn encode_score(
    ctx: &Context,
    enc: &mut wgpu::CommandEncoder,
    dt: DType,
    prm: &BlockScoreParams,
    b: &ScoreBuffers<'_>,
) -> Result<()> {
    encode(ctx, enc, dispatch_score(ctx, dt, prm, b)?).await
}

/// Rows of scores that fit in one binding.
pub fn rows_per_chunk(ctx: &Context, hs: usize, w: usize) -> Result<usize> {
    let row_bytes = (hs * w * 4).max(4) as u64;
    let rows = ctx.binding_capacity() / row_bytes;
    if rows == 0 {
        return Err(Error::Limit {
            op: OP,
            input: "scores".into(),
            need: row_bytes,
            limit_name: "max_storage_buffer_binding_size",
            limit: ctx.limits.max_storage_buffer_binding_size,
        });
    }
    Ok(rows as usize)
}

/// Runs on the GPU, in row chunks when the score matrix exceeds one binding.
/// `max_chunk_rows` caps the chunk (tests use it to force the chunked path).
pub async fn gpu_chunked(
    ctx: &Context,
    x: &BlockScoreInputs<'_>,
    a: &BlockScoreAttrs,
    max_chunk_rows: Option<usize>,
) -> Result<Tensor> {
    gpu_tiled(ctx, x, a, max_chunk_rows, None, false).await
}

/// [`gpu_chunked`] with every chunk tiled as `tiling` (`None`: as [`Tiling::for_context`]
/// chooses), the queries and keys read from [`WordTexture`]s when `textures`; tests use it
/// to run both tilings and both sources on one problem.
pub async fn gpu_tiled(
    ctx: &Context,
    x: &BlockScoreInputs<'_>,
    a: &BlockScoreAttrs,
    max_chunk_rows: Option<usize>,
    tiling: Option<Tiling>,
    textures: bool,
) -> Result<Tensor> {
    let p = validate(x, a)?;
    let up = |name: &str, t: &Tensor| GpuTensor::upload(ctx, &format!("qsa.{OP}.{name}"), t);
    let q = up("index_query", x.index_query)?;
    let k = up("block_keys", x.block_keys)?;
    let copy = |name: &str, buf: &GpuTensor| {
        WordTexture::new(ctx, &format!("qsa.{OP}.{name}"), buf.buffer.size()).ok_or_else(|| {
            Error::input(
                OP,
                name,
                format!(
                    "{} bytes exceed the largest texture of this adapter",
                    buf.buffer.size()
                ),
            )
        })
    };
    let tex = match textures {
        false => None,
        true => Some([copy("index_query", &q)?, copy("block_keys", &k)?]),
    };
    let offs = up("row_offsets", &Tensor::from_u32(&[p.n + 1], &p.offsets))?;
    let lens: Vec<u32> = p.cache.iter().chain(p.counts.iter()).copied().collect();
    let lens = up("lens", &Tensor::from_u32(&[lens.len()], &lens))?;
    let w = x
        .index_weights
        .map(|t| up("index_weights", t))
        .transpose()?;
    let flags = flag_word(ctx)?;
    let mut chunk = rows_per_chunk(ctx, p.hs, p.max_blocks)?;
    if let Some(m) = max_chunk_rows {
        chunk = chunk.min(m.max(1));
    }
    let mut out = Vec::with_capacity(p.t * p.hs * p.max_blocks * 4);
    let mut base = 0;
    while base < p.t || (p.t == 0 && base == 0) {
        let rows = chunk.min(p.t - base);
        let scores = GpuTensor::filled(
            ctx,
            "qsa.block_score.scores",
            DType::F32,
            &[rows, p.hs, p.max_blocks],
            0xff,
        )?;
        let prm = BlockScoreParams {
            t_total: p.t as u32,
            row_base: base as u32,
            rows: rows as u32,
            n: p.n as u32,
            hi: p.hi as u32,
            hs: p.hs as u32,
            di: p.di as u32,
            r: a.ratio as u32,
            max_blocks: p.max_blocks as u32,
            has_counts: 1,
            has_weights: w.is_some() as u32,
            scale: p.scale,
        };
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        if let (Some([tq, tk]), 0) = (&tex, base) {
            tq.copy_words(&mut enc, &q.buffer, 0, q.buffer.size() / 16);
            tk.copy_words(&mut enc, &k.buffer, 0, k.buffer.size() / 16);
        }
        let bufs = ScoreBuffers {
            query: &q.buffer,
            keys: &k.buffer,
            textures: tex.as_ref().map(|[tq, tk]| [&tq.view, &tk.view]),
            row_offsets: &offs.buffer,
            lens: &lens.buffer,
            weights: w.as_ref().map(|b| &b.buffer),
            scores: &scores.buffer,
            flags: &flags.buffer,
        };
        let tiling = tiling.unwrap_or(Tiling::for_context(ctx, prm.rows, prm.n));
        encode(
            ctx,
            &mut enc,
            dispatch_score_tiled(ctx, p.dt, &prm, &bufs, tiling)?,
        )
        .await?;
        ctx.submit(OP, enc).await?;
        let got = read_checked(ctx, OP, &[&scores], &flags).await?;
        out.extend_from_slice(&got[0].data);
        base += rows;
        if p.t == 0 {
            break;
        }
    }
    Tensor::from_bytes(DType::F32, &[p.t, p.hs, p.max_blocks], out)
}

/// Runs on the GPU (chunked only when it must be).
pub async fn gpu(ctx: &Context, x: &BlockScoreInputs<'_>, a: &BlockScoreAttrs) -> Result<Tensor> {
    gpu_chunked(ctx, x, a, None).await
}
