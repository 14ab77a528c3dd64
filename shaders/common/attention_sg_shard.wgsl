// One shard of a dispatch of the subgroup partial pass: the body of common/attention_sg.wgsl's
// main for pass slot $SLOT (shard P.shard + $SLOT), expanded there once per slot by
// `//#expand common/attention_sg_shard.wgsl SLOT=<k>u` (src/shaders.rs), so that every
// ld_word and touch names its binding by a constant rather than choosing among them per load
// (on lavapipe a per-load choice cost more than the dispatches it saves). It runs this split's
// batches of the slot's part of the row list, carrying the state (m, l, the accumulators a<j><x>)
// in main's registers from one slot to the next.
if (PS > $SLOT && ns > $SLOT) {
    let range = split_range_of(list, split, P.shard + $SLOT);
    let first = range.x;
    let n = range.y;
    for (var i0 = sub * SG; i0 < n; i0 += subs * SG) {
        // Lane b reads token b's row offset, which subgroupShuffle hands to every lane for
        // the K and V loops (a load there would be a loop over the lanes, twice per token).
        // Then it touches that token's K and V rows (two words 128 bytes apart in each), so
        // that the batch's cache misses overlap instead of coming one row at a time.
        let rb = routes[first + min(i0 + sl, n - 1u)] + kh * pool_dim();
        tk |= touch($SLOT, (rb + P.k_off) >> sh, (rb + P.v_off) >> sh, kl, vl);
        var mine = mat4x4<f32>(vec4<f32>(LOW), vec4<f32>(LOW), vec4<f32>(LOW), vec4<f32>(LOW));
        for (var b = 0u; b < SG; b++) {
            let i = i0 + b;
            let kr = subgroupShuffle(rb, b) + P.k_off;
            var z = mat4x4<f32>();
            var kw = mat4x4<f32>();
            if (QK > 0u) {
                kw = ld_word($SLOT, kr, 4u * quad(0u, sl), e);
                z = qk(z, kw[0], q00, q01, q02, q03);
            }
            if (QK > 1u) {
                if (1u % W == 0u) { kw = ld_word($SLOT, kr, 4u * quad(1u, sl), e); }
                z = qk(z, kw[1u % W], q10, q11, q12, q13);
            }
            if (QK > 2u) {
                if (2u % W == 0u) { kw = ld_word($SLOT, kr, 4u * quad(2u, sl), e); }
                z = qk(z, kw[2u % W], q20, q21, q22, q23);
            }
            if (QK > 3u) {
                if (3u % W == 0u) { kw = ld_word($SLOT, kr, 4u * quad(3u, sl), e); }
                z = qk(z, kw[3u % W], q30, q31, q32, q33);
            }
            if (QK > 4u) {
                if (4u % W == 0u) { kw = ld_word($SLOT, kr, 4u * quad(4u, sl), e); }
                z = qk(z, kw[4u % W], q40, q41, q42, q43);
            }
            if (QK > 5u) {
                if (5u % W == 0u) { kw = ld_word($SLOT, kr, 4u * quad(5u, sl), e); }
                z = qk(z, kw[5u % W], q50, q51, q52, q53);
            }
            if (QK > 6u) {
                if (6u % W == 0u) { kw = ld_word($SLOT, kr, 4u * quad(6u, sl), e); }
                z = qk(z, kw[6u % W], q60, q61, q62, q63);
            }
            if (QK > 7u) {
                if (7u % W == 0u) { kw = ld_word($SLOT, kr, 4u * quad(7u, sl), e); }
                z = qk(z, kw[7u % W], q70, q71, q72, q73);
            }
            let keep = sl == b && i < n;
            mine[0] = select(mine[0], sg_sum4(z[0]) * P.scale, keep);
            if (HQ > 1u) { mine[1] = select(mine[1], sg_sum4(z[1]) * P.scale, keep); }
            if (HQ > 2u) { mine[2] = select(mine[2], sg_sum4(z[2]) * P.scale, keep); }
            if (HQ > 3u) { mine[3] = select(mine[3], sg_sum4(z[3]) * P.scale, keep); }
        }
        var al = mat4x4<f32>();
        var p = mat4x4<f32>();  // this lane's token's weights
        let w0 = weigh(mine[0], m[0], l[0]);
        m[0] = w0[0]; l[0] = w0[1]; al[0] = w0[2]; p[0] = w0[3];
        if (HQ > 1u) {
            let w1 = weigh(mine[1], m[1], l[1]);
            m[1] = w1[0]; l[1] = w1[1]; al[1] = w1[2]; p[1] = w1[3];
        }
        if (HQ > 2u) {
            let w2 = weigh(mine[2], m[2], l[2]);
            m[2] = w2[0]; l[2] = w2[1]; al[2] = w2[2]; p[2] = w2[3];
        }
        if (HQ > 3u) {
            let w3 = weigh(mine[3], m[3], l[3]);
            m[3] = w3[0]; l[3] = w3[1]; al[3] = w3[2]; p[3] = w3[3];
        }
        if (QV > 0u) {
            a00 = rescale(a00, al[0]);
            if (HQ > 1u) { a01 = rescale(a01, al[1]); }
            if (HQ > 2u) { a02 = rescale(a02, al[2]); }
            if (HQ > 3u) { a03 = rescale(a03, al[3]); }
        }
        if (QV > 1u) {
            a10 = rescale(a10, al[0]);
            if (HQ > 1u) { a11 = rescale(a11, al[1]); }
            if (HQ > 2u) { a12 = rescale(a12, al[2]); }
            if (HQ > 3u) { a13 = rescale(a13, al[3]); }
        }
        if (QV > 2u) {
            a20 = rescale(a20, al[0]);
            if (HQ > 1u) { a21 = rescale(a21, al[1]); }
            if (HQ > 2u) { a22 = rescale(a22, al[2]); }
            if (HQ > 3u) { a23 = rescale(a23, al[3]); }
        }
        if (QV > 3u) {
            a30 = rescale(a30, al[0]);
            if (HQ > 1u) { a31 = rescale(a31, al[1]); }
            if (HQ > 2u) { a32 = rescale(a32, al[2]); }
            if (HQ > 3u) { a33 = rescale(a33, al[3]); }
        }
        if (QV > 4u) {
            a40 = rescale(a40, al[0]);
            if (HQ > 1u) { a41 = rescale(a41, al[1]); }
            if (HQ > 2u) { a42 = rescale(a42, al[2]); }
            if (HQ > 3u) { a43 = rescale(a43, al[3]); }
        }
        if (QV > 5u) {
            a50 = rescale(a50, al[0]);
            if (HQ > 1u) { a51 = rescale(a51, al[1]); }
            if (HQ > 2u) { a52 = rescale(a52, al[2]); }
            if (HQ > 3u) { a53 = rescale(a53, al[3]); }
        }
        if (QV > 6u) {
            a60 = rescale(a60, al[0]);
            if (HQ > 1u) { a61 = rescale(a61, al[1]); }
            if (HQ > 2u) { a62 = rescale(a62, al[2]); }
            if (HQ > 3u) { a63 = rescale(a63, al[3]); }
        }
        if (QV > 7u) {
            a70 = rescale(a70, al[0]);
            if (HQ > 1u) { a71 = rescale(a71, al[1]); }
            if (HQ > 2u) { a72 = rescale(a72, al[2]); }
            if (HQ > 3u) { a73 = rescale(a73, al[3]); }
        }
        // Two tokens per iteration (SG is even): each accumulator is loaded and stored once for
        // both, in the same order of terms as token by token.
        for (var b = 0u; b < SG; b += 2u) {
            let vr = subgroupShuffle(rb, b) + P.v_off;
            let vs = subgroupShuffle(rb, b + 1u) + P.v_off;
            // Tokens b's and b + 1's weights (0 past the list: their lanes kept LOW scores).
            let p0 = subgroupShuffle(p[0], b);
            let r0 = subgroupShuffle(p[0], b + 1u);
            var p1 = vec4<f32>();
            var r1 = vec4<f32>();
            var p2 = vec4<f32>();
            var r2 = vec4<f32>();
            var p3 = vec4<f32>();
            var r3 = vec4<f32>();
            if (HQ > 1u) { p1 = subgroupShuffle(p[1], b); r1 = subgroupShuffle(p[1], b + 1u); }
            if (HQ > 2u) { p2 = subgroupShuffle(p[2], b); r2 = subgroupShuffle(p[2], b + 1u); }
            if (HQ > 3u) { p3 = subgroupShuffle(p[3], b); r3 = subgroupShuffle(p[3], b + 1u); }
            var vw = mat4x4<f32>();
            var uw = mat4x4<f32>();
            if (QV > 0u) {
                vw = ld_word($SLOT, vr, 4u * quad(0u, sl), ev);
                uw = ld_word($SLOT, vs, 4u * quad(0u, sl), ev);
                let v = vw[0];
                let u = uw[0];
                a00 = axpy(axpy(a00, p0, v), r0, u);
                if (HQ > 1u) { a01 = axpy(axpy(a01, p1, v), r1, u); }
                if (HQ > 2u) { a02 = axpy(axpy(a02, p2, v), r2, u); }
                if (HQ > 3u) { a03 = axpy(axpy(a03, p3, v), r3, u); }
            }
            if (QV > 1u) {
                if (1u % W == 0u) {
                    vw = ld_word($SLOT, vr, 4u * quad(1u, sl), ev);
                    uw = ld_word($SLOT, vs, 4u * quad(1u, sl), ev);
                }
                let v = vw[1u % W];
                let u = uw[1u % W];
                a10 = axpy(axpy(a10, p0, v), r0, u);
                if (HQ > 1u) { a11 = axpy(axpy(a11, p1, v), r1, u); }
                if (HQ > 2u) { a12 = axpy(axpy(a12, p2, v), r2, u); }
                if (HQ > 3u) { a13 = axpy(axpy(a13, p3, v), r3, u); }
            }
            if (QV > 2u) {
                if (2u % W == 0u) {
                    vw = ld_word($SLOT, vr, 4u * quad(2u, sl), ev);
                    uw = ld_word($SLOT, vs, 4u * quad(2u, sl), ev);
                }
                let v = vw[2u % W];
                let u = uw[2u % W];
                a20 = axpy(axpy(a20, p0, v), r0, u);
                if (HQ > 1u) { a21 = axpy(axpy(a21, p1, v), r1, u); }
                if (HQ > 2u) { a22 = axpy(axpy(a22, p2, v), r2, u); }
                if (HQ > 3u) { a23 = axpy(axpy(a23, p3, v), r3, u); }
            }
            if (QV > 3u) {
                if (3u % W == 0u) {
                    vw = ld_word($SLOT, vr, 4u * quad(3u, sl), ev);
                    uw = ld_word($SLOT, vs, 4u * quad(3u, sl), ev);
                }
                let v = vw[3u % W];
                let u = uw[3u % W];
                a30 = axpy(axpy(a30, p0, v), r0, u);
                if (HQ > 1u) { a31 = axpy(axpy(a31, p1, v), r1, u); }
                if (HQ > 2u) { a32 = axpy(axpy(a32, p2, v), r2, u); }
                if (HQ > 3u) { a33 = axpy(axpy(a33, p3, v), r3, u); }
            }
            if (QV > 4u) {
                if (4u % W == 0u) {
                    vw = ld_word($SLOT, vr, 4u * quad(4u, sl), ev);
                    uw = ld_word($SLOT, vs, 4u * quad(4u, sl), ev);
                }
                let v = vw[4u % W];
                let u = uw[4u % W];
                a40 = axpy(axpy(a40, p0, v), r0, u);
                if (HQ > 1u) { a41 = axpy(axpy(a41, p1, v), r1, u); }
                if (HQ > 2u) { a42 = axpy(axpy(a42, p2, v), r2, u); }
                if (HQ > 3u) { a43 = axpy(axpy(a43, p3, v), r3, u); }
            }
            if (QV > 5u) {
                if (5u % W == 0u) {
                    vw = ld_word($SLOT, vr, 4u * quad(5u, sl), ev);
                    uw = ld_word($SLOT, vs, 4u * quad(5u, sl), ev);
                }
                let v = vw[5u % W];
                let u = uw[5u % W];
                a50 = axpy(axpy(a50, p0, v), r0, u);
                if (HQ > 1u) { a51 = axpy(axpy(a51, p1, v), r1, u); }
                if (HQ > 2u) { a52 = axpy(axpy(a52, p2, v), r2, u); }
                if (HQ > 3u) { a53 = axpy(axpy(a53, p3, v), r3, u); }
            }
            if (QV > 6u) {
                if (6u % W == 0u) {
                    vw = ld_word($SLOT, vr, 4u * quad(6u, sl), ev);
                    uw = ld_word($SLOT, vs, 4u * quad(6u, sl), ev);
                }
                let v = vw[6u % W];
                let u = uw[6u % W];
                a60 = axpy(axpy(a60, p0, v), r0, u);
                if (HQ > 1u) { a61 = axpy(axpy(a61, p1, v), r1, u); }
                if (HQ > 2u) { a62 = axpy(axpy(a62, p2, v), r2, u); }
                if (HQ > 3u) { a63 = axpy(axpy(a63, p3, v), r3, u); }
            }
            if (QV > 7u) {
                if (7u % W == 0u) {
                    vw = ld_word($SLOT, vr, 4u * quad(7u, sl), ev);
                    uw = ld_word($SLOT, vs, 4u * quad(7u, sl), ev);
                }
                let v = vw[7u % W];
                let u = uw[7u % W];
                a70 = axpy(axpy(a70, p0, v), r0, u);
                if (HQ > 1u) { a71 = axpy(axpy(a71, p1, v), r1, u); }
                if (HQ > 2u) { a72 = axpy(axpy(a72, p2, v), r2, u); }
                if (HQ > 3u) { a73 = axpy(axpy(a73, p3, v), r3, u); }
            }
        }
    }
}
