/* A C storage engine that keeps its fencing marks inside its own transactions, through
 * fencekeeper_admit_in and a fencekeeper_mark_store table; and the ABI's refusals of
 * bad arguments, as a C caller meets them. Run by host/capi/tests/c_callers.rs:
 * prints one line per check and exits 0 when every check held.
 *
 * The engine is a toy (a fixed table of rows and marks; a transaction works on a copy
 * and replaces the committed state on commit), but its shape is a real engine's:
 * the mark is read and swapped through the transaction, so it commits or rolls back
 * with the row it fenced, and the audit line is kept in the same transaction. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fencekeeper_capi.h"

#define SLOTS 8
#define KEY_CAP 64
#define ROW_CAP 64

struct slot {
    char key[KEY_CAP];
    uint8_t mark[FENCEKEEPER_RECORD_CAP]; /* the value the library asked us to keep */
    size_t mark_len;                      /* 0: no mark */
    char row[ROW_CAP];
};

struct tables {
    struct slot slots[SLOTS];
    int audit_lines;
    char last_audit[1024];
};

struct engine {
    struct tables committed;
};

struct txn {
    struct engine *engine;
    struct tables working;
    bool fail_reads; /* to see a store that fails */
};

static struct slot *find(struct tables *t, const uint8_t *key, size_t len, bool create) {
    if (len >= KEY_CAP) {
        return NULL;
    }
    for (int i = 0; i < SLOTS; i++) {
        if (strlen(t->slots[i].key) == len && memcmp(t->slots[i].key, key, len) == 0) {
            return &t->slots[i];
        }
    }
    if (!create) {
        return NULL;
    }
    for (int i = 0; i < SLOTS; i++) {
        if (t->slots[i].key[0] == '\0') {
            memcpy(t->slots[i].key, key, len);
            t->slots[i].key[len] = '\0';
            return &t->slots[i];
        }
    }
    return NULL;
}

static fencekeeper_store_status get(void *ctx, const uint8_t *key, size_t key_len, uint8_t *value, size_t *value_len,
                                    char *why, size_t why_cap) {
    struct txn *txn = ctx;
    if (txn->fail_reads) {
        snprintf(why, why_cap, "the disk is gone");
        return FENCEKEEPER_STORE_FAILED;
    }
    struct slot *s = find(&txn->working, key, key_len, false);
    if (s == NULL || s->mark_len == 0) {
        return FENCEKEEPER_STORE_ABSENT;
    }
    if (s->mark_len > *value_len) {
        snprintf(why, why_cap, "stored value too long");
        return FENCEKEEPER_STORE_FAILED;
    }
    memcpy(value, s->mark, s->mark_len);
    *value_len = s->mark_len;
    return FENCEKEEPER_STORE_FOUND;
}

/* Inside the transaction nobody else writes: compare-and-swap is compare, then write. */
static fencekeeper_store_status swap(void *ctx, const uint8_t *key, size_t key_len, const uint8_t *expected,
                                     size_t expected_len, const uint8_t *value, size_t value_len, char *why,
                                     size_t why_cap) {
    struct txn *txn = ctx;
    struct slot *s = find(&txn->working, key, key_len, true);
    if (s == NULL || value_len > FENCEKEEPER_RECORD_CAP) {
        snprintf(why, why_cap, "no room for key");
        return FENCEKEEPER_STORE_FAILED;
    }
    if (s->mark_len != expected_len || (expected_len > 0 && memcmp(s->mark, expected, expected_len) != 0)) {
        return FENCEKEEPER_STORE_CONFLICT;
    }
    memcpy(s->mark, value, value_len);
    s->mark_len = value_len;
    return FENCEKEEPER_STORE_SWAPPED;
}

static fencekeeper_store_status audit(void *ctx, const char *line, size_t line_len, char *why, size_t why_cap) {
    struct txn *txn = ctx;
    (void)why;
    (void)why_cap;
    snprintf(txn->working.last_audit, sizeof txn->working.last_audit, "%.*s", (int)line_len, line);
    txn->working.audit_lines++;
    return FENCEKEEPER_STORE_WRITTEN;
}

static fencekeeper_mark_store table_of(struct txn *txn) {
    fencekeeper_mark_store table = {0};
    table.ctx = txn;
    table.get = get;
    table.compare_and_swap = swap;
    table.audit = audit;
    table.name = "the C engine";
    return table;
}

static struct txn begin(struct engine *e) {
    struct txn txn = {0};
    txn.engine = e;
    txn.working = e->committed;
    return txn;
}

static void commit(struct txn *txn) {
    txn->engine->committed = txn->working;
}

/* A fenced write: admitted and applied in one transaction, or refused (rolled back).
 * Fills *outcome; returns the admit's status. */
