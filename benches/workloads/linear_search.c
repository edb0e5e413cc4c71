/* Repeated linear searches in a singly linked list: a symbol table kept as a
 * list, looked up by key over and over.  Each lookup reloads the same nodes,
 * keys and next pointers as the lookups before it, unchanged in between: the
 * redundant-load pattern LoadSpy reports.  Nodes are allocated in shuffled
 * order so the walk chases pointers.  A few updates between rounds keep the
 * list from being read-only.  Usage: linear_search [NODES [LOOKUPS]]. */
#include <stdio.h>
#include <stdlib.h>

struct node {
    struct node *next;
    long key;
    long value;
    char name[8];
};

static unsigned long long rng = 0x9E3779B97F4A7C15ULL;
static unsigned long long next_rand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

static struct node *find(struct node *head, long key) {
    for (struct node *p = head; p; p = p->next)
        if (p->key == key)
            return p;
    return NULL;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 4000;
    long lookups = argc > 2 ? atol(argv[2]) : 80000;
    struct node *pool = calloc(n, sizeof *pool);
    long *order = malloc(n * sizeof *order);
    if (!pool || !order) return 1;
    for (long i = 0; i < n; i++) order[i] = i;
    for (long i = n - 1; i > 0; i--) { /* Fisher-Yates */
        long j = next_rand() % (i + 1), t = order[i];
        order[i] = order[j]; order[j] = t;
    }
    struct node *head = NULL;
    for (long i = 0; i < n; i++) { /* push: key i lives in a random slot */
        struct node *p = &pool[order[i]];
        p->key = i * 7 + 3;
        p->value = i;
        p->name[0] = 'a' + i % 26;
        p->next = head;
        head = p;
    }
    unsigned long long sum = 0;
    long misses = 0;
    for (long q = 0; q < lookups; q++) {
        /* mostly hits, skewed toward the older (deeper) entries; some misses */
        long r = next_rand() % (n + n / 8);
        long key = r < n ? (r * r / n) * 7 + 3 : r * 7 + 4;
        struct node *p = find(head, key);
        if (p) {
            sum += p->value * 31 + p->name[0];
            if ((q & 1023) == 0) p->value++; /* an occasional update */
        } else {
            misses++;
        }
    }
    printf("linear_search n=%ld lookups=%ld misses=%ld sum=%llu\n", n, lookups, misses, sum);
    free(pool);
    free(order);
    return 0;
}
