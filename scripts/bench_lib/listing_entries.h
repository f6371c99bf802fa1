/*
 * The entries of the C listing file systems (listing.c, listing_ll.c): "KIND SIZE PATH" lines of a file, KIND f
 * for a file, d for a directory, PATH relative to the root ("/" between names), a directory's line before its
 * entries', each directory's entries in listing order; sorted by path too, for lookups.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define FIRST_INO 16

struct entry {
    char *name; /* the path */
    struct stat st;
};

static struct entry *entries;  /* in the file's order; entry i has inode FIRST_INO + i */
static struct entry **sorted;  /* by path, for lookups */
static size_t count;

static int by_name(const void *a, const void *b)
{
    return strcmp((*(struct entry *const *)a)->name, (*(struct entry *const *)b)->name);
}

static int link_entries(void);

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
    return link_entries();
}

static struct entry *find_relative(const char *path)
{
    struct entry key = {.name = (char *)path};
    struct entry *pkey = &key;
    struct entry **found = bsearch(&pkey, sorted, count, sizeof(*sorted), by_name);
    return found ? *found : NULL;
}

/* Each directory's entries in listing order: a chain from its first through next (indices + 1; 0 ends it). */
static size_t root_first, *first, *last, *next;

static int link_entries(void)
{
    first = calloc(count, sizeof(*first));
    last = calloc(count, sizeof(*last));
    next = calloc(count, sizeof(*next));
    size_t root_last = 0;
    for (size_t i = 0; i < count; i++) {
        char *slash = strrchr(entries[i].name, '/');
        size_t *head = &root_first, *tail = &root_last;
        if (slash != NULL) {
            char *folder = strndup(entries[i].name, (size_t)(slash - entries[i].name));
            struct entry *parent = find_relative(folder);
            free(folder);
            if (parent == NULL || !S_ISDIR(parent->st.st_mode) || parent >= &entries[i]) {
                fprintf(stderr, "%s: no directory listed before it\n", entries[i].name);
                return -1;
            }
            head = &first[parent - entries];
            tail = &last[parent - entries];
        }
        if (*tail)
            next[*tail - 1] = i + 1;
        else
            *head = i + 1;
        *tail = i + 1;
    }
    return 0;
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}
