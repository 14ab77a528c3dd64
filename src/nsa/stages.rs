//! The selector's own two stages, each beside its shader: `nsa_compress_paged`
//! (`shaders/nsa_compress_paged.wgsl`: nsa_compress over the raw paged pool, written into the
//! paged compressed cache) and `nsa_select_expand` (`shaders/nsa_select_expand.wgsl`: the token
//! lists of the selected l'-token blocks, clipped to each query's position). Each has its
//! params struct (checked against the WGSL layout by a test), a dispatch description for a
//! `BindCache`, and a CPU port; the compress stage's CPU port is `nsa_compress`'s reference
//! itself, fed by a gather (`cpu.rs`).

use crate::error::{Error, Result};
use crate::gpu::{Context, PipelineKey};
use crate::ops::common::Dispatch;
use crate::tensor::{DType, Tensor};

/// Shader (and pipeline label) of the compress stage.
pub const COMPRESS_SHADER: &str = "nsa_compress_paged";
/// Shader (and pipeline label) of the expand stage.
pub const EXPAND_SHADER: &str = "nsa_select_expand";

/// Uniform parameters of `nsa_compress_paged`; layout checked against the WGSL struct.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct NsaCompressPagedParams {
    /// Output words of this dispatch (one f32, or two f16/bf16, each).
    pub words: u32,
    /// Output elements: new windows · N · width.
    pub total: u32,
    /// Batch entries B.
    pub batches: u32,
    /// KV heads N.
    pub heads: u32,
    /// Channels compressed: Dqk for K, Dv for V.
    pub width: u32,
    /// Channels of a pool row per head (≥ width).
    pub head_dim: u32,
    /// Elements from a page's start to row 0 of the plane read (K or V).
    pub plane_off: u32,
    pub page_size: u32,
    pub page_stride: u32,
    pub num_pages: u32,
    /// Columns of the page table.
    pub max_pages: u32,
    pub l: u32,
    pub d: u32,
    /// Compressed tokens per cache block P.
    pub cmp_page: u32,
    /// Blocks of the compressed cache.
    pub cmp_blocks: u32,
    /// Columns of the cache's block table.
    pub max_cmp_blocks: u32,
}

/// Device buffers of one `nsa_compress_paged` dispatch.
pub struct CompressPagedBuffers<'a> {
    /// The raw pool `[num_pages, 2, 1, page_size, N, head_dim]` T.
    pub pool: &'a wgpu::Buffer,
    /// `[l, N]` T.
    pub weight: &'a wgpu::Buffer,
    /// `[B+1 | B | B | B·max_pages]` u32: the first output row of each batch entry's new
    /// windows (then the total), its first new window, its raw length, its page table.
    pub seqs: &'a wgpu::Buffer,
    /// `[B, max_cmp_blocks]` i32: the compressed cache's block table.
    pub table: &'a wgpu::Buffer,
    /// The compressed cache `[cmp_blocks, P, N·width]` T, written in place.
    pub cache: &'a wgpu::Buffer,
    /// The flag word (`shaders/common/flags.wgsl`).
    pub flags: &'a wgpu::Buffer,
}

/// The `seqs` image of [`CompressPagedBuffers`].
pub fn compress_seqs(
    win_off: &[u32],
    first_win: &[u32],
    raw_len: &[u32],
    table: &[u32],
) -> Vec<u32> {
    [win_off, first_win, raw_len, table].concat()
}

/// Describes one compress dispatch; buffers too small for `prm` are an error here.
pub fn dispatch_compress_paged<'a>(
    ctx: &'a Context,
    dt: DType,
    prm: &'a NsaCompressPagedParams,
    b: &CompressPagedBuffers<'a>,
) -> Result<Dispatch<'a>> {
    let op = COMPRESS_SHADER;
    let row = prm.heads as u64 * prm.width as u64;
    let bad = |name: &str, msg: String| Err(Error::input(op, name, msg));
    if !dt.is_float() || row == 0 || prm.width > prm.head_dim || prm.l == 0 || prm.d == 0 {
        return bad("params", format!("{dt}, {prm:?}"));
    }
    if prm.page_size == 0 || prm.cmp_page == 0 {
        return bad("params", format!("page sizes in {prm:?}"));
    }
    if dt != DType::F32 && !row.is_multiple_of(2) {
        return bad(
            "cache",
            format!("{dt} rows of N·width = {row} elements must fill whole words"),
        );
    }
    let per_word = if dt == DType::F32 { 1 } else { 2 };
    if prm.total as u64 != prm.words as u64 * per_word {
        return bad(
            "params",
            format!("{} words for {} elements", prm.words, prm.total),
        );
    }
    let es = dt.size() as u64;
    let (nb, heads) = (prm.batches as u64, prm.heads as u64);
    let pool_rows = prm.page_size as u64 * heads * prm.head_dim as u64;
    let pool_need = (prm.num_pages as u64).saturating_sub(1) * prm.page_stride as u64
        + prm.plane_off as u64
        + pool_rows;
    for (name, buf, bytes) in [
        ("pool", b.pool, pool_need * es),
        (
            "weight",
            b.weight,
            (prm.l as u64 * heads * es).div_ceil(4) * 4,
        ),
        ("seqs", b.seqs, (3 * nb + 1 + nb * prm.max_pages as u64) * 4),
        ("table", b.table, nb * prm.max_cmp_blocks as u64 * 4),
        (
            "cache",
            b.cache,
            prm.cmp_blocks as u64 * prm.cmp_page as u64 * row * es,
        ),
    ] {
        ctx.check_binding_size(op, name, bytes)?;
        if buf.size() < bytes {
            return bad(
                name,
                format!("buffer holds {} bytes, the call needs {bytes}", buf.size()),
            );
        }
    }
    Ok(Dispatch {
        key: PipelineKey::new(COMPRESS_SHADER, "main").with("T_KIND", dt.shader_kind()),
        params: bytemuck::bytes_of(prm),
        buffers: vec![b.pool, b.weight, b.seqs, b.table, b.cache, b.flags],
        textures: vec![],
        groups: prm.words.div_ceil(64),
    })
}

