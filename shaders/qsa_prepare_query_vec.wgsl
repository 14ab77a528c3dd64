// qsa_prepare_query (SPEC §3) in 16-byte words: the kernel of qsa_prepare_query.wgsl for rows
// that are whole words (Di a multiple of 4 elements in f32, 8 in f16 / bf16) and rotary halves
// that are too (Dr a multiple of 8 or 16), which the host checks. One invocation per (row t,
// head h) as there; each word of the row is loaded once for the sum of squares and once for
// the output, the rotated pairs (channel c and c + Dr/2) a word of each at a time with their
// weights and tables, and every output word is stored whole. The values and their order are
// those of qsa_prepare_query.wgsl (the sum of squares in channel order, the same products), so
// the results are the same bit for bit unless the driver fuses multiply-adds differently in
// the two (NVIDIA's does: one rounding step). Why: on llvmpipe every load is a loop over the lanes,
// and the scalar kernel loads each channel three times and each weight twice, one element at a
// time (8K prefill: 35 ms).

//#include common/dtype.wgsl
//#include common/flags.wgsl
//#include common/qsa_prepare_query.wgsl
//#include common/qsa_prepare_query_words.wgsl

struct QueryUniform {
    q: QsaPrepareQueryParams,
}

@group(0) @binding(0) var<uniform> U: QueryUniform;
@group(0) @binding(1) var<storage, read> q_raw: array<vec4<u32>>;   // [T, Hi, Di] T
@group(0) @binding(2) var<storage, read> weight: array<vec4<u32>>;  // [Di] T
@group(0) @binding(3) var<storage, read> rope_a: array<vec4<u32>>;  // [T, Dr] or [positions, Dr] T
@group(0) @binding(4) var<storage, read> rope_b: array<vec4<u32>>;  // [T, Dr] T
@group(0) @binding(5) var<storage, read> positions: array<i32>;   // [T] i32
@group(0) @binding(6) var<storage, read_write> out: array<vec4<u32>>; // [T, Hi, Di] T
@group(0) @binding(7) var<storage, read_write> flags: atomic<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let rq = query_row(wg.y * nwg.x + wg.x, lid);
    if (rq.w != 0u) {
        query_words(rq);
    }
}
