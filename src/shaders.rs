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
        "common/word16.wgsl",
        include_str!("../shaders/common/word16.wgsl"),
    ),
    (
        "common/qsa_prepare_query_words.wgsl",
        include_str!("../shaders/common/qsa_prepare_query_words.wgsl"),
    ),
    (
        "common/qsa_compress_block.wgsl",
        include_str!("../shaders/common/qsa_compress_block.wgsl"),
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
        "common/nsa_logits_stage.wgsl",
        include_str!("../shaders/common/nsa_logits_stage.wgsl"),
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
        "qsa_compress_query.wgsl",
        include_str!("../shaders/qsa_compress_query.wgsl"),
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
        "block_topk_split.wgsl",
        include_str!("../shaders/block_topk_split.wgsl"),
    ),
    (
        "block_topk_chunks.wgsl",
        include_str!("../shaders/block_topk_chunks.wgsl"),
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
        "common/texel.wgsl",
        include_str!("../shaders/common/texel.wgsl"),
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
        "nsa_compress_attention_sg_tex.wgsl",
        include_str!("../shaders/nsa_compress_attention_sg_tex.wgsl"),
    ),
    (
        "nsa_compress_attention_gpu.wgsl",
        include_str!("../shaders/nsa_compress_attention_gpu.wgsl"),
    ),
    (
        "nsa_compress_attention_values.wgsl",
        include_str!("../shaders/nsa_compress_attention_values.wgsl"),
    ),
    (
        "nsa_compress_attention_values_gpu.wgsl",
        include_str!("../shaders/nsa_compress_attention_values_gpu.wgsl"),
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
        "nsa_compress_attention_values_sg_tex.wgsl",
        include_str!("../shaders/nsa_compress_attention_values_sg_tex.wgsl"),
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

/// The lines of `src` without their `//` comments.
fn code_lines(src: &str) -> impl Iterator<Item = &str> {
    src.lines().map(|l| l.split("//").next().unwrap_or(""))
}

/// The identifiers and literals of `src` outside `//` comments.
fn code_words(src: &str) -> impl Iterator<Item = &str> {
    code_lines(src).flat_map(|l| l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
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

/// The header of every loop in `src` outside `//` comments (`for (…)`, `while (…)`, `loop`),
/// whitespace collapsed, up to its `{`, except `for` loops of the plain form that ends by
/// construction: `for (var i = …; i < bound; i++)` or `i += step` with a literal or a named
/// (upper-case) constant step.
#[cfg(test)]
fn unplain_loops(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    for code in code_lines(src) {
        let mut rest = code;
        while let Some(at) = ["for", "while", "loop"]
            .iter()
            .filter_map(|k| keyword_at(rest, k).map(|i| (i, *k)))
            .min()
        {
            let (i, kw) = at;
            let head: String = rest[i..].split('{').next().unwrap_or("").to_string();
            let head = head.split_whitespace().collect::<Vec<_>>().join(" ");
            if !(kw == "for" && plain_for(&head)) {
                out.push(head);
            }
            rest = &rest[i + kw.len()..];
        }
    }
    out
}

/// Byte offset of `kw` in `s` as a whole word.
#[cfg(test)]
fn keyword_at(s: &str, kw: &str) -> Option<usize> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    s.match_indices(kw).map(|(i, _)| i).find(|&i| {
        !s[..i].chars().next_back().is_some_and(word)
            && !s[i + kw.len()..].chars().next().is_some_and(word)
    })
}

#[cfg(test)]
fn plain_for(head: &str) -> bool {
    let Some(inner) = head.strip_prefix("for (").and_then(|h| h.strip_suffix(')')) else {
        return false;
    };
    let parts: Vec<&str> = inner.split(';').map(str::trim).collect();
    let [init, cond, step] = parts[..] else {
        return false;
    };
    let Some(var) = init
        .strip_prefix("var ")
        .and_then(|i| i.split_whitespace().next())
    else {
        return false;
    };
    let constant = |s: &str| {
        let digits = s.strip_suffix('u').unwrap_or(s);
        (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && digits != "0")
            || (s.starts_with(|c: char| c.is_ascii_uppercase())
                && s.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'))
    };
    cond.starts_with(&format!("{var} < "))
        && (step == format!("{var}++")
            || step
                .strip_prefix(&format!("{var} += "))
                .is_some_and(constant))
}

/// The u32 constant `name` of `shader` as assembled: for the tests that hold the host's sizes
/// to the shaders' own.
#[cfg(test)]
pub(crate) fn wgsl_u32(shader: &str, name: &str) -> u32 {
    let src = assemble(shader).unwrap();
    let module = naga::front::wgsl::parse_str(&src).unwrap();
    let (_, c) = module
        .constants
        .iter()
        .find(|(_, c)| c.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no constant {name} in {shader}"));
    match module.global_expressions[c.init] {
        naga::Expression::Literal(naga::Literal::U32(v)) => v,
        ref e => panic!("{shader}: {name}: {e:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loops of the shaders that are not a counter stepping up by a constant to a bound,
    /// each checked to end for every input: the pipelines are built without wgpu's loop
    /// bounding (src/gpu/cache.rs), which makes an endless loop undefined behaviour in the
    /// backend's compiler. A loop added, changed or removed fails
    /// `every_loop_is_plain_or_reviewed` until it is checked and listed here.
    const REVIEWED_LOOPS: &[(&str, &str, &str)] = &[
        (
            "bench_copy.wgsl",
            "while (i < P.words)",
            "i += P.stride, stride >= 1 set by the bench",
        ),
        (
            "bench_copy.wgsl",
            "while (i < P.words)",
            "i += P.stride, as above",
        ),
        (
            "bench_copy_tex.wgsl",
            "while (i < P.words)",
            "i += P.stride, as above",
        ),
        (
            "block_topk_sg.wgsl",
            "for (var m = 1u; m < ssz; m <<= 1u)",
            "doubles to the subgroup size (<= 128)",
        ),
        (
            "block_topk_sg.wgsl",
            "for (var m = 1u; m < ssz; m <<= 1u)",
            "as above",
        ),
        (
            "block_topk_sg.wgsl",
            "for (var b = q0; b < select(q0, qa, any_own); b += ssz)",
            "steps by the subgroup size (>= 1) to a quad count",
        ),
        (
            "block_topk_sg.wgsl",
            "for (var b = qa; b < qe; b += ssz)",
            "as above",
        ),
        (
            "block_topk_sg.wgsl",
            "for (var b = qb; b < select(qb, nq, any_own); b += ssz)",
            "as above",
        ),
        (
            "block_topk_sg.wgsl",
            "for (var d = 1u; d < ssz; d <<= 1u)",
            "doubles to the subgroup size (<= 128)",
        ),
        (
            "block_topk_sg.wgsl",
            "loop",
            "each pass clears a bit of `bits` (pop_bit); leaves at 0",
        ),
        (
            "block_topk_split.wgsl",
            "loop",
            "binary search: hi - lo (<= 64 parts) shrinks to at least half each pass; leaves at <= 1",
        ),
        (
            "block_topk_sg.wgsl",
            "loop",
            "refine_step: j counts down from 15 and leaves at 0",
        ),
        (
            "expand_route.wgsl",
            "for (var s = lid; s <= P.k; s += 64u)",
            "P.k is far below u32::MAX (validated k)",
        ),
        (
            "nsa_compress.wgsl",
            "while (hi - lo > 1u)",
            "binary search: hi - lo shrinks every step",
        ),
        (
            "nsa_compress_attention_finish.wgsl",
            "for (var u = 0u; u + 1u < sp + np && u <= a; u++)",
            "counts up to sp + np (< 64)",
        ),
        (
            "nsa_compress_paged.wgsl",
            "while (hi - lo > 1u)",
            "binary search",
        ),
        (
            "sparse_attention.wgsl",
            "for (var s = ph; s < rt; s += P.phases)",
            "P.phases >= 1 (set by the host)",
        ),
        (
            "sparse_attention_route_sg.wgsl",
            "for (var d = 1u; d < RL; d <<= 1u)",
            "doubles to RL (8)",
        ),
        (
            "common/attention_route.wgsl",
            "while (hi - lo > 1u)",
            "binary search",
        ),
        (
            "common/attention_sg_shard.wgsl",
            "for (var i0 = sub * SG; i0 < n; i0 += subs * SG)",
            "subs * SG >= 1, n a row's entry count",
        ),
        (
            "common/block_score.wgsl",
            "while (hi - lo > 1u)",
            "binary search",
        ),
        (
            "common/block_score.wgsl",
            "for (var n = n_lo; n <= n_hi; n++)",
            "n_hi <= P.n - 1 < u32::MAX (rows exist only when P.n >= 1)",
        ),
        (
            "common/block_topk.wgsl",
            "loop",
            "g counts down from 15 and leaves at 0",
        ),
        (
            "common/block_topk.wgsl",
            "loop",
            "b counts down and leaves at 16 * g",
        ),
        (
            "common/block_topk.wgsl",
            "for (var s = n + lid; s < P.k; s += lanes)",
            "lanes >= 1, P.k validated",
        ),
        (
            "common/block_topk.wgsl",
            "for (var e = e0 + lid; e < P.width; e += lanes)",
            "lanes >= 1; P.width = k · r + r − 1 checked against k and r <= 64 by the host",
        ),
        (
            "common/block_topk.wgsl",
            "loop",
            "each pass clears a bit of `bits` (pop_bit); leaves at 0",
        ),
        (
            "common/nsa_attention.wgsl",
            "while (hi - b > 1u)",
            "binary search",
        ),
        (
            "common/nsa_logits_stage.wgsl",
            "for (var i = lid; i < HC / 2u * dc; i += lanes)",
            "lanes is the workgroup's size (WG or GWG, >= 1)",
        ),
        (
            "common/nsa_logits_stage.wgsl",
            "for (var i = lid; i < HC * dc; i += lanes)",
            "as above",
        ),
        (
            "common/nsa_values_sg.wgsl",
            "for (var c = 0u; c < P.dv; c += select(32u, 16u, T_KIND == 0u))",
            "steps by 16 or 32 to Dv",
        ),
        (
            "common/rowmath.wgsl",
            "for (var s = WG / 2u; s > 0u; s >>= 1u)",
            "halves to 0",
        ),
    ];

    #[test]
    fn every_loop_is_plain_or_reviewed() {
        let mut found = Vec::new();
        for (path, src) in FILES {
            found.extend(unplain_loops(src).into_iter().map(|h| (*path, h)));
        }
        let reviewed: Vec<(&str, String)> = REVIEWED_LOOPS
            .iter()
            .map(|(p, h, _)| (*p, h.to_string()))
            .collect();
        let mut missing = found.clone();
        for r in &reviewed {
            if let Some(i) = missing.iter().position(|f| f == r) {
                missing.remove(i);
            }
        }
        let mut gone = reviewed.clone();
        for f in &found {
            if let Some(i) = gone.iter().position(|r| r == f) {
                gone.remove(i);
            }
        }
        assert!(
            missing.is_empty() && gone.is_empty(),
            "loops not reviewed: {missing:?}; reviewed loops no longer found: {gone:?}"
        );
    }

    #[test]
    fn loop_review_sees_every_loop_form() {
        let src = "for (var i = 0u; i < n; i++) {\n\
                   for (var j = 0u; j < n; j += 4u) { for (var k = 0u; k < n; k += WG) {\n\
                   for (var z = 0u; z < n; z += 0u) {\n\
                   for (var i = a; i <= n; i++) {\n\
                   for (var d = 1u; d < n; d <<= 1u) {\n\
                   for (var s = 0u; s < n; s += stride) {\n\
                   while (hi - lo > 1u) {\n\
                   loop {\n\
                   // loop { in a comment\n\
                   let forward = while_x + loops; // for (;;) {";
        assert_eq!(
            unplain_loops(src),
            [
                "for (var z = 0u; z < n; z += 0u)",
                "for (var i = a; i <= n; i++)",
                "for (var d = 1u; d < n; d <<= 1u)",
                "for (var s = 0u; s < n; s += stride)",
                "while (hi - lo > 1u)",
                "loop",
            ]
        );
    }

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
