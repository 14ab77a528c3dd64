//! `qsa_compress_paged` (SPEC §2, MAX QSACompressKeysPaged): block keys computed from the raw
//! index keys of a paged pool, written in place into `block_keys`.
//! Shader: `shaders/qsa_compress_paged.wgsl`.

use super::common::*;
use crate::error::{Error, Result};
use crate::gpu::{Context, GpuTensor, PipelineKey};
use crate::paged::PoolLayout;
use crate::tensor::{DType, Tensor};

pub const OP: &str = "qsa_compress_paged";

/// Largest ratio: the shader resolves a block's token rows into a workgroup array of this
/// many (`MAX_R` in common/qsa_compress_block.wgsl).
pub const MAX_RATIO: usize = 512;

/// `incremental` writes the blocks completed by this step; `full` recomputes all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompressMode {
    Incremental,
    Full,
}

/// Attributes of `qsa_compress_paged`.
#[derive(Clone, Debug)]
pub struct QsaCompressAttrs {
    pub ratio: usize,
    /// `None`: taken from `freqs_cis` (0 without it).
    pub rotary_dim: Option<usize>,
    pub epsilon: f32,
    pub norm_weight_offset: f32,
    pub layer_idx: usize,
    pub page_stride: Option<i64>,
    pub mode: CompressMode,
}

impl QsaCompressAttrs {
    pub fn from_map(a: &AttrMap) -> Result<Self> {
        let ratio = attr_int(OP, a, "ratio", None)?;
        if !(2..=MAX_RATIO as i64).contains(&ratio) {
            return Err(Error::attr(
                OP,
                "ratio",
                format!("must be in 2..={MAX_RATIO}, got {ratio}"),
            ));
        }
        let rotary_dim = attr_opt_usize(OP, a, "rotary_dim")?;
        let layer = attr_int(OP, a, "layer_idx", Some(0))?;
        if layer < 0 {
            return Err(Error::attr(
                OP,
                "layer_idx",
                format!("must be >= 0, got {layer}"),
            ));
        }
        let page_stride = attr_opt_int(OP, a, "page_stride")?;
        let mode = match attr_str(OP, a, "mode", "incremental")?.as_str() {
            "incremental" => CompressMode::Incremental,
            "full" => CompressMode::Full,
            other => {
                return Err(Error::attr(
                    OP,
                    "mode",
                    format!("must be \"incremental\" or \"full\", got {other:?}"),
                ))
            }
        };
        let epsilon = attr_epsilon(OP, a)?;
        Ok(QsaCompressAttrs {
            ratio: ratio as usize,
            rotary_dim,
            epsilon,
            norm_weight_offset: attr_f32(OP, a, "norm_weight_offset", 0.0)?,
            layer_idx: layer as usize,
            page_stride,
            mode,
        })
    }
}

/// Inputs of `qsa_compress_paged`.
pub struct QsaCompressInputs<'a> {
    pub kv_blocks: &'a Tensor,
    pub page_table: &'a Tensor,
    pub cache_lengths: &'a Tensor,
    pub key_counts: &'a Tensor,
    pub gamma: Option<&'a Tensor>,
    pub freqs_cis: Option<&'a Tensor>,
    pub block_keys: &'a Tensor,
}

impl<'a> QsaCompressInputs<'a> {
    pub fn from_map(m: &'a TensorMap) -> Result<Self> {
        Ok(QsaCompressInputs {
            kv_blocks: req(OP, m, "kv_blocks")?,
            page_table: req(OP, m, "page_table")?,
            cache_lengths: req(OP, m, "cache_lengths")?,
            key_counts: req(OP, m, "key_counts")?,
            gamma: opt(m, "gamma"),
            freqs_cis: opt(m, "freqs_cis"),
            block_keys: req(OP, m, "block_keys")?,
        })
    }
}

/// The checked geometry of one call.
pub struct Plan {
    pub dt: DType,
    pub n: usize,
    pub di: usize,
    pub dr: usize,
    pub layout: PoolLayout,
    pub max_pages: usize,
    pub max_blocks: usize,
    pub freq_rows: usize,
    pub cache: Vec<u32>,
    pub counts: Vec<u32>,
    pub table: Vec<u32>,
    /// Blocks written per sequence, at most.
    pub span: usize,
}

