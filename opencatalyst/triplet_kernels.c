/* DimeNet++'s triplet message on the CPU: one pass over the triplets per function, nothing per triplet
 * written to memory except the per-triplet outputs themselves (see triplet.py for the maths).
 *
 *   y[ji] += a[kj] * (b[t] @ w)                        msg_fwd
 *   its gradient for gy                                msg_grad
 *   that gradient's gradient                           msg_gradgrad
 *
 * Shapes (row-major, contiguous): a, gy, gga, y, ga, dgy, da [E][C]; b, gb, ggb, db [T][K]; w, gw, ggw, dw
 * [K][C]; kj, ji [T] int64. Rows of b are ldb apart and rows of ggb ldgg apart (each may be a column slice of a
 * wider matrix). A NULL output is not computed, a NULL input counts as zero. Scattered outputs
 * (y, ga, dgy, da) and the weight gradients (gw, dw) are ACCUMULATED into (the caller zeroes them or gives
 * each thread its own); per-triplet outputs (gb, db) are written. The caller gives each call a span of
 * triplets (pointers and T for that span), so threads never share an output row they both write.
 *
 * The spherical basis's projection, per triplet a weighted sum of L rows of an edge table:
 *
 *   out[t] = sum_l c[t][l] * r[kj][l]          basis_fwd   (r [E][L][P], c [T][L], out [T][P])
 *   z[kj][l] += c[t][l] * g[t]                 basis_adj   (its adjoint: the gradient for r)
 *
 * Both are linear in their table, and each is the other's transpose, so every derivative of one is
 * the other (see triplet.py).
 *
 * Built twice, for float (suffix _f32) and double (_f64). Indices are trusted (the caller checks them).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAXC 1024 /* scratch rows live on the stack (5 x C values): at most 40 KB in double */

#define DEFINE_KERNELS(REAL, SFX)                                                                          \
                                                                                                             \
/* out[c] = sum_k v[k] * m[k][c] */                                                                        \
static inline void vecmat_##SFX(const REAL *restrict v, const REAL *restrict m, int64_t K, int64_t C,     \
                                REAL *restrict out) {                                                      \
    for (int64_t c = 0; c < C; c++) out[c] = 0;                                                            \
    for (int64_t k = 0; k < K; k++) {                                                                      \
        const REAL vk = v[k];                                                                              \
        const REAL *restrict row = m + k * C;                                                              \
        for (int64_t c = 0; c < C; c++) out[c] += vk * row[c];                                             \
    }                                                                                                      \
}                                                                                                          \
                                                                                                             \
/* out[k] (+)= sum_c m[k][c] * u[c] */                                                                     \
static inline REAL dot_##SFX(const REAL *restrict x, const REAL *restrict y, int64_t C) {                  \
    REAL s = 0;                                                                                            \
    for (int64_t c = 0; c < C; c++) s += x[c] * y[c];                                                      \
    return s;                                                                                              \
}                                                                                                          \
                                                                                                             \
static inline __attribute__((always_inline)) int fwd_body_##SFX(int64_t T, const int64_t K, const int64_t C, int64_t ldb, const REAL *a, const REAL *b, const REAL *w,            \
                  const int64_t *kj, const int64_t *ji, REAL *y) {                                         \
    REAL bw[C];                                                                                            \
    for (int64_t t = 0; t < T; t++) {                                                                      \
        vecmat_##SFX(b + t * ldb, w, K, C, bw);                                                              \
        const REAL *restrict x = a + kj[t] * C;                                                            \
        REAL *restrict out = y + ji[t] * C;                                                                \
        for (int64_t c = 0; c < C; c++) out[c] += x[c] * bw[c];                                            \
    }                                                                                                      \
    return 0;                                                                                              \
}                                                                                                          \
                                                                                                             \
