// nsa_compress_attention (SPEC §8.1), stage 2 of 3, subgroup variant with 32-byte loads: the
// kernel of nsa_compress_attention_values_sg.wgsl (same bindings, work split, records and
// results, bit for bit) whose V rows are read as 32-byte `vec4<u64>` words, half as many loads
// as 16-byte ones. Chosen where the device has 64-bit integers in shaders and V rows start on
// 32-byte boundaries (Dv·sizeof(T) a multiple of 32).

//#include common/dtype.wgsl
//#include common/flags.wgsl
//#include common/nsa_attention.wgsl
//#include common/nsa_values.wgsl
//#include common/nsa_values_sg.wgsl
//#include common/wide.wgsl

@group(0) @binding(4) var<storage, read> value: array<u32>;         // [num_blocks, page, N2·Dv] T (read through value8 here)
@group(0) @binding(5) var<storage, read> value8: array<vec4<u64>>;  // the same, 32 bytes a load
@group(0) @binding(6) var<storage, read_write> scratch: array<vec4<f32>>;  // layout in common/nsa_attention.wgsl
@group(0) @binding(7) var<storage, read_write> psum: array<f32>;    // [R·N2, c_max] f32

// Channels cb … cb + 15 of the V row at element vb as four quads, in two 32-byte words (f32)
// or one (16-bit T); a word past Dv reads the row's last one (its channels are dropped).
fn v_row(vb: u32, cb: u32) -> array<vec4<f32>, 4> {
    if (T_KIND == 0u) {
        let last = P.dv - 8u;
        let a = words(value8[(vb + min(cb, last)) / 8u]);
        let b = words(value8[(vb + min(cb + 8u, last)) / 8u]);
        return array<vec4<f32>, 4>(bitcast<vec4<f32>>(a[0]), bitcast<vec4<f32>>(a[1]),
                                   bitcast<vec4<f32>>(b[0]), bitcast<vec4<f32>>(b[1]));
    }
    let a = words(value8[(vb + min(cb, P.dv - 16u)) / 16u]);
    return array<vec4<f32>, 4>(lo4(a[0]), hi4(a[0]), lo4(a[1]), hi4(a[1]));
}

// The 32-bit word of V holding element e, for the touches of the next batch's rows.
fn touch_v(e: u32) -> u32 {
    return value[t_word(e)];
}
