// nsa_compress_attention (SPEC §8.1), stage 2 of 3, subgroup variant reading V from a texture
// copy: the kernel of nsa_compress_attention_values_sg.wgsl (same work split, records and
// results, bit for bit) whose V rows and touches are texel fetches of a gpu::WordTexture of
// the V buffer. Chosen where the caller passes that copy (NsaAttnBuffers::value_tex) and the
// context reads texture copies (Capabilities::textures).

//#include common/dtype.wgsl
//#include common/flags.wgsl
//#include common/nsa_attention.wgsl
//#include common/nsa_values.wgsl
//#include common/nsa_values_sg.wgsl
//#include common/texel.wgsl

@group(0) @binding(4) var value_tex: texture_2d<u32>;               // [num_blocks, page, N2·Dv] T, in 16-byte texels
@group(0) @binding(5) var<storage, read_write> scratch: array<vec4<f32>>;  // layout in common/nsa_attention.wgsl
@group(0) @binding(6) var<storage, read_write> psum: array<f32>;    // [R·N2, c_max] f32

fn value_word(i: u32) -> vec4<u32> {
    return textureLoad(value_tex, texel(i), 0);
}

// The 32-bit word of V holding element e, for the touches of the next batch's rows.
fn touch_v(e: u32) -> u32 {
    return value_word(t_word(e) / 4u).x;
}

// Channels cb … cb + 15 of the V row at element vb as four quads, in four 16-byte texels (f32)
// or two (16-bit T); a quad past Dv reads the row's last one (its channels are dropped).
fn v_row(vb: u32, cb: u32) -> array<vec4<f32>, 4> {
    if (T_KIND == 0u) {
        let last = P.dv - 4u;
        return array<vec4<f32>, 4>(bitcast<vec4<f32>>(value_word((vb + min(cb, last)) / 4u)),
                                   bitcast<vec4<f32>>(value_word((vb + min(cb + 4u, last)) / 4u)),
                                   bitcast<vec4<f32>>(value_word((vb + min(cb + 8u, last)) / 4u)),
                                   bitcast<vec4<f32>>(value_word((vb + min(cb + 12u, last)) / 4u)));
    }
    let last = P.dv - 8u;
    let w0 = value_word((vb + min(cb, last)) / 8u);
    let w1 = value_word((vb + min(cb + 8u, last)) / 8u);
    return array<vec4<f32>, 4>(lo4(w0), hi4(w0), lo4(w1), hi4(w1));
}
