// block_score (SPEC §4, see block_score.wgsl) with the queries and block keys in textures:
// the 16-byte words of each, one per texel, row after row of 8192 texels (the indexer keeps
// these copies of its buffers; see WordTexture). On llvmpipe a texel fetch is a vector gather
// where a storage load is a loop over the lanes (docs/perf.md); the products and their order
// are the same, so both files give the same scores bit for bit.

//#include common/block_score.wgsl
//#include common/block_score_queries.wgsl
//#include common/block_score_textures.wgsl
