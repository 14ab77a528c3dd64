// qsa_compress_paged (SPEC §2): block keys from the raw index keys of a paged pool.
// One workgroup per (sequence n, j < span): block b = first_n + j with first_n = cache_len/r
// (incremental) or 0 (full), computed when b < key_count/r. Lengths and page-table entries are
// device data: anything out of range is clamped, skipped and reported in `flags`.

//#include common/dtype.wgsl
//#include common/rowmath.wgsl
//#include common/flags.wgsl
//#include common/qsa_compress_block.wgsl

struct CompressUniform {
    c: QsaCompressParams,
}

@group(0) @binding(0) var<uniform> U: CompressUniform;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let id = wg.y * nwg.x + wg.x;
    if (id < U.c.n * U.c.span) {
        compress_block(id, lid);
    }
}
