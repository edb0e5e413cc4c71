/* JSON workload: parses a generated JSON document (an array of user records
 * with strings, integers, floats, booleans, nested objects and arrays) with
 * simdjson's DOM parser (its runtime-selected kernel for this CPU), walks the
 * whole tree summing numbers and string lengths, looks up a few fields by
 * key, and writes the document back out minified; prints sizes and checksums.
 * Usage: simdjson_driver [SIZE [REPS]]: SIZE of the document in KiB; REPS
 * repeats the parse, walk and minify of the same document with the same
 * parser (benches/accuracy.py's steady state: two exact runs differing in
 * REPS). */
#include <cstdio>
#include <cstdlib>
#include <string>
#include "simdjson.h"

using namespace simdjson;

static unsigned long long rng = 0x2545F4914F6CDD1DULL;
static unsigned long long next_rand() {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

static const char *cities[] = {"Lisbon", "Kyoto", "Montr\\u00e9al", "Nairobi", "Oslo", "Valpara\\u00edso", "Hanoi", "Tbilisi"};
static const char *tags[] = {"admin", "beta", "trial", "vip", "mobile", "legacy", "eu", "us", "apac"};

static void record(std::string &out, unsigned long long id) {
    unsigned long long r = next_rand(), s = next_rand();
    char buf[512];
    snprintf(buf, sizeof buf,
             "{\"id\":%llu,\"name\":\"user_%llu\",\"email\":\"user%llu@example.com\",\"score\":%.4f,"
             "\"active\":%s,\"balance\":%lld,\"address\":{\"city\":\"%s\",\"zip\":\"%05llu\",\"geo\":[%.6f,%.6f]},"
             "\"tags\":[",
             id, r % 100000, id, (double)(r % 1000000) / 1000.0, (s & 1) ? "true" : "false",
             (long long)(s % 2000000) - 1000000, cities[(r >> 20) % 8], (r >> 24) % 100000,
             (double)((s >> 8) % 180000000) / 1e6 - 90.0, (double)((s >> 36) % 360000000) / 1e6 - 180.0);
    out += buf;
    int nt = (int)((r >> 40) % 4);
    for (int i = 0; i < nt; i++) {
        if (i) out += ',';
        out += '"';
        out += tags[(r >> (44 + 4 * i)) % 9];
        out += '"';
    }
    out += "],\"history\":[";
    int nh = (int)((s >> 60) % 5);
    for (int i = 0; i < nh; i++) {
        unsigned long long h = next_rand();
        snprintf(buf, sizeof buf, "%s{\"t\":%llu,\"v\":%.3f,\"note\":%s}", i ? "," : "", 1700000000ULL + h % 10000000,
                 (double)(h >> 32 & 0xffff) / 7.0, (h >> 50) % 3 ? "null" : "\"manual \\\"override\\\"\"");
        out += buf;
    }
    out += "]}";
}

struct Stats {
    unsigned long long nodes = 0, strings = 0, keys = 0;
    long long ints = 0;
    double doubles = 0;
};

static void walk(dom::element e, Stats &st) {
    st.nodes++;
    switch (e.type()) {
    case dom::element_type::ARRAY:
        for (dom::element c : dom::array(e)) walk(c, st);
        break;
    case dom::element_type::OBJECT:
        for (dom::key_value_pair kv : dom::object(e)) {
            st.keys += kv.key.size();
            walk(kv.value, st);
        }
        break;
    case dom::element_type::INT64: st.ints += int64_t(e); break;
    case dom::element_type::UINT64: st.ints += (long long)uint64_t(e); break;
    case dom::element_type::DOUBLE: st.doubles += double(e); break;
    case dom::element_type::STRING: st.strings += std::string_view(e).size(); break;
    case dom::element_type::BOOL: st.ints += bool(e); break;
    case dom::element_type::NULL_VALUE: break;
    case dom::element_type::BIGINT: break;
    }
}

int main(int argc, char **argv) {
    size_t len = (argc > 1 ? (size_t)strtoul(argv[1], nullptr, 10) : 1024) << 10;
    long reps = argc > 2 ? atol(argv[2]) : 1;
    std::string text = "[";
    for (unsigned long long id = 0; text.size() < len; id++) {
        if (id) text += ',';
        record(text, id);
    }
    text += ']';
    padded_string json(text);
    dom::parser parser;
    Stats st;
    unsigned long long active = 0, minified = 0, mhash = 1469598103934665603ULL;
    double score = 0;
    for (long r = 0; r < reps; r++) {
        dom::element doc;
        auto err = parser.parse(json).get(doc);
        if (err) {
            fprintf(stderr, "parse: %s\n", error_message(err));
            return 1;
        }
        st = Stats();
        walk(doc, st);
        active = 0;
        score = 0;
        for (dom::element u : dom::array(doc)) {
            bool a;
            double s;
            if (!u["active"].get(a) && a) active++;
            if (!u["score"].get(s)) score += s;
        }
        std::string m = minify(doc);
        minified = m.size();
        mhash = 1469598103934665603ULL;
        for (unsigned char c : m) { mhash ^= c; mhash *= 1099511628211ULL; }
    }
    printf("simdjson %s (%s) bytes=%zu nodes=%llu keys=%llu strings=%llu ints=%lld doubles=%.3f active=%llu score=%.3f "
           "minified=%llu hash=%016llx\n",
           SIMDJSON_VERSION, get_active_implementation()->name().c_str(), text.size(), st.nodes, st.keys, st.strings,
           st.ints, st.doubles, active, score, minified, mhash);
    return 0;
}
