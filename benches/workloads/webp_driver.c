/* Image-codec workload: encodes a generated RGB picture as lossy WebP
 * (libwebp's VP8 encoder at quality 75, its default method 4) and decodes
 * it back, then prints the compressed size and the round trip's error.
 * The picture has what photographs and screenshots have: smooth gradients,
 * flat regions with sharp edges, fine texture and noise.
 * Usage: webp_driver [SIDE [REPS]]: a SIDE x SIDE picture; REPS repeats
 * the encode and decode of the same picture (benches/accuracy.py's steady
 * state: two exact runs differing in REPS). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "webp/decode.h"
#include "webp/encode.h"

static unsigned long long rng = 0x9E3779B97F4A7C15ULL;
static unsigned long long next_rand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

static uint8_t clamp(int v) { return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v; }

static void picture(uint8_t *rgb, int side) {
    for (int y = 0; y < side; y++) {
        for (int x = 0; x < side; x++) {
            uint8_t *p = rgb + 3 * ((size_t)y * side + x);
            int r = 40 + 180 * x / side, g = 60 + 150 * y / side, b = 200 - 120 * (x + y) / (2 * side);
            /* a disc and a bar: flat colour with sharp edges */
            int dx = x - side / 3, dy = y - side / 2;
            if (dx * dx + dy * dy < side * side / 16) { r = 230; g = 200; b = 40; }
            if (x > 2 * side / 3 && x < 2 * side / 3 + side / 10) { r = 20; g = 20; b = 30; }
            /* texture in the lower quarter, noise everywhere */
            if (y > 3 * side / 4) { int t = ((x / 2) ^ (y / 2)) & 1 ? 24 : -24; r += t; g += t; b += t; }
            int n = (int)(next_rand() % 17) - 8;
            p[0] = clamp(r + n);
            p[1] = clamp(g + n / 2);
            p[2] = clamp(b - n);
        }
    }
}

int main(int argc, char **argv) {
    int side = argc > 1 ? atoi(argv[1]) : 256;
    long reps = argc > 2 ? atol(argv[2]) : 1;
    if (side < 16 || side > 4096 || reps < 0) {
        fprintf(stderr, "usage: webp_driver [SIDE [REPS]]\n");
        return 2;
    }
    uint8_t *rgb = malloc((size_t)3 * side * side);
    if (!rgb) return 1;
    picture(rgb, side);
    unsigned long long bytes = 0, err = 0, sum = 0;
    for (long r = 0; r < reps; r++) {
        uint8_t *webp = NULL;
        size_t n = WebPEncodeRGB(rgb, side, side, 3 * side, 75.0f, &webp);
        if (!n) {
            fprintf(stderr, "encoding failed\n");
            return 1;
        }
        int w = 0, h = 0;
        uint8_t *back = WebPDecodeRGB(webp, n, &w, &h);
        if (!back || w != side || h != side) {
            fprintf(stderr, "decoding failed\n");
            return 1;
        }
        for (size_t i = 0; i < (size_t)3 * side * side; i++) {
            int d = (int)back[i] - (int)rgb[i];
            err += (unsigned long long)(d * d);
            sum = sum * 31 + back[i];
        }
        bytes += n;
        WebPFree(back);
        WebPFree(webp);
    }
    printf("webp %dx%d x %ld: %llu bytes, squared error %llu, checksum %016llx\n", side, side, reps, bytes, err, sum);
    free(rgb);
    return 0;
}
