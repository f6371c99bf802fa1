/* A listing's entries added to a readdir reply buffer by a loop in C: one call per request instead of one
 * ctypes call per entry (``fuse.dirents`` loads it; without it the same loop runs in Python).
 *
 * The entries are formatted by libfuse's own ``fuse_add_direntry`` or ``fuse_add_direntry_plus`` (``add``):
 * this file only walks a window of entries, never writes into the buffer itself. No Python.h: plain C, loaded
 * with ctypes. */

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef size_t (*add_entry_fn)(void *req, char *buf, size_t bufsize, const char *name, const void *entry,
                               int64_t off);

/* Adds entries ``first`` to ``count - 1`` of a window until ``buf`` (``size`` bytes, ``used`` of them taken) is
 * full: the names are NUL-terminated one after another in ``names``, entry ``i``'s ``fuse_entry_param`` (or
 * ``struct stat``) is at ``entries + i * stride``, its offset (where the next listing request starts) ``start + i +
 * 1``. Returns the bytes taken in all; ``*next`` is the first entry not added. */
size_t cd_add_entries(add_entry_fn add, void *req, char *buf, size_t size, size_t used, const char *names,
                      const char *entries, size_t stride, int64_t start, int64_t first, int64_t count,
                      int64_t *next) {
    const char *name = names;
    for (int64_t i = 0; i < first; i++)
        name += strlen(name) + 1;
    int64_t i = first;
    for (; i < count && used <= size; i++) {
        size_t need = add(req, buf + used, size - used, name, entries + (size_t)i * stride, start + i + 1);
        if (need > size - used)
            break;
        used += need;
        name += strlen(name) + 1;
    }
    *next = i;
    return used;
}
