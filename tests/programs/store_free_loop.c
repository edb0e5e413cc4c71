/* A long store-free loop: ~0.3 s of a floating-point dependency chain in
 * registers, then one store. A store sampler that counts stores (a PMU, or
 * --exact) sees a handful of stores, all of them in start-up and the final
 * store; witch's software sampler, which takes the store nearest to where
 * each timer interrupt lands, finds none near the loop and must say so
 * instead of blaming the run's length. Exits 3. */
#include <stdio.h>

volatile double sink;

int main(void) {
    double x = 1.0;
    for (long i = 0; i < 120000000L; i++)
        x = x * 0.9999999 + 1e-9; /* @loop */
    sink = x;                     /* @store */
    printf("%.6f\n", x);
    return 3;
}
