/* Parser workload: parses generated C source with tree-sitter (its
 * runtime, a GLR parser with error recovery, and its C grammar, both from
 * their release sources), as an editor does: a full parse, a walk of the
 * whole syntax tree with a cursor, then an edit in the middle of the text
 * and an incremental re-parse that reuses the old tree, and a second walk.
 * Prints node counts and a checksum.
 * Usage: treesitter_driver [FUNCTIONS [REPS]]: the source has FUNCTIONS
 * functions (about 600 bytes each); REPS repeats the parse, edit, re-parse
 * and walks of the same text (benches/accuracy.py's steady state: two
 * exact runs differing in REPS). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tree_sitter/api.h"

const TSLanguage *tree_sitter_c(void);

static unsigned long long rng = 0x9E3779B97F4A7C15ULL;
static unsigned long long next_rand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

static const char *types[] = {"int", "long", "double", "unsigned", "size_t", "char *"};
static const char *ops[] = {"+", "-", "*", "^", "<<", "&", "|", "%"};

static size_t function(char *p, size_t room, int i) {
    unsigned long long r = next_rand();
    int n = snprintf(p, room,
                     "/* helper %d */\n"
                     "static %s fn_%d(const struct item *items, size_t n, %s bias) {\n"
                     "    %s acc = (%s)%llu;\n"
                     "    for (size_t k = 0; k < n; k++) {\n"
                     "        if (items[k].flags & 0x%llxu) {\n"
                     "            acc = acc %s (%s)items[k].value + bias;\n"
                     "        } else if (items[k].next != NULL) {\n"
                     "            acc = acc %s fn_%d(items[k].next, n / 2, bias);\n"
                     "        }\n"
                     "    }\n"
                     "    switch ((int)(acc) %% %llu) {\n"
                     "    case 0: return acc;\n"
                     "    case 1: acc += sizeof(struct item) * %llu; break;\n"
                     "    default: acc = table_%llu[(size_t)acc %% 16] ? acc : -acc;\n"
                     "    }\n"
                     "    return acc %s %llu;\n"
                     "}\n\n",
                     i, types[r % 6], i, types[(r >> 3) % 6], types[r % 6], types[r % 6], (r >> 6) % 1000,
                     (r >> 16) % 256, ops[(r >> 24) % 8], types[r % 6], ops[(r >> 27) % 8], i > 0 ? i - 1 : 0,
                     (r >> 30) % 7 + 2, (r >> 33) % 64, (r >> 40) % 8, ops[(r >> 44) % 8], (r >> 47) % 100);
    return n > 0 && (size_t)n < room ? (size_t)n : 0;
}

struct tally {
    unsigned long nodes, named, errors;
    unsigned max_depth;
    unsigned long long sum;
};

static void walk(TSTree *tree, struct tally *t) {
    TSTreeCursor c = ts_tree_cursor_new(ts_tree_root_node(tree));
    unsigned depth = 0;
    for (;;) {
        TSNode n = ts_tree_cursor_current_node(&c);
        t->nodes++;
        t->named += ts_node_is_named(n);
        t->errors += ts_node_is_error(n) || ts_node_is_missing(n);
        t->sum = t->sum * 1000003 + ts_node_symbol(n) + ts_node_start_byte(n);
        if (depth > t->max_depth) t->max_depth = depth;
        if (ts_tree_cursor_goto_first_child(&c)) {
            depth++;
            continue;
        }
        while (!ts_tree_cursor_goto_next_sibling(&c)) {
            if (!ts_tree_cursor_goto_parent(&c)) {
                ts_tree_cursor_delete(&c);
                return;
            }
            depth--;
        }
    }
}

static TSPoint point_at(const char *text, size_t off) {
    TSPoint pt = {0, 0};
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') {
            pt.row++;
            pt.column = 0;
        } else {
            pt.column++;
        }
    }
    return pt;
}

int main(int argc, char **argv) {
    int funcs = argc > 1 ? atoi(argv[1]) : 100;
    long reps = argc > 2 ? atol(argv[2]) : 1;
    if (funcs < 1 || reps < 0) {
        fprintf(stderr, "usage: treesitter_driver [FUNCTIONS [REPS]]\n");
        return 2;
    }
    size_t room = (size_t)funcs * 1024 + 1024;
    char *text = malloc(room), *edited = malloc(room);
    if (!text || !edited) return 1;
    size_t used = (size_t)snprintf(text, room,
                                   "#include <stddef.h>\nstruct item { long value; unsigned flags; "
                                   "const struct item *next; };\nstatic const int table_0[16];\n\n");
    for (int i = 0; i < funcs; i++) used += function(text + used, room - used, i);
    /* The edit: an operator in the middle function becomes another, as a
     * keystroke would change it; the text keeps its length. */
    memcpy(edited, text, used + 1);
    char *mid = strstr(edited + used / 2, "acc = acc ");
    if (!mid) return 1;
    size_t at = (size_t)(mid - edited) + 10;
    edited[at] = edited[at] == '-' ? '+' : '-';
    TSParser *parser = ts_parser_new();
    if (!ts_parser_set_language(parser, tree_sitter_c())) {
        fprintf(stderr, "grammar and runtime ABI versions differ\n");
        return 1;
    }
    struct tally t = {0};
    for (long r = 0; r < reps; r++) {
        TSTree *tree = ts_parser_parse_string(parser, NULL, text, (uint32_t)used);
        if (!tree) return 1;
        walk(tree, &t);
        TSInputEdit e = {(uint32_t)at, (uint32_t)at + 1, (uint32_t)at + 1, point_at(text, at), point_at(text, at + 1),
                         point_at(text, at + 1)};
        ts_tree_edit(tree, &e);
        TSTree *again = ts_parser_parse_string(parser, tree, edited, (uint32_t)used);
        if (!again) return 1;
        walk(again, &t);
        ts_tree_delete(again);
        ts_tree_delete(tree);
    }
    ts_parser_delete(parser);
    printf("tree-sitter %zu bytes x %ld: %lu nodes, %lu named, %lu errors, depth %u, checksum %016llx\n", used, reps,
           t.nodes, t.named, t.errors, t.max_depth, t.sum);
    free(text);
    free(edited);
    return 0;
}
