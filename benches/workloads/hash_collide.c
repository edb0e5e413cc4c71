/* A chained hash table with a bad hash function: string keys hashed by the
 * sum of their characters, so the many buckets go unused and a few chains
 * grow hundreds of entries long.  Inserting (with a duplicate check) and
 * looking up walk those chains again and again, comparing the same keys:
 * the collision-heavy hash table of the Witch paper's case studies.
 * Usage: hash_collide [KEYS [LOOKUPS]].  Prints a checksum. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBUCKETS 65536

struct entry {
    struct entry *next;
    char key[24];
    long value;
};

static struct entry *table[NBUCKETS];

static unsigned bad_hash(const char *s) { /* sum of bytes: anagrams collide, range is tiny */
    unsigned h = 0;
    while (*s) h += (unsigned char)*s++;
    return h % NBUCKETS;
}

static struct entry *lookup(const char *key) {
    for (struct entry *e = table[bad_hash(key)]; e; e = e->next)
        if (strcmp(e->key, key) == 0)
            return e;
    return NULL;
}

static int insert(const char *key, long value) {
    struct entry *e = lookup(key);
    if (e) { e->value += value; return 0; }
    e = malloc(sizeof *e);
    if (!e) exit(1);
    strcpy(e->key, key);
    e->value = value;
    unsigned h = bad_hash(key);
    e->next = table[h];
    table[h] = e;
    return 1;
}

static unsigned long long rng = 0x2545F4914F6CDD1DULL;
static unsigned long long next_rand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

static void make_key(char *buf, long i) { /* "user" + decimal id, like real identifiers */
    sprintf(buf, "user%ld", i);
}

int main(int argc, char **argv) {
    long keys = argc > 1 ? atol(argv[1]) : 45000;
    long lookups = argc > 2 ? atol(argv[2]) : 45000;
    char buf[32];
    long distinct = 0;
    for (long i = 0; i < keys; i++) {
        make_key(buf, (long)(next_rand() % (keys * 3 / 2))); /* some repeats */
        distinct += insert(buf, i);
    }
    unsigned long long sum = 0;
    long found = 0;
    for (long q = 0; q < lookups; q++) {
        make_key(buf, (long)(next_rand() % (keys * 2)));
        struct entry *e = lookup(buf);
        if (e) { found++; sum = sum * 1000003 + (unsigned long long)e->value; }
    }
    long used = 0, longest = 0;
    for (long b = 0; b < NBUCKETS; b++) {
        long len = 0;
        for (struct entry *e = table[b]; e; e = e->next) len++;
        if (len) used++;
        if (len > longest) longest = len;
    }
    printf("hash_collide keys=%ld distinct=%ld buckets_used=%ld longest=%ld found=%ld sum=%llu\n",
           keys, distinct, used, longest, found, sum);
    return 0;
}
