/*
 * mlp.h — the layer math of zero_train's multilayer perceptron (64-256-256-10, ReLU, softmax cross-entropy), in
 * float64, on a micro-batch of m samples stored row-major. Sums over samples always run in sample order, so a
 * result depends only on the samples, not on how they were split across ranks (up to the final cross-rank sum).
 */
#ifndef ZT_MLP_H
#define ZT_MLP_H

#include <stddef.h>

/* z[m][nout] = in[m][nin] * W[nin][nout] + b[nout]. */
void zt_linear_forward(const double *in, size_t m, int nin, int nout, const double *W, const double *b, double *z);

/* h = max(z, 0), n elements (h may equal z). */
void zt_relu(const double *z, double *h, size_t n);

/*
 * Softmax cross-entropy over z[m][nclass] with labels y[m]: writes dz = softmax(z) - onehot(y) (the gradient of
 * the summed loss), adds the summed loss to *loss_sum and the number of correct arg-max predictions to *correct.
 * dz may be NULL (evaluation).
 */
void zt_softmax_xent(const double *z, const int *y, size_t m, int nclass, double *dz, double *loss_sum,
                     double *correct);

/*
 * Backward of zt_linear_forward for the summed loss: dW[nin][nout] += in^T dz, db[nout] += column sums of dz,
 * and, when din is not NULL, din[m][nin] = dz W^T (W is then required).
 */
void zt_linear_backward(const double *in, const double *dz, size_t m, int nin, int nout, const double *W,
                        double *dW, double *db, double *din);

/* din[i] = 0 where z[i] <= 0 (ReLU backward, in place), n elements. */
void zt_relu_backward(double *din, const double *z, size_t n);

#endif
