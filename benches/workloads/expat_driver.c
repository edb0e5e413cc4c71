/* XML-parser workload: parses a generated XML document (an order feed:
 * namespaced elements, attributes, character data with entity and
 * character references, CDATA sections, comments and processing
 * instructions) with Expat's streaming parser, in 8 KiB chunks as a reader
 * of a file or socket would feed it, with handlers that keep an element
 * stack, sum attribute values and hash the text; prints the counts and a
 * checksum.
 * Usage: expat_driver [SIZE [REPS]]: SIZE of the document in KiB; REPS
 * repeats the parse of the same document with a new parser each time
 * (benches/accuracy.py's steady state: two exact runs differing in REPS). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "expat.h"

static unsigned long long rng = 0x9E3779B97F4A7C15ULL;
static unsigned long long next_rand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

static const char *items[] = {"widget", "gadget", "sprocket", "flange", "gizmo", "doohickey", "valve", "bracket"};
static const char *cities[] = {"Lyon", "Zürich", "Kraków", "Porto", "Malmö", "Brno", "Gent", "Bergen"};
static const char *notes[] = {"fragile &amp; heavy", "leave at door", "call &quot;first&quot;", "gift &#x2014; wrap",
                              "none", "2 &lt; 3 boxes"};

/* One <order> record, like
 * <o:order id="17" status="shipped"><o:customer city="Lyon">...</o:customer>... */
static size_t record(char *p, size_t room, unsigned long id) {
    unsigned long long r = next_rand(), s = next_rand();
    int n = snprintf(p, room,
                     "  <o:order id=\"%lu\" status=\"%s\" priority=\"%llu\">\n"
                     "    <o:customer city=\"%s\" tier=\"%llu\">customer-%llu</o:customer>\n"
                     "    <o:lines>\n"
                     "      <o:line sku=\"%s-%llu\" qty=\"%llu\" price=\"%llu.%02llu\"/>\n"
                     "      <o:line sku=\"%s-%llu\" qty=\"%llu\" price=\"%llu.%02llu\"/>\n"
                     "%s"
                     "    </o:lines>\n"
                     "    <o:note>%s</o:note>\n"
                     "%s"
                     "  </o:order>\n",
                     id, (r & 3) == 0 ? "pending" : (r & 3) == 1 ? "shipped" : "delivered", (r >> 2) % 5,
                     cities[(r >> 5) % 8], (r >> 8) % 4, (r >> 10) % 100000, items[(r >> 27) % 8], (r >> 30) % 1000,
                     (r >> 40) % 20 + 1, (r >> 45) % 500, (r >> 54) % 100, items[s % 8], (s >> 3) % 1000,
                     (s >> 13) % 20 + 1, (s >> 18) % 500, (s >> 27) % 100,
                     (s >> 34) % 3 == 0 ? "      <o:line sku=\"gift-card\" qty=\"1\" price=\"25.00\"/>\n" : "",
                     notes[(s >> 36) % 6],
                     (s >> 40) % 4 == 0 ? "    <o:raw><![CDATA[<carrier code=\"X&Y\"/>]]></o:raw>\n"
                                          "    <!-- re-routed -->\n    <?audit checked?>\n"
                                        : "");
    return n > 0 && (size_t)n < room ? (size_t)n : 0;
}

struct state {
    int depth, max_depth;
    unsigned long elements, attributes, text_bytes, pis, comments;
    unsigned long long sum, hash;
    const char *stack[64];
};

static unsigned long long mix(unsigned long long h, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001B3ULL;
    return h;
}

static void XMLCALL start(void *data, const XML_Char *name, const XML_Char **atts) {
    struct state *st = data;
    st->elements++;
    if (st->depth < 64) st->stack[st->depth] = name;
    if (++st->depth > st->max_depth) st->max_depth = st->depth;
    st->hash = mix(st->hash, name, strlen(name));
    for (int i = 0; atts[i]; i += 2) {
        st->attributes++;
        st->hash = mix(st->hash, atts[i + 1], strlen(atts[i + 1]));
        if (strcmp(strrchr(atts[i], '|') ? strrchr(atts[i], '|') + 1 : atts[i], "qty") == 0)
            st->sum += strtoul(atts[i + 1], NULL, 10);
    }
}

static void XMLCALL end(void *data, const XML_Char *name) {
    struct state *st = data;
    st->depth--;
    st->hash = mix(st->hash, name, 1);
}

static void XMLCALL text(void *data, const XML_Char *s, int len) {
    struct state *st = data;
    st->text_bytes += (unsigned long)len;
    st->hash = mix(st->hash, s, (size_t)len);
}

static void XMLCALL pi(void *data, const XML_Char *target, const XML_Char *body) {
    struct state *st = data;
    st->pis++;
    st->hash = mix(st->hash, target, strlen(target));
    st->hash = mix(st->hash, body, strlen(body));
}

static void XMLCALL comment(void *data, const XML_Char *body) {
    struct state *st = data;
    st->comments++;
    st->hash = mix(st->hash, body, strlen(body));
}

int main(int argc, char **argv) {
    size_t len = (argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 1024) << 10;
    long reps = argc > 2 ? atol(argv[2]) : 1;
    if (reps < 0) {
        fprintf(stderr, "usage: expat_driver [SIZE [REPS]]\n");
        return 2;
    }
    char *doc = malloc(len + 4096);
    if (!doc) return 1;
    size_t used = (size_t)sprintf(doc, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                                       "<o:feed xmlns:o=\"urn:example:orders\" version=\"2\">\n");
    for (unsigned long id = 1; used < len; id++) {
        size_t n = record(doc + used, len + 4096 - used - 16, id);
        if (!n) break;
        used += n;
    }
    used += (size_t)sprintf(doc + used, "</o:feed>\n");
    struct state st;
    memset(&st, 0, sizeof st);
    st.hash = 0xcbf29ce484222325ULL;
    for (long r = 0; r < reps; r++) {
        XML_Parser p = XML_ParserCreateNS("UTF-8", '|');
        if (!p) return 1;
        /* a fixed salt: the default draws one from the clock */
        XML_SetHashSalt(p, 0x5eed);
        XML_SetUserData(p, &st);
        XML_SetElementHandler(p, start, end);
        XML_SetCharacterDataHandler(p, text);
        XML_SetProcessingInstructionHandler(p, pi);
        XML_SetCommentHandler(p, comment);
        for (size_t off = 0; off < used; off += 8192) {
            size_t n = used - off < 8192 ? used - off : 8192;
            if (XML_Parse(p, doc + off, (int)n, off + n == used) == XML_STATUS_ERROR) {
                fprintf(stderr, "line %lu: %s\n", (unsigned long)XML_GetCurrentLineNumber(p),
                        XML_ErrorString(XML_GetErrorCode(p)));
                return 1;
            }
        }
        XML_ParserFree(p);
    }
    printf("expat %zu bytes x %ld: %lu elements, %lu attributes, %lu text bytes, %lu PIs, %lu comments, "
           "depth %d, qty %llu, checksum %016llx\n",
           used, reps, st.elements, st.attributes, st.text_bytes, st.pis, st.comments, st.max_depth, st.sum,
           st.hash);
    free(doc);
    return 0;
}
