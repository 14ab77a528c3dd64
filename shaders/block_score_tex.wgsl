// block_score (SPEC §4, see block_score.wgsl) with the queries and block keys in textures:
// the 16-byte words of each, one per texel, row after row of 8192 texels (the indexer keeps
// these copies of its buffers; see WordTexture). On llvmpipe a texel fetch is a vector gather
// where a storage load is a loop over the lanes (docs/perf.md); the products and their order
// are the same, so both files give the same scores bit for bit.

//#include common/block_score.wgsl

const TEX_SHIFT: u32 = 13u; // 8192 texels per texture row

@group(0) @binding(1) var query: texture_2d<u32>; // [T, Hi, Di] T, in 16-byte words
@group(0) @binding(2) var keys: texture_2d<u32>;  // [N·max_blocks, Di] T, in 16-byte words

fn texel(i: u32) -> vec2<u32> {
    return vec2<u32>(i & ((1u << TEX_SHIFT) - 1u), i >> TEX_SHIFT);
}

fn query_word(i: u32) -> vec4<u32> {
    return textureLoad(query, texel(i), 0);
}

fn key_word(i: u32) -> vec4<u32> {
    return textureLoad(keys, texel(i), 0);
}
