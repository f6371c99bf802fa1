/*
 * Random positioned reads, timed in C so the figure is the kernel's and the filesystem's,
 * not an interpreter's. Used by scripts/bench for the random 4 KiB pread figure.
 *
 *   preadbench FILE BASE LENGTH COUNT BLOCK SEED
 *
 * Reads COUNT blocks of BLOCK bytes at BASE + k*BLOCK, k uniform in [0, LENGTH/BLOCK),
 * drawn from a fixed xorshift64* sequence (same SEED => same offsets on every file).
 * Prints one JSON line: total seconds, mean/p50/p90/p99/max latency in microseconds.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t state;

static uint64_t next_rand(void)
{
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 2685821657736338717ULL;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: %s FILE BASE LENGTH COUNT BLOCK SEED\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    long long base = strtoll(argv[2], NULL, 10);
    long long length = strtoll(argv[3], NULL, 10);
    long count = strtol(argv[4], NULL, 10);
    long block = strtol(argv[5], NULL, 10);
    state = strtoull(argv[6], NULL, 10) | 1;
    long long nblocks = length / block;
    if (nblocks <= 0 || count <= 0) {
        fprintf(stderr, "nothing to read\n");
        return 2;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        perror(path);
        return 1;
    }
    char *buf = aligned_alloc(4096, (size_t)((block + 4095) / 4096 * 4096));
    double *lat = malloc(sizeof(double) * (size_t)count);
    long long *offs = malloc(sizeof(long long) * (size_t)count);
    for (long i = 0; i < count; i++)
        offs[i] = base + (long long)(next_rand() % (uint64_t)nblocks) * block;
    double t0 = now();
    for (long i = 0; i < count; i++) {
        double a = now();
        ssize_t n = pread(fd, buf, (size_t)block, offs[i]);
        double b = now();
        if (n != block) {
            fprintf(stderr, "pread at %lld returned %zd (%s)\n", offs[i], n, n < 0 ? strerror(errno) : "short");
            return 1;
        }
        lat[i] = (b - a) * 1e6;
    }
    double total = now() - t0;
    qsort(lat, (size_t)count, sizeof(double), cmp_double);
    printf("{\"count\": %ld, \"block\": %ld, \"total_s\": %.6f, \"mean_us\": %.3f, \"p50_us\": %.3f, "
           "\"p90_us\": %.3f, \"p99_us\": %.3f, \"max_us\": %.3f}\n",
           count, block, total, total / (double)count * 1e6, lat[count / 2], lat[count * 9 / 10],
           lat[count * 99 / 100], lat[count - 1]);
    close(fd);
    return 0;
}
