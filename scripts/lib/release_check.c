/* A C program that uses the release's C library as a user would, from its tarball:
   the paused holder's story (34 admitted, 33 refused with the mark). Exit 0 when the
   library fences. scripts/test.sh compiles it against the unpacked release. */
#include <stdio.h>
#include <string.h>
#include "fencekeeper_capi.h"

static int admit(fencekeeper_guard *guard, const char *token, fencekeeper_outcome *outcome) {
    const char *resource = "orders/2026-11.csv";
    return fencekeeper_admit(guard, (const uint8_t *)resource, strlen(resource), (const uint8_t *)token,
                             strlen(token), outcome);
}

int main(void) {
    fencekeeper_options options = {0}; /* the bundled validator, marks in memory */
    fencekeeper_guard *guard;
    if (fencekeeper_guard_open(&options, &guard) != FENCEKEEPER_OK) {
        fprintf(stderr, "open: %s\n", fencekeeper_last_error());
        return 1;
    }
    fencekeeper_outcome first, late;
    if (admit(guard, "34", &first) != FENCEKEEPER_OK || !first.admitted) {
        fprintf(stderr, "34 was not admitted\n");
        return 1;
    }
    if (admit(guard, "33", &late) != FENCEKEEPER_OK || late.admitted || late.http_status != 409) {
        fprintf(stderr, "33 was not refused as stale\n");
        return 1;
    }
    printf("%s\n", late.reason);
    fencekeeper_guard_close(guard);
    return 0;
}
