/* amibake's kernels suite: four small compute kernels whose speed depends on the compiler's
 * target flags, each printing a checksum (to verify a build by its output) and its throughput.
 *
 *   kernels [--quick] [--threads N] [--size N] [--block B] [--min-time S] [--only NAME]
 *
 * Each kernel repeats its timed part until --min-time seconds (default 0.25; none with --quick)
 * have passed and reports the work of all repetitions over their time: one pass of the default
 * size takes 10-50 ms, too short to time on a shared machine (measured: +-30% between runs).
 *
 * Built with -ffp-contract=off so that every flag set computes bit-identical results: a
 * different checksum means a wrong build, never a different rounding.
 */
#include <malloc.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void report(const char *name, double checksum, double seconds, double work,
                   const char *unit) {
    printf("kernel=%s checksum=%.12e seconds=%.6f throughput=%.3f unit=%s\n", name, checksum,
           seconds, work / seconds, unit);
}

static double min_time = 0.25;

/* Runs `pass` (which times itself and returns its seconds) until min_time has passed, and reports
 * the throughput over every repetition. The checksum is the first pass's: every pass computes
 * the same thing from the same input, and a mismatch is a broken build. */
#define MEASURE(name, work, unit, pass)                                                          \
    do {                                                                                       \
        double first = 0, sum = 0, seconds = 0;                                                \
        long reps = 0;                                                                          \
        do {                                                                                    \
            seconds += pass(&sum);                                                             \
            if (reps++ == 0) first = sum;                                                      \
            else if (sum != first) {                                                           \
                fprintf(stderr, "kernels: %s: checksum differs between repetitions\n", name);  \
                exit(3);                                                                       \
            }                                                                                  \
        } while (seconds < min_time);                                                          \
        report(name, first, seconds, (work) * reps, unit);                                     \
    } while (0)

/* 2-D 5-point Jacobi stencil on an n x n grid. */
static int st_n, st_iterations;
static double stencil_pass(double *checksum) {
    int n = st_n, iterations = st_iterations;
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n);
    for (int i = 0; i < n * n; i++) a[i] = b[i] = (float)(((int64_t)i * 7919) % 1000) / 1000.0f;
    double t0 = now();
    for (int it = 0; it < iterations; it++) {
#pragma omp parallel for schedule(static)
        for (int y = 1; y < n - 1; y++)
            for (int x = 1; x < n - 1; x++)
                b[y * n + x] = 0.2f * (a[y * n + x] + a[y * n + x - 1] + a[y * n + x + 1] +
                                       a[(y - 1) * n + x] + a[(y + 1) * n + x]);
        float *t = a; a = b; b = t;
    }
    double seconds = now() - t0, sum = 0;
    for (int i = 0; i < n * n; i++) sum += a[i];
    free(a); free(b);
    *checksum = sum;
    return seconds;
}

static void stencil(int n, int iterations) {
    st_n = n, st_iterations = iterations;
    MEASURE("stencil", (double)(n - 2) * (n - 2) * iterations / 1e6, "Mcell/s", stencil_pass);
}

/* Blocked matrix multiply C = A * B, n x n, block size bs. */
static int mm_n, mm_bs;
static double matmul_pass(double *checksum) {
    int n = mm_n, bs = mm_bs;
    double *A = malloc(sizeof(double) * n * n), *B = malloc(sizeof(double) * n * n);
    double *C = malloc(sizeof(double) * n * n);
    memset(C, 0, sizeof(double) * n * n); /* touched before the clock starts: no page faults timed */
    for (int i = 0; i < n * n; i++) {
        A[i] = (double)((i * 31) % 97) / 97.0;
        B[i] = (double)((i * 17) % 89) / 89.0;
    }
    double t0 = now();
#pragma omp parallel for schedule(static)
    for (int ii = 0; ii < n; ii += bs)
        for (int kk = 0; kk < n; kk += bs)
            for (int jj = 0; jj < n; jj += bs)
                for (int i = ii; i < ii + bs && i < n; i++)
                    for (int k = kk; k < kk + bs && k < n; k++) {
                        double aik = A[i * n + k];
                        for (int j = jj; j < jj + bs && j < n; j++) C[i * n + j] += aik * B[k * n + j];
                    }
    double seconds = now() - t0, sum = 0;
    for (int i = 0; i < n * n; i++) sum += C[i];
    free(A); free(B); free(C);
    *checksum = sum;
    return seconds;
}

