//! The WGSL sources, embedded at build time, and their assembly: an operator shader names the
//! common files it needs with `//#include common/<file>.wgsl` lines, which are replaced by the
//! file's text (each file at most once). A `//#expand common/<file>.wgsl NAME=value …` line is
//! replaced by the file's text every time, each `$NAME` in it by its value (the subgroup
//! attention pass writes its loop over a shard once and expands it per pool binding). Native and browser builds use the same sources; where
//! naga's WGSL and the browsers' differ, [`assemble_for`] applies the difference.

use crate::error::{Error, Result};

/// Every shader file under `shaders/`, by path relative to that folder.
pub const FILES: &[(&str, &str)] = &[
    (
        "common/dtype.wgsl",
        include_str!("../shaders/common/dtype.wgsl"),
    ),
    (
        "common/rowmath.wgsl",
        include_str!("../shaders/common/rowmath.wgsl"),
    ),
    (
        "common/flags.wgsl",
        include_str!("../shaders/common/flags.wgsl"),
    ),
    (
        "common/qsa_prepare_query.wgsl",
        include_str!("../shaders/common/qsa_prepare_query.wgsl"),
    ),
    (
        "common/nsa_attention.wgsl",
        include_str!("../shaders/common/nsa_attention.wgsl"),
    ),
    (
        "common/nsa_logits.wgsl",
        include_str!("../shaders/common/nsa_logits.wgsl"),
    ),
    (
        "common/nsa_values.wgsl",
        include_str!("../shaders/common/nsa_values.wgsl"),
    ),
    (
        "common/nsa_values_rows16.wgsl",
        include_str!("../shaders/common/nsa_values_rows16.wgsl"),
    ),
    (
        "common/nsa_values_sg.wgsl",
        include_str!("../shaders/common/nsa_values_sg.wgsl"),
    ),
    (
        "common/nsa_logits_sg.wgsl",
        include_str!("../shaders/common/nsa_logits_sg.wgsl"),
    ),
    (
        "common/wide.wgsl",
        include_str!("../shaders/common/wide.wgsl"),
    ),
    (
        "common/attention.wgsl",
        include_str!("../shaders/common/attention.wgsl"),
    ),
    (
        "common/attention_pass.wgsl",
        include_str!("../shaders/common/attention_pass.wgsl"),
    ),
    (
        "common/attention_sg.wgsl",
        include_str!("../shaders/common/attention_sg.wgsl"),
    ),
    (
        "common/attention_sg_shard.wgsl",
        include_str!("../shaders/common/attention_sg_shard.wgsl"),
    ),
    (
        "common/attention_route.wgsl",
        include_str!("../shaders/common/attention_route.wgsl"),
    ),
    (
        "qsa_prepare.wgsl",
        include_str!("../shaders/qsa_prepare.wgsl"),
    ),
    (
        "qsa_compress_paged.wgsl",
        include_str!("../shaders/qsa_compress_paged.wgsl"),
    ),
    (
        "qsa_prepare_query.wgsl",
        include_str!("../shaders/qsa_prepare_query.wgsl"),
    ),
    (
        "qsa_prepare_query_vec.wgsl",
        include_str!("../shaders/qsa_prepare_query_vec.wgsl"),
    ),
    (
        "block_topk.wgsl",
        include_str!("../shaders/block_topk.wgsl"),
    ),
    (
        "common/block_topk.wgsl",
        include_str!("../shaders/common/block_topk.wgsl"),
    ),
    (
        "block_topk_sg.wgsl",
        include_str!("../shaders/block_topk_sg.wgsl"),
    ),
    (
        "common/block_score.wgsl",
        include_str!("../shaders/common/block_score.wgsl"),
    ),
    (
        "common/block_score_queries.wgsl",
        include_str!("../shaders/common/block_score_queries.wgsl"),
    ),
    (
        "common/block_score_textures.wgsl",
        include_str!("../shaders/common/block_score_textures.wgsl"),
    ),
    (
        "block_score_tex_sg.wgsl",
        include_str!("../shaders/block_score_tex_sg.wgsl"),
    ),
    (
        "block_score.wgsl",
        include_str!("../shaders/block_score.wgsl"),
    ),
    (
        "block_score_tex.wgsl",
        include_str!("../shaders/block_score_tex.wgsl"),
    ),
    (
        "expand_route.wgsl",
        include_str!("../shaders/expand_route.wgsl"),
    ),
    (
        "nsa_compress.wgsl",
        include_str!("../shaders/nsa_compress.wgsl"),
    ),
    (
        "nsa_compress_attention.wgsl",
        include_str!("../shaders/nsa_compress_attention.wgsl"),
    ),
    (
        "nsa_compress_attention_sg.wgsl",
        include_str!("../shaders/nsa_compress_attention_sg.wgsl"),
    ),
    (
        "nsa_compress_attention_sg_w32.wgsl",
        include_str!("../shaders/nsa_compress_attention_sg_w32.wgsl"),
    ),
    (
        "nsa_compress_attention_values.wgsl",
        include_str!("../shaders/nsa_compress_attention_values.wgsl"),
    ),
    (
        "nsa_compress_attention_values_sg.wgsl",
        include_str!("../shaders/nsa_compress_attention_values_sg.wgsl"),
    ),
    (
        "nsa_compress_attention_values_sg_w32.wgsl",
        include_str!("../shaders/nsa_compress_attention_values_sg_w32.wgsl"),
    ),
    (
        "nsa_compress_attention_finish.wgsl",
        include_str!("../shaders/nsa_compress_attention_finish.wgsl"),
    ),
    (
        "sparse_attention.wgsl",
        include_str!("../shaders/sparse_attention.wgsl"),
    ),
    (
        "sparse_attention_sg.wgsl",
        include_str!("../shaders/sparse_attention_sg.wgsl"),
    ),
    (
        "sparse_attention_sg_w32.wgsl",
        include_str!("../shaders/sparse_attention_sg_w32.wgsl"),
    ),
    (
        "sparse_attention_route.wgsl",
        include_str!("../shaders/sparse_attention_route.wgsl"),
    ),
    (
        "sparse_attention_route_sg.wgsl",
        include_str!("../shaders/sparse_attention_route_sg.wgsl"),
    ),
    (
        "sparse_attention_combine.wgsl",
        include_str!("../shaders/sparse_attention_combine.wgsl"),
    ),
    (
        "bench_copy.wgsl",
        include_str!("../shaders/bench_copy.wgsl"),
    ),
    (
        "bench_copy_tex.wgsl",
        include_str!("../shaders/bench_copy_tex.wgsl"),
    ),
    (
        "nsa_compress_paged.wgsl",
        include_str!("../shaders/nsa_compress_paged.wgsl"),
    ),
    (
        "nsa_select_expand.wgsl",
        include_str!("../shaders/nsa_select_expand.wgsl"),
    ),
];

