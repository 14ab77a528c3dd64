// The indexer's compress and query preparation in one dispatch: qsa_compress_paged's kernel
// (common/qsa_compress_block.wgsl) in workgroups 0 … n·span − 1 and qsa_prepare_query's word
// kernel (common/qsa_prepare_query_words.wgsl) in the workgroups after them, 64 (row, head)
// pairs each. The two write different buffers and read none of each other's outputs, so
// they need no order; each workgroup runs the code of its own operator's shader, so the
// results are those of the two dispatches (bit for bit on lavapipe and llvmpipe; a driver that
// contracts multiply-adds may do so differently in different shaders). Why: on a CPU adapter each
// dispatch costs a wait for all of its workgroups and the two are one workgroup each in a
// decode step, one core idling while the other works; one dispatch runs both at once
// (docs/perf.md, qsa-decode-128k). The host takes it only for that (the query one workgroup):
// llvmpipe compiles this whole kernel as a coroutine for the compress's barriers, which halves
// the speed of the query's workgroups.

//#include common/dtype.wgsl
//#include common/rowmath.wgsl
//#include common/flags.wgsl
//#include common/qsa_compress_block.wgsl
//#include common/qsa_prepare_query.wgsl
//#include common/qsa_prepare_query_words.wgsl

struct FusedUniform {
    c: QsaCompressParams,
    q: QsaPrepareQueryParams,
}

@group(0) @binding(0) var<uniform> U: FusedUniform;
// qsa_compress_paged's bindings 1 … 7 are in common/qsa_compress_block.wgsl
// qsa_prepare_query_vec's bindings but its flags, which are compress's (binding 7)
@group(0) @binding(8) var<storage, read> q_raw: array<vec4<u32>>;    // [T, Hi, Di] T
@group(0) @binding(9) var<storage, read> weight: array<vec4<u32>>;   // [Di] T
@group(0) @binding(10) var<storage, read> rope_a: array<vec4<u32>>;  // [T, Dr] or [positions, Dr] T
@group(0) @binding(11) var<storage, read> rope_b: array<vec4<u32>>;  // [T, Dr] T
@group(0) @binding(12) var<storage, read> positions: array<i32>;     // [T] i32
@group(0) @binding(13) var<storage, read_write> out: array<vec4<u32>>; // [T, Hi, Di] T

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let id = wg.y * nwg.x + wg.x;
    let nc = U.c.n * U.c.span;
    if (id < nc) {
        compress_block(id, lid);
    } else {
        let rq = query_row(id - nc, lid);
        if (rq.w != 0u) {
            query_words(rq);
        }
    }
}
