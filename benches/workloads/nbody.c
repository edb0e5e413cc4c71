/* Direct-summation gravitational N-body simulation (O(N^2) per step,
 * leapfrog integration, softened forces), double precision.
 * Usage: nbody [N [STEPS]].  Prints the energy before and after. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

struct body { double x, y, z, vx, vy, vz, m; };

static unsigned long long rng = 88172645463325252ULL;
static double urand(void) { /* xorshift64, deterministic */
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static const double EPS2 = 1e-4, DT = 1e-3;

static void accel(const struct body *b, int n, double *ax, double *ay, double *az) {
    for (int i = 0; i < n; i++) ax[i] = ay[i] = az[i] = 0;
    for (int i = 0; i < n; i++) {
        double xi = b[i].x, yi = b[i].y, zi = b[i].z, fx = 0, fy = 0, fz = 0;
        for (int j = 0; j < n; j++) {
            double dx = b[j].x - xi, dy = b[j].y - yi, dz = b[j].z - zi;
            double r2 = dx * dx + dy * dy + dz * dz + EPS2;
            double inv = 1.0 / (r2 * sqrt(r2));
            double s = b[j].m * inv;
            fx += dx * s; fy += dy * s; fz += dz * s;
        }
        ax[i] = fx; ay[i] = fy; az[i] = fz;
    }
}

static double energy(const struct body *b, int n) {
    double e = 0;
    for (int i = 0; i < n; i++) {
        e += 0.5 * b[i].m * (b[i].vx * b[i].vx + b[i].vy * b[i].vy + b[i].vz * b[i].vz);
        for (int j = i + 1; j < n; j++) {
            double dx = b[i].x - b[j].x, dy = b[i].y - b[j].y, dz = b[i].z - b[j].z;
            e -= b[i].m * b[j].m / sqrt(dx * dx + dy * dy + dz * dz + EPS2);
        }
    }
    return e;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    int steps = argc > 2 ? atoi(argv[2]) : 250;
    struct body *b = malloc(n * sizeof *b);
    double *ax = malloc(n * sizeof *ax), *ay = malloc(n * sizeof *ay), *az = malloc(n * sizeof *az);
    if (!b || !ax || !ay || !az) return 1;
    for (int i = 0; i < n; i++) { /* a rotating disc of unequal masses */
        double r = 0.1 + urand(), th = 6.283185307179586 * urand();
        b[i].x = r * cos(th); b[i].y = r * sin(th); b[i].z = 0.05 * (urand() - 0.5);
        b[i].vx = -0.5 * sin(th); b[i].vy = 0.5 * cos(th); b[i].vz = 0;
        b[i].m = (0.5 + urand()) / n;
    }
    double e0 = energy(b, n);
    accel(b, n, ax, ay, az);
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < n; i++) { /* kick half, drift */
            b[i].vx += 0.5 * DT * ax[i]; b[i].vy += 0.5 * DT * ay[i]; b[i].vz += 0.5 * DT * az[i];
            b[i].x += DT * b[i].vx; b[i].y += DT * b[i].vy; b[i].z += DT * b[i].vz;
        }
        accel(b, n, ax, ay, az);
        for (int i = 0; i < n; i++) { /* kick half */
            b[i].vx += 0.5 * DT * ax[i]; b[i].vy += 0.5 * DT * ay[i]; b[i].vz += 0.5 * DT * az[i];
        }
    }
    double e1 = energy(b, n), cx = 0;
    for (int i = 0; i < n; i++) cx += b[i].m * b[i].x;
    printf("nbody n=%d steps=%d e0=%.9e e1=%.9e cx=%.9e\n", n, steps, e0, e1, cx);
    return 0;
}
