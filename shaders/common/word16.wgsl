// One 16-byte word of T as f32, shared by the kernels that read rows a word at a time
// (block_score's dot products, qsa_prepare_query's word kernel): 4 f32 elements (in lo), or 8
// f16/bf16 elements split into the even ones (lo) and the odd ones (hi). Two words split alike
// give their dot product as lo·lo + hi·hi.

//#include common/dtype.wgsl

struct Chunk {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// Elements of T per word.
fn chunk_len() -> u32 {
    if (T_KIND == 0u) {
        return 4u;
    }
    return 8u;
}

fn word_chunk(w: vec4<u32>) -> Chunk {
    if (T_KIND == 0u) {
        return Chunk(bitcast<vec4<f32>>(w), vec4<f32>(0.0));
    }
    return Chunk(t_low4(w), t_high4(w));
}
