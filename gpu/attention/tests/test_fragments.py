"""Model check of the mma path's fragment bookkeeping, on the CPU.

The mma kernel in tasks/attention/templates-cuda/device.cuh.j2 addresses shared memory for ldmatrix with
per-lane row/column offsets and re-packs the S accumulators into A fragments for P V. This
test replays exactly those formulas against the PTX ISA's documented register layouts of
ldmatrix (.x4, with and without .trans) and mma.m16n8k16, and checks that one warp's tile
products equal numpy matmuls. A mistake in any offset shows up as a wrong element.
"""

import numpy as np

G = np.arange(32) // 4  # groupID
T4 = np.arange(32) % 4  # threadID_in_group


def ldmatrix_x4(smem, addr_rc, trans=False):
    """smem: 2-D array; addr_rc[lane] = (row, col) of the 8-element row that lane points at.
    Returns regs[i][lane] = (lo, hi) for matrix i (lanes 8i..8i+7 supply its row addresses)."""
    regs = []
    for i in range(4):
        rows = [smem[addr_rc[8 * i + r][0], addr_rc[8 * i + r][1]:addr_rc[8 * i + r][1] + 8] for r in range(8)]
        m = np.stack(rows)  # 8x8
        if trans:
            m = m.T
        regs.append([(m[G[l], 2 * T4[l]], m[G[l], 2 * T4[l] + 1]) for l in range(32)])
    return regs


def mma(c, a, b0, b1):
    """c[lane] = 4 floats; a = 4 regs; b0, b1 regs; layouts of mma.m16n8k16 .row.col."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for l in range(32):
        g, t = G[l], T4[l]
        A[g, 2 * t:2 * t + 2] = a[0][l]
        A[g + 8, 2 * t:2 * t + 2] = a[1][l]
        A[g, 2 * t + 8:2 * t + 10] = a[2][l]
        A[g + 8, 2 * t + 8:2 * t + 10] = a[3][l]
        B[2 * t:2 * t + 2, g] = b0[l]
        B[2 * t + 8:2 * t + 10, g] = b1[l]
    D = A @ B
    for l in range(32):
        g, t = G[l], T4[l]
        c[l] += np.array([D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]])


def test_qk_and_pv_fragments_match_matmul():
    rng = np.random.default_rng(7)
    D, BN = 32, 32
    NT, KT, DT = BN // 8, D // 16, D // 8
    Q = rng.standard_normal((16, D))
    K = rng.standard_normal((BN, D))
    V = rng.standard_normal((BN, D))
    lane = np.arange(32)
    a_row, a_col = lane % 16, (lane // 16) * 8
    kb_row, kb_col = (lane // 16) * 8 + lane % 8, ((lane // 8) % 2) * 8
    vb_row, vb_col = ((lane // 8) % 2) * 8 + lane % 8, (lane // 16) * 8

    s = np.zeros((NT, 32, 4))
    for kk in range(KT):
        a = ldmatrix_x4(Q, [(a_row[l], a_col[l] + kk * 16) for l in range(32)])
        for np_ in range(NT // 2):
            b = ldmatrix_x4(K, [(kb_row[l] + np_ * 16, kb_col[l] + kk * 16) for l in range(32)])
            mma(s[2 * np_], a, b[0], b[1])
            mma(s[2 * np_ + 1], a, b[2], b[3])
    S = np.zeros((16, BN))
    for nt in range(NT):
        for l in range(32):
            g, t = G[l], T4[l]
            S[g, nt * 8 + 2 * t:nt * 8 + 2 * t + 2] = s[nt][l][:2]
            S[g + 8, nt * 8 + 2 * t:nt * 8 + 2 * t + 2] = s[nt][l][2:]
    np.testing.assert_allclose(S, Q @ K.T, rtol=1e-12, atol=1e-12)

    # P := S (any values do); the kernel's re-pack of accumulators into A fragments, then O = P V.
    o = np.zeros((DT, 32, 4))
    for kk in range(BN // 16):
        pa = [[(s[2 * kk][l][0], s[2 * kk][l][1]) for l in range(32)],
              [(s[2 * kk][l][2], s[2 * kk][l][3]) for l in range(32)],
              [(s[2 * kk + 1][l][0], s[2 * kk + 1][l][1]) for l in range(32)],
              [(s[2 * kk + 1][l][2], s[2 * kk + 1][l][3]) for l in range(32)]]
        for dp in range(DT // 2):
            b = ldmatrix_x4(V, [(vb_row[l] + kk * 16, vb_col[l] + dp * 16) for l in range(32)], trans=True)
            mma(o[2 * dp], pa, b[0], b[1])
            mma(o[2 * dp + 1], pa, b[2], b[3])
    O = np.zeros((16, D))
    for dt in range(DT):
        for l in range(32):
            g, t = G[l], T4[l]
            O[g, dt * 8 + 2 * t:dt * 8 + 2 * t + 2] = o[dt][l][:2]
            O[g + 8, dt * 8 + 2 * t:dt * 8 + 2 * t + 2] = o[dt][l][2:]
    np.testing.assert_allclose(O, S @ V, rtol=1e-10, atol=1e-10)
