// row_tiles' query hooks and entry point, for the kernels that read every query word in
// every invocation (block_score.wgsl, block_score_tex.wgsl).

// Per-lane query rows, and the words a lane fetches for all (none: every invocation loads
// all 24 rows itself).
fn query_rows(o0: vec4<u32>, o1: vec4<u32>, o2: vec4<u32>, o3: vec4<u32>, o4: vec4<u32>,
              o5: vec4<u32>, sl: u32) -> vec3<u32> {
    return vec3<u32>(0u);
}

fn query_fetch(mine: vec3<u32>, c: u32) -> array<vec4<u32>, 3> {
    return array<vec4<u32>, 3>();
}

// Chunk c of quad m of the tile's query rows (element offsets o), as mac_rows takes it.
fn query_quad(o: vec4<u32>, m: u32, f: array<vec4<u32>, 3>, c: u32) -> Quad {
    return quad(o, c);
}

// one_row: chunk c of the four heads' query rows (element offsets o).
fn head_quad(o: vec4<u32>, c: u32, sl: u32) -> Quad {
    return quad(o, c);
}

// Whether an invocation runs the products: when any of its blocks is visible.
fn tile_runs(mine: bool) -> bool {
    return mine;
}

@compute @workgroup_size(64)
fn row_tiles(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lane: u32) {
    row_tiles_body(wg, nwg, lane, 0u);
}

@compute @workgroup_size(64)
fn one_row(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lane: u32) {
    one_row_body(wg, nwg, lane, 0u);
}