/// The pipeline shaders (files outside `common/`): one per operator, or per stage of one, by
/// name.
pub fn operators() -> impl Iterator<Item = &'static str> {
    FILES
        .iter()
        .filter(|(p, _)| !p.starts_with("common/"))
        .map(|(p, _)| p.trim_end_matches(".wgsl"))
}

fn file(path: &str) -> Option<&'static str> {
    FILES.iter().find(|(p, _)| *p == path).map(|(_, s)| *s)
}

/// Who compiles the WGSL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ShaderTarget {
    /// naga (wgpu on Vulkan, Metal, DX12, GL, and every test): the sources as written.
    #[default]
    Naga,
    /// A browser's WebGPU (Tint, WebKit): requires `enable subgroups;` before any subgroup
    /// builtin, which naga 30 rejects as an unknown extension.
    Browser,
}

impl ShaderTarget {
    /// The compiler behind an adapter of `backend`.
    pub fn of(backend: wgpu::Backend) -> ShaderTarget {
        match backend {
            wgpu::Backend::BrowserWebGpu => ShaderTarget::Browser,
            _ => ShaderTarget::Naga,
        }
    }
}

/// The final WGSL of operator shader `name` for `target`.
pub fn assemble_for(name: &str, target: ShaderTarget) -> Result<String> {
    Ok(for_target(assemble(name)?, target))
}

/// Applies the dialect differences of `target` to assembled WGSL.
pub fn for_target(src: String, target: ShaderTarget) -> String {
    match target {
        ShaderTarget::Naga => src,
        ShaderTarget::Browser if uses_subgroups(&src) && !src.contains("enable subgroups;") => {
            format!("enable subgroups;\n{src}")
        }
        ShaderTarget::Browser => src,
    }
}

