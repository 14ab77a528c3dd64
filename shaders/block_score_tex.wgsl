// block_score (SPEC §4, see block_score.wgsl) with the block keys in a texture: the words of
// the [N·max_blocks, Di] T keys, 16 bytes per texel, row after row of KEY_TEX_WIDTH texels
// (the indexer keeps this copy of its block-key buffer). On llvmpipe a texel fetch is a
// vector gather where a storage load is a loop over the lanes (docs/perf.md); the products and
// their order are the same, so both files give the same scores bit for bit.

//#include common/block_score.wgsl

const KEY_TEX_SHIFT: u32 = 13u; // KEY_TEX_WIDTH = 8192 texels per texture row

@group(0) @binding(2) var keys: texture_2d<u32>;

fn key_word(i: u32) -> vec4<u32> {
    return textureLoad(keys, vec2<u32>(i & ((1u << KEY_TEX_SHIFT) - 1u), i >> KEY_TEX_SHIFT), 0);
}
