/* One admit through libfencekeeper_capi from C: scripts/bench-capi.sh runs it beside
 * the Rust library call and the Python caller (BENCHMARKS.md, "Admit through the C
 * ABI"). Prints `c SCENARIO MEDIAN_NS`: the median over rounds of the thread's CPU
 * time per admit, repeating (the mark's token again) and advancing (rising tokens). */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fencekeeper_capi.h"

#define ROUNDS 15
#define PER_ROUND 20000

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void) {
    static char tokens[ROUNDS][PER_ROUND][24];
    const char *resource = "orders/2026.csv";
    for (int advancing = 0; advancing <= 1; advancing++) {
        fencekeeper_guard *guard;
        if (fencekeeper_guard_open(NULL, &guard) != FENCEKEEPER_OK) {
            fprintf(stderr, "%s\n", fencekeeper_last_error());
            return 2;
        }
        fencekeeper_outcome outcome;
        fencekeeper_admit(guard, (const uint8_t *)resource, strlen(resource), (const uint8_t *)"34", 2, &outcome);
        for (int r = 0; r < ROUNDS; r++) {
            for (int i = 0; i < PER_ROUND; i++) {
                snprintf(tokens[r][i], sizeof tokens[r][i], "%ld", advancing ? 1000000L + (long)r * PER_ROUND + i : 34L);
            }
        }
        double per_admit[ROUNDS];
        for (int r = 0; r < ROUNDS; r++) {
            double start = now_ns();
            for (int i = 0; i < PER_ROUND; i++) {
                const char *t = tokens[r][i];
                if (fencekeeper_admit(guard, (const uint8_t *)resource, strlen(resource), (const uint8_t *)t, strlen(t),
                                      &outcome) != FENCEKEEPER_OK ||
                    !outcome.admitted) {
                    fprintf(stderr, "refused: %s\n", outcome.reason);
                    return 1;
                }
            }
            per_admit[r] = (now_ns() - start) / PER_ROUND;
        }
        qsort(per_admit, ROUNDS, sizeof per_admit[0], by_value);
        printf("c %s %.1f\n", advancing ? "advancing" : "repeating", per_admit[ROUNDS / 2]);
        fencekeeper_guard_close(guard);
    }
    return 0;
}
