/* DimeNet++'s output blocks sum each edge state, weighted by its radial projection, onto the edge's target
 * atom: P[dst[e]] += x[e] * r[e]. Its first and second derivatives, each one pass over the edges (see
 * edge_sum.py for the maths); the per-atom rows P, gP stay in cache while the edge rows stream:
 *
 *   edge_sum_fwd       P[dst] += x * r
 *   edge_sum_grad      gx = gP[dst] * r;  gr = gP[dst] * x
 *   edge_sum_gradgrad  dgP[dst] += hx * r + hr * x;  dx = hr * gP[dst];  dr = hx * gP[dst]
 *
 * Shapes (row-major): x, r, hx, hr [E][C] with rows ldx, ldr, ldhx, ldhr apart (column slices of wider
 * matrices: the radial projections are slices of one fused projection, and so are their gradients);
 * gx, gr, dx, dr [E][C] and P, gP, dgP [N][C] contiguous; dst [E] int64, trusted (the caller checks it). A NULL output is not computed, a NULL hx or hr counts as zero. P and dgP are
 * ACCUMULATED into (the caller zeroes them, one per thread); per-edge outputs are written. Built for float
 * (suffix _f32) and double (_f64).
 */
#include <stddef.h>
#include <stdint.h>

#define DEFINE_EDGE_SUM(REAL, SFX)                                                                         \
int edge_sum_fwd_##SFX(int64_t E, int64_t C, int64_t ldx, int64_t ldr, const REAL *restrict x,           \
                       const REAL *restrict r, const int64_t *restrict dst, REAL *restrict P) {            \
    for (int64_t e = 0; e < E; e++) {                                                                      \
        const REAL *xe = x + e * ldx, *re = r + e * ldr;                                                   \
        REAL *p = P + dst[e] * C;                                                                          \
        for (int64_t c = 0; c < C; c++) p[c] += xe[c] * re[c];                                             \
    }                                                                                                      \
    return 0;                                                                                              \
}                                                                                                          \
int edge_sum_grad_##SFX(int64_t E, int64_t C, int64_t ldx, int64_t ldr, const REAL *restrict gP,          \
                        const REAL *restrict x,                                                            \
                        const REAL *restrict r, const int64_t *restrict dst, REAL *restrict gx,            \
                        REAL *restrict gr) {                                                               \
    for (int64_t e = 0; e < E; e++) {                                                                      \
        const REAL *g = gP + dst[e] * C;                                                                   \
        if (gx) {                                                                                          \
            const REAL *re = r + e * ldr;                                                                  \
            REAL *o = gx + e * C;                                                                          \
            for (int64_t c = 0; c < C; c++) o[c] = g[c] * re[c];                                           \
        }                                                                                                  \
        if (gr) {                                                                                          \
            const REAL *xe = x + e * ldx;                                                                  \
            REAL *o = gr + e * C;                                                                          \
            for (int64_t c = 0; c < C; c++) o[c] = g[c] * xe[c];                                           \
        }                                                                                                  \
    }                                                                                                      \
    return 0;                                                                                              \
}                                                                                                          \
int edge_sum_gradgrad_##SFX(int64_t E, int64_t C, int64_t ldx, int64_t ldr, int64_t ldhx, int64_t ldhr,  \
                            const REAL *restrict gP, const REAL *restrict x,                               \
                            const REAL *restrict r, const int64_t *restrict dst, const REAL *restrict hx,  \
                            const REAL *restrict hr, REAL *restrict dgP, REAL *restrict dx,                \
                            REAL *restrict dr) {                                                           \
    for (int64_t e = 0; e < E; e++) {                                                                      \
        const int64_t off = e * C;                                                                         \
        const REAL *xe = x + e * ldx, *re = r + e * ldr;                                                   \
        const REAL *hxe = hx ? hx + e * ldhx : NULL, *hre = hr ? hr + e * ldhr : NULL;                     \
        if (dgP) {                                                                                         \
            REAL *o = dgP + dst[e] * C;                                                                    \
            if (hxe && hre)                                                                                \
                for (int64_t c = 0; c < C; c++) o[c] += hxe[c] * re[c] + hre[c] * xe[c];                   \
            else if (hxe)                                                                                  \
                for (int64_t c = 0; c < C; c++) o[c] += hxe[c] * re[c];                                    \
            else if (hre)                                                                                  \
                for (int64_t c = 0; c < C; c++) o[c] += hre[c] * xe[c];                                    \
        }                                                                                                  \
        const REAL *g = gP + dst[e] * C;                                                                   \
        if (dx && hre)                                                                                     \
            for (int64_t c = 0; c < C; c++) dx[off + c] = hre[c] * g[c];                                   \
        if (dr && hxe)                                                                                     \
            for (int64_t c = 0; c < C; c++) dr[off + c] = hxe[c] * g[c];                                   \
    }                                                                                                      \
    return 0;                                                                                              \
}

DEFINE_EDGE_SUM(float, f32)
DEFINE_EDGE_SUM(double, f64)
