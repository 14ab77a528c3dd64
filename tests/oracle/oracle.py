"""The operators of SPEC.md sections 1-8, written from the contract alone.

Nothing here comes from the library (neither its shaders nor its CPU reference): each function
is the contract's text turned into numpy, computed in float64, with an output of type T rounded
to T once at the end.

Each operator function takes (tensors, attrs): tensors maps a name to (dtype, values) as
st.load returns it, attrs maps an attribute name to its parsed JSON value (absent attributes
are missing). It returns (outputs, aux). outputs maps an output name to (dtype, values). aux
holds what compare.py needs for an output NAME:

- 'mag:NAME': per element, the sum of the magnitudes of the terms that make the value (the
  scale of the f32 accumulation error);
- 'raw:NAME': the unrounded float64 value (to tell a single rounding from a double one);
- 'atol:NAME': an extra allowance per element (NSA's round_T of each probability);
- 'exact:NAME': a mask of the elements that are copies or zeros, which must be exact;
- 'scores:NAME': for an index output whose order comes from float sums (NSA topk), the
  float64 score of every candidate of each row, to judge near-ties;
- 'written': a mask of the rows an operator writes (BSND rows beyond q_len are not written).
"""
import json
import math

import numpy as np

from st import round_to, ulp


def rounded(dtype, x, name, aux):
    """x rounded to dtype; the unrounded values are kept in aux for the comparator."""
    aux['raw:' + name] = np.array(x, dtype=np.float64)
    return round_to(dtype, x)


def f64(tensor):
    return np.asarray(tensor[1], dtype=np.float64)


def optional(tensors, name):
    """An optional input: absent, or present with zero elements, counts as absent (§0)."""
    if name not in tensors or tensors[name][1].size == 0:
        return None
    return tensors[name]


def rms_rope(y, w, eps, off, cos, sin, dr):
    """§1 steps 2-3 on one mean vector y [Di].

    w: the norm weight [Di] or None (no norm). cos, sin: one value per channel [Dr] or None
    (no rotation). Returns (y', mag) with mag the magnitude of the terms of each channel.
    """
    y = np.array(y, dtype=np.float64)
    mag = np.abs(y)
    if w is not None:
        inv = 1.0 / math.sqrt(np.mean(y * y) + eps)
        y = y * inv * (off + w)
        mag = mag * inv * np.abs(off + w) + np.abs(y)
    if cos is not None and dr > 0:
        h = dr // 2
        a, b = y[:h].copy(), y[h:dr].copy()
        ma, mb = mag[:h].copy(), mag[h:dr].copy()
        y[:h] = a * cos[:h] - b * sin[:h]
        y[h:dr] = b * cos[h:dr] + a * sin[h:dr]
        mag[:h] = ma * np.abs(cos[:h]) + mb * np.abs(sin[:h])
        mag[h:dr] = mb * np.abs(cos[h:dr]) + ma * np.abs(sin[h:dr])
    return y, mag


def interleaved_rope(freqs, row, dr):
    """cos and sin per channel from a freqs_cis row of interleaved pairs (§2): pair i is the
    angle of channels i and i + Dr/2."""
    cos = freqs[row, 0:dr:2]
    sin = freqs[row, 1:dr:2]
    return np.concatenate([cos, cos]), np.concatenate([sin, sin])


def row_positions(row_offsets, cache_lengths):
    """Sequence and position of every packed row of a ragged batch (§0)."""
    seq, pos = [], []
    for n, cached in enumerate(np.asarray(cache_lengths, dtype=np.int64)):
        for t in range(int(row_offsets[n]), int(row_offsets[n + 1])):
            seq.append(n)
            pos.append(int(cached) + t - int(row_offsets[n]))
    return np.array(seq, dtype=np.int64), np.array(pos, dtype=np.int64)


def topk_order(row, k):
    """§0 top-k order of the candidates (entries other than -inf) of one score row: descending
    score, ties to the lower index, NaN below every number. Returns (k indices padded with -1,
    number selected)."""
    def key(i):
        return (1, 0.0, i) if np.isnan(row[i]) else (0, -row[i], i)

    cand = sorted((i for i in range(len(row)) if row[i] != -np.inf), key=key)[:k]
    return cand + [-1] * (k - len(cand)), len(cand)


