// nsa_compress_attention (SPEC §8.1), stage 1 of 3, subgroup variant: the logits of
// nsa_compress_attention.wgsl for adapters whose subgroups are 8 lanes, where K rows and query
// rows start on 16-byte boundaries (BY16 there). Same bindings, same workgroup split (one per
// query row r, KV head, chunk of 16 query heads, split of P.split1 = 1024 compressed tokens), same
// token ownership (invocation lid: tokens lo + lid + 64·t, t < 16) and the same outputs: the
// logits and each split's max and sum of exp per head, which stage 2 merges.
//
// What differs is where the queries come from. The portable kernel stages them in workgroup
// memory and reads them back for every four channels; on llvmpipe (lavapipe's CPU driver) each
// such read is a loop over the SIMD lanes, as costly as loading a key. Here the channels are
// taken a chunk at a time, as many as one 32-byte word of a K row holds (8 f32, 16 16-bit):
// each lane loads its share of the chunk's queries (heads sl and sl + 8), and subgroupBroadcast,
// a single vector permute on llvmpipe, hands every value to every lane. The chunk's query values
// of the 16 heads then serve the 16 tokens of the invocation, each token's K words loaded once;
// the only lane-wise loads left are the keys themselves and one sixteenth as many query words.
//
// Registers are named variables or structs indexed by constants only (llvmpipe keeps an array
// indexed in a loop in memory and gathers it lane by lane).

//#include common/dtype.wgsl
//#include common/flags.wgsl
//#include common/nsa_attention.wgsl
//#include common/nsa_logits.wgsl
//#include common/nsa_logits_sg.wgsl

@group(0) @binding(4) var<storage, read> query4: array<vec4<u32>>;  // [R, N1, Dqk] T, 16 bytes a load
@group(0) @binding(5) var<storage, read> key: array<u32>;           // [num_blocks, page, N2·Dqk] T (unused here)
@group(0) @binding(6) var<storage, read> key4: array<vec4<u32>>;    // the same, 16 bytes a load
@group(0) @binding(7) var<storage, read_write> scratch: array<vec4<f32>>;  // layout in common/nsa_attention.wgsl

// Channels c … c + 7 of an f32 K row at element rb: two 16-byte words.
fn f32_key8(rb: u32, c: u32) -> array<vec4<f32>, 2> {
    let e = (rb + c) / 4u;
    return live2(c, bitcast<vec4<f32>>(key4[e]), bitcast<vec4<f32>>(key4[e + 1u]));
}

// Channels c … c + 15 of a 16-bit K row at element rb: two 16-byte words.
fn half_key16(rb: u32, c: u32) -> array<vec4<f32>, 4> {
    let e = (rb + c) / 8u;
    let w0 = key4[e];
    let w1 = key4[e + 1u];
    return live4(c, lo4(w0), hi4(w0), lo4(w1), hi4(w1));
}