/* ga[kj] += gy[ji] * (b @ w);  gb[t] = (gy[ji] * a[kj]) @ w^T;  gw += b[t]^T (gy[ji] * a[kj]) */          \
static inline __attribute__((always_inline)) int grad_body_##SFX(int64_t T, const int64_t K, const int64_t C, int64_t ldb, const REAL *gy, const REAL *a, const REAL *b,          \
                   const REAL *w, const int64_t *kj, const int64_t *ji, REAL *ga, REAL *gb, REAL *gw) {    \
    REAL bw[C], u[C];                                                                                      \
    for (int64_t t = 0; t < T; t++) {                                                                      \
        const REAL *restrict g = gy + ji[t] * C;                                                           \
        const REAL *restrict bt = b + t * ldb;                                                               \
        if (ga) {                                                                                          \
            vecmat_##SFX(bt, w, K, C, bw);                                                                 \
            REAL *restrict out = ga + kj[t] * C;                                                           \
            for (int64_t c = 0; c < C; c++) out[c] += g[c] * bw[c];                                        \
        }                                                                                                  \
        if (!gb && !gw) continue;                                                                          \
        const REAL *restrict x = a + kj[t] * C;                                                            \
        for (int64_t c = 0; c < C; c++) u[c] = g[c] * x[c];                                                \
        if (gb)                                                                                            \
            for (int64_t k = 0; k < K; k++) gb[t * K + k] = dot_##SFX(w + k * C, u, C);                    \
        if (gw)                                                                                            \
            for (int64_t k = 0; k < K; k++) {                                                              \
                const REAL bk = bt[k];                                                                     \
                REAL *restrict row = gw + k * C;                                                           \
                for (int64_t c = 0; c < C; c++) row[c] += bk * u[c];                                       \
            }                                                                                              \
    }                                                                                                      \
    return 0;                                                                                              \
}                                                                                                          \
                                                                                                             \
/* Second order. With x = a[kj], g = gy[ji], v = gga[kj], r = ggb[t] @ w + b[t] @ ggw:                    \
 *   dgy[ji] += (b[t] @ w) * v + r * x;   da[kj] += r * g;                                                 \
 *   db[t] = (g * v) @ w^T + (g * x) @ ggw^T;   dw += b[t]^T (g * v) + ggb[t]^T (g * x). */                \
static inline __attribute__((always_inline)) int gradgrad_body_##SFX(int64_t T, const int64_t K, const int64_t C, int64_t ldb, int64_t ldgg, const REAL *gy, const REAL *a, const REAL *b,      \
                       const REAL *w, const int64_t *kj, const int64_t *ji, const REAL *gga,               \
                       const REAL *ggb, const REAL *ggw, REAL *dgy, REAL *da, REAL *db, REAL *dw) {        \
    REAL bw[C], r[C], r2[C], p[C], u[C];                                                                   \
    const int has_r = ggb != NULL || ggw != NULL;                                                          \
    for (int64_t t = 0; t < T; t++) {                                                                      \
        const REAL *restrict x = a + kj[t] * C;                                                            \
        const REAL *restrict g = gy + ji[t] * C;                                                           \
        const REAL *restrict bt = b + t * ldb;                                                               \
        const REAL *restrict v = gga ? gga + kj[t] * C : NULL;                                             \
        if (ggb) {                                                                                         \
            vecmat_##SFX(ggb + t * ldgg, w, K, C, r);                                                      \
            if (ggw) {                                                                                     \
                vecmat_##SFX(bt, ggw, K, C, r2);                                                           \
                for (int64_t c = 0; c < C; c++) r[c] += r2[c];                                             \
            }                                                                                              \
        } else if (ggw) {                                                                                  \
            vecmat_##SFX(bt, ggw, K, C, r);                                                                \
        }                                                                                                  \
        if (dgy && (v || has_r)) {                                                                         \
            REAL *restrict out = dgy + ji[t] * C;                                                          \
            if (v) {                                                                                       \
                vecmat_##SFX(bt, w, K, C, bw);                                                             \
                for (int64_t c = 0; c < C; c++) out[c] += bw[c] * v[c];                                    \
            }                                                                                              \
            if (has_r)                                                                                     \
                for (int64_t c = 0; c < C; c++) out[c] += r[c] * x[c];                                     \
        }                                                                                                  \
        if (da && has_r) {                                                                                 \
            REAL *restrict out = da + kj[t] * C;                                                           \
            for (int64_t c = 0; c < C; c++) out[c] += r[c] * g[c];                                         \
        }                                                                                                  \
        if (!db && !dw) continue;                                                                          \
        if (v)                                                                                             \
            for (int64_t c = 0; c < C; c++) p[c] = g[c] * v[c];                                            \
        if (has_r)                                                                                         \
            for (int64_t c = 0; c < C; c++) u[c] = g[c] * x[c];                                            \
        if (db)                                                                                            \
            for (int64_t k = 0; k < K; k++) {                                                              \
                REAL s = 0;                                                                                \
                if (v) s += dot_##SFX(w + k * C, p, C);                                                    \
                if (ggw) s += dot_##SFX(ggw + k * C, u, C);                                                \
                db[t * K + k] = s;                                                                         \
            }                                                                                              \
        if (dw)                                                                                            \
            for (int64_t k = 0; k < K; k++) {                                                              \
                REAL *restrict row = dw + k * C;                                                           \
                if (v) {                                                                                   \
                    const REAL bk = bt[k];                                                                 \
                    for (int64_t c = 0; c < C; c++) row[c] += bk * p[c];                                   \
                }                                                                                          \
                if (ggb) {                                                                                 \
                    const REAL gk = ggb[t * ldgg + k];                                                     \
                    for (int64_t c = 0; c < C; c++) row[c] += gk * u[c];                                   \
                }                                                                                          \
            }                                                                                              \
    }                                                                                                      \
    return 0;                                                                                              \
}

