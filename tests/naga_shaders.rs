//! Every shader is parsed, validated and translated to SPIR-V, MSL and HLSL by naga, with no
//! GPU, for each entry point, storage type and value of its other switches (`VEC`); every
//! `<Op>Params` struct is checked against naga's layout of its WGSL twin. All failures are
//! reported together, each with its shader's name.

use qsa_wgpu::gpu::BenchCopyParams;
use qsa_wgpu::nsa;
use qsa_wgpu::ops::{
    block_score, block_topk, block_topk_chunks, expand_route, nsa_compress, nsa_compress_attention,
    qsa_compress_paged, qsa_prepare, qsa_prepare_query, sparse_attention,
};
use qsa_wgpu::shaders;

/// Translates entry point `ep` of shader `name` with the given override values (those the
/// shader does not declare are skipped).
fn translate(name: &str, ep: &str, overrides: &[(&str, u32)]) -> Result<(), String> {
    let src = shaders::assemble(name).map_err(|e| e.to_string())?;
    let module = naga::front::wgsl::parse_str(&src).map_err(|e| e.emit_to_string(&src))?;
    // Subgroup variants need the subgroup capability, the 32-byte word variants 64-bit
    // integers; nothing else needs one.
    let mut caps = naga::valid::Capabilities::empty();
    if shaders::uses_subgroups(&src) {
        caps |= naga::valid::Capabilities::SUBGROUP;
    }
    if shaders::uses_int64(&src) {
        caps |= naga::valid::Capabilities::SHADER_INT64;
    }
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
        .validate(&module)
        .map_err(|e| format!("validate: {e:?}"))?;
    let mut consts = naga::back::PipelineConstants::default();
    // Shaders without activations (integer-only stages) have no T_KIND override.
    for (k, v) in overrides {
        if module
            .overrides
            .iter()
            .any(|(_, o)| o.name.as_deref() == Some(*k))
        {
            consts.insert(k.to_string(), *v as f64);
        }
    }
    let ep = ep.to_string();
    let (module, info) = naga::back::pipeline_constants::process_overrides(
        &module,
        &info,
        Some((naga::ShaderStage::Compute, &ep)),
        &consts,
    )
    .map_err(|e| format!("overrides: {e:?}"))?;
    naga::back::spv::write_vec(
        &module,
        &info,
        &naga::back::spv::Options::default(),
        Some(&naga::back::spv::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: ep.clone(),
        }),
    )
    .map_err(|e| format!("spir-v: {e:?}"))?;
    naga::back::msl::write_string(
        &module,
        &info,
        &naga::back::msl::Options::default(),
        &naga::back::msl::PipelineOptions {
            entry_point: Some((naga::ShaderStage::Compute, ep.clone())),
            ..Default::default()
        },
    )
    .map_err(|e| format!("msl: {e:?}"))?;
    let mut hlsl = String::new();
    let opts = naga::back::hlsl::Options::default();
    let popts = naga::back::hlsl::PipelineOptions {
        entry_point: Some((naga::ShaderStage::Compute, ep.clone())),
    };
    naga::back::hlsl::Writer::new(&mut hlsl, &opts, &popts)
        .write(&module, &info, None)
        .map_err(|e| format!("hlsl: {e:?}"))?;
    Ok(())
}

/// Entry points of shader `name`, and whether it declares the `VEC` switch.
fn entry_points(name: &str) -> (Vec<String>, bool) {
    let src = shaders::assemble(name).unwrap();
    match naga::front::wgsl::parse_str(&src) {
        Ok(m) => (
            m.entry_points.iter().map(|e| e.name.clone()).collect(),
            m.overrides
                .iter()
                .any(|(_, o)| o.name.as_deref() == Some("VEC")),
        ),
        // Reported by translate.
        Err(_) => (vec!["main".to_string()], false),
    }
}

#[test]
fn every_shader_validates_and_translates() {
    let mut failures = Vec::new();
    let mut count = 0;
    for name in shaders::operators() {
        let (eps, has_vec) = entry_points(name);
        let vecs: &[u32] = if has_vec { &[0, 1] } else { &[1] };
        for ep in eps {
            for kind in 0..3 {
                for &vec in vecs {
                    count += 1;
                    if let Err(e) = translate(name, &ep, &[("T_KIND", kind), ("VEC", vec)]) {
                        failures.push(format!("{name}::{ep} (T_KIND={kind}, VEC={vec}): {e}"));
                    }
                }
            }
        }
    }
    assert!(
        count >= 9 * 3,
        "expected every operator shader, found {count}"
    );
    assert!(
        failures.is_empty(),
        "{} shader failures:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn every_shader_file_is_embedded() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let mut on_disk = Vec::new();
    for sub in ["", "common/"] {
        for e in std::fs::read_dir(dir.join(sub)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "wgsl") {
                on_disk.push(format!("{sub}{}", p.file_name().unwrap().to_str().unwrap()));
            }
        }
    }
    for f in &on_disk {
        assert!(
            shaders::FILES.iter().any(|(p, _)| p == f),
            "shaders/{f} is not in shaders::FILES"
        );
    }
    assert_eq!(on_disk.len(), shaders::FILES.len());
}

