/* mlp.c — layer math for zero_train (see mlp.h). */
#include "mlp.h"

#include <math.h>

void zt_linear_forward(const double *in, size_t m, int nin, int nout, const double *W, const double *b, double *z)
{
    for (size_t s = 0; s < m; s++) {
        double *zs = z + s * (size_t)nout;
        for (int o = 0; o < nout; o++) zs[o] = b[o];
        const double *xs = in + s * (size_t)nin;
        for (int i = 0; i < nin; i++) {
            double xi = xs[i];
            if (xi == 0.0) continue; /* exact: adding 0*w changes nothing (w is finite) */
            const double *wi = W + (size_t)i * nout;
            for (int o = 0; o < nout; o++) zs[o] += xi * wi[o];
        }
    }
}

void zt_relu(const double *z, double *h, size_t n)
{
    for (size_t i = 0; i < n; i++) h[i] = z[i] > 0.0 ? z[i] : 0.0;
}

void zt_softmax_xent(const double *z, const int *y, size_t m, int nclass, double *dz, double *loss_sum,
                     double *correct)
{
    for (size_t s = 0; s < m; s++) {
        const double *zs = z + s * (size_t)nclass;
        int arg = 0;
        for (int c = 1; c < nclass; c++)
            if (zs[c] > zs[arg]) arg = c;
        double mx = zs[arg], sum = 0.0;
        for (int c = 0; c < nclass; c++) sum += exp(zs[c] - mx);
        double lse = mx + log(sum);
        *loss_sum += lse - zs[y[s]];
        *correct += arg == y[s];
        if (dz) {
            double *ds = dz + s * (size_t)nclass;
            for (int c = 0; c < nclass; c++) ds[c] = exp(zs[c] - lse) - (c == y[s]);
        }
    }
}

void zt_linear_backward(const double *in, const double *dz, size_t m, int nin, int nout, const double *W,
                        double *dW, double *db, double *din)
{
    for (size_t s = 0; s < m; s++) {
        const double *xs = in + s * (size_t)nin, *ds = dz + s * (size_t)nout;
        for (int o = 0; o < nout; o++) db[o] += ds[o];
        for (int i = 0; i < nin; i++) {
            double xi = xs[i];
            double *dwi = dW + (size_t)i * nout;
            for (int o = 0; o < nout; o++) dwi[o] += xi * ds[o];
        }
        if (din) {
            double *dis = din + s * (size_t)nin;
            for (int i = 0; i < nin; i++) {
                const double *wi = W + (size_t)i * nout;
                double acc = 0.0;
                for (int o = 0; o < nout; o++) acc += wi[o] * ds[o];
                dis[i] = acc;
            }
        }
    }
}

void zt_relu_backward(double *din, const double *z, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (z[i] <= 0.0) din[i] = 0.0;
}
