/*
 * listing.c on libfuse3's low-level API: the same entries ("KIND SIZE PATH" lines of ENTRIES, each directory's
 * listed in that order with their attributes), the same configuration (inode numbers given, entries and attributes cached
 * for a day, readdirplus on every request), answered by inode number. libfuse then keeps no node table of its
 * own and no path per entry, and directories need no open (opendir answers ENOSYS: the kernel's no_opendir).
 * scripts/bench measures it beside listing.c to tell what the high-level API costs a listing (issue 24).
 *
 *   listing_ll ENTRIES MOUNTPOINT [-f] [-s] [-o ...]
 *
 * Build: gcc -O2 -Wall listing_ll.c $(pkg-config --cflags --libs fuse3) -o listing_ll
 */
#define FUSE_USE_VERSION 34
#define _GNU_SOURCE
#include <errno.h>
#include <fuse_lowlevel.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TIMEOUT 86400.0

#include "listing_entries.h"

static struct stat root_st = {.st_mode = S_IFDIR | 0555, .st_nlink = 1, .st_ino = FUSE_ROOT_ID};

static const struct stat *stat_of(fuse_ino_t ino)
{
    if (ino == FUSE_ROOT_ID)
        return &root_st;
    if (ino >= FIRST_INO && ino - FIRST_INO < count)
        return &entries[ino - FIRST_INO].st;
    return NULL;
}

static void ll_init(void *userdata, struct fuse_conn_info *conn)
{
    (void)userdata;
    conn->want |= conn->capable & FUSE_CAP_READDIRPLUS;
    conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;
}

static void ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    struct fuse_entry_param e = {.attr_timeout = TIMEOUT, .entry_timeout = TIMEOUT};
    const struct stat *folder = stat_of(parent);
    if (folder != NULL && S_ISDIR(folder->st_mode)) {
        char *joined = NULL;
        if (parent != FUSE_ROOT_ID && asprintf(&joined, "%s/%s", entries[parent - FIRST_INO].name, name) < 0)
            joined = NULL;
        struct entry *found = parent == FUSE_ROOT_ID ? find_relative(name) : joined ? find_relative(joined) : NULL;
        free(joined);
        if (found != NULL) {
            e.ino = found->st.st_ino;
            e.attr = found->st;
            fuse_reply_entry(req, &e);
            return;
        }
    }
    fuse_reply_err(req, ENOENT);
}

static void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)fi;
    const struct stat *st = stat_of(ino);
    if (st == NULL)
        fuse_reply_err(req, ENOENT);
    else
        fuse_reply_attr(req, st, TIMEOUT);
}

static void ll_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino;
    (void)fi;
    fuse_reply_err(req, ENOSYS);
}

static void list(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, int plus)
{
    const struct stat *st = stat_of(ino);
    if (st == NULL) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    if (!S_ISDIR(st->st_mode)) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    char *buf = malloc(size);
    size_t used = 0;
    /* As listing.c: entry i's offset is i + 3; "." and ".." are 1 and 2. */
    size_t at = off >= 3 ? next[off - 3] : ino == FUSE_ROOT_ID ? root_first : first[ino - FIRST_INO];
    for (off_t position = off < 2 ? off : 2; position < 2 || at;) {
        int dot = position < 2;
        const char *name = dot ? (position == 0 ? "." : "..") : base_name(entries[at - 1].name);
        const struct stat *entry_st = dot ? st : &entries[at - 1].st;
        off_t after = dot ? position + 1 : (off_t)at + 2;
        size_t need;
        if (plus) {
            struct fuse_entry_param e = {.attr_timeout = TIMEOUT, .entry_timeout = TIMEOUT, .attr = *entry_st};
            /* "." and ".." take no lookup reference: an entry of inode 0 is what tells the kernel so. */
            e.ino = dot ? 0 : entry_st->st_ino;
            need = fuse_add_direntry_plus(req, buf + used, size - used, name, &e, after);
        } else {
            need = fuse_add_direntry(req, buf + used, size - used, name, entry_st, after);
        }
        if (need > size - used)
            break;
        used += need;
        if (dot)
            position++;
        else
            at = next[at - 1];
    }
    fuse_reply_buf(req, buf, used);
    free(buf);
}

static void ll_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
    (void)fi;
    list(req, ino, size, off, 0);
}

static void ll_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
    (void)fi;
    list(req, ino, size, off, 1);
}

static void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino;
    (void)fi;
    fuse_reply_err(req, EACCES);
}

int main(int argc, char *argv[])
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s ENTRIES MOUNTPOINT [-f] [-s] [-o ...]\n", argv[0]);
        return 2;
    }
    if (load(argv[1]) != 0)
        return 1;
    argv[1] = argv[0];
    struct fuse_args args = FUSE_ARGS_INIT(argc - 1, argv + 1);
    struct fuse_cmdline_opts opts;
    if (fuse_parse_cmdline(&args, &opts) != 0 || opts.mountpoint == NULL) {
        fprintf(stderr, "usage: %s ENTRIES MOUNTPOINT [-f] [-s] [-o ...]\n", argv[0]);
        return 2;
    }
    struct fuse_lowlevel_ops ops = {
        .init = ll_init,
        .lookup = ll_lookup,
        .getattr = ll_getattr,
        .opendir = ll_opendir,
        .readdir = ll_readdir,
        .readdirplus = ll_readdirplus,
        .open = ll_open,
    };
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof(ops), NULL);
    int status = 1;
    if (se != NULL && fuse_set_signal_handlers(se) == 0) {
        if (fuse_session_mount(se, opts.mountpoint) == 0) {
            fuse_daemonize(opts.foreground);
            status = fuse_session_loop(se) != 0;
            fuse_session_unmount(se);
        }
        fuse_remove_signal_handlers(se);
    }
    if (se != NULL)
        fuse_session_destroy(se);
    free(opts.mountpoint);
    fuse_opt_free_args(&args);
    return status;
}
