//! The operators of the contract, one module each (params, validation, CPU reference, GPU
//! encode), and the registry that runs one by name on a map of named tensors.

pub mod common;
pub mod qsa_compress_paged;
pub mod qsa_prepare;
pub mod qsa_prepare_query;

pub use common::{AttrMap, Exec, TensorMap};

use crate::error::{Error, Result};

/// Operator names [`run`] knows.
pub const NAMES: &[&str] = &[
    qsa_prepare::OP,
    qsa_compress_paged::OP,
    qsa_prepare_query::OP,
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
        other => Err(Error::UnknownOp(other.to_string(), NAMES.join(", "))),
    }
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
