// block_score's queries and block keys in textures (block_score_tex.wgsl, block_score_tex_sg.wgsl).

//#include common/texel.wgsl

@group(0) @binding(1) var query: texture_2d<u32>; // [T, Hi, Di] T, in 16-byte words
@group(0) @binding(2) var keys: texture_2d<u32>;  // [N·max_blocks, Di] T, in 16-byte words

fn query_word(i: u32) -> vec4<u32> {
    return textureLoad(query, texel(i), 0);
}

fn key_word(i: u32) -> vec4<u32> {
    return textureLoad(keys, texel(i), 0);
}
