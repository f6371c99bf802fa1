/* Random windows through cd_add_entries (ckptfs/fuse/_cdirents.c) and libfuse's own formatting functions, built
 * with AddressSanitizer and UBSan by tests/fuse/test_dirents.py: every buffer is allocated to its exact size, so
 * a write past it stops the run. Prints "windows N entries added M". */

#define _DEFAULT_SOURCE

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "../xorshift.h"

typedef size_t (*add_entry_fn)(void *req, char *buf, size_t bufsize, const char *name, const void *entry,
                               int64_t off);
size_t cd_add_entries(add_entry_fn add, void *req, char *buf, size_t size, size_t used, const char *names,
                      const char *entries, size_t stride, int64_t start, int64_t first, int64_t count,
                      int64_t *next);
size_t fuse_add_direntry(void *req, char *buf, size_t bufsize, const char *name, const struct stat *stbuf,
                         off_t off);
size_t fuse_add_direntry_plus(void *req, char *buf, size_t bufsize, const char *name, const void *entry, off_t off);

struct entry_param { /* fuse_lowlevel.h's struct fuse_entry_param */
    uint64_t ino;
    uint64_t generation;
    struct stat attr;
    double attr_timeout;
    double entry_timeout;
};

int main(int argc, char **argv) {
    long windows = argc > 1 ? strtol(argv[1], NULL, 10) : 1000;
    long long added = 0;
    for (long w = 0; w < windows; w++) {
        int64_t count = (int64_t)(next_random() % 65);
        int plus = (int)(next_random() & 1);
        int64_t *name_at = malloc(sizeof(int64_t) * (size_t)(count + 1));
        struct entry_param *entries = calloc((size_t)count + 1, sizeof(struct entry_param));
        size_t text_length = 0;
        int *lengths = malloc(sizeof(int) * (size_t)(count + 1));
        for (int64_t i = 0; i < count; i++) {
            lengths[i] = 1 + (int)(next_random() % 300);
            name_at[i] = (int64_t)text_length;
            text_length += (size_t)lengths[i] + 1;
            entries[i].ino = entries[i].attr.st_ino = next_random();
            entries[i].attr.st_mode = (i % 2) ? S_IFREG | 0444 : S_IFDIR | 0555;
            entries[i].attr.st_size = (off_t)(next_random() >> 2);
            entries[i].attr_timeout = entries[i].entry_timeout = (double)(next_random() % 100000);
        }
        char *text = malloc(text_length ? text_length : 1);
        for (int64_t i = 0; i < count; i++) {
            for (int k = 0; k < lengths[i]; k++) {
                char c = (char)(1 + next_random() % 255);
                text[name_at[i] + k] = c == '/' ? 'x' : c;
            }
            text[name_at[i] + lengths[i]] = '\0';
        }
        size_t size = (size_t)(next_random() % (size_t)(count * 200 + 1));
        size_t used = size ? (size_t)(next_random() % (size + 1)) : 0;
        char *buf = malloc(size ? size : 1);
        int64_t first = count ? (int64_t)(next_random() % (uint64_t)(count + 1)) : 0;
        int64_t next = -1;
        const char *base = plus ? (const char *)entries : (const char *)&entries[0].attr;
        add_entry_fn add = plus ? (add_entry_fn)fuse_add_direntry_plus : (add_entry_fn)fuse_add_direntry;
        size_t taken = cd_add_entries(add, NULL, buf, size, used, text, base, sizeof(struct entry_param),
                                      (int64_t)(next_random() >> 2), first, count, &next);
        if (taken < used || taken > size || next < first || next > count) {
            fprintf(stderr, "window %ld: taken %zu of %zu (from %zu), next %lld of %lld from %lld\n", w, taken, size,
                    used, (long long)next, (long long)count, (long long)first);
            return 1;
        }
        added += next - first;
        free(buf);
        free(text);
        free(lengths);
        free(entries);
        free(name_at);
    }
    printf("windows %ld entries added %lld\n", windows, added);
    return 0;
}
