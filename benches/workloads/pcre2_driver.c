/* Regular-expression workload: scans a generated web-server log with a
 * handful of patterns of the kinds log tools use (IPv4 addresses, request
 * lines, timestamps, key=value pairs, case-insensitive severity words, mail
 * addresses) through PCRE2's interpreter (its JIT is not built), finding
 * every match of every pattern, and prints match counts and a checksum.
 * Usage: pcre2_driver [SIZE [REPS]]: SIZE of the log in KiB; REPS repeats
 * the scan of the same log with the same compiled patterns
 * (benches/accuracy.py's steady state: two exact runs differing in REPS). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pcre2.h"

static unsigned long long rng = 0x9E3779B97F4A7C15ULL;
static unsigned long long next_rand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

static const char *paths[] = {"/", "/index.html", "/api/v1/users", "/api/v1/orders", "/static/app.js",
                              "/static/style.css", "/login", "/search", "/img/logo.png", "/api/v2/items"};
static const char *methods[] = {"GET", "GET", "GET", "POST", "PUT", "DELETE"};
static const char *levels[] = {"info", "info", "INFO", "debug", "Warning", "warn", "ERROR", "error", "failed"};
static const char *users[] = {"alice", "bob", "carol", "dave", "eve", "mallory", "trent", "peggy"};
static const char *domains[] = {"example.com", "mail.example.org", "corp.example.net"};

/* One line of an access log, like
 * 10.1.2.3 - - [2024-03-05T12:34:56] "GET /api/v1/users?id=42 HTTP/1.1" 200 5120 level=info user=bob@example.com ms=12 */
static size_t log_line(char *p, size_t room) {
    unsigned long long r = next_rand(), s = next_rand();
    int n = snprintf(p, room,
                     "%llu.%llu.%llu.%llu - - [2024-%02llu-%02lluT%02llu:%02llu:%02llu] \"%s %s%s%llu HTTP/1.%llu\" %llu %llu "
                     "level=%s user=%s@%s ms=%llu%s\n",
                     r % 223 + 1, (r >> 8) % 256, (r >> 16) % 256, (r >> 24) % 254 + 1, (r >> 32) % 12 + 1,
                     (r >> 36) % 28 + 1, (r >> 41) % 24, (r >> 46) % 60, (r >> 52) % 60, methods[s % 6],
                     paths[(s >> 3) % 10], (s >> 7) % 3 ? "?id=" : "#", (s >> 9) % 100000, (s >> 30) % 2,
                     (s >> 31) % 5 == 0 ? 404ULL : 200ULL, (s >> 34) % 100000, levels[(s >> 50) % 9],
                     users[(s >> 54) % 8], domains[(s >> 58) % 3], (s >> 40) % 2000,
                     (s >> 60) % 4 == 0 ? " note=\"slow upstream, retried\"" : "");
    return n > 0 && (size_t)n < room ? (size_t)n : 0;
}

static const char *patterns[] = {
    "\\b(\\d{1,3})\\.(\\d{1,3})\\.(\\d{1,3})\\.(\\d{1,3})\\b",
    "\"(GET|POST|PUT|DELETE) (/[^ ?#\"]*)([?#][^ \"]*)? HTTP/1\\.[01]\" (\\d{3})",
    "\\[(\\d{4})-(\\d{2})-(\\d{2})T(\\d{2}):(\\d{2}):(\\d{2})\\]",
    "(\\w+)=(\"[^\"]*\"|\\S+)",
    "(?i)\\b(error|warn(?:ing)?|fail(?:ed|ure)?)\\b",
    "[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[a-z]{2,}",
};
#define NPAT (sizeof patterns / sizeof *patterns)

int main(int argc, char **argv) {
    size_t len = (argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 1024) << 10;
    long reps = argc > 2 ? atol(argv[2]) : 1;
    char *text = malloc(len + 512);
    if (!text) return 1;
    size_t used = 0;
    while (used < len) {
        size_t n = log_line(text + used, len + 512 - used);
        if (!n) break;
        used += n;
    }
    pcre2_code *re[NPAT];
    for (size_t i = 0; i < NPAT; i++) {
        int err;
        PCRE2_SIZE off;
        re[i] = pcre2_compile((PCRE2_SPTR)patterns[i], PCRE2_ZERO_TERMINATED, 0, &err, &off, NULL);
        if (!re[i]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            fprintf(stderr, "pattern %zu at %zu: %s\n", i, (size_t)off, msg);
            return 1;
        }
    }
    pcre2_match_data *md = pcre2_match_data_create(16, NULL);
    unsigned long long count[NPAT] = {0}, sum = 0;
    for (long r = 0; r < reps; r++) {
        for (size_t i = 0; i < NPAT; i++) {
            PCRE2_SIZE at = 0;
            count[i] = 0;
            while (at < used) {
                int rc = pcre2_match(re[i], (PCRE2_SPTR)text, used, at, 0, md, NULL);
                if (rc == PCRE2_ERROR_NOMATCH) break;
                if (rc < 0) { fprintf(stderr, "match error %d\n", rc); return 1; }
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
                count[i]++;
                for (int g = 0; g < rc; g++) sum += ov[2 * g + 1] - ov[2 * g];
                at = ov[1] > ov[0] ? ov[1] : ov[0] + 1;
            }
        }
    }
    printf("pcre2 %d.%d bytes=%zu", PCRE2_MAJOR, PCRE2_MINOR, used);
    for (size_t i = 0; i < NPAT; i++) printf(" m%zu=%llu", i, count[i]);
    printf(" sum=%llu\n", sum);
    pcre2_match_data_free(md);
    for (size_t i = 0; i < NPAT; i++) pcre2_code_free(re[i]);
    free(text);
    return 0;
}
