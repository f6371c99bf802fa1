/* The floor of a remote mount's daemon CPU per GiB (issue 25): THREADS threads fetch SIZE bytes from an HTTP
 * server in PART-byte ranged GETs (keep-alive), recv() straight into a memfd's mapping; then, as libfuse sends a
 * read's reply, the memfd is spliced to a pipe in 960 KiB pieces and the pipe to /dev/null (SPLICE 1) or into a
 * second memfd (SPLICE 2: the pages copied, as /dev/fuse copies them into the request's). Prints user+sys CPU
 * per GiB. Built and run by remote_floor.py: floor HOST PORT PATH OFFSET SIZE THREADS PART SPLICE */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static const char *host, *path; static int port, threads; static long long base, size, part;
static char *map; static long long next_part; static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void *worker(void *arg) {
    (void)arg;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    if (connect(s, (struct sockaddr *)&a, sizeof a)) { perror("connect"); exit(1); }
    for (;;) {
        pthread_mutex_lock(&lock); long long at = next_part; next_part += part; pthread_mutex_unlock(&lock);
        if (at >= size) break;
        long long n = at + part > size ? size - at : part;
        char req[512], head[4096];
        int len = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s\r\nRange: bytes=%lld-%lld\r\n\r\n", path,
                           host, base + at, base + at + n - 1);
        send(s, req, len, 0);
        int got = 0; char *end = NULL;
        while (!end) {  /* headers, one byte at a time past the first read would be slow: read then split */
            int r = recv(s, head + got, sizeof head - 1 - got, 0);
            if (r <= 0) { perror("recv head"); exit(1); }
            got += r; head[got] = 0; end = strstr(head, "\r\n\r\n");
        }
        int body = got - (int)(end + 4 - head);
        memcpy(map + at, end + 4, body);
        long long done = body;
        while (done < n) {
            ssize_t r = recv(s, map + at + done, n - done, 0);
            if (r <= 0) { perror("recv body"); exit(1); }
            done += r;
        }
    }
    close(s);
    return NULL;
}

int main(int argc, char **argv) {
    host = argv[1]; port = atoi(argv[2]); path = argv[3]; base = atoll(argv[4]); size = atoll(argv[5]);
    threads = atoi(argv[6]); part = atoll(argv[7]); int do_splice = atoi(argv[8]);
    int fd = memfd_create("floor", 0);
    ftruncate(fd, size);
    map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    madvise(map, size, 23 /* MADV_POPULATE_WRITE: the daemon reuses warm blocks */);
    struct rusage r0, r1; struct timeval t0, t1;
    getrusage(RUSAGE_SELF, &r0); gettimeofday(&t0, NULL);
    pthread_t t[64];
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, NULL);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    struct rusage rg; getrusage(RUSAGE_SELF, &rg);
    if (do_splice) {
        int p[2]; pipe(p); fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
        /* SPLICE=2: into a memfd (overwriting its first MiB), which copies the pages as /dev/fuse copies them into
         * the request's; SPLICE=1: /dev/null, which drops them */
        int null = do_splice == 2 ? memfd_create("sink", 0) : open("/dev/null", O_WRONLY);
        for (loff_t at = 0; at < size;) {
            size_t n = size - at < 983040 ? size - at : 983040;
            ssize_t in = splice(fd, &at, p[1], NULL, n, 0);
            if (in <= 0) { perror("splice in"); return 1; }
            for (ssize_t out = 0; out < in;) {
                loff_t zero = 0;
                ssize_t o = splice(p[0], NULL, null, do_splice == 2 ? &zero : NULL, in - out, 0);
                if (o <= 0) { perror("splice out"); return 1; }
                out += o;
            }
        }
    }
    getrusage(RUSAGE_SELF, &r1); gettimeofday(&t1, NULL);
    double g = (double)size / (1 << 30);
#define CPU(a, b) ((b.ru_utime.tv_sec - a.ru_utime.tv_sec) + (b.ru_utime.tv_usec - a.ru_utime.tv_usec) / 1e6 + \
                   (b.ru_stime.tv_sec - a.ru_stime.tv_sec) + (b.ru_stime.tv_usec - a.ru_stime.tv_usec) / 1e6)
    double wall = (t1.tv_sec - t0.tv_sec) + (t1.tv_usec - t0.tv_usec) / 1e6;
    printf("GETs %.3f s/GiB, splice %.3f s/GiB, total %.3f s/GiB, %.0f MiB/s\n", CPU(r0, rg) / g, CPU(rg, r1) / g,
           CPU(r0, r1) / g, size / wall / (1 << 20));
    return 0;
}
