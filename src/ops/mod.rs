//! The operators of the contract, one module each (params, validation, CPU reference, GPU
//! encode), and the registry that runs one by name on a map of named tensors.

pub mod block_score;
pub mod block_topk;
pub mod block_topk_chunks;
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

/// The names an operator takes and gives: attributes, inputs and outputs (SPEC §1–§8).
pub struct Signature {
    pub op: &'static str,
    pub attrs: &'static [&'static str],
    pub inputs: &'static [&'static str],
    pub outputs: &'static [&'static str],
}

/// Every operator [`run`] knows, by its [`Signature`].
pub const SIGNATURES: &[Signature] = &[
    Signature {
        op: qsa_prepare::OP,
        attrs: &["key_block_size", "epsilon", "norm_weight_offset"],
        inputs: &[
            "raw_index_keys",
            "past_block_index_keys",
            "key_length",
            "rope_cos",
            "rope_sin",
            "k_norm_weight",
            "past_incomplete_raw_keys",
            "past_incomplete_rope",
        ],
        outputs: &["block_index_keys", "incomplete_raw_keys", "incomplete_rope"],
    },
    Signature {
        op: qsa_compress_paged::OP,
        attrs: &[
            "ratio",
            "rotary_dim",
            "epsilon",
            "norm_weight_offset",
            "layer_idx",
            "page_stride",
            "mode",
        ],
        inputs: &[
            "kv_blocks",
            "page_table",
            "cache_lengths",
            "key_counts",
            "gamma",
            "freqs_cis",
            "block_keys",
        ],
        outputs: &["block_keys"],
    },
    Signature {
        op: qsa_prepare_query::OP,
        attrs: &["epsilon", "norm_weight_offset", "rotary_dim"],
        inputs: &[
            "index_query_raw",
            "q_norm_weight",
            "rope_cos",
            "rope_sin",
            "freqs_cis",
            "positions",
        ],
        outputs: &["index_query"],
    },
    Signature {
        op: block_score::OP,
        attrs: &["ratio", "num_selection_heads", "scale"],
        inputs: &[
            "index_query",
            "block_keys",
            "row_offsets",
            "cache_lengths",
            "key_counts",
            "index_weights",
        ],
        outputs: &["scores"],
    },
    Signature {
        op: expand_route::OP,
        attrs: &["ratio"],
        inputs: &["block_indices", "block_count", "positions"],
        outputs: &["token_indices", "token_count"],
    },
    Signature {
        op: block_topk::OP,
        attrs: &["k", "token_budget", "ratio"],
        inputs: &["scores"],
        outputs: &["block_indices", "block_count"],
    },
    Signature {
        op: nsa_compress::OP,
        attrs: &["l", "d"],
        inputs: &["input", "weight", "seq_lens"],
        outputs: &["out"],
    },
    Signature {
        op: nsa_compress_attention::OP,
        attrs: &[
            "num_heads",
            "num_kv_heads",
            "compress_block_size",
            "compress_stride",
            "select_block_size",
            "select_block_count",
            "scale",
            "layout",
            "causal_mask",
        ],
        inputs: &[
            "query",
            "key",
            "value",
            "block_table",
            "actual_q_len",
            "actual_cmp_kv_len",
            "actual_sel_kv_len",
        ],
        outputs: &["out", "topk"],
    },
    Signature {
        op: sparse_attention::OP,
        attrs: &["scale", "layer_idx", "page_stride", "v_head_dim"],
        inputs: &[
            "query",
            "kv_blocks",
            "page_table",
            "row_offsets",
            "cache_lengths",
            "token_indices",
            "token_count",
            "sinks",
        ],
        outputs: &["out"],
    },
];

/// The names of the operators [`run`] knows, comma-separated.
pub fn names() -> String {
    SIGNATURES
        .iter()
        .map(|s| s.op)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The [`Signature`] of operator `op`.
pub fn signature(op: &str) -> Result<&'static Signature> {
    SIGNATURES
        .iter()
        .find(|s| s.op == op)
        .ok_or_else(|| Error::UnknownOp(op.to_string(), names()))
}

/// Rejects an attribute or input `op` does not have (a misspelt `layer_idx` would otherwise
/// fall back to its default without a word). A tensor named as one of the operator's outputs is
/// let through and ignored, so a case file may carry its expected results.
pub fn check_names(op: &str, inputs: &TensorMap, attrs: &AttrMap) -> Result<()> {
    let sig = signature(op)?;
    if let Some(a) = attrs.keys().find(|a| !sig.attrs.contains(&a.as_str())) {
        return Err(Error::attr(
            sig.op,
            a.as_str(),
            format!(
                "not an attribute of {} (its attributes: {})",
                sig.op,
                sig.attrs.join(", ")
            ),
        ));
    }
    let known = |n: &str| sig.inputs.contains(&n) || sig.outputs.contains(&n);
    if let Some(i) = inputs.keys().find(|i| !known(i.as_str())) {
        return Err(Error::input(
            sig.op,
            i.as_str(),
            format!(
                "not an input of {} (its inputs: {})",
                sig.op,
                sig.inputs.join(", ")
            ),
        ));
    }
    Ok(())
}

