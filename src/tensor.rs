//! Host tensors: a dtype, a row-major shape and little-endian bytes. f16 and bf16 elements are
//! two bytes each, so a tensor's bytes are exactly what the shaders see as packed `u32` words.

use crate::error::{Error, Result};
use half::{bf16, f16};

/// Element types of the contract (SPEC §0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    U32,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            _ => 4,
        }
    }

    /// True for the activation types f32, f16, bf16.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// The value of the shaders' `T_KIND` override for this storage type.
    pub fn shader_kind(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::BF16 => 2,
            DType::I32 | DType::U32 => 0,
        }
    }

    /// Lower-case name as used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::U32 => "u32",
        }
    }

    /// Parses `f32`, `f16`, `bf16`, `i32`, `u32` (any case).
    pub fn parse(s: &str) -> Option<DType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Some(DType::F32),
            "f16" => Some(DType::F16),
            "bf16" => Some(DType::BF16),
            "i32" => Some(DType::I32),
            "u32" => Some(DType::U32),
            _ => None,
        }
    }

    /// Rounds an f32 to this type (nearest-even) and back; identity for f32.
    pub fn round(self, v: f32) -> f32 {
        match self {
            DType::F16 => f16::from_f32(v).to_f32(),
            DType::BF16 => bf16::from_f32(v).to_f32(),
            _ => v,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A dense host tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl Tensor {
    /// A zero-filled tensor.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor {
            dtype,
            shape: shape.to_vec(),
            data: vec![0; n * dtype.size()],
        }
    }

    /// Builds a tensor from raw little-endian bytes, checking their length.
    pub fn from_bytes(dtype: DType, shape: &[usize], data: Vec<u8>) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        if data.len() != n * dtype.size() {
            return Err(Error::Case(format!(
                "tensor of shape {shape:?} {dtype} needs {} bytes, has {}",
                n * dtype.size(),
                data.len()
            )));
        }
        Ok(Tensor {
            dtype,
            shape: shape.to_vec(),
            data,
        })
    }

    /// Rounds f32 values (nearest-even) into a float tensor of `dtype`.
    pub fn from_f32(dtype: DType, shape: &[usize], values: &[f32]) -> Tensor {
        assert_eq!(
            values.len(),
            shape.iter().product::<usize>(),
            "shape/value count"
        );
        let data = match dtype {
            DType::F32 => bytemuck::cast_slice(values).to_vec(),
            DType::F16 => values
                .iter()
                .flat_map(|v| f16::from_f32(*v).to_le_bytes())
                .collect(),
            DType::BF16 => values
                .iter()
                .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
                .collect(),
            DType::I32 => values
                .iter()
                .flat_map(|v| (*v as i32).to_le_bytes())
                .collect(),
            DType::U32 => values
                .iter()
                .flat_map(|v| (*v as u32).to_le_bytes())
                .collect(),
        };
        Tensor {
            dtype,
            shape: shape.to_vec(),
            data,
        }
    }

    /// An i32 tensor.
    pub fn from_i32(shape: &[usize], values: &[i32]) -> Tensor {
        assert_eq!(
            values.len(),
            shape.iter().product::<usize>(),
            "shape/value count"
        );
        Tensor {
            dtype: DType::I32,
            shape: shape.to_vec(),
            data: bytemuck::cast_slice(values).to_vec(),
        }
    }

    /// A u32 tensor.
    pub fn from_u32(shape: &[usize], values: &[u32]) -> Tensor {
        assert_eq!(
            values.len(),
            shape.iter().product::<usize>(),
            "shape/value count"
        );
        Tensor {
            dtype: DType::U32,
            shape: shape.to_vec(),
            data: bytemuck::cast_slice(values).to_vec(),
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Every element widened to f32 (exact for f16/bf16; integers converted).
    pub fn to_f32(&self) -> Vec<f32> {
        let b = &self.data;
        match self.dtype {
            DType::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::F16 => b
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::BF16 => b
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::I32 | DType::U32 => self.to_i64().into_iter().map(|v| v as f32).collect(),
        }
    }

    /// Every element of an integer tensor as i64 (u32 and i32 alike); floats are truncated.
    pub fn to_i64(&self) -> Vec<i64> {
        let b = &self.data;
        match self.dtype {
            DType::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
            DType::U32 => b
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
            _ => self.to_f32().into_iter().map(|v| v as i64).collect(),
        }
    }

    /// Integer tensor as i32 values (u32 bit patterns reinterpreted).
    pub fn to_i32(&self) -> Vec<i32> {
        self.to_i64().into_iter().map(|v| v as i32).collect()
    }
}