impl Plan {
    /// First block written for sequence `n`.
    pub fn first(&self, n: usize, a: &QsaCompressAttrs) -> usize {
        match a.mode {
            CompressMode::Incremental => self.cache[n] as usize / a.ratio,
            CompressMode::Full => 0,
        }
    }
}

/// Every host-checkable rule of SPEC §2 (page-table entries included: they are host data here).
pub fn validate(x: &QsaCompressInputs, a: &QsaCompressAttrs) -> Result<Plan> {
    let r = a.ratio;
    let dt = float_type(OP, "kv_blocks", x.kv_blocks)?;
    let layout = PoolLayout::from_tensor(OP, "kv_blocks", x.kv_blocks, a.page_stride, true)?;
    if layout.num_kv_heads != 1 {
        return Err(Error::input(
            OP,
            "kv_blocks",
            format!(
                "the indexer pool has one KV head, got {}",
                layout.num_kv_heads
            ),
        ));
    }
    if a.layer_idx >= layout.num_layers {
        return Err(Error::attr(
            OP,
            "layer_idx",
            format!("{} >= num_layers {}", a.layer_idx, layout.num_layers),
        ));
    }
    let di = layout.head_dim;
    check_di(OP, "kv_blocks", di)?;
    let &[rows, bdi] = rank(OP, "block_keys", x.block_keys, 2)? else {
        unreachable!()
    };
    float_of(OP, "block_keys", x.block_keys, dt)?;
    if bdi != di {
        return Err(Error::input(
            OP,
            "block_keys",
            format!("has {bdi} channels, the pool has head_dim {di}"),
        ));
    }
    let cache = uints(OP, "cache_lengths", x.cache_lengths)?;
    let n = cache.len();
    rank(OP, "cache_lengths", x.cache_lengths, 1)?;
    let why = format!("cache_lengths holds {n} sequences");
    shape_because(OP, "key_counts", x.key_counts, &[n], Some(&why))?;
    let kc = ints(OP, "key_counts", x.key_counts)?;
    let &[tn, max_pages] = rank(OP, "page_table", x.page_table, 2)? else {
        unreachable!()
    };
    if tn != n {
        return Err(Error::input(
            OP,
            "page_table",
            format!("has {tn} rows for {n} sequences"),
        ));
    }
    let table = page_entries(OP, x.page_table)?;
    if n > 0 && !rows.is_multiple_of(n) {
        return Err(Error::input(
            OP,
            "block_keys",
            format!("{rows} rows do not split evenly over N = {n} sequences"),
        ));
    }
    let max_blocks = rows.checked_div(n).unwrap_or(0);
    let dr = match (x.freqs_cis, a.rotary_dim) {
        (None, _) => 0,
        (Some(f), dr) => {
            float_of(OP, "freqs_cis", f, dt)?;
            let &[_, w] = rank(OP, "freqs_cis", f, 2)? else {
                unreachable!()
            };
            let dr = dr.unwrap_or(w);
            if w != dr {
                return Err(Error::input(
                    OP,
                    "freqs_cis",
                    format!("has {w} columns, rotary_dim is {dr}"),
                ));
            }
            check_dr(OP, "freqs_cis", dr, di)?;
            dr
        }
    };
    let freq_rows = x.freqs_cis.map(|f| f.shape[0]).unwrap_or(0);
    if let Some(g) = x.gamma {
        float_of(OP, "gamma", g, dt)?;
        shape_is(OP, "gamma", g, &[di])?;
    }
    let mut counts = Vec::with_capacity(n);
    let mut span = 0;
    for i in 0..n {
        let k = kc[i];
        if k < cache[i] as i64 {
            return Err(Error::input(
                OP,
                "key_counts",
                format!("sequence {i}: key_counts {k} < cache_lengths {}", cache[i]),
            ));
        }
        if k as usize / r > max_blocks {
            return Err(Error::input(
                OP,
                "key_counts",
                format!("sequence {i}: {k} keys make {} blocks, block_keys holds {max_blocks} per sequence", k as usize / r),
            ));
        }
        let k = k as usize;
        let first = match a.mode {
            CompressMode::Incremental => cache[i] as usize / r,
            CompressMode::Full => 0,
        };
        let last = k / r;
        if last > first {
            span = span.max(last - first);
            let top = last * r - 1;
            if top / layout.page_size >= max_pages {
                return Err(Error::input(
                    OP,
                    "page_table",
                    format!("sequence {i}: position {top} needs page column {}, the table has {max_pages}", top / layout.page_size),
                ));
            }
            for col in (first * r) / layout.page_size..=top / layout.page_size {
                let at = (i * max_pages + col, i, col);
                check_page(OP, x.page_table, &table, at, layout.num_pages)?;
            }
            if dr > 0 && (last - 1) * r >= freq_rows {
                return Err(Error::input(
                    OP,
                    "freqs_cis",
                    format!(
                        "sequence {i}: position {} >= its {freq_rows} rows",
                        (last - 1) * r
                    ),
                ));
            }
        }
        counts.push(k as u32);
    }
    Ok(Plan {
        dt,
        n,
        di,
        dr,
        layout,
        max_pages,
        max_blocks,
        freq_rows,
        cache,
        counts,
        table,
        span,
    })
}

