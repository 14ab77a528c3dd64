//! The operators of the contract, one module each (params, validation, CPU reference, GPU
//! encode), and the registry that runs one by name on a map of named tensors.

pub mod block_score;
pub mod block_topk;
pub mod common;
pub mod expand_route;
pub mod nsa_compress;
pub mod nsa_compress_attention;
pub mod qsa_compress_paged;
pub mod qsa_prepare;
pub mod qsa_prepare_query;
pub mod sparse_attention;

pub use common::{AttrMap, Exec, TensorMap};

use crate::error::{Error, Result};

/// Operator names [`run`] knows.
pub const NAMES: &[&str] = &[
    qsa_prepare::OP,
    qsa_compress_paged::OP,
    qsa_prepare_query::OP,
    block_score::OP,
    expand_route::OP,
    block_topk::OP,
    nsa_compress::OP,
    nsa_compress_attention::OP,
    sparse_attention::OP,
];

/// Runs operator `op` on named inputs and attributes; returns the named outputs.
pub async fn run(
    op: &str,
    inputs: &TensorMap,
    attrs: &AttrMap,
    exec: Exec<'_>,
) -> Result<TensorMap> {
    match op {
        qsa_prepare::OP => {
            let a = qsa_prepare::QsaPrepareAttrs::from_map(attrs)?;
            let x = qsa_prepare::QsaPrepareInputs::from_map(inputs)?;
            let out = match exec {
                Exec::Cpu => qsa_prepare::cpu(&x, &a)?,
                Exec::Gpu(ctx) => qsa_prepare::gpu(ctx, &x, &a).await?,
            };
            Ok(out.into_map())
        }
        qsa_compress_paged::OP => {
            let a = qsa_compress_paged::QsaCompressAttrs::from_map(attrs)?;
            let x = qsa_compress_paged::QsaCompressInputs::from_map(inputs)?;
            let out = match exec {
                Exec::Cpu => qsa_compress_paged::cpu(&x, &a)?,
                Exec::Gpu(ctx) => qsa_compress_paged::gpu(ctx, &x, &a).await?,
            };
            Ok(TensorMap::from([("block_keys".to_string(), out)]))
        }
        qsa_prepare_query::OP => {
            let a = qsa_prepare_query::QsaPrepareQueryAttrs::from_map(attrs)?;
            let x = qsa_prepare_query::QsaPrepareQueryInputs::from_map(inputs)?;
            let out = match exec {
                Exec::Cpu => qsa_prepare_query::cpu(&x, &a)?,
                Exec::Gpu(ctx) => qsa_prepare_query::gpu(ctx, &x, &a).await?,
            };
            Ok(TensorMap::from([("index_query".to_string(), out)]))
        }
        block_topk::OP => {
            let a = block_topk::BlockTopkAttrs::from_map(attrs)?;
            let x = block_topk::BlockTopkInputs::from_map(inputs)?;
            let out = match exec {
                Exec::Cpu => block_topk::cpu(&x, &a)?,
                Exec::Gpu(ctx) => block_topk::gpu(ctx, &x, &a).await?,
            };
            Ok(out.into_map())
        }
        block_score::OP => {
            let a = block_score::BlockScoreAttrs::from_map(attrs)?;
            let x = block_score::BlockScoreInputs::from_map(inputs)?;
            let out = match exec {
                Exec::Cpu => block_score::cpu(&x, &a)?,
                Exec::Gpu(ctx) => block_score::gpu(ctx, &x, &a).await?,
            };
            Ok(TensorMap::from([("scores".to_string(), out)]))
        }
        expand_route::OP => {
            let r = expand_route::ratio_from_map(attrs)?;
            let x = expand_route::ExpandRouteInputs::from_map(inputs)?;
            let out = match exec {
                Exec::Cpu => expand_route::cpu(&x, r)?,
                Exec::Gpu(ctx) => expand_route::gpu(ctx, &x, r).await?,
            };
            Ok(out.into_map())
        }
        nsa_compress::OP => {
            let a = nsa_compress::NsaCompressAttrs::from_map(attrs)?;
            let x = nsa_compress::NsaCompressInputs::from_map(inputs)?;
            let out = match exec {
                Exec::Cpu => nsa_compress::cpu(&x, &a)?,
                Exec::Gpu(ctx) => nsa_compress::gpu(ctx, &x, &a).await?,
            };
            Ok(TensorMap::from([("out".to_string(), out)]))
        }
        nsa_compress_attention::OP => {
            let a = nsa_compress_attention::NsaCompressAttentionAttrs::from_map(attrs)?;
            let x = nsa_compress_attention::NsaCompressAttentionInputs::from_map(inputs)?;
            let out = match exec {
                Exec::Cpu => nsa_compress_attention::cpu(&x, &a)?,
                Exec::Gpu(ctx) => nsa_compress_attention::gpu(ctx, &x, &a).await?,
            };
            Ok(out.into_map())
        }
        sparse_attention::OP => {
            let a = sparse_attention::SparseAttentionAttrs::from_map(attrs)?;
            let x = sparse_attention::SparseAttentionInputs::from_map(inputs)?;
            let out = match exec {
                Exec::Cpu => sparse_attention::cpu(&x, &a)?,
                Exec::Gpu(ctx) => sparse_attention::gpu(ctx, &x, &a).await?,
            };
            Ok(TensorMap::from([("out".to_string(), out)]))
        }
        other => Err(Error::UnknownOp(other.to_string(), NAMES.join(", "))),
    }
}

/// Runs operator `op` on the CPU reference, synchronously on every target (the CPU path of
/// [`run`] never waits, so its future is ready on the first poll; no executor is needed).
pub fn run_cpu(op: &str, inputs: &TensorMap, attrs: &AttrMap) -> Result<TensorMap> {
    use futures::FutureExt;
    run(op, inputs, attrs, Exec::Cpu)
        .now_or_never()
        .expect("the CPU path of ops::run does not wait")
}

/// Blocking wrapper of [`run`] for native callers.
#[cfg(not(target_arch = "wasm32"))]
pub fn run_blocking(
    op: &str,
    inputs: &TensorMap,
    attrs: &AttrMap,
    exec: Exec<'_>,
) -> Result<TensorMap> {
    pollster::block_on(run(op, inputs, attrs, exec))
}