static fencekeeper_status write_row(fencekeeper_guard *guard, struct engine *e, const char *key, const char *row,
                                    const char *token, fencekeeper_outcome *outcome) {
    struct txn txn = begin(e);
    fencekeeper_mark_store table = table_of(&txn);
    fencekeeper_status status = fencekeeper_admit_in(guard, &table, (const uint8_t *)key, strlen(key),
                                                     (const uint8_t *)token, strlen(token), outcome);
    if (status != FENCEKEEPER_OK || !outcome->admitted) {
        return status; /* txn dropped: rolled back */
    }
    if (strlen(row) >= ROW_CAP) {
        return status; /* the write fails after the admit: rolled back, mark included */
    }
    snprintf(find(&txn.working, (const uint8_t *)key, strlen(key), true)->row, ROW_CAP, "%s", row);
    commit(&txn);
    return status;
}

static int failures = 0;
static int checks = 0;

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        checks++;                                                                                                      \
        if (cond) {                                                                                                    \
            printf("ok   ");                                                                                           \
        } else {                                                                                                       \
            printf("FAIL ");                                                                                           \
            failures++;                                                                                                \
        }                                                                                                              \
        printf(__VA_ARGS__);                                                                                           \
        printf("\n");                                                                                                  \
    } while (0)

static const char *mark_in(struct engine *e, const char *key, char *mark) {
    struct txn txn = begin(e);
    fencekeeper_mark_store table = table_of(&txn);
    bool found = false;
    if (fencekeeper_mark_in(&table, (const uint8_t *)key, strlen(key), mark, &found) != FENCEKEEPER_OK) {
        return fencekeeper_last_error();
    }
    return found ? mark : "none";
}

static void engine_keeps_marks_in_its_transactions(fencekeeper_guard *guard) {
    struct engine e = {0};
    fencekeeper_outcome o;
    char mark[FENCEKEEPER_TOKEN_CAP];
    CHECK(write_row(guard, &e, "invoice/7", "draft by A", "33", &o) == FENCEKEEPER_OK && o.admitted && o.advanced,
          "A (33) writes: %s", o.reason);
    CHECK(write_row(guard, &e, "invoice/7", "final by B", "34", &o) == FENCEKEEPER_OK && o.admitted,
          "B (34) writes: %s", o.reason);
    CHECK(write_row(guard, &e, "invoice/7", "late draft by A", "33", &o) == FENCEKEEPER_OK && !o.admitted &&
              o.class_ == FENCEKEEPER_CLASS_STALE && o.http_status == 409 && strcmp(o.mark, "34") == 0,
          "A (33) again is stale, the mark it reports is %s: %s", o.mark, o.reason);
    CHECK(strcmp(e.committed.slots[0].row, "final by B") == 0, "the row is B's: %s", e.committed.slots[0].row);
    CHECK(e.committed.audit_lines == 2 && strstr(e.committed.last_audit, "\"old\":\"33\",") != NULL &&
              strstr(e.committed.last_audit, "\"store\":\"the C engine\"") != NULL,
          "two advances, two audit lines in the engine's own tables: %s", e.committed.last_audit);
    /* An admitted write that fails later rolls its mark back with it. */
    CHECK(write_row(guard, &e, "invoice/7", "a row far too long for this toy engine's sixty-four bytes of row", "35",
                    &o) == FENCEKEEPER_OK &&
              o.admitted,
          "C (35) is admitted, then its write fails");
    CHECK(strcmp(mark_in(&e, "invoice/7", mark), "34") == 0 && e.committed.audit_lines == 2,
          "after the rollback the mark is %s and no audit line was kept", mark_in(&e, "invoice/7", mark));
}

static void damaged_values_and_failing_stores_are_refused(fencekeeper_guard *guard, fencekeeper_guard *efficient) {
    struct engine e = {0};
    fencekeeper_outcome o;
    char mark[FENCEKEEPER_TOKEN_CAP];
    write_row(guard, &e, "r", "x", "50", &o);
    /* The disk flips the mark's first digit: "fk2 50 ..." now reads 40. */
    struct slot *s = &e.committed.slots[0];
    CHECK(s->mark_len > 4 && s->mark[4] == '5', "the stored value is the record %.*s", (int)s->mark_len, s->mark);
    s->mark[4] = '4';
    CHECK(write_row(guard, &e, "r", "y", "45", &o) == FENCEKEEPER_OK && !o.admitted &&
              o.class_ == FENCEKEEPER_CLASS_UNDECIDED && o.http_status == 503,
          "a damaged mark is undecided (503), never read as 40: %s", o.reason);
    CHECK(strstr(mark_in(&e, "r", mark), "damaged") != NULL, "reading it is an error: %s", mark_in(&e, "r", mark));
    CHECK(write_row(efficient, &e, "r", "y", "45", &o) == FENCEKEEPER_OK && o.admitted && o.failed_open,
          "efficiency mode lets it through and says so: %s", o.reason);
    /* A store that fails. */
    struct txn txn = begin(&e);
    txn.fail_reads = true;
    fencekeeper_mark_store table = table_of(&txn);
    CHECK(fencekeeper_admit_in(guard, &table, (const uint8_t *)"q", 1, (const uint8_t *)"1", 1, &o) == FENCEKEEPER_OK &&
              !o.admitted && strstr(o.reason, "the disk is gone") != NULL,
          "a failing store is undecided with its own reason: %s", o.reason);
}

