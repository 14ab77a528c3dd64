//! `block_topk` over rows wider than the one-workgroup kernels take ([`MAX_W`] columns, whose
//! ties they key by a 16-bit column): DSA's indexer (r = 1) over a long context scores one
//! column per token. The row is cut into chunks of at most [`MAX_W`] columns, the usual kernel
//! selects each chunk's k best, `shaders/block_topk_chunks.wgsl` gathers their scores into one
//! merged row per score row, the usual kernel selects the k best of that, and the shader maps
//! them back to columns. Same outputs as one selection over the row: the k best of a row are
//! among its chunks' k best, and ties keep the lower column (the shader says why).

use super::block_topk::{
    dispatch_topk, read_outputs, BlockTopkInputs, BlockTopkOutputs, Plan, MAX_W, OP,
};
use super::common::{encode, Dispatch};
use crate::error::{Error, Result};
use crate::gpu::{Context, GpuTensor, PipelineKey};
use crate::tensor::{DType, Tensor};

/// The chunks' join (`gather`, `map`).
pub const SHADER: &str = "block_topk_chunks";

/// Uniform parameters of `block_topk_chunks.wgsl`; layout checked against the WGSL struct by a
/// test.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockTopkChunksParams {
    /// Score rows, T · Hs.
    pub rows: u32,
    /// Columns per chunk.
    pub wc: u32,
    /// Chunks per row.
    pub nch: u32,
    pub k: u32,
}

/// How a row of width `w` is cut: `(nch, wc)`, chunks and columns per chunk (a multiple of 4,
/// so that chunks start on the 16-byte words the kernels read), or `None` where one selection
/// takes the row (w <= [`MAX_W`]).
pub fn chunks(w: usize) -> Option<(usize, usize)> {
    if w <= MAX_W {
        return None;
    }
    let nch = w.div_ceil(MAX_W);
    Some((nch, w.div_ceil(nch).next_multiple_of(4)))
}

/// The host checks of a chunked selection: the merged row (`nch · k` columns) must itself be a
/// row one selection takes, and the padded chunks must stay within u32 element offsets.
pub fn validate(rows: usize, w: usize, k: usize) -> Result<()> {
    let Some((nch, wc)) = chunks(w) else {
        return Ok(());
    };
    if nch.saturating_mul(k) > MAX_W {
        return Err(Error::input(
            OP,
            "scores",
            format!(
                "row width W = {w} with k = {k}: rows over {MAX_W} columns are selected in {nch} \
                 chunks whose k best each are merged, and {nch} · k = {} exceeds {MAX_W} \
                 (W <= {MAX_W} · floor({MAX_W} / k) = {})",
                nch * k,
                MAX_W * (MAX_W / k)
            ),
        ));
    }
    if rows.saturating_mul(nch).saturating_mul(wc) > u32::MAX as usize {
        return Err(Error::input(
            OP,
            "scores",
            format!("{rows} rows of W = {w} in {nch} chunks of {wc} exceed 2^32 elements"),
        ));
    }
    Ok(())
}

/// The rows of `scores` ([rows, w] f32) cut into `nch` chunks of `wc` columns, the last one
/// padded with -inf: [rows · nch, wc].
fn chunked_scores(scores: &Tensor, rows: usize, w: usize, nch: usize, wc: usize) -> Tensor {
    let pad = f32::NEG_INFINITY.to_le_bytes();
    let mut data = Vec::with_capacity(rows * nch * wc * 4);
    for row in scores.data.chunks_exact(w * 4).take(rows) {
        data.extend_from_slice(row);
        for _ in w..nch * wc {
            data.extend_from_slice(&pad);
        }
    }
    Tensor::from_bytes(DType::F32, &[rows * nch, wc], data).expect("sized above")
}

/// The join's dispatch `entry` over its buffers.
fn join<'a>(
    params: &'a BlockTopkChunksParams,
    entry: &'static str,
    buffers: Vec<&'a wgpu::Buffer>,
    invocations: u32,
) -> Dispatch<'a> {
    Dispatch {
        key: PipelineKey::new(SHADER, entry),
        params: bytemuck::bytes_of(params),
        buffers,
        textures: vec![],
        groups: invocations.div_ceil(256),
    }
}

