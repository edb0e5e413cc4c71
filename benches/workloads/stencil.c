/* 3D Jacobi stencil (7-point, double precision) on an N^3 grid, the kernel
 * of many PDE solvers.  Two grids are swapped each sweep.  The hot face's
 * temperature cycles with a period of 4 sweeps, so the grid never settles:
 * after a transient, every 4 sweeps do the same work (benches/accuracy.py
 * compares such a steady state; a fixed boundary converged, after which
 * every store was silent).  Usage: stencil [N [SWEEPS]].  Prints a checksum. */
#include <stdio.h>
#include <stdlib.h>

#define IDX(i, j, k) (((size_t)(i) * n + (j)) * n + (k))

static void sweep(const double *restrict a, double *restrict b, int n) {
    const double c0 = 0.4, c1 = 0.1;
    for (int i = 1; i < n - 1; i++)
        for (int j = 1; j < n - 1; j++)
            for (int k = 1; k < n - 1; k++)
                b[IDX(i, j, k)] = c0 * a[IDX(i, j, k)] +
                    c1 * (a[IDX(i - 1, j, k)] + a[IDX(i + 1, j, k)] +
                          a[IDX(i, j - 1, k)] + a[IDX(i, j + 1, k)] +
                          a[IDX(i, j, k - 1)] + a[IDX(i, j, k + 1)]);
}

/* The hot face (i == 0) before sweep s. */
static void drive(double *a, int n, int s) {
    const double t = 100.0 + 50.0 * ((s & 3) - 1.5);
    for (int j = 0; j < n; j++)
        for (int k = 0; k < n; k++) a[IDX(0, j, k)] = t;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 128;
    int sweeps = argc > 2 ? atoi(argv[2]) : 250;
    size_t total = (size_t)n * n * n;
    double *a = malloc(total * sizeof *a), *b = malloc(total * sizeof *b);
    if (!a || !b) return 1;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            for (int k = 0; k < n; k++) {
                int edge = i == 0 || j == 0 || k == 0 || i == n - 1 || j == n - 1 || k == n - 1;
                /* hot face at i == 0, a warm spot in the middle */
                double v = edge ? (i == 0 ? 100.0 : 0.0)
                                : ((i - n / 2) * (i - n / 2) + (j - n / 2) * (j - n / 2) < 16 ? 50.0 : 0.0);
                a[IDX(i, j, k)] = b[IDX(i, j, k)] = v;
            }
    for (int s = 0; s < sweeps; s++) {
        drive(a, n, s);
        sweep(a, b, n);
        double *t = a; a = b; b = t;
    }
    double sum = 0, wsum = 0;
    for (size_t x = 0; x < total; x++) {
        sum += a[x];
        wsum += a[x] * (double)(x % 97);
    }
    printf("stencil n=%d sweeps=%d sum=%.9e wsum=%.9e center=%.9e\n", n, sweeps, sum, wsum,
           a[IDX(n / 2, n / 2, n / 2)]);
    free(a);
    free(b);
    return 0;
}