/// The CPU reference: returns the updated `block_keys`.
pub fn cpu(x: &QsaCompressInputs, a: &QsaCompressAttrs) -> Result<Tensor> {
    let p = validate(x, a)?;
    let (r, di, dr) = (a.ratio, p.di, p.dr);
    let pool = x.kv_blocks.to_f32();
    let gamma = x.gamma.map(|t| t.to_f32());
    let freqs = x.freqs_cis.map(|t| t.to_f32());
    let mut keys = x.block_keys.to_f32();
    let l = p.layout;
    for n in 0..p.n {
        for b in p.first(n, a)..p.counts[n] as usize / r {
            let row = &mut keys[(n * p.max_blocks + b) * di..][..di];
            row.fill(0.0);
            for j in 0..r {
                let pos = b * r + j;
                let page = p.table[n * p.max_pages + pos / l.page_size] as usize;
                let off = l.offset(page, 0, a.layer_idx, pos % l.page_size, 0);
                for (c, v) in row.iter_mut().enumerate() {
                    *v += pool[off + c];
                }
            }
            row.iter_mut().for_each(|v| *v /= r as f32);
            let pos0 = b * r;
            transform_row(
                row,
                gamma.as_deref(),
                a.epsilon,
                a.norm_weight_offset,
                dr,
                |c| {
                    let f = freqs.as_ref().unwrap();
                    let i = pos0 * dr + 2 * (c % (dr / 2));
                    (f[i], f[i + 1])
                },
            );
        }
    }
    // Rows not written keep their exact input bits; written rows are rounded once.
    let fresh = Tensor::from_f32(p.dt, &x.block_keys.shape, &keys);
    let mut out = x.block_keys.clone();
    let es = p.dt.size();
    for n in 0..p.n {
        let lo = (n * p.max_blocks + p.first(n, a)) * di * es;
        let hi = (n * p.max_blocks + p.counts[n] as usize / r) * di * es;
        if hi > lo {
            out.data[lo..hi].copy_from_slice(&fresh.data[lo..hi]);
        }
    }
    Ok(out)
}

/// Uniform parameters; layout checked against the WGSL struct by a test.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct QsaCompressParams {
    pub n: u32,
    pub di: u32,
    pub dr: u32,
    pub r: u32,
    pub page_size: u32,
    pub k_off: u32,
    pub page_stride: u32,
    pub num_pages: u32,
    pub max_pages: u32,
    pub max_blocks: u32,
    pub freq_rows: u32,
    pub span: u32,
    pub norm_on: u32,
    pub full: u32,
    pub eps: f32,
    pub offset: f32,
    /// First page of the pool binding (0 unless the pool is split in shards).
    pub page_lo: u32,
    /// Pages in the pool binding; blocks on other pages are skipped.
    pub shard_pages: u32,
    pub _pad0: u32,
    pub _pad1: u32,
}

/// Buffers of one compress dispatch, already on the device.
pub struct CompressBuffers<'a> {
    pub pool: &'a wgpu::Buffer,
    pub page_table: &'a wgpu::Buffer,
    /// `[2, N]` u32: cache_lengths then key_counts.
    pub lens: &'a wgpu::Buffer,
    pub gamma: Option<&'a wgpu::Buffer>,
    pub freqs: Option<&'a wgpu::Buffer>,
    pub block_keys: &'a wgpu::Buffer,
    pub flags: &'a wgpu::Buffer,
}