/// Runs a checked selection whose rows are wider than [`MAX_W`] on the GPU: one submission of
/// four dispatches (the chunks' selections, `gather`, the merged rows' selection, `map`), then
/// the readback.
pub async fn gpu(ctx: &Context, x: &BlockTopkInputs<'_>, p: &Plan) -> Result<BlockTopkOutputs> {
    let (rows, w, k) = (p.t * p.hs, p.w, p.k);
    let (nch, wc) = chunks(w).expect("rows wider than MAX_W");
    let label = |name: &str| format!("qsa.{OP}.chunks.{name}");
    let part = chunked_scores(x.scores, rows, w, nch, wc);
    let part = GpuTensor::upload(ctx, &label("scores"), &part)?;
    // Every slot of these is written; the sentinel (not -1) shows a missed write.
    let i32s =
        |name: &str, shape: &[usize]| GpuTensor::filled(ctx, &label(name), DType::I32, shape, 0x7f);
    let part_idx = i32s("chunk_indices", &[rows * nch, k])?;
    let part_cnt = i32s("chunk_count", &[rows * nch])?;
    let merged = GpuTensor::filled(ctx, &label("merged"), DType::F32, &[rows, nch * k], 0x7f)?;
    let merged_idx = i32s("merged_indices", &[rows, k])?;
    let idx = i32s("block_indices", &[p.t, p.hs, k])?;
    let cnt = i32s("block_count", &[p.t, p.hs])?;

    // The chunks' rows, then the merged rows: each a row of one selection (dispatch_topk
    // checks their buffers against the binding limit).
    let first = Plan {
        t: rows * nch,
        hs: 1,
        w: wc,
        k,
    }
    .params();
    let second = Plan {
        t: rows,
        hs: 1,
        w: nch * k,
        k,
    }
    .params();
    let jp = BlockTopkChunksParams {
        rows: rows as u32,
        wc: wc as u32,
        nch: nch as u32,
        k: k as u32,
    };
    let join_buffers = vec![
        &part.buffer,
        &part_idx.buffer,
        &merged.buffer,
        &merged_idx.buffer,
        &idx.buffer,
    ];
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let d = dispatch_topk(
        ctx,
        &first,
        &part.buffer,
        &part_idx.buffer,
        &part_cnt.buffer,
        None,
    )?;
    encode(ctx, &mut enc, d).await?;
    let n = (rows * nch * k) as u32;
    encode(ctx, &mut enc, join(&jp, "gather", join_buffers.clone(), n)).await?;
    let d = dispatch_topk(
        ctx,
        &second,
        &merged.buffer,
        &merged_idx.buffer,
        &cnt.buffer,
        None,
    )?;
    encode(ctx, &mut enc, d).await?;
    let n = (rows * k) as u32;
    encode(ctx, &mut enc, join(&jp, "map", join_buffers, n)).await?;
    ctx.submit(OP, enc).await?;
    read_outputs(ctx, &idx, &cnt).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows up to MAX_W are one selection; wider ones are cut into the fewest chunks of at most
    /// MAX_W columns, each a multiple of 4, covering the row.
    #[test]
    fn chunk_shapes() {
        assert_eq!(chunks(MAX_W), None);
        assert_eq!(chunks(1), None);
        for w in [
            MAX_W + 1,
            131072,
            140_003,
            3 * MAX_W,
            3 * MAX_W + 1,
            2_000_000,
        ] {
            let (nch, wc) = chunks(w).unwrap();
            assert_eq!(nch, w.div_ceil(MAX_W), "W = {w}");
            assert!(
                wc <= MAX_W && wc % 4 == 0 && nch * wc >= w,
                "W = {w}: {nch} × {wc}"
            );
            assert!((nch - 1) * wc < w, "W = {w}: an empty last chunk");
        }
    }

    /// The padded copy keeps each row's bits and fills the rest with -inf.
    #[test]
    fn chunked_scores_pad_with_neg_inf() {
        let v: Vec<f32> = (0..10).map(|i| i as f32 - 0.5).collect();
        let t = Tensor::from_f32(DType::F32, &[2, 5], &v);
        let c = chunked_scores(&t, 2, 5, 2, 4).to_f32();
        let ni = f32::NEG_INFINITY;
        let want = [
            -0.5, 0.5, 1.5, 2.5, 3.5, ni, ni, ni, 4.5, 5.5, 6.5, 7.5, 8.5, ni, ni, ni,
        ];
        assert_eq!(c, want);
    }

    /// The merged row must be one selection's row; the message names the limit.
    #[test]
    fn merged_rows_must_fit() {
        assert!(validate(4, 2 * MAX_W, 2048).is_ok());
        assert!(validate(4, 32 * MAX_W, 2048).is_ok());
        let e = validate(1, 32 * MAX_W + 1, 2048).unwrap_err().to_string();
        assert!(
            e.contains("block_topk") && e.contains("scores") && e.contains("33"),
            "{e}"
        );
    }
}
