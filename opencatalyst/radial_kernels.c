/* The radial part of DimeNet++'s spherical basis with the envelope, and its first two derivatives in x
 * (x = distance / cutoff), in one pass over the edges (see basis.py):
 *
 *   f_ln(x)  = u(x) N_ln j_l(z_ln x)
 *   f_ln'(x) = u' N j + u N z j'
 *   f_ln''(x) = u'' N j + 2 u' N z j' + u N z^2 j''
 *
 * u(x) = 1/x + a x^(p-1) + b x^p + c x^(p+1) for x < 1 and 0 beyond (DimeNet's envelope, p = exponent + 1),
 * j_l by the upward recurrence from j_-1 = cos(t)/t and j_0 = sin(t)/t at t = z x, j_l' = j_{l-1} - (l+1)/t j_l,
 * j_l'' = (l(l+1)/t^2 - 1) j_l - 2/t j_l' (Bessel's equation). All in double: the recurrence cancels digits at
 * small arguments. A NaN or infinite x gives NaN rows (neither is "beyond 1", as in the torch path, where
 * inf * 0 is NaN). Shapes: x [E]; z, nrm [L][R]; f, f1, f2 [E][L][R], row-major.
 */
#include <math.h>
#include <stdint.h>

int sbf_radial_f64(int64_t E, int64_t L, int64_t R, int64_t p, const double *x, const double *z,
                   const double *nrm, double *f, double *f1, double *f2) {
    const double a = -(double)((p + 1) * (p + 2)) / 2.0, b = (double)(p * (p + 2)), c = -(double)(p * (p + 1)) / 2.0;
    const int64_t LR = L * R;
    for (int64_t e = 0; e < E; e++) {
        const double xe = x[e];
        double *fe = f + e * LR, *f1e = f1 + e * LR, *f2e = f2 + e * LR;
        if (isinf(xe)) {
            for (int64_t i = 0; i < LR; i++) fe[i] = f1e[i] = f2e[i] = NAN;
            continue;
        }
        if (xe >= 1.0) {
            for (int64_t i = 0; i < LR; i++) fe[i] = f1e[i] = f2e[i] = 0.0;
            continue;
        }
        const double inv = 1.0 / xe, xq = pow(xe, (double)(p - 3)); /* x^(p-3) */
        const double u = inv + xq * xe * xe * (a + xe * (b + xe * c));
        const double du = -inv * inv + xq * xe * ((p - 1) * a + xe * (p * b + xe * (p + 1) * c));
        const double d2u = 2.0 * inv * inv * inv
                           + xq * ((p - 1) * (p - 2) * a + xe * (p * (p - 1) * b + xe * (p + 1) * p * c));
        for (int64_t l = 0; l < L; l++) {
            for (int64_t n = 0; n < R; n++) {
                const double zz = z[l * R + n], nn = nrm[l * R + n], t = zz * xe, it = 1.0 / t;
                double jm1 = cos(t) * it, j = sin(t) * it; /* j_{-1}, j_0 */
                for (int64_t k = 0; k < l; k++) {
                    const double next = (double)(2 * k + 1) * it * j - jm1;
                    jm1 = j;
                    j = next;
                }
                const double dj = jm1 - (double)(l + 1) * it * j;
                const double d2j = ((double)(l * (l + 1)) * it * it - 1.0) * j - 2.0 * it * dj;
                const double nj = nn * j, nzdj = nn * zz * dj;
                fe[l * R + n] = u * nj;
                f1e[l * R + n] = du * nj + u * nzdj;
                f2e[l * R + n] = d2u * nj + 2.0 * du * nzdj + u * nn * zz * zz * d2j;
            }
        }
    }
    return 0;
}