/* The exported functions: in float (training) the bodies are compiled once per common (K, C) of DimeNet++
 * (basis_emb 8; int_emb 32 in the mini preset, 64 in the full one, 128), where the compiler unrolls the
 * channel loops into whole vectors and keeps the rows of b @ w in registers, and once for any other
 * shape; double (the tests' gradient checks) is compiled once, for any shape (a third of the build time). */
#define SPECIALISE_f32(CALL)                                                                               \
    if (K == 8) {                                                                                          \
        switch (C) {                                                                                       \
        case 32: return CALL(f32, 8, 32);                                                                  \
        case 64: return CALL(f32, 8, 64);                                                                  \
        case 128: return CALL(f32, 8, 128);                                                                \
        default: break;                                                                                    \
        }                                                                                                  \
    }                                                                                                      \
    return CALL(f32, K, C);
#define SPECIALISE_f64(CALL) return CALL(f64, K, C);

#define DEFINE_EXPORTS(REAL, SFX)                                                                          \
int msg_fwd_##SFX(int64_t T, int64_t K, int64_t C, int64_t ldb, const REAL *a, const REAL *b, const REAL *w, \
                  const int64_t *kj, const int64_t *ji, REAL *y) {                                         \
    if (C < 1 || C > MAXC) return -1;                                                                               \
    SPECIALISE_##SFX(FWD_CALL)                                                                                \
}                                                                                                          \
int msg_grad_##SFX(int64_t T, int64_t K, int64_t C, int64_t ldb, const REAL *gy, const REAL *a,           \
                   const REAL *b, const REAL *w, const int64_t *kj, const int64_t *ji, REAL *ga, REAL *gb, \
                   REAL *gw) {                                                                             \
    if (C < 1 || C > MAXC) return -1;                                                                               \
    SPECIALISE_##SFX(GRAD_CALL)                                                                                \
}                                                                                                          \
int msg_gradgrad_##SFX(int64_t T, int64_t K, int64_t C, int64_t ldb, int64_t ldgg, const REAL *gy,         \
                       const REAL *a,                                                                      \
                       const REAL *b, const REAL *w, const int64_t *kj, const int64_t *ji, const REAL *gga, \
                       const REAL *ggb, const REAL *ggw, REAL *dgy, REAL *da, REAL *db, REAL *dw) {        \
    if (C < 1 || C > MAXC) return -1;                                                                               \
    SPECIALISE_##SFX(GRADGRAD_CALL)                                                                             \
}

