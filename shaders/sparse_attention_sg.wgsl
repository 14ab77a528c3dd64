// sparse_attention, stage 2 of 3, subgroup variant (SPEC §7): the partial pass of
// sparse_attention.wgsl for adapters whose subgroups have one fixed size SG, reading the pool
// in 16-byte words: W = 1 channel quad a load for f32, 2 for 16-bit T; element by element
// (W = 1) where rows do not start on whole words (VEC = 0). The pass itself, and what it
// shares with sparse_attention_sg_w32.wgsl, is in common/attention_sg.wgsl. Bindings 2, 5, 6
// and 7 are the pass's PS pool shards (slots 0 … 3; slots past PS repeat a bound shard).

//#include common/dtype.wgsl
//#include common/attention.wgsl
//#include common/attention_pass.wgsl
//#include common/attention_sg.wgsl

@group(0) @binding(5) var<storage, read> pool1: array<vec4<u32>>;  // slot 1's shard
@group(0) @binding(6) var<storage, read> pool2: array<vec4<u32>>;  // slot 2's shard
@group(0) @binding(7) var<storage, read> pool3: array<vec4<u32>>;  // slot 3's shard

// log2 of the elements of T in a 16-byte word.
fn word_log2() -> u32 {
    return select(3u, 2u, T_KIND == 0u);
}

// Word j of slot s's shard (s is a constant in each expansion of
// common/attention_sg_shard.wgsl, so the choice folds away).
fn word(s: u32, j: u32) -> vec4<u32> {
    if (PS == 1u || s == 0u) {
        return pool[j];
    }
    var w = vec4<u32>();
    switch s {
        case 1u: { w = pool1[j]; }
        case 2u: { w = pool2[j]; }
        default: { w = pool3[j]; }
    }
    return w;
}

// Element j of slot s's shard.
fn el(s: u32, j: u32) -> f32 {
    let w = t_word(j);
    return t_load(word(s, w >> 2u)[w & 3u], j);
}

// Quads c/4 … c/4 + W − 1 of the row starting at element i of slot s's shard (contract in
// common/attention_sg.wgsl).
fn ld_word(s: u32, i: u32, c: u32, e: u32) -> mat4x4<f32> {
    let j = word_at(i, c, e);
    var m = mat4x4<f32>();
    if (VEC != 0u && T_KIND == 0u) {
        m[0] = bitcast<vec4<f32>>(word(s, j >> word_log2()));
    } else if (VEC != 0u) {
        let w = word(s, j >> word_log2());
        m[0] = lo4(w);
        m[1] = hi4(w);
    } else {
        m[0] = vec4<f32>(el(s, j), el(s, j + 1u), el(s, j + 2u), el(s, j + 3u));
    }
    return live_quads(m, c, e);
}

// Words kw and vw of slot s's K and V rows and those 128 bytes (8 words) on, or the rows' last
// words kw + kl and vw + vl if shorter; nothing where rows are read element by element.
fn touch(s: u32, kw: u32, vw: u32, kl: u32, vl: u32) -> u32 {
    if (VEC == 0u) {
        return 0u;
    }
    return word(s, kw).x | word(s, kw + min(8u, kl)).x | word(s, vw).x | word(s, vw + min(8u, vl)).x;
}