# ---------------------------------------------------------------- §1
def qsa_prepare(t, a):
    T = t['raw_index_keys'][0]
    X = f64(t['raw_index_keys'])
    N, L, Di = X.shape
    PB = f64(t['past_block_index_keys'])
    kl = t['key_length'][1].astype(np.int64)
    if kl.shape == (1,):
        kl = np.repeat(kl, N)
    rc = optional(t, 'rope_cos')
    rs = optional(t, 'rope_sin')
    w = optional(t, 'k_norm_weight')
    w = f64(w) if w is not None else None
    PI = f64(t['past_incomplete_raw_keys'])
    PR = optional(t, 'past_incomplete_rope')
    r = int(a['key_block_size'])
    eps = float(a.get('epsilon', 1e-6))
    off = float(a.get('norm_weight_offset', 0.0))
    rope = rc is not None
    Dr = rc[1].shape[2] if rope else 0
    if rope:
        C, Sn = f64(rc), f64(rs)
        PRv = f64(PR) if PR is not None else np.zeros((N, 2 * Dr))
    B = int(max(kl // r)) if N > 0 else 0
    BK = np.zeros((N, B, Di))
    BKm = np.zeros((N, B, Di))
    copied = np.ones((N, B, Di), dtype=bool)
    IR = np.zeros((N, r - 1, Di))
    IRope = np.zeros((N, 2 * Dr))
    for n in range(N):
        S = int(kl[n])
        past = S - L
        pend = past % r
        base = past - pend

        def token(pos):
            return X[n, pos - past] if pos >= past else PI[n, pos - base]

        def rope_of(pos):
            if pos >= past:
                return C[n, pos - past], Sn[n, pos - past]
            return PRv[n, :Dr], PRv[n, Dr:]

        for b in range(past // r):
            BK[n, b] = PB[n, b]
            BKm[n, b] = np.abs(PB[n, b])
        for b in range(past // r, S // r):
            xs = np.stack([token(b * r + j) for j in range(r)])
            c, s = rope_of(b * r) if rope else (None, None)
            y, mag = rms_rope(xs.sum(0) / r, w, eps, off, c, s, Dr)
            BK[n, b] = y
            BKm[n, b] = mag + np.abs(xs).sum(0) / r
            copied[n, b] = False
        start = (S // r) * r
        for i in range(S % r):
            IR[n, i] = token(start + i)
        if rope and S % r > 0:
            c, s = rope_of(start)
            IRope[n, :Dr] = c
            IRope[n, Dr:] = s
    aux = {'mag:block_index_keys': BKm, 'exact:block_index_keys': copied,
           'exact:incomplete_raw_keys': np.ones(IR.shape, dtype=bool),
           'exact:incomplete_rope': np.ones(IRope.shape, dtype=bool)}
    out = {'block_index_keys': (T, rounded(T, BK, 'block_index_keys', aux)),
           'incomplete_raw_keys': (T, round_to(T, IR))}
    if rope:
        out['incomplete_rope'] = (T, round_to(T, IRope))
    return out, aux


# ---------------------------------------------------------------- §2
def qsa_compress_paged(t, a):
    T = t['kv_blocks'][0]
    kv = f64(t['kv_blocks'])
    _, _, NL, P, Hk, Di = kv.shape
    flat = kv.ravel()
    pt = t['page_table'][1].astype(np.int64)
    cl = t['cache_lengths'][1].astype(np.int64)
    kc = t['key_counts'][1].astype(np.int64)
    g = optional(t, 'gamma')
    g = f64(g) if g is not None else None
    fr = optional(t, 'freqs_cis')
    fr = f64(fr) if fr is not None else None
    BKin = f64(t['block_keys'])
    N = cl.shape[0]
    MB = BKin.shape[0] // N
    r = int(a['ratio'])
    Dr = int(a.get('rotary_dim', fr.shape[1] if fr is not None else 0))
    eps = float(a.get('epsilon', 1e-6))
    off = float(a.get('norm_weight_offset', 0.0))
    layer = int(a.get('layer_idx', 0))
    stride = int(a.get('page_stride', 2 * NL * P * Hk * Di))
    full = a.get('mode', 'incremental') == 'full'
    out = BKin.copy()
    mag = np.abs(BKin)
    kept = np.ones(out.shape, dtype=bool)
    for n in range(N):
        for b in range(0 if full else cl[n] // r, kc[n] // r):
            xs = []
            for j in range(r):
                pos = b * r + j
                o = pt[n, pos // P] * stride + (layer * P + pos % P) * Hk * Di  # plane 0 = K
                xs.append(flat[o:o + Di])
            xs = np.stack(xs)
            if fr is not None and Dr > 0:
                c, s = interleaved_rope(fr, b * r, Dr)
            else:
                c = s = None
            y, mg = rms_rope(xs.sum(0) / r, g, eps, off, c, s, Dr)
            out[n * MB + b] = y
            mag[n * MB + b] = mg + np.abs(xs).sum(0) / r
            kept[n * MB + b] = False
    aux = {'mag:block_keys': mag, 'exact:block_keys': kept}
    return {'block_keys': (T, rounded(T, out, 'block_keys', aux))}, aux


# ---------------------------------------------------------------- §3
def qsa_prepare_query(t, a):
    T = t['index_query_raw'][0]
    Q = f64(t['index_query_raw'])
    TT, Hi, _ = Q.shape
    w = optional(t, 'q_norm_weight')
    w = f64(w) if w is not None else None
    rc = optional(t, 'rope_cos')
    rs = optional(t, 'rope_sin')
    fr = optional(t, 'freqs_cis')
    pos = optional(t, 'positions')
    eps = float(a.get('epsilon', 1e-6))
    off = float(a.get('norm_weight_offset', 0.0))
    out = np.zeros_like(Q)
    mag = np.zeros_like(Q)
    for tt in range(TT):
        c = s = None
        Dr = 0
        if rc is not None:
            c, s = f64(rc)[tt], f64(rs)[tt]
            Dr = c.shape[0]
        elif fr is not None:
            F = f64(fr)
            Dr = int(a.get('rotary_dim', F.shape[1]))
            c, s = interleaved_rope(F, int(pos[1][tt]), Dr)
        for h in range(Hi):
            out[tt, h], mag[tt, h] = rms_rope(Q[tt, h], w, eps, off, c, s, Dr)
    aux = {'mag:index_query': mag}
    return {'index_query': (T, rounded(T, out, 'index_query', aux))}, aux


# ---------------------------------------------------------------- §4
def block_score(t, a):
    Q = f64(t['index_query'])
    K = f64(t['block_keys'])
    TT, Hi, Di = Q.shape
    ro = t['row_offsets'][1]
    cl = t['cache_lengths'][1].astype(np.int64)
    N = cl.shape[0]
    MB = K.shape[0] // N if N > 0 else 0
    kc = optional(t, 'key_counts')
    kc = kc[1].astype(np.int64) if kc is not None else cl + np.diff(ro.astype(np.int64))
    iw = optional(t, 'index_weights')
    W = f64(iw) if iw is not None else np.ones((TT, Hi))
    r = int(a['ratio'])
    Hs = int(a.get('num_selection_heads', 1))
    scale = float(a.get('scale', 1.0 / math.sqrt(Di)))
    seq, pos = row_positions(ro, cl)
    S = np.full((TT, Hs, MB), -np.inf)
    M = np.zeros((TT, Hs, MB))
    G = Hi // Hs
    for tt in range(TT):
        n = seq[tt]
        vis = min((pos[tt] + 1) // r, kc[n] // r, MB)
        for g in range(Hs):
            heads = range(g * G, (g + 1) * G)
            for b in range(vis):
                k = K[n * MB + b]
                S[tt, g, b] = scale * sum(W[tt, h] * max(0.0, float(Q[tt, h] @ k))
                                          for h in heads)
                M[tt, g, b] = abs(scale) * sum(abs(W[tt, h]) * float(np.abs(Q[tt, h]) @ np.abs(k))
                                               for h in heads)
    return {'scores': ('F32', round_to('F32', S))}, {'mag:scores': M}


# ---------------------------------------------------------------- §5
def block_topk(t, a):
    S = f64(t['scores'])
    TT, Hs, _ = S.shape
    k = int(a['k']) if 'k' in a else int(a['token_budget']) // int(a['ratio'])
    BI = np.full((TT, Hs, k), -1, dtype=np.int64)
    BC = np.zeros((TT, Hs), dtype=np.int64)
    for tt in range(TT):
        for g in range(Hs):
            sel, BC[tt, g] = topk_order(S[tt, g], k)
            BI[tt, g] = sel
    return {'block_indices': ('I32', BI), 'block_count': ('I32', BC)}, {}


# ---------------------------------------------------------------- §6
def expand_route(t, a):
    BI = t['block_indices'][1].astype(np.int64)
    BC = t['block_count'][1].astype(np.int64)
    positions = t['positions'][1].astype(np.int64)
    r = int(a['ratio'])
    TT, Hs, k = BI.shape
    TI = np.full((TT, Hs, k * r + r - 1), -1, dtype=np.int64)
    TC = np.zeros((TT, Hs), dtype=np.int64)
    for tt in range(TT):
        p = positions[tt]
        tail = list(range(((p + 1) // r) * r, p + 1))
        for g in range(Hs):
            c = BC[tt, g]
            tokens = [b * r + i for b in BI[tt, g, :c] for i in range(r)] + tail
            TI[tt, g, :len(tokens)] = tokens
            TC[tt, g] = r * c + (p + 1) % r
    return {'token_indices': ('I32', TI), 'token_count': ('I32', TC)}, {}


# ---------------------------------------------------------------- §7
def sparse_attention(t, a):
    T = t['query'][0]
    Q = f64(t['query'])
    TT, H, E = Q.shape
    kv = f64(t['kv_blocks'])
    _, _, _, P, Hkv, _ = kv.shape
    pt = t['page_table'][1].astype(np.int64)
    TI = t['token_indices'][1].astype(np.int64)
    TC = t['token_count'][1].astype(np.int64)
    Hs = TI.shape[1]
    sinks = optional(t, 'sinks')
    sinks = f64(sinks) if sinks is not None else None
    scale = float(a.get('scale', 1.0 / math.sqrt(E)))
    layer = int(a.get('layer_idx', 0))
    seq, _ = row_positions(t['row_offsets'][1], t['cache_lengths'][1])
    out = np.zeros((TT, H, E))
    mag = np.zeros((TT, H, E))
    for tt in range(TT):
        n = seq[tt]
        for h in range(H):
            hk = h // (H // Hkv)
            J = TI[tt, h // (H // Hs), :TC[tt, h // (H // Hs)]]
            if len(J) == 0:
                continue  # with or without a sink, an empty selection gives 0
            Ks = np.array([kv[pt[n, j // P], 0, layer, j % P, hk] for j in J])
            Vs = np.array([kv[pt[n, j // P], 1, layer, j % P, hk] for j in J])
            z = scale * (Ks @ Q[tt, h])
            m = max(z.max(), sinks[h]) if sinks is not None else z.max()
            e = np.exp(z - m)
            den = e.sum() + (math.exp(sinks[h] - m) if sinks is not None else 0.0)
            out[tt, h] = (e @ Vs) / den
            # the value terms, plus the softmax's sensitivity to an error of |z|·eps in a logit
            zmag = abs(scale) * (np.abs(Ks) @ np.abs(Q[tt, h]))
            mag[tt, h] = (e @ np.abs(Vs) + (e * zmag) @ np.abs(Vs)) / den
    aux = {'mag:out': mag}
    return {'out': (T, rounded(T, out, 'out', aux))}, aux


# ---------------------------------------------------------------- §8.1
def nsa_compress_attention(t, a):
    T = t['query'][0]
    Q = f64(t['query'])
    K = f64(t['key'])
    V = f64(t['value'])
    bt = t['block_table'][1].astype(np.int64)
    B = bt.shape[0]
    N1 = int(a['num_heads'])
    N2 = int(a['num_kv_heads'])
    ell = int(a['compress_block_size'])  # the contract's l
    d = int(a['compress_stride'])
    lp = int(a['select_block_size'])
    k = int(a['select_block_count'])
    tnd = a.get('layout', 'TND') == 'TND'
    causal = bool(a.get('causal_mask', False))
    G = N1 // N2
    P = K.shape[1]
    Dqk = K.shape[2] // N2
    Dv = V.shape[2] // N2
    scale = float(a.get('scale', 1.0 / math.sqrt(Dqk)))
    aq = optional(t, 'actual_q_len')
    qlen = aq[1].astype(np.int64) if aq is not None else np.ones(B, dtype=np.int64)
    cb = t['actual_cmp_kv_len'][1].astype(np.int64)
    sl = optional(t, 'actual_sel_kv_len')
    Sp, Np = lp // d, ell // d
    rows = (Q.shape[0],) if tnd else (B, Q.shape[1])
    outs = np.zeros(rows + (N1, Dv))
    mags = np.zeros_like(outs)
    atols = np.zeros_like(outs)
    topk = np.zeros(rows + (N2, k), dtype=np.int64)
    written = np.zeros(rows, dtype=bool)
    scores = {}
    row0 = 0
    for b in range(B):
        c_b = int(cb[b])
        nsel = -(-((c_b - 1) * d + ell) // lp)
        Kc = np.array([K[bt[b, c // P], c % P] for c in range(c_b)]).reshape(c_b, N2, Dqk)
        Vc = np.array([V[bt[b, c // P], c % P] for c in range(c_b)]).reshape(c_b, N2, Dv)
        for s in range(int(qlen[b])):
            idx = (row0 + s,) if tnd else (b, s)
            q = Q[idx]
            written[idx] = True
            visible = np.ones(c_b, dtype=bool)
            if causal:
                p = int(sl[1][b]) - int(qlen[b]) + s
                visible = np.array([j * d + ell - 1 <= p for j in range(c_b)], dtype=bool)
            agg = np.zeros((N2, nsel))
            for h in range(N1):
                n2 = h // G
                prob = np.zeros(c_b)
                if visible.any():
                    x = scale * (Kc[visible, n2] @ q[h])
                    e = np.exp(x - x.max())
                    prob[visible] = e / e.sum()
                    prob_t = round_to(T, prob)
                    outs[idx][h] = prob_t @ Vc[:, n2]
                    mags[idx][h] = prob_t @ np.abs(Vc[:, n2])
                    # an f32 probability may round to T one ulp away from the exact one's
                    atols[idx][h] = ulp(T, prob) @ np.abs(Vc[:, n2])
                for o in range(nsel):
                    agg[n2, o] += sum(prob[j] for m in range(Sp) for nn in range(Np)
                                      for j in [Sp * (o + 1) - m - nn] if 0 <= j < c_b)
            for n2 in range(N2):
                for forced in {0, nsel - 2, nsel - 1}:
                    if forced >= 0:
                        agg[n2, forced] = np.inf
                topk[idx][n2] = topk_order(agg[n2], k)[0]
                scores[idx + (n2,)] = agg[n2].copy()
        row0 += int(qlen[b])
    aux = {'mag:out': mags, 'atol:out': atols, 'scores:topk': scores, 'written': written}
    return {'out': (T, rounded(T, outs, 'out', aux)), 'topk': ('I32', topk)}, aux


# ---------------------------------------------------------------- §8.2
def nsa_compress(t, a):
    T = t['input'][0]
    X = f64(t['input'])
    W = f64(t['weight'])
    ell = int(a['l'])
    d = int(a['d'])
    _, N, D = X.shape
    outs, mags = [], []
    start = 0
    for L in t['seq_lens'][1].astype(np.int64):
        L = int(L)
        for i in range((L - ell) // d + 1 if L >= ell else 0):
            seg = X[start + i * d: start + i * d + ell]
            outs.append(np.einsum('tn,tnd->nd', W, seg))
            mags.append(np.einsum('tn,tnd->nd', np.abs(W), np.abs(seg)))
        start += L
    out = np.stack(outs) if outs else np.zeros((0, N, D))
    aux = {'mag:out': np.stack(mags) if mags else out}
    return {'out': (T, rounded(T, out, 'out', aux))}, aux


OPS = {
    'qsa_prepare': qsa_prepare,
    'qsa_compress_paged': qsa_compress_paged,
    'qsa_prepare_query': qsa_prepare_query,
    'block_score': block_score,
    'block_topk': block_topk,
    'expand_route': expand_route,
    'sparse_attention': sparse_attention,
    'nsa_compress_attention': nsa_compress_attention,
    'nsa_compress': nsa_compress,
}


def run(tensors, meta):
    """The expected outputs of a case file's call: (outputs, aux) as described above.

    Attributes are parsed as JSON; a null one is left out (takes its default), and the
    `format` entry that safetensors writers add is not an attribute.
    """
    attrs = {k: json.loads(v) for k, v in meta.items() if k not in ('op', 'format')}
    attrs = {k: v for k, v in attrs.items() if v is not None}
    return OPS[meta['op']](tensors, attrs)
