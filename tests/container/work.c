/* The test image's workload: a fixed amount of arithmetic (--n), or as much as fits in a time
   (--seconds: a test that needs the run sampled must not depend on the host's speed), timed,
   reported as a rate on stdout and in $FLEET_METRIC_FILE (when set), so the metric file works
   with or without a shell. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv) {
    long n = 2000000;
    double seconds = 0;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--n") == 0) n = atol(argv[i + 1]);
        if (strcmp(argv[i], "--seconds") == 0) seconds = atof(argv[i + 1]);
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    volatile double x = 0;
    double s = 0;
    if (seconds > 0) {
        n = 0;
        do {
            for (long i = 0; i < 1000000; i++, n++) x += 1.0 / (double)(n + 1);
            clock_gettime(CLOCK_MONOTONIC, &b);
            s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
        } while (s < seconds);
    } else {
        for (long i = 0; i < n; i++) x += 1.0 / (double)(i + 1);
        clock_gettime(CLOCK_MONOTONIC, &b);
        s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    }
    double rate = (double)n / (s > 1e-9 ? s : 1e-9);
    printf("iterations=%ld rate=%.1f\n", n, rate);
    const char *path = getenv("FLEET_METRIC_FILE");
    if (path != NULL) {
        FILE *out = fopen(path, "w");
        if (out != NULL) {
            fprintf(out, "%.1f\n", rate);
            fclose(out);
        }
    }
    return 0;
}