static void bad_arguments_are_refused_with_a_status_and_a_line(fencekeeper_guard *guard) {
    fencekeeper_outcome o;
    const uint8_t *key = (const uint8_t *)"k";
    CHECK(fencekeeper_admit(guard, key, 1, (const uint8_t *)"1", 1, NULL) == FENCEKEEPER_ERR_ARGUMENT &&
              strstr(fencekeeper_last_error(), "outcome") != NULL,
          "a NULL outcome: %s", fencekeeper_last_error());
    CHECK(fencekeeper_admit(NULL, key, 1, NULL, 0, &o) == FENCEKEEPER_ERR_ARGUMENT, "a NULL guard: %s",
          fencekeeper_last_error());
    CHECK(fencekeeper_admit(guard, key, 1, NULL, 5, &o) == FENCEKEEPER_ERR_ARGUMENT, "a token length without a token: %s",
          fencekeeper_last_error());
    CHECK(fencekeeper_admit(guard, key, 1, NULL, 0, &o) == FENCEKEEPER_OK && o.class_ == FENCEKEEPER_CLASS_MISSING &&
              o.http_status == 428,
          "no token is missing (428): %s", o.reason);
    CHECK(strcmp(fencekeeper_last_error(), "") == 0, "a call that succeeded leaves no error behind");
    CHECK(fencekeeper_admit(guard, (const uint8_t *)"/\xff\xfe", 3, (const uint8_t *)"1", 1, &o) == FENCEKEEPER_OK &&
              o.class_ == FENCEKEEPER_CLASS_MALFORMED,
          "a key that is not UTF-8 is malformed: %s", o.reason);
    CHECK(fencekeeper_admit(guard, key, (size_t)1 << 40, (const uint8_t *)"1", 1, &o) == FENCEKEEPER_OK &&
              o.class_ == FENCEKEEPER_CLASS_MALFORMED,
          "a key length past the buffer is malformed on its length alone: %s", o.reason);
    uint64_t not_a_guard[64] = {0};
    CHECK(fencekeeper_admit((const fencekeeper_guard *)not_a_guard, key, 1, NULL, 0, &o) == FENCEKEEPER_ERR_ARGUMENT,
          "a pointer that is not a guard: %s", fencekeeper_last_error());
    fencekeeper_mark_store half = {0};
    CHECK(fencekeeper_admit_in(guard, &half, key, 1, NULL, 0, &o) == FENCEKEEPER_ERR_ARGUMENT,
          "a table without callbacks: %s", fencekeeper_last_error());

    fencekeeper_options options = {0};
    fencekeeper_guard *g = (fencekeeper_guard *)not_a_guard;
    options.mode = 7;
    CHECK(fencekeeper_guard_open(&options, &g) == FENCEKEEPER_ERR_ARGUMENT && g == NULL,
          "an unknown mode, and the handle is NULL: %s", fencekeeper_last_error());
    options.mode = FENCEKEEPER_MODE_CORRECTNESS;
    options.guest_path = "/nonexistent/guest.wasm";
    CHECK(fencekeeper_guard_open(&options, &g) == FENCEKEEPER_ERR_LOAD, "a guest that is not there: %s",
          fencekeeper_last_error());
    options.guest_path = NULL;
    options.store = FENCEKEEPER_STORE_KIND_FILE;
    CHECK(fencekeeper_guard_open(&options, &g) == FENCEKEEPER_ERR_ARGUMENT, "a file store without a path: %s",
          fencekeeper_last_error());
    fencekeeper_guard_close(NULL);
}

int main(void) {
    fencekeeper_guard *guard, *efficient;
    fencekeeper_options options = {0};
    if (fencekeeper_guard_open(&options, &guard) != FENCEKEEPER_OK) {
        fprintf(stderr, "cannot open the guard: %s\n", fencekeeper_last_error());
        return 2;
    }
    options.mode = FENCEKEEPER_MODE_EFFICIENCY;
    if (fencekeeper_guard_open(&options, &efficient) != FENCEKEEPER_OK) {
        fprintf(stderr, "cannot open the guard: %s\n", fencekeeper_last_error());
        return 2;
    }
    engine_keeps_marks_in_its_transactions(guard);
    damaged_values_and_failing_stores_are_refused(guard, efficient);
    bad_arguments_are_refused_with_a_status_and_a_line(guard);
    fencekeeper_guard_close(efficient);
    fencekeeper_guard_close(guard);
    printf("c engine: %d passed, %d failed\n", checks - failures, failures);
    return failures == 0 ? 0 : 1;
}
