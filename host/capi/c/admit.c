/* The paused-holder story, told to libfencekeeper_capi from C (docs/embedding.md).
 *
 *   cc -std=c11 -I host/capi/include admit.c -L target/release -lfencekeeper_capi \
 *      -Wl,-rpath,target/release -o admit && ./admit marks.redb
 *
 * A holds the lock with token 33 and is paused; its lease expires, B acquires the
 * lock with token 34 and writes; A wakes up and writes with 33: refused. The marks
 * are in a durable file, so a second run refuses 33 at once. Exit 0 when the late
 * write was refused, 1 if it was admitted, 2 on an error. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "fencekeeper_capi.h"

/* 1 admitted, 0 refused, -1 error. */
static int admit(fencekeeper_guard *guard, const char *resource, const char *token) {
    fencekeeper_outcome outcome;
    fencekeeper_status status = fencekeeper_admit(guard, (const uint8_t *)resource, strlen(resource),
                                                  (const uint8_t *)token, token ? strlen(token) : 0, &outcome);
    if (status != FENCEKEEPER_OK) {
        fprintf(stderr, "admit: %s\n", fencekeeper_last_error());
        return -1;
    }
    printf("%d %s\n", outcome.http_status, outcome.reason);
    return outcome.admitted ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s STORE.redb\n", argv[0]);
        return 2;
    }
    if (fencekeeper_abi_version() != FENCEKEEPER_ABI_VERSION) {
        fprintf(stderr, "libfencekeeper_capi implements ABI %u, this program was built for %u\n",
                fencekeeper_abi_version(), FENCEKEEPER_ABI_VERSION);
        return 2;
    }
    fencekeeper_options options = {0}; /* the bundled validator, correctness mode, not strict */
    options.store = FENCEKEEPER_STORE_KIND_FILE;
    options.store_path = argv[1];
    fencekeeper_guard *guard;
    if (fencekeeper_guard_open(&options, &guard) != FENCEKEEPER_OK) {
        fprintf(stderr, "cannot open the guard: %s\n", fencekeeper_last_error());
        return 2;
    }
    const char *file = "orders/2026-11.csv";
    int a = admit(guard, file, "33");    /* A holds the lock, then pauses */
    int b = admit(guard, file, "34");    /* B acquires it and writes */
    int late = admit(guard, file, "33"); /* A wakes up and writes with its old token */
    char mark[FENCEKEEPER_TOKEN_CAP];
    bool found;
    if (fencekeeper_mark(guard, (const uint8_t *)file, strlen(file), mark, &found) != FENCEKEEPER_OK) {
        fprintf(stderr, "mark: %s\n", fencekeeper_last_error());
        late = -1;
    } else {
        printf("mark of %s: %s\n", file, found ? mark : "none");
    }
    fencekeeper_guard_close(guard);
    if (a < 0 || b < 0 || late < 0) {
        return 2;
    }
    return late ? 1 : 0;
}
