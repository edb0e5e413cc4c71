/* Database workload: SQLite (the amalgamation, built from source) on an
 * in-memory database.  Creates a table, inserts rows in one transaction with
 * a prepared statement, builds an index, runs aggregate, index and join
 * queries, and prints their results.  Usage: sqlite_driver [ROWS [REPS]]:
 * REPS runs the whole session again on a new database (benches/accuracy.py's
 * steady state); the results are printed for the last one. */
#include <stdio.h>
#include <stdlib.h>
#include "sqlite3.h"

static sqlite3 *db;

static void exec(const char *sql) {
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK) {
        fprintf(stderr, "%s: %s\n", sql, err);
        exit(1);
    }
}

static int quiet;

static int print_row(void *tag, int n, char **vals, char **cols) {
    (void)cols;
    if (quiet) return 0;
    printf("%s:", (const char *)tag);
    for (int i = 0; i < n; i++) printf(" %s", vals[i] ? vals[i] : "NULL");
    printf("\n");
    return 0;
}

static void query(const char *tag, const char *sql) {
    char *err = NULL;
    if (sqlite3_exec(db, sql, print_row, (void *)tag, &err) != SQLITE_OK) {
        fprintf(stderr, "%s: %s\n", sql, err);
        exit(1);
    }
}

static unsigned long long rng = 0x0123456789ABCDEFULL;
static unsigned long long next_rand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

static int session(long rows) {
    if (sqlite3_open(":memory:", &db) != SQLITE_OK) return 1;
    exec("CREATE TABLE item(id INTEGER PRIMARY KEY, name TEXT, grp INTEGER, qty INTEGER, price REAL)");
    exec("CREATE TABLE grp(id INTEGER PRIMARY KEY, label TEXT)");
    exec("BEGIN");
    for (int g = 0; g < 100; g++) {
        char sql[96];
        snprintf(sql, sizeof sql, "INSERT INTO grp VALUES(%d, 'group-%02d')", g, g);
        exec(sql);
    }
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, "INSERT INTO item(name, grp, qty, price) VALUES(?1, ?2, ?3, ?4)", -1, &st, NULL))
        return 1;
    for (long i = 0; i < rows; i++) {
        char name[32];
        unsigned long long r = next_rand();
        snprintf(name, sizeof name, "item-%06llu", (r >> 16) % 1000000);
        sqlite3_bind_text(st, 1, name, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int(st, 2, (int)(r % 100));
        sqlite3_bind_int(st, 3, (int)((r >> 8) % 50) + 1);
        sqlite3_bind_double(st, 4, (double)((r >> 24) % 100000) / 100.0);
        if (sqlite3_step(st) != SQLITE_DONE) return 1;
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    exec("COMMIT");
    exec("CREATE INDEX item_name ON item(name)");
    exec("CREATE INDEX item_grp ON item(grp, price)");
    query("count", "SELECT count(*), sum(qty), printf('%.2f', sum(qty * price)) FROM item");
    query("top-groups", "SELECT g.label, count(*), printf('%.2f', avg(i.price)) FROM item i JOIN grp g ON g.id = i.grp "
                        "GROUP BY g.id ORDER BY sum(i.qty * i.price) DESC, g.id LIMIT 3");
    query("range", "SELECT count(*), min(name), max(name) FROM item WHERE name BETWEEN 'item-100000' AND 'item-200000'");
    query("by-index", "SELECT grp, count(*), printf('%.2f', max(price)) FROM item WHERE grp IN (7, 42, 99) AND price > 500 GROUP BY grp");
    query("like", "SELECT count(*) FROM item WHERE name LIKE '%777%'");
    query("dups", "SELECT count(*) FROM (SELECT name FROM item GROUP BY name HAVING count(*) > 1)");
    exec("UPDATE item SET qty = qty + 1 WHERE grp % 10 = 3");
    exec("DELETE FROM item WHERE price < 10");
    query("after", "SELECT count(*), sum(qty) FROM item");
    sqlite3_close(db);
    return 0;
}

int main(int argc, char **argv) {
    long rows = argc > 1 ? atol(argv[1]) : 200000;
    long reps = argc > 2 ? atol(argv[2]) : 1;
    for (long r = 0; r < reps; r++) {
        quiet = r + 1 < reps;
        rng = 0x0123456789ABCDEFULL;
        if (session(rows)) return 1;
    }
    return 0;
}