/// Offsets of a WGSL struct's members as naga lays them out, and its size.
fn wgsl_layout(shader: &str, ty: &str) -> (Vec<(String, u32)>, u32) {
    let src = shaders::assemble(shader).unwrap();
    let module = naga::front::wgsl::parse_str(&src).unwrap();
    for (_, t) in module.types.iter() {
        if t.name.as_deref() == Some(ty) {
            if let naga::TypeInner::Struct { members, span } = &t.inner {
                return (
                    members
                        .iter()
                        .map(|m| (m.name.clone().unwrap(), m.offset))
                        .collect(),
                    *span,
                );
            }
        }
    }
    panic!("{shader}: no struct {ty}");
}

macro_rules! check_params {
    ($shader:expr, $rust:ty, $wgsl:expr, [$($f:ident),* $(,)?]) => {{
        let (members, span) = wgsl_layout($shader, $wgsl);
        let rust: Vec<(String, u32)> =
            vec![$((stringify!($f).to_string(), std::mem::offset_of!($rust, $f) as u32)),*];
        assert_eq!(members, rust, "{}: field names/offsets of {} differ", $shader, $wgsl);
        assert_eq!(span as usize, std::mem::size_of::<$rust>(), "{}: size of {}", $shader, $wgsl);
    }};
}

#[test]
fn params_structs_match_wgsl_layout() {
    check_params!(
        "qsa_prepare",
        qsa_prepare::QsaPrepareParams,
        "QsaPrepareParams",
        [
            n, l, di, r, dr, bp, b_out, norm_on, eps, offset, cos_off, sin_off, prope_off, w_off,
            _pad0, _pad1
        ]
    );
    check_params!(
        "qsa_compress_paged",
        qsa_compress_paged::QsaCompressParams,
        "QsaCompressParams",
        [
            n,
            di,
            dr,
            r,
            page_size,
            k_off,
            page_stride,
            num_pages,
            max_pages,
            max_blocks,
            freq_rows,
            span,
            norm_on,
            full,
            eps,
            offset,
            page_lo,
            shard_pages,
            _pad0,
            _pad1
        ]
    );
    check_params!(
        "qsa_prepare_query",
        qsa_prepare_query::QsaPrepareQueryParams,
        "QsaPrepareQueryParams",
        [t, hi, di, dr, rope_mode, norm_on, freq_rows, _pad0, eps, offset, _pad1, _pad2]
    );
    check_params!(
        "block_topk",
        block_topk::BlockTopkParams,
        "BlockTopkParams",
        [rows, w, k, out_base, hs, r, width, _pad]
    );
    check_params!(
        "block_topk_chunks",
        block_topk_chunks::BlockTopkChunksParams,
        "BlockTopkChunksParams",
        [rows, wc, nch, k]
    );
    check_params!(
        "block_score",
        block_score::BlockScoreParams,
        "BlockScoreParams",
        [
            t_total,
            row_base,
            rows,
            n,
            hi,
            hs,
            di,
            r,
            max_blocks,
            has_counts,
            has_weights,
            scale
        ]
    );
    check_params!(
        "expand_route",
        expand_route::ExpandRouteParams,
        "ExpandRouteParams",
        [t, hs, k, r, width, _pad0, _pad1, _pad2]
    );
    check_params!(
        "nsa_compress",
        nsa_compress::NsaCompressParams,
        "NsaCompressParams",
        [words, total, n, dim, l, d, batches, t]
    );
    check_params!(
        "nsa_compress_attention",
        nsa_compress_attention::NsaCompressAttentionParams,
        "NsaCompressAttentionParams",
        [
            rows, batches, seq, n1, n2, dqk, dv, page, num_blocks, max_blocks, l, d, lsel, k,
            c_max, w, causal, scale, split2, split1
        ]
    );
    // The three stages of sparse_attention include one struct (common/attention.wgsl).
    for shader in [
        "sparse_attention_route",
        "sparse_attention",
        "sparse_attention_sg",
        "sparse_attention_sg_w32",
        "sparse_attention_combine",
    ] {
        check_params!(
            shader,
            sparse_attention::SparseAttentionParams,
            "SparseAttentionParams",
            [
                t,
                n,
                h,
                hkv,
                hs,
                e,
                w,
                hc,
                segs,
                chunks,
                cblocks,
                splits,
                split_len,
                page_size,
                page_stride,
                num_pages,
                max_pages,
                k_off,
                v_off,
                shard,
                shards,
                shard_pages,
                row_base,
                rows,
                has_sinks,
                scale,
                phases,
                ev,
                dp,
                sg,
                _pad1
            ]
        );
    }
    check_params!(
        "bench_copy",
        BenchCopyParams,
        "BenchCopyParams",
        [words, stride, _pad0, _pad1]
    );
    check_params!(
        nsa::COMPRESS_SHADER,
        nsa::NsaCompressPagedParams,
        "NsaCompressPagedParams",
        [
            words,
            total,
            batches,
            heads,
            width,
            head_dim,
            plane_off,
            page_size,
            page_stride,
            num_pages,
            max_pages,
            l,
            d,
            cmp_page,
            cmp_blocks,
            max_cmp_blocks
        ]
    );
    check_params!(
        nsa::EXPAND_SHADER,
        nsa::NsaSelectExpandParams,
        "NsaSelectExpandParams",
        [t, hs, k, lsel, width, _pad0, _pad1, _pad2]
    );
}
