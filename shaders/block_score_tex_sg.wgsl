// block_score (SPEC §4, see block_score.wgsl) from the texture copies (block_score_tex.wgsl)
// for subgroups of 8 lanes. The query rows are the same in every invocation of a workgroup
// (row_tiles: the tile's 24 rows; one_row: the row's 4 heads at a time), so instead of every
// lane fetching each of their texels, row_tiles' lane l fetches rows l, l + 8 and l + 16 and
// one_row's lane l head l % 4, and `subgroupShuffle` hands each word to every lane (one vector
// permute on llvmpipe, where a texel fetch is a gather of 8 lanes through a function call:
// about half of row_tiles' time went to fetches, 24 of 40 per chunk to the queries). The same
// words, products and order: the same scores bit for bit. Invocations run the products when
// any lane of their subgroup has a visible block (the shuffles need the whole subgroup); the
// others' sums are stored as -inf as before. The host picks this file for row tiles in f32
// (in bf16 it measured slower) and one-row tiles in every type.

//#include common/block_score.wgsl
//#include common/block_score_textures.wgsl

// Element v[i] without indexing a vector by a variable.
fn pick(v: vec4<u32>, i: u32) -> u32 {
    return select(select(v.x, v.y, i == 1u), select(v.z, v.w, i == 3u), i >= 2u);
}

// Lane sl's rows: sl, sl + 8 and sl + 16 of the tile (quads sl / 4, + 2, + 4; element sl % 4).
fn query_rows(o0: vec4<u32>, o1: vec4<u32>, o2: vec4<u32>, o3: vec4<u32>, o4: vec4<u32>,
              o5: vec4<u32>, sl: u32) -> vec3<u32> {
    let i = sl & 3u;
    let hi = sl >= 4u;
    return vec3<u32>(pick(select(o0, o1, hi), i), pick(select(o2, o3, hi), i),
                     pick(select(o4, o5, hi), i));
}

// Word c of each of the lane's three rows.
fn query_fetch(mine: vec3<u32>, c: u32) -> array<vec4<u32>, 3> {
    return array<vec4<u32>, 3>(query_word(mine.x / chunk_len() + c),
                               query_word(mine.y / chunk_len() + c),
                               query_word(mine.z / chunk_len() + c));
}

// Quad m (rows 4m … 4m + 3): fetched by lanes 4 (m % 2) … + 3, in their word m / 2.
fn query_quad(o: vec4<u32>, m: u32, f: array<vec4<u32>, 3>, c: u32) -> Quad {
    let w = f[m >> 1u];
    let l = 4u * (m & 1u);
    return quad_of(word_chunk(subgroupShuffle(w, l)), word_chunk(subgroupShuffle(w, l + 1u)),
                   word_chunk(subgroupShuffle(w, l + 2u)), word_chunk(subgroupShuffle(w, l + 3u)));
}

// one_row: lane l fetches head l % 4's word; lanes 0 … 3 hand them on.
fn head_quad(o: vec4<u32>, c: u32, sl: u32) -> Quad {
    let w = query_word(pick(o, sl & 3u) / chunk_len() + c);
    return quad_of(word_chunk(subgroupShuffle(w, 0u)), word_chunk(subgroupShuffle(w, 1u)),
                   word_chunk(subgroupShuffle(w, 2u)), word_chunk(subgroupShuffle(w, 3u)));
}

fn tile_runs(mine: bool) -> bool {
    return subgroupAny(mine);
}

@compute @workgroup_size(64)
fn row_tiles(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lane: u32,
             @builtin(subgroup_invocation_id) sl: u32) {
    row_tiles_body(wg, nwg, lane, sl);
}

@compute @workgroup_size(64)
fn one_row(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lane: u32,
           @builtin(subgroup_invocation_id) sl: u32) {
    one_row_body(wg, nwg, lane, sl);
}
