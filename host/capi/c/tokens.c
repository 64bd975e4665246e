/* The token contract (tests/contract/tokens.json) told to libfencekeeper_capi from C:
 * host/capi/tests/all/tokens_contract.rs runs this program and plays the table's rows
 * through it, one request a line on stdin, one answer a line on stdout:
 *
 *   A STRICT RESOURCE_HEX TOKEN_HEX   admit -> the outcome's class value, or "E STATUS"
 *   M STRICT KEY_HEX                  the mark -> the mark, "-" for none, or "E STATUS"
 *
 * where a hex text of no bytes is ".", and TOKEN_HEX "-" is no token (a NULL pointer).
 *
 * STRICT is 0 or 1: one guard per policy, each over a memory store. Bytes go in as
 * hex so that a resource that is not UTF-8, or holds a space, reaches the library as
 * it is. Exit 0 at the end of input, 2 on an error of its own. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fencekeeper_capi.h"

enum { LINE = 16384, BYTES = LINE / 2 };

/* Decode the hex text `hex` ("." for no bytes) into `out`; its length, or -1 when
 * it is not hex. */
static long unhex(const char *hex, uint8_t *out) {
    if (strcmp(hex, ".") == 0) return 0;
    size_t n = strlen(hex);
    if (n % 2 != 0 || n / 2 > BYTES) return -1;
    for (size_t i = 0; i < n / 2; i++) {
        unsigned int byte;
        if (sscanf(hex + 2 * i, "%2x", &byte) != 1) return -1;
        out[i] = (uint8_t)byte;
    }
    return (long)(n / 2);
}

int main(void) {
    fencekeeper_guard *guards[2] = {NULL, NULL};
    for (int strict = 0; strict < 2; strict++) {
        fencekeeper_options options = {0};
        options.store = FENCEKEEPER_STORE_KIND_MEMORY;
        options.strict = (uint8_t)strict;
        if (fencekeeper_guard_open(&options, &guards[strict]) != FENCEKEEPER_OK) {
            fprintf(stderr, "tokens: cannot open a guard: %s\n", fencekeeper_last_error());
            return 2;
        }
    }
    static char line[LINE], a[LINE], b[LINE];
    static uint8_t resource[BYTES], token[BYTES];
    while (fgets(line, sizeof line, stdin)) {
        char op;
        int strict;
        int fields = sscanf(line, "%c %d %16383s %16383s", &op, &strict, a, b);
        if (fields < 3 || (strict != 0 && strict != 1)) {
            fprintf(stderr, "tokens: a line it cannot read: %s", line);
            return 2;
        }
        long rl = unhex(a, resource);
        if (rl < 0) {
            fprintf(stderr, "tokens: not hex: %s\n", a);
            return 2;
        }
        if (op == 'A' && fields == 4) {
            long tl = strcmp(b, "-") == 0 ? 0 : unhex(b, token);
            if (tl < 0) {
                fprintf(stderr, "tokens: not hex: %s\n", b);
                return 2;
            }
            const uint8_t *presented = strcmp(b, "-") == 0 ? NULL : token;
            fencekeeper_outcome outcome;
            fencekeeper_status status =
                fencekeeper_admit(guards[strict], resource, (size_t)rl, presented, (size_t)tl, &outcome);
            if (status == FENCEKEEPER_OK) {
                printf("%d\n", outcome.class_);
            } else {
                printf("E %d\n", status);
            }
        } else if (op == 'M') {
            char mark[FENCEKEEPER_TOKEN_CAP];
            bool found = false;
            fencekeeper_status status = fencekeeper_mark(guards[strict], resource, (size_t)rl, mark, &found);
            if (status != FENCEKEEPER_OK) {
                printf("E %d\n", status);
            } else {
                printf("%s\n", found ? mark : "-");
            }
        } else {
            fprintf(stderr, "tokens: a line it cannot read: %s", line);
            return 2;
        }
        fflush(stdout);
    }
    fencekeeper_guard_close(guards[0]);
    fencekeeper_guard_close(guards[1]);
    return 0;
}