/// The identifiers and literals of `src` outside `//` comments.
fn code_words(src: &str) -> impl Iterator<Item = &str> {
    src.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .flat_map(|l| l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
}

/// Whether code outside `//` comments names a subgroup builtin (`subgroupAdd`,
/// `subgroup_size`, …) or a quad operation, which need the `subgroups` extension.
pub fn uses_subgroups(src: &str) -> bool {
    code_words(src).any(|w| {
        w.starts_with("subgroup") || w.starts_with("quadBroadcast") || w.starts_with("quadSwap")
    })
}

/// Whether code outside `//` comments names a 64-bit integer type (`u64`, `i64`), which needs
/// the device's `SHADER_INT64` feature (the 32-byte word variants, chosen only where
/// [`Capabilities::wide_loads`](crate::gpu::Capabilities::wide_loads)).
pub fn uses_int64(src: &str) -> bool {
    code_words(src).any(|w| w == "u64" || w == "i64")
}

/// The final WGSL of operator shader `name` (without `.wgsl`), includes expanded, as naga
/// reads it.
pub fn assemble(name: &str) -> Result<String> {
    let top = format!("{name}.wgsl");
    let src = file(&top).ok_or_else(|| Error::Shader {
        name: name.to_string(),
        msg: "no such shader file".into(),
    })?;
    let mut seen = Vec::new();
    let mut out = String::new();
    expand(name, src, &mut seen, &mut out)?;
    Ok(out)
}

/// The text of an `//#expand <path> NAME=value …` line's file with each `$NAME` replaced by
/// its value; a placeholder left without a value is an error.
fn instantiate(name: &str, args: &str) -> Result<String> {
    let err = |msg: String| Error::Shader {
        name: name.to_string(),
        msg,
    };
    let mut words = args.split_whitespace();
    let path = words.next().unwrap_or("");
    let mut text = file(path)
        .ok_or_else(|| err(format!("expansion of unknown file `{path}`")))?
        .to_string();
    for w in words {
        let (k, v) = w
            .split_once('=')
            .ok_or_else(|| err(format!("expansion of `{path}`: `{w}` is not NAME=value")))?;
        text = text.replace(&format!("${k}"), v);
    }
    if let Some(i) = text.find('$') {
        let rest = &text[i..];
        let end = rest[1..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(rest.len(), |e| e + 1);
        return Err(err(format!(
            "expansion of `{path}`: no value for `{}`",
            &rest[..end]
        )));
    }
    Ok(text)
}

fn expand(name: &str, src: &str, seen: &mut Vec<String>, out: &mut String) -> Result<()> {
    for line in src.lines() {
        if let Some(path) = line.trim().strip_prefix("//#include ") {
            let path = path.trim();
            if seen.iter().any(|s| s == path) {
                continue;
            }
            seen.push(path.to_string());
            let inc = file(path).ok_or_else(|| Error::Shader {
                name: name.to_string(),
                msg: format!("include of unknown file `{path}`"),
            })?;
            expand(name, inc, seen, out)?;
        } else if let Some(args) = line.trim().strip_prefix("//#expand ") {
            let text = instantiate(name, args)?;
            expand(name, &text, seen, out)?;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expand_lines_instantiate_their_file_each_time() {
        let one = instantiate("t", "common/attention_sg_shard.wgsl SLOT=1u").unwrap();
        assert!(!one.contains('$'));
        assert!(one.contains("ld_word(1u, kr,") && one.contains("P.shard + 1u"));
        // Every slot's copy lands in the pass, each naming its slot.
        let pass = assemble("sparse_attention_sg").unwrap();
        for k in 0..4 {
            let head = format!("if (PS > {k}u && ns > {k}u) {{");
            assert_eq!(pass.matches(&head).count(), 1, "slot {k}");
        }
        assert!(!pass.contains('$'));
    }

    #[test]
    fn bad_expand_lines_are_errors() {
        let e = |args: &str| instantiate("t", args).unwrap_err().to_string();
        let missing = e("common/attention_sg_shard.wgsl");
        assert!(missing.contains("no value for `$SLOT`"), "{missing}");
        let other = e("common/attention_sg_shard.wgsl SLOTS=1u");
        assert!(other.contains("no value for `$SLOT`"), "{other}");
        assert!(e("common/nope.wgsl").contains("unknown file `common/nope.wgsl`"));
        let bad = e("common/attention_sg_shard.wgsl SLOT");
        assert!(bad.contains("`SLOT` is not NAME=value"), "{bad}");
    }
}
