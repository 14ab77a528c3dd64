// Texture copies of buffers (gpu::WordTexture): a buffer's 16-byte words, row after row of
// 8192 texels of an Rgba32Uint texture. `texel(i)` is the coordinate of word i.

const TEX_SHIFT: u32 = 13u; // 8192 texels per texture row (gpu::TEX_WIDTH)

fn texel(i: u32) -> vec2<u32> {
    return vec2<u32>(i & ((1u << TEX_SHIFT) - 1u), i >> TEX_SHIFT);
}
