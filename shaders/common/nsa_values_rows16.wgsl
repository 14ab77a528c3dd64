// The V row loads of nsa_compress_attention's values stage (SPEC §8.1) in 16-byte words,
// shared by the portable kernel (nsa_compress_attention_values.wgsl, where BY16) and the
// subgroup variant (…_values_sg.wgsl, whose shared body calls `v_row`). The including shader
// declares the `value4` binding.

// Channels cb … cb + 15 of the V row at element vb (16-byte rows, read through value4), as four
// quads; a quad past Dv reads the row's last quad (its channels are dropped).
fn v_row(vb: u32, cb: u32) -> array<vec4<f32>, 4> {
    if (T_KIND == 0u) {
        let last = P.dv - 4u;
        return array<vec4<f32>, 4>(bitcast<vec4<f32>>(value4[(vb + min(cb, last)) / 4u]),
                                   bitcast<vec4<f32>>(value4[(vb + min(cb + 4u, last)) / 4u]),
                                   bitcast<vec4<f32>>(value4[(vb + min(cb + 8u, last)) / 4u]),
                                   bitcast<vec4<f32>>(value4[(vb + min(cb + 12u, last)) / 4u]));
    }
    let last = P.dv - 8u;
    let w0 = value4[(vb + min(cb, last)) / 8u];
    let w1 = value4[(vb + min(cb + 8u, last)) / 8u];
    return array<vec4<f32>, 4>(lo4(w0), hi4(w0), lo4(w1), hi4(w1));
}