/// Uniform parameters of `nsa_select_expand`; layout checked against the WGSL struct.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct NsaSelectExpandParams {
    /// Query rows T.
    pub t: u32,
    /// Selection groups (KV heads).
    pub hs: u32,
    /// Selected blocks per row k.
    pub k: u32,
    /// Select block size l'.
    pub lsel: u32,
    /// Token slots per row: k·l'.
    pub width: u32,
    pub _pad0: u32,
    pub _pad1: u32,
    pub _pad2: u32,
}

/// Device buffers of one `nsa_select_expand` dispatch.
pub struct SelectExpandBuffers<'a> {
    /// `[T, Hs, k]` i32.
    pub topk: &'a wgpu::Buffer,
    /// `[T]` i32.
    pub positions: &'a wgpu::Buffer,
    /// `[T, Hs, k·l']` i32, every slot written.
    pub token_indices: &'a wgpu::Buffer,
    /// `[T, Hs]` i32.
    pub token_count: &'a wgpu::Buffer,
    pub flags: &'a wgpu::Buffer,
}

/// Describes one expand dispatch; buffers too small for `prm` are an error here.
pub fn dispatch_select_expand<'a>(
    ctx: &'a Context,
    prm: &'a NsaSelectExpandParams,
    b: &SelectExpandBuffers<'a>,
) -> Result<Dispatch<'a>> {
    let op = EXPAND_SHADER;
    if prm.lsel == 0 || prm.width as u64 != prm.k as u64 * prm.lsel as u64 {
        return Err(Error::input(op, "params", format!("{prm:?}")));
    }
    let rows = prm.t as u64 * prm.hs as u64;
    let total = rows * prm.width as u64;
    if total > u32::MAX as u64 / 2 {
        return Err(Error::input(
            op,
            "token_indices",
            format!("{total} slots exceed u32 addressing"),
        ));
    }
    for (name, buf, bytes) in [
        ("topk", b.topk, rows * prm.k as u64 * 4),
        ("positions", b.positions, prm.t as u64 * 4),
        ("token_indices", b.token_indices, total * 4),
        ("token_count", b.token_count, rows * 4),
    ] {
        ctx.check_binding_size(op, name, bytes)?;
        if buf.size() < bytes {
            return Err(Error::input(
                op,
                name,
                format!("buffer holds {} bytes, the call needs {bytes}", buf.size()),
            ));
        }
    }
    Ok(Dispatch {
        key: PipelineKey::new(EXPAND_SHADER, "main"),
        params: bytemuck::bytes_of(prm),
        buffers: vec![b.topk, b.positions, b.token_indices, b.token_count, b.flags],
        textures: vec![],
        groups: (total as u32).div_ceil(64),
    })
}

/// The CPU port of `nsa_select_expand`: from `topk [T, Hs, k]` i32 and each row's position,
/// `token_indices [T, Hs, k·l']` (each selected block's positions in selection order, clipped
/// to ≤ p, then −1) and `token_count [T, Hs]`.
pub fn select_expand_cpu(
    topk: &Tensor,
    positions: &[i32],
    lsel: usize,
) -> Result<(Tensor, Tensor)> {
    let &[t, hs, k] = topk.shape.as_slice() else {
        return Err(Error::input(
            EXPAND_SHADER,
            "topk",
            format!("expected [T, Hs, k], got {:?}", topk.shape),
        ));
    };
    if positions.len() != t || positions.iter().any(|&p| p < 0) || lsel == 0 {
        return Err(Error::input(
            EXPAND_SHADER,
            "positions",
            format!(
                "{} positions for {t} rows (each >= 0), l' = {lsel}",
                positions.len()
            ),
        ));
    }
    let sel = topk.to_i32();
    let width = k * lsel;
    let mut tokens = vec![-1i32; t * hs * width];
    let mut count = vec![0i32; t * hs];
    for row in 0..t * hs {
        let p1 = positions[row / hs] as usize + 1;
        let out = &mut tokens[row * width..][..width];
        let mut j = 0;
        for &o in &sel[row * k..][..k] {
            if o < 0 {
                continue;
            }
            let first = o as usize * lsel;
            for pos in first..(first + lsel).min(p1) {
                out[j] = pos as i32;
                j += 1;
            }
        }
        count[row] = j as i32;
    }
    Ok((
        Tensor::from_i32(&[t, hs, width], &tokens),
        Tensor::from_i32(&[t, hs], &count),
    ))
}
