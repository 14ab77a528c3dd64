// nsa_compress_attention (SPEC §8.1), stage 2 of 3, subgroup variant: probabilities and values
// as nsa_compress_attention_values.wgsl, for adapters whose subgroups are 8 lanes, where V rows
// start on 16-byte boundaries and Dv takes 8 channel tiles (113 ≤ Dv ≤ 128, as NSA's 128).
// Same bindings, work split, scratch records and psum, and step 1 is the same.
//
// Steps 2 and 3 are fused, with no tile in workgroup memory. Subgroup u takes part u of the
// split (a run of whole batches of 8 tokens; parts = subgroups = 8) and lane sl its channel
// tile (CT = 16 channels), so all lanes of a subgroup work on the same token. For each batch,
// lane k computes token k's probabilities (adding the group's sum to psum, as step 2 does)
// and V row offset itself, and subgroupShuffle (a single vector permute on llvmpipe) hands
// each token's to every lane in turn. The portable kernel stages them in workgroup memory for
// every invocation to read; on llvmpipe each such write and read is a loop over the lanes, and
// with the tile's two barriers that round trip cost more than the V loads. Each token's
// probabilities are still computed once, in the same order, so psum and the parts' products
// are the same values.

//#include common/dtype.wgsl
//#include common/flags.wgsl
//#include common/nsa_attention.wgsl
//#include common/nsa_values.wgsl
//#include common/nsa_values_rows16.wgsl
//#include common/nsa_values_sg.wgsl

@group(0) @binding(4) var<storage, read> value: array<u32>;         // [num_blocks, page, N2·Dv] T (read through value4 here)
@group(0) @binding(5) var<storage, read> value4: array<vec4<u32>>;  // the same, 16 bytes a load
@group(0) @binding(6) var<storage, read_write> scratch: array<vec4<f32>>;  // layout in common/nsa_attention.wgsl
@group(0) @binding(7) var<storage, read_write> psum: array<f32>;    // [R·N2, c_max] f32

// The 32-bit word of V holding element e, for the touches of the next batch's rows.
fn touch_v(e: u32) -> u32 {
    return value[t_word(e)];
}
