/*
 * Minimal read-only FUSE file system on libfuse3, used by scripts/bench as the limit of the
 * kernel's FUSE path for mounting and listing a big tree: it holds the entries named in ENTRIES,
 * one per line as "KIND SIZE PATH" (KIND f for a file, d for a directory; PATH relative to the
 * root, "/" between its names, a directory's line before those of its entries), each directory's
 * entries listed in that order with their attributes (readdirplus), configured as ckptfs
 * configures its mounts: inode numbers given, entries and attributes cached for a day,
 * readdirplus on every request. Files have no contents (open fails): only listings and
 * attributes are measured.
 *
 *   listing ENTRIES MOUNTPOINT [fuse options: -f -s -o ...]
 *
 * Build: gcc -O2 -Wall listing.c $(pkg-config --cflags --libs fuse3) -o listing
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <errno.h>
#include <fuse.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "listing_entries.h"

static void *ls_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
    cfg->kernel_cache = 1;
    cfg->entry_timeout = 86400.0;
    cfg->attr_timeout = 86400.0;
    cfg->negative_timeout = 86400.0;
    cfg->use_ino = 1;
    conn->want |= conn->capable & FUSE_CAP_READDIRPLUS;
    conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;
    return NULL;
}

static struct entry *find(const char *path)
{
    return path[0] == '/' ? find_relative(path + 1) : NULL;
}

static int ls_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
    (void)fi;
    if (strcmp(path, "/") == 0) {
        memset(st, 0, sizeof(*st));
        st->st_mode = S_IFDIR | 0555;
        st->st_nlink = 1;
        st->st_ino = 1;
        return 0;
    }
    struct entry *e = find(path);
    if (e == NULL)
        return -ENOENT;
    *st = e->st;
    return 0;
}

static int ls_readdir(const char *path, void *buf, fuse_fill_dir_t filler, off_t off,
                      struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
    (void)fi;
    enum fuse_fill_dir_flags plus = (flags & FUSE_READDIR_PLUS) ? FUSE_FILL_DIR_PLUS : 0;
    struct stat dir = {.st_mode = S_IFDIR | 0555, .st_nlink = 1, .st_ino = 1};
    int root = strcmp(path, "/") == 0;
    struct entry *e = root ? NULL : find(path);
    if (!root && (e == NULL || !S_ISDIR(e->st.st_mode)))
        return -ENOENT;
    /* The offset of an entry is its index + 3 (0 starts, 1 is ".", 2 is ".."): found again in O(1). */
    size_t at = off >= 3 ? next[off - 3] : root ? root_first : first[e - entries];
    for (off_t position = off; position < 2; position++)
        if (filler(buf, position == 0 ? "." : "..", &dir, position + 1, plus))
            return 0;
    for (; at; at = next[at - 1]) {
        struct entry *child = &entries[at - 1];
        if (filler(buf, base_name(child->name), &child->st, (off_t)at + 2, plus))
            break;
    }
    return 0;
}

static int ls_open(const char *path, struct fuse_file_info *fi)
{
    (void)path;
    (void)fi;
    return -EACCES;
}

int main(int argc, char *argv[])
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s ENTRIES MOUNTPOINT [fuse options]\n", argv[0]);
        return 2;
    }
    if (load(argv[1]) != 0)
        return 1;
    struct fuse_operations ops = {
        .init = ls_init,
        .getattr = ls_getattr,
        .readdir = ls_readdir,
        .open = ls_open,
    };
    argv[1] = argv[0];
    return fuse_main(argc - 1, argv + 1, &ops, NULL);
}