/// Runs operator `op` on named inputs and attributes; returns the named outputs. An attribute
/// or input the operator does not have is an error ([`check_names`]).
pub async fn run(
    op: &str,
    inputs: &TensorMap,
    attrs: &AttrMap,
    exec: Exec<'_>,
) -> Result<TensorMap> {
    check_names(op, inputs, attrs)?;
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
        other => Err(Error::UnknownOp(other.to_string(), names())),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The string literals that follow `prefix` in `src` once all whitespace is removed (the
    /// name argument of `attr_int(OP, a, "ratio", …)`, `req(OP, m, "query")`, …).
    fn names_after(src: &str, prefix: &str) -> Vec<String> {
        let flat: String = src.chars().filter(|c| !c.is_whitespace()).collect();
        flat.match_indices(prefix)
            .filter_map(|(i, _)| {
                let rest = &flat[i + prefix.len()..];
                rest.find('"').map(|end| rest[..end].to_string())
            })
            .collect()
    }

    /// Every attribute and input name an operator's module reads, from its source.
    fn read_names(src: &str) -> (Vec<String>, Vec<String>) {
        // `pos("…")` and `opt_pos("…")`: nsa_compress_attention's closures over `attr_int`.
        let mut attrs = names_after(src, "(OP,a,\"");
        attrs.extend(names_after(src, "pos(\""));
        if src.contains("attr_epsilon(OP, a)") {
            attrs.push("epsilon".into());
        }
        let mut inputs = names_after(src, "req(OP,m,\"");
        inputs.extend(names_after(src, "opt(m,\""));
        (attrs, inputs)
    }

    /// Each signature lists exactly the names its module reads, so that `check_names` never
    /// turns away an attribute or input the operator takes, nor lets through one it ignores.
    #[test]
    fn signatures_match_what_the_modules_read() {
        let sources = [
            (qsa_prepare::OP, include_str!("qsa_prepare.rs")),
            (
                qsa_compress_paged::OP,
                include_str!("qsa_compress_paged.rs"),
            ),
            (qsa_prepare_query::OP, include_str!("qsa_prepare_query.rs")),
            (block_score::OP, include_str!("block_score.rs")),
            (expand_route::OP, include_str!("expand_route.rs")),
            (block_topk::OP, include_str!("block_topk.rs")),
            (nsa_compress::OP, include_str!("nsa_compress.rs")),
            (
                nsa_compress_attention::OP,
                include_str!("nsa_compress_attention/mod.rs"),
            ),
            (
                sparse_attention::OP,
                include_str!("sparse_attention/mod.rs"),
            ),
        ];
        assert_eq!(sources.len(), SIGNATURES.len());
        for (op, src) in sources {
            let sig = signature(op).unwrap();
            let (mut a, mut i) = read_names(src);
            a.sort();
            a.dedup();
            i.sort();
            i.dedup();
            let mut sa: Vec<String> = sig.attrs.iter().map(|s| s.to_string()).collect();
            let mut si: Vec<String> = sig.inputs.iter().map(|s| s.to_string()).collect();
            sa.sort();
            si.sort();
            assert_eq!(a, sa, "{op}: attributes read against its signature");
            assert_eq!(i, si, "{op}: inputs read against its signature");
        }
        // The scan finds names in each form it looks for.
        let probe = "attr_int(\n OP, a, \"x\", None); opt_pos(\"w\"); attr_epsilon(OP, a); \
                     req(OP, m, \"y\"); opt(m, \"z\")";
        assert_eq!(
            read_names(probe),
            (
                vec!["x".into(), "w".into(), "epsilon".into()],
                vec!["y".into(), "z".into()]
            )
        );
    }

    fn one_input() -> TensorMap {
        TensorMap::from([(
            "scores".to_string(),
            crate::Tensor::from_f32(crate::DType::F32, &[1, 1, 4], &[1.0, 4.0, 2.0, 3.0]),
        )])
    }

    #[test]
    fn unknown_names_are_errors_that_name_them() {
        let attrs = AttrMap::from([("k".to_string(), serde_json::json!(2))]);
        let out = run_cpu(block_topk::OP, &one_input(), &attrs).unwrap();
        assert_eq!(out["block_indices"].to_i32(), vec![1, 3]);

        let mut typo = attrs.clone();
        typo.insert("kk".into(), serde_json::json!(3));
        let e = run_cpu(block_topk::OP, &one_input(), &typo).unwrap_err();
        assert!(
            matches!(&e, Error::Attr { op: "block_topk", attr, .. } if attr == "kk"),
            "{e}"
        );

        let mut extra = one_input();
        extra.insert("score".into(), extra["scores"].clone());
        let e = run_cpu(block_topk::OP, &extra, &attrs).unwrap_err();
        assert!(
            matches!(&e, Error::Input { op: "block_topk", input, .. } if input == "score"),
            "{e}"
        );

        // A tensor under an output's name is ignored: a case may carry its expected results.
        let mut with_expected = one_input();
        with_expected.insert(
            "block_indices".into(),
            crate::Tensor::from_i32(&[1, 1, 2], &[1, 3]),
        );
        assert!(run_cpu(block_topk::OP, &with_expected, &attrs).is_ok());

        let e = run_cpu("block_topkk", &one_input(), &attrs).unwrap_err();
        assert!(matches!(e, Error::UnknownOp(..)), "{e}");
    }
}