static void matmul(int n, int bs) {
    mm_n = n, mm_bs = bs;
    MEASURE("matmul", 2.0 * n * n * (double)n / 1e9, "GFLOP/s", matmul_pass);
}

/* One direct-summation n-body step, repeated. Structure of arrays for vectorization. */
static int nb_n, nb_steps;
static double nbody_pass(double *checksum) {
    int n = nb_n, steps = nb_steps;
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n), *z = malloc(sizeof(float) * n);
    float *vx = malloc(sizeof(float) * n), *vy = malloc(sizeof(float) * n), *vz = malloc(sizeof(float) * n);
    memset(vx, 0, sizeof(float) * n), memset(vy, 0, sizeof(float) * n), memset(vz, 0, sizeof(float) * n);
    for (int i = 0; i < n; i++) {
        x[i] = (float)((i * 13) % 101); y[i] = (float)((i * 29) % 103); z[i] = (float)((i * 47) % 107);
    }
    double t0 = now();
    for (int s = 0; s < steps; s++) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < n; i++) {
            float ax = 0, ay = 0, az = 0;
            for (int j = 0; j < n; j++) {
                float dx = x[j] - x[i], dy = y[j] - y[i], dz = z[j] - z[i];
                float d2 = dx * dx + dy * dy + dz * dz + 0.01f;
                float inv = 1.0f / sqrtf(d2);
                float inv3 = inv * inv * inv;
                ax += dx * inv3; ay += dy * inv3; az += dz * inv3;
            }
            vx[i] += 0.001f * ax; vy[i] += 0.001f * ay; vz[i] += 0.001f * az;
        }
        for (int i = 0; i < n; i++) { x[i] += vx[i]; y[i] += vy[i]; z[i] += vz[i]; }
    }
    double seconds = now() - t0, sum = 0;
    for (int i = 0; i < n; i++) sum += x[i] + y[i] + z[i];
    free(x); free(y); free(z); free(vx); free(vy); free(vz);
    *checksum = sum;
    return seconds;
}

static void nbody(int n, int steps) {
    nb_n = n, nb_steps = steps;
    MEASURE("nbody", (double)n * n * steps / 1e6, "Minteractions/s", nbody_pass);
}

/* Sieve of Eratosthenes up to limit. */
static int64_t sv_limit;
static double sieve_pass(double *checksum) {
    int64_t limit = sv_limit;
    uint8_t *composite = malloc((size_t)limit + 1);
    memset(composite, 0, (size_t)limit + 1);
    double t0 = now();
    for (int64_t p = 2; p * p <= limit; p++)
        if (!composite[p])
            for (int64_t m = p * p; m <= limit; m += p) composite[m] = 1;
    int64_t count = 0;
    for (int64_t i = 2; i <= limit; i++) count += !composite[i];
    double seconds = now() - t0;
    free(composite);
    *checksum = (double)count;
    return seconds;
}

static void sieve(int64_t limit) {
    sv_limit = limit;
    MEASURE("sieve", (double)limit / 1e6, "Mint/s", sieve_pass);
}

int main(int argc, char **argv) {
    int quick = 0, threads = 0, size = 0, block = 64;
    const char *only = NULL;
    int timed = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--size") && i + 1 < argc) size = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--block") && i + 1 < argc) block = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--min-time") && i + 1 < argc) min_time = atof(argv[++i]), timed = 1;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else { fprintf(stderr, "kernels: unknown argument %s\n", argv[i]); return 2; }
    }
    /* Every repetition gets the same heap memory back instead of a fresh mmap: matmul measured
     * 1.6x slower alone (fresh mappings per pass) than after another kernel (heap reuse). */
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    if (quick && !timed) min_time = 0;
    if (min_time < 0) { fprintf(stderr, "kernels: --min-time must not be negative\n"); return 2; }
    if (block < 1) { fprintf(stderr, "kernels: --block must be positive\n"); return 2; }
#ifdef _OPENMP
    if (threads > 0) omp_set_num_threads(threads);
#endif
    int scale = size > 0 ? size : (quick ? 1 : 4); /* problem size multiplier */
    if (!only || !strcmp(only, "stencil")) stencil(256 * scale, quick ? 10 : 60);
    if (!only || !strcmp(only, "matmul")) matmul(96 * scale, block);
    if (!only || !strcmp(only, "nbody")) nbody(512 * scale, quick ? 2 : 6);
    if (!only || !strcmp(only, "sieve")) sieve((int64_t)2000000 * scale);
    return 0;
}