DEFINE_KERNELS(float, f32)
DEFINE_KERNELS(double, f64)

/* the basis loops compiled for the presets' 8 x blocks (P = 16, 24) and 32 with L = 7, and once for any shape */
#define BASIS_SPECIALISE(BODY, IN, OUT)                                                                    \
    if (L == 7 && P == 16) BODY(T, 7, 16, IN, cb, kj, OUT);                                                \
    else if (L == 7 && P == 24) BODY(T, 7, 24, IN, cb, kj, OUT);                                           \
    else if (L == 7 && P == 32) BODY(T, 7, 32, IN, cb, kj, OUT);                                           \
    else BODY(T, L, P, IN, cb, kj, OUT);                                                                   \
    return 0;

#define DEFINE_BASIS(REAL, SFX)                                                                            \
static inline __attribute__((always_inline)) void basis_fwd_body_##SFX(                                    \
        int64_t T, const int64_t L, const int64_t P, const REAL *r, const REAL *cb, const int64_t *kj,     \
        REAL *out) {                                                                                       \
    for (int64_t t = 0; t < T; t++) {                                                                      \
        const REAL *restrict row = r + kj[t] * L * P;                                                      \
        const REAL *restrict ct = cb + t * L;                                                              \
        REAL *restrict o = out + t * P;                                                                    \
        for (int64_t p = 0; p < P; p++) o[p] = 0;                                                          \
        for (int64_t l = 0; l < L; l++) {                                                                  \
            const REAL cl = ct[l];                                                                         \
            for (int64_t p = 0; p < P; p++) o[p] += cl * row[l * P + p];                                   \
        }                                                                                                  \
    }                                                                                                      \
}                                                                                                          \
static inline __attribute__((always_inline)) void basis_adj_body_##SFX(                                    \
        int64_t T, const int64_t L, const int64_t P, const REAL *g, const REAL *cb, const int64_t *kj,     \
        REAL *z) {                                                                                         \
    for (int64_t t = 0; t < T; t++) {                                                                      \
        REAL *restrict row = z + kj[t] * L * P;                                                            \
        const REAL *restrict ct = cb + t * L;                                                              \
        const REAL *restrict gt = g + t * P;                                                               \
        for (int64_t l = 0; l < L; l++) {                                                                  \
            const REAL cl = ct[l];                                                                         \
            for (int64_t p = 0; p < P; p++) row[l * P + p] += cl * gt[p];                                  \
        }                                                                                                  \
    }                                                                                                      \
}                                                                                                          \
int basis_fwd_##SFX(int64_t T, int64_t L, int64_t P, const REAL *r, const REAL *cb, const int64_t *kj,     \
                    REAL *out) {                                                                           \
    BASIS_SPECIALISE(basis_fwd_body_##SFX, r, out)                                                         \
}                                                                                                          \
int basis_adj_##SFX(int64_t T, int64_t L, int64_t P, const REAL *g, const REAL *cb, const int64_t *kj,     \
                    REAL *z) {                                                                             \
    BASIS_SPECIALISE(basis_adj_body_##SFX, g, z)                                                           \
}

DEFINE_BASIS(float, f32)
DEFINE_BASIS(double, f64)

/* one call per body, for the dtype suffix SFX and the (K, C) SPECIALISE_<sfx> picks */
#define FWD_CALL(SFX, KK, CC) fwd_body_##SFX(T, KK, CC, ldb, a, b, w, kj, ji, y)
#define GRAD_CALL(SFX, KK, CC) grad_body_##SFX(T, KK, CC, ldb, gy, a, b, w, kj, ji, ga, gb, gw)
#define GRADGRAD_CALL(SFX, KK, CC) \
    gradgrad_body_##SFX(T, KK, CC, ldb, ldgg, gy, a, b, w, kj, ji, gga, ggb, ggw, dgy, da, db, dw)
DEFINE_EXPORTS(float, f32)
DEFINE_EXPORTS(double, f64)
