//! qsa-wgpu: the sparse-attention indexers of long-context models (QSA, DSA, NSA) as portable
//! WGSL compute shaders driven through wgpu, each with a CPU reference. `docs/operators.md`
//! holds the choices made per operator, `README.md` says how to run and test.

pub mod case;
pub mod error;
pub mod gpu;
pub mod indexer;
pub mod nsa;
pub mod ops;
pub mod paged;
pub mod shaders;
pub mod tensor;
pub mod testing;

pub use error::{Error, Result};
pub use tensor::{DType, Tensor};
