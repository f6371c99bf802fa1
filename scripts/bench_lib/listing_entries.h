/*
 * The root entries of the C listing file systems (listing.c, listing_ll.c): "KIND SIZE NAME" lines of a file,
 * KIND f for a file, d for an empty directory, in listing order; sorted by name too, for lookups.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define FIRST_INO 16

struct entry {
    char *name;
    struct stat st;
};

static struct entry *entries;  /* in listing order; entry i has inode FIRST_INO + i */
static struct entry **sorted;  /* by name, for lookups */
static size_t count;

static int by_name(const void *a, const void *b)
{
    return strcmp((*(struct entry *const *)a)->name, (*(struct entry *const *)b)->name);
}

static int load(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        perror(path);
        return -1;
    }
    size_t capacity = 1024;
    entries = malloc(capacity * sizeof(*entries));
    char *line = NULL;
    size_t line_size = 0;
    ssize_t n;
    while ((n = getline(&line, &line_size, f)) > 0) {
        if (line[n - 1] == '\n')
            line[--n] = '\0';
        char kind;
        long long size;
        int name_at;
        /* One space ends the size: a name may itself begin with spaces. */
        if (sscanf(line, "%c %lld%n", &kind, &size, &name_at) != 2 || line[name_at] != ' ' ||
            line[++name_at] == '\0') {
            fprintf(stderr, "%s: bad line: %s\n", path, line);
            return -1;
        }
        if (count == capacity) {
            capacity *= 2;
            entries = realloc(entries, capacity * sizeof(*entries));
        }
        struct entry *e = &entries[count];
        memset(e, 0, sizeof(*e));
        e->name = strdup(line + name_at);
        e->st.st_ino = FIRST_INO + count;
        e->st.st_nlink = 1;
        e->st.st_blksize = 1 << 20;
        if (kind == 'd') {
            e->st.st_mode = S_IFDIR | 0555;
        } else {
            e->st.st_mode = S_IFREG | 0444;
            e->st.st_size = size;
            e->st.st_blocks = (size + 511) / 512;
        }
        count++;
    }
    free(line);
    fclose(f);
    sorted = malloc(count * sizeof(*sorted));
    for (size_t i = 0; i < count; i++)
        sorted[i] = &entries[i];
    qsort(sorted, count, sizeof(*sorted), by_name);
    return 0;
}