/// Params of a dispatch from a plan.
pub fn params(p: &Plan, a: &QsaCompressAttrs, norm_on: bool) -> QsaCompressParams {
    let l = p.layout;
    QsaCompressParams {
        n: p.n as u32,
        di: p.di as u32,
        dr: p.dr as u32,
        r: a.ratio as u32,
        page_size: l.page_size as u32,
        k_off: l.offset(0, 0, a.layer_idx, 0, 0) as u32,
        page_stride: l.page_stride as u32,
        num_pages: l.num_pages as u32,
        max_pages: p.max_pages as u32,
        max_blocks: p.max_blocks as u32,
        freq_rows: p.freq_rows as u32,
        span: p.span as u32,
        norm_on: norm_on as u32,
        full: (a.mode == CompressMode::Full) as u32,
        eps: a.epsilon,
        offset: a.norm_weight_offset,
        page_lo: 0,
        shard_pages: l.num_pages as u32,
        _pad0: 0,
        _pad1: 0,
    }
}

/// Describes one compress dispatch (recorded by the `encode_` wrapper below or an orchestrator).
pub fn dispatch_compress<'a>(
    ctx: &'a Context,
    dt: DType,
    prm: &'a QsaCompressParams,
    b: &'a CompressBuffers<'a>,
) -> Result<Dispatch<'a>> {
    Ok(Dispatch {
        key: PipelineKey::new(OP, "main").with("T_KIND", dt.shader_kind()),
        params: bytemuck::bytes_of(prm),
        buffers: vec![
            b.pool,
            b.page_table,
            b.lens,
            b.gamma.unwrap_or(&ctx.dummy),
            b.freqs.unwrap_or(&ctx.dummy),
            b.block_keys,
            b.flags,
        ],
        textures: vec![],
        groups: prm.n * prm.span,
    })
}

/// Records the dispatch of [`dispatch_compress`] with a fresh bind group.
pub async fn encode_compress(
    ctx: &Context,
    enc: &mut wgpu::CommandEncoder,
    dt: DType,
    prm: &QsaCompressParams,
    b: &CompressBuffers<'_>,
) -> Result<()> {
    encode(ctx, enc, dispatch_compress(ctx, dt, prm, b)?).await
}

/// Runs on the GPU: uploads, one dispatch, readback of `block_keys` and the flags.
pub async fn gpu(ctx: &Context, x: &QsaCompressInputs<'_>, a: &QsaCompressAttrs) -> Result<Tensor> {
    let p = validate(x, a)?;
    let up = |name: &str, t: &Tensor| GpuTensor::upload(ctx, &format!("qsa.{OP}.{name}"), t);
    let pool = up("kv_blocks", x.kv_blocks)?;
    let table = up("page_table", &Tensor::from_u32(&[p.table.len()], &p.table))?;
    let lens: Vec<u32> = p.cache.iter().chain(p.counts.iter()).copied().collect();
    let lens = up("lens", &Tensor::from_u32(&[lens.len()], &lens))?;
    let gamma = x.gamma.map(|g| up("gamma", g)).transpose()?;
    let freqs = x.freqs_cis.map(|f| up("freqs_cis", f)).transpose()?;
    let keys = up("block_keys", x.block_keys)?;
    let flags = flag_word(ctx)?;
    let prm = params(&p, a, gamma.is_some());
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let bufs = CompressBuffers {
        pool: &pool.buffer,
        page_table: &table.buffer,
        lens: &lens.buffer,
        gamma: gamma.as_ref().map(|g| &g.buffer),
        freqs: freqs.as_ref().map(|f| &f.buffer),
        block_keys: &keys.buffer,
        flags: &flags.buffer,
    };
    encode_compress(ctx, &mut enc, p.dt, &prm, &bufs).await?;
    ctx.submit(OP, enc).await?;
    let mut got = read_checked(ctx, OP, &[&keys], &flags).await?;
    Ok(got.remove(0))
}

#[cfg(test)]
mod tests {
    /// The host's largest ratio is the shaders' row array (both shaders that compress blocks).
    #[test]
    fn max_ratio_matches_the_shaders() {
        for shader in [super::OP, "qsa_compress_query"] {
            let r = crate::shaders::wgsl_u32(shader, "MAX_R") as usize;
            assert_eq!(r, super::MAX_RATIO, "{shader}");
        }
    }
}
