//! Case files (SPEC §9): a safetensors file holding one call — the input tensors under their
//! contract names, `op` and the attributes in the metadata as JSON text — and the output
//! file with the results under their contract names.

use crate::error::{Error, Result};
use crate::ops::{AttrMap, TensorMap};
use crate::tensor::{DType, Tensor};
use safetensors::tensor::TensorInfo;
use safetensors::{Dtype as SDtype, SafeTensors};
use std::collections::HashMap;

/// One call read from a case file.
#[derive(Clone, Debug)]
pub struct Case {
    pub op: String,
    pub attrs: AttrMap,
    pub inputs: TensorMap,
}

/// The type of tensor `name`; an unsupported one is an error naming the operator where the
/// file names one (`op`).
fn dtype_from(d: SDtype, name: &str, op: Option<&'static str>) -> Result<DType> {
    Ok(match d {
        SDtype::F32 => DType::F32,
        SDtype::F16 => DType::F16,
        SDtype::BF16 => DType::BF16,
        SDtype::I32 => DType::I32,
        SDtype::U32 => DType::U32,
        other => {
            let msg = format!("has type {other:?}; supported: F32, F16, BF16, I32, U32");
            return Err(match op {
                Some(op) => Error::input(op, name, msg),
                None => Error::Case(format!("tensor `{name}` {msg}")),
            });
        }
    })
}

/// Metadata keys that are not attributes: `op`, and `format`, which safetensors writers of
/// several frameworks add ("pt", "np") and which says nothing about the call.
const NOT_ATTRIBUTES: &[&str] = &["op", "format"];

fn dtype_to(d: DType) -> SDtype {
    match d {
        DType::F32 => SDtype::F32,
        DType::F16 => SDtype::F16,
        DType::BF16 => SDtype::BF16,
        DType::I32 => SDtype::I32,
        DType::U32 => SDtype::U32,
    }
}

/// The error for bytes the safetensors crate refuses, naming the tensor whose data offsets do
/// not match its shape and type where the header says so (the crate's message names none).
fn not_safetensors(bytes: &[u8], e: safetensors::SafeTensorError) -> Error {
    let culprit = || -> Option<String> {
        let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
        let header: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(bytes.get(8..8usize.checked_add(n)?)?).ok()?;
        let data = bytes.len() - 8 - n;
        header.iter().find_map(|(name, v)| {
            // The crate's own header entry (`__metadata__` and malformed entries do not parse).
            let t: TensorInfo = serde_json::from_value(v.clone()).ok()?;
            let want = t.shape.iter().product::<usize>() * t.dtype.bitsize() / 8;
            let (start, end) = t.data_offsets;
            (end < start || end - start != want || end > data).then(|| {
                format!(
                    "; tensor `{name}` ({:?} {:?}) needs {want} bytes, its data_offsets \
                     [{start}, {end}] give {} of the {data} after the header",
                    t.dtype,
                    t.shape,
                    end.saturating_sub(start)
                )
            })
        })
    };
    Error::Case(format!(
        "not a safetensors file: {e}{}",
        culprit().unwrap_or_default()
    ))
}

impl Case {
    /// Parses case-file bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Case> {
        let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|e| not_safetensors(bytes, e))?;
        let st = SafeTensors::deserialize(bytes).map_err(|e| not_safetensors(bytes, e))?;
        let md = meta.metadata().clone().unwrap_or_default();
        let op_text = md
            .get("op")
            .ok_or_else(|| Error::Case("metadata has no `op` entry".into()))?;
        // `op` is the bare name; a JSON string ("\"qsa_prepare\"") is accepted too.
        let op = match serde_json::from_str::<serde_json::Value>(op_text) {
            Ok(serde_json::Value::String(s)) => s,
            _ => op_text.trim().to_string(),
        };
        // An unknown operator is the first thing to report; errors below name the known one.
        let sop = crate::ops::signature(&op)?.op;
        let mut attrs = AttrMap::new();
        for (k, v) in &md {
            if NOT_ATTRIBUTES.contains(&k.as_str()) {
                continue;
            }
            let val: serde_json::Value = serde_json::from_str(v).map_err(|e| {
                Error::attr(
                    sop,
                    k.as_str(),
                    format!("value {v:?} is not JSON text: {e}"),
                )
            })?;
            attrs.insert(k.clone(), val);
        }
        let mut inputs = TensorMap::new();
        for (name, view) in st.tensors() {
            let dt = dtype_from(view.dtype(), &name, Some(sop))?;
            let t = Tensor::from_bytes(dt, view.shape(), view.data().to_vec())?;
            inputs.insert(name, t);
        }
        Ok(Case { op, attrs, inputs })
    }

    /// Reads a case file.
    pub fn read(path: &str) -> Result<Case> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_string(),
            source,
        })?;
        Case::from_bytes(&bytes)
    }

    /// Serializes this call as a case file.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut md = HashMap::new();
        md.insert("op".to_string(), self.op.clone());
        for (k, v) in &self.attrs {
            md.insert(k.clone(), v.to_string());
        }
        serialize(&self.inputs, Some(md))
    }
}

/// Serializes named tensors as safetensors bytes.
pub fn serialize(
    tensors: &TensorMap,
    metadata: Option<HashMap<String, String>>,
) -> Result<Vec<u8>> {
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(k, t)| {
            safetensors::tensor::TensorView::new(dtype_to(t.dtype), t.shape.clone(), &t.data)
                .map(|v| (k.clone(), v))
                .map_err(|e| Error::Case(format!("tensor `{k}`: {e}")))
        })
        .collect::<Result<_>>()?;
    safetensors::serialize(views, metadata).map_err(|e| Error::Case(format!("serialize: {e}")))
}

/// Reads an output (or any) safetensors file into named tensors.
pub fn read_tensors(bytes: &[u8]) -> Result<TensorMap> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| not_safetensors(bytes, e))?;
    let mut m = TensorMap::new();
    for (name, view) in st.tensors() {
        let dt = dtype_from(view.dtype(), &name, None)?;
        m.insert(
            name,
            Tensor::from_bytes(dt, view.shape(), view.data().to_vec())?,
        );
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tensor_short_of_its_data_is_named() {
        let mut m = TensorMap::new();
        m.insert(
            "scores".into(),
            Tensor::from_f32(DType::F32, &[1, 4], &[1.0, 2.0, 3.0, 4.0]),
        );
        let md = std::collections::HashMap::from([("op".to_string(), "block_topk".to_string())]);
        let good = serialize(&m, Some(md)).unwrap();
        assert!(Case::from_bytes(&good).is_ok());
        // The header's shape [1, 4] becomes [1, 6]: 24 bytes wanted, 16 there.
        let n = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
        let header = String::from_utf8(good[8..8 + n].to_vec()).unwrap();
        let bad_header = header.replacen("[1,4]", "[1,6]", 1);
        assert_ne!(bad_header, header, "{header}");
        let mut bad = (bad_header.len() as u64).to_le_bytes().to_vec();
        bad.extend_from_slice(bad_header.as_bytes());
        bad.extend_from_slice(&good[8 + n..]);
        let err = Case::from_bytes(&bad).unwrap_err().to_string();
        assert!(
            err.contains("`scores`") && err.contains("needs 24 bytes"),
            "{err}"
        );
    }
}
