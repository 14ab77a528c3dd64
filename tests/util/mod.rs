//! Shared by the integration tests: one GPU context per test binary.
#![allow(dead_code)]

pub mod nsa;

use qsa_wgpu::gpu::{Context, ContextOptions};
use std::sync::{Arc, OnceLock};

/// The context for this test binary, on the adapter `WGPU_BACKEND` selects. A missing adapter
/// fails the test: CI always has lavapipe or llvmpipe GL.
pub fn ctx() -> Arc<Context> {
    static CTX: OnceLock<Arc<Context>> = OnceLock::new();
    CTX.get_or_init(|| {
        let _ = env_logger::builder().is_test(true).try_init();
        let c = Context::new_blocking(&ContextOptions::default())
            .expect("a GPU adapter (lavapipe or llvmpipe GL)");
        eprintln!("adapter: {}", c.describe());
        c
    })
    .clone()
}
