/*
 * Minimal pass-through FUSE filesystem on libfuse3, used by scripts/bench as the limit of
 * the kernel's FUSE path: it exposes ONE file, /NAME, whose bytes are [OFFSET,
 * OFFSET+LENGTH) of SOURCE, answered with pread or with a file-descriptor buffer
 * (read_buf, FUSE_BUF_IS_FD|FUSE_BUF_FD_SEEK: no copy through this program).
 *
 *   passthrough SOURCE OFFSET LENGTH NAME MODE MOUNTPOINT [fuse options: -f -s -o ...]
 *     MODE  buf   answer reads with read_buf (fd buffer; libfuse preads/splices it)
 *           read  answer reads with pread into a buffer
 *           write as read, and take writes: each a pwrite into SOURCE at OFFSET + its offset
 *                 (EFBIG past LENGTH), fsync an fsync of SOURCE, no page cache kept between
 *                 opens and 1 MiB write requests, as a `ckptfs mount -o rw` (the write-fill floor)
 *
 * The kernel page cache is kept (kernel_cache => FOPEN_KEEP_CACHE), attributes and
 * entries are cached for a day, and glibc's malloc is pinned to the heap (fixed mmap
 * and trim thresholds) so 1 MiB request buffers do not each get a fresh mmap.
 * Files belong to the source's owner, as ckptfs's do: the kernel's mincore() shows the
 * page cache of a file only to its owner (or to whom may write it, or root) and says
 * "all resident" to anyone else, which would blind the benchmark's residency check.
 * Build: gcc -O2 -Wall passthrough.c $(pkg-config --cflags --libs fuse3) -o passthrough
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int src_fd = -1;
static off_t base_off;
static off_t file_len;
static char file_path[512];
static int use_buf = 1;
static int writable;
static unsigned max_read_opt; /* -o max_read=N, which libfuse wants repeated in init() */
static uid_t src_uid;
static gid_t src_gid;

static void *pt_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
    if (max_read_opt)
        conn->max_read = max_read_opt;
    cfg->kernel_cache = !writable;
    if (writable)
        conn->max_write = 1 << 20;
    cfg->entry_timeout = 86400.0;
    cfg->attr_timeout = 86400.0;
    cfg->negative_timeout = 86400.0;
    cfg->use_ino = 1;
    return NULL;
}

static int pt_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
    (void)fi;
    memset(st, 0, sizeof(*st));
    st->st_uid = src_uid;
    st->st_gid = src_gid;
    if (strcmp(path, "/") == 0) {
        st->st_mode = S_IFDIR | 0555;
        st->st_nlink = 2;
        st->st_ino = 1;
        return 0;
    }
    if (strcmp(path, file_path) == 0) {
        st->st_mode = S_IFREG | (writable ? 0644 : 0444);
        st->st_nlink = 1;
        st->st_ino = 2;
        st->st_size = file_len;
        st->st_blksize = 1 << 20;
        st->st_blocks = (file_len + 511) / 512;
        return 0;
    }
    return -ENOENT;
}

static int pt_readdir(const char *path, void *buf, fuse_fill_dir_t filler, off_t off,
                      struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
    (void)off;
    (void)fi;
    (void)flags;
    if (strcmp(path, "/") != 0)
        return -ENOENT;
    filler(buf, ".", NULL, 0, 0);
    filler(buf, "..", NULL, 0, 0);
    filler(buf, file_path + 1, NULL, 0, 0);
    return 0;
}

static int pt_open(const char *path, struct fuse_file_info *fi)
{
    if (strcmp(path, file_path) != 0)
        return -ENOENT;
    if ((fi->flags & O_ACCMODE) != O_RDONLY && !writable)
        return -EROFS;
    fi->keep_cache = !writable;
    return 0;
}

static size_t clamp(size_t size, off_t off)
{
    if (off >= file_len)
        return 0;
    if ((off_t)size > file_len - off)
        size = (size_t)(file_len - off);
    return size;
}

static int pt_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
    (void)path;
    (void)fi;
    size = clamp(size, off);
    size_t done = 0;
    while (done < size) {
        ssize_t n = pread(src_fd, buf + done, size - done, base_off + off + (off_t)done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (n == 0)
            break;
        done += (size_t)n;
    }
    return (int)done;
}

static int pt_read_buf(const char *path, struct fuse_bufvec **bufp, size_t size, off_t off,
                       struct fuse_file_info *fi)
{
    (void)path;
    (void)fi;
    struct fuse_bufvec *src = malloc(sizeof(*src));
    if (src == NULL)
        return -ENOMEM;
    *src = FUSE_BUFVEC_INIT(clamp(size, off));
    src->buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK | FUSE_BUF_FD_RETRY;
    src->buf[0].fd = src_fd;
    src->buf[0].pos = base_off + off;
    *bufp = src;
    return 0;
}

static int pt_write(const char *path, const char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
    (void)path;
    (void)fi;
    if (off < 0 || off + (off_t)size > file_len)
        return -EFBIG;
    size_t done = 0;
    while (done < size) {
        ssize_t n = pwrite(src_fd, buf + done, size - done, base_off + off + (off_t)done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        done += (size_t)n;
    }
    return (int)done;
}

static int pt_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
    (void)path;
    (void)datasync;
    (void)fi;
    return fsync(src_fd) == 0 ? 0 : -errno;
}

static int pt_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
    (void)path;
    (void)fi;
    return size == file_len ? 0 : -EROFS;
}

int main(int argc, char *argv[])
{
    if (argc < 7) {
        fprintf(stderr, "usage: %s SOURCE OFFSET LENGTH NAME buf|read MOUNTPOINT [fuse options]\n", argv[0]);
        return 2;
    }
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 << 20);
    writable = strcmp(argv[5], "write") == 0;
    src_fd = open(argv[1], (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (src_fd < 0) {
        perror(argv[1]);
        return 1;
    }
    struct stat src_st;
    if (fstat(src_fd, &src_st) != 0) {
        perror(argv[1]);
        return 1;
    }
    src_uid = src_st.st_uid;
    src_gid = src_st.st_gid;
    base_off = strtoll(argv[2], NULL, 10);
    file_len = strtoll(argv[3], NULL, 10);
    snprintf(file_path, sizeof(file_path), "/%s", argv[4]);
    if (strcmp(argv[5], "buf") == 0)
        use_buf = 1;
    else if (strcmp(argv[5], "read") == 0 || writable)
        use_buf = 0;
    else {
        fprintf(stderr, "MODE must be buf, read or write\n");
        return 2;
    }
    struct fuse_operations ops = {
        .init = pt_init,
        .getattr = pt_getattr,
        .readdir = pt_readdir,
        .open = pt_open,
    };
    if (use_buf)
        ops.read_buf = pt_read_buf;
    else
        ops.read = pt_read;
    if (writable) {
        ops.write = pt_write;
        ops.fsync = pt_fsync;
        ops.truncate = pt_truncate;
    }
    /* argv for fuse_main: program name, mountpoint, then the remaining options */
    int fargc = argc - 5;
    char **fargv = calloc((size_t)fargc + 1, sizeof(char *));
    fargv[0] = argv[0];
    for (int i = 6; i < argc; i++) {
        fargv[i - 5] = argv[i];
        const char *mr = strstr(argv[i], "max_read=");
        if (mr)
            max_read_opt = (unsigned)strtoul(mr + 9, NULL, 10);
    }
    return fuse_main(fargc, fargv, &ops, NULL);
}
