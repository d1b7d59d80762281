"""Brute-force Python references of Clip_B / Clip_V (THEORY §3), shared by the functional and the end-to-end tests."""

from __future__ import annotations

import math
import statistics
from fractions import Fraction


def _valid(mask):
    return [(b, t) for b in range(len(mask)) for t in range(len(mask[0])) if mask[b][t]]


def ref_clip_b(S, A, mask, mu, symmetric=False, extra=()):
    """Keep mask as nested lists; ``extra`` = additional valid S values of a larger global batch."""
    vals = [S[b][t] for b, t in _valid(mask)] + list(extra)
    keep = [[False] * len(mask[0]) for _ in mask]
    if not vals:
        return keep
    m, s = statistics.fmean(vals), statistics.pstdev(vals)
    for b, t in _valid(mask):
        drop = s > 0 and (
            (A[b][t] < 0 and S[b][t] - m < -mu * s) or (symmetric and A[b][t] > 0 and S[b][t] - m > mu * s)
        )
        keep[b][t] = not drop
    return keep


def ref_cap(n, max_frac):
    return max(math.floor(Fraction(str(max_frac)) * n), 1)


def ref_clip_v(S, E, A, mask, mu, max_frac, symmetric=False):
    valid = _valid(mask)
    D = {bt: E[bt[0]][bt[1]] - S[bt[0]][bt[1]] for bt in valid}
    keep = [[False] * len(mask[0]) for _ in mask]
    for bt in valid:
        keep[bt[0]][bt[1]] = True
    if not valid:
        return keep
    s = statistics.pstdev(list(D.values()))
    cands = []
    for bt in valid:
        a = A[bt[0]][bt[1]]
        if a < 0 and D[bt] > mu * s and s > 0:
            cands.append((D[bt], bt))
        elif symmetric and a > 0 and -D[bt] > mu * s and s > 0:
            cands.append((-D[bt], bt))
    if max_frac is not None:  # the k largest scores, ties broken by row-major position
        cands = sorted(cands, key=lambda c: (-c[0], c[1]))[: ref_cap(len(valid), max_frac)]
    for _, bt in cands:
        keep[bt[0]][bt[1]] = False
    return keep
