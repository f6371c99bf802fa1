/* The compiled scanner's second part: a zip central directory read into rows (ckptfs/formats/zip_directory.py).
 *
 * It accepts only a directory ZipArchive._parse_directory reads without an error of its own, but for duplicate
 * names (which the rows' reader checks), and without zip64 fields or names other than ASCII: anything else makes
 * it return CS_REFUSED and the Python loop reads the directory, raising what it raises. */
#include <stdint.h>

#include "_cscan.h"

#define CD_HEADER 46
#define LOCAL_HEADER 30
#define U32 INT64_C(0xFFFFFFFF)

static int64_t le16(const uint8_t *q) { return (int64_t)q[0] | (int64_t)q[1] << 8; }

static int64_t le32(const uint8_t *q) {
    return (int64_t)q[0] | (int64_t)q[1] << 8 | (int64_t)q[2] << 16 | (int64_t)q[3] << 24;
}

int cs_directory(const uint8_t *dir, int64_t size, int64_t count, int64_t cd_offset, int64_t *rows,
                 int64_t *in_order) {
    int64_t pos = 0, last = -1;
    *in_order = 1;
    if (count < 0 || count > size / CD_HEADER) return CS_REFUSED;
    for (int64_t i = 0; i < count; i++) {
        int64_t start = pos + CD_HEADER;
        if (start > size) return CS_REFUSED;
        const uint8_t *h = dir + pos;
        if (h[0] != 'P' || h[1] != 'K' || h[2] != 1 || h[3] != 2) return CS_REFUSED;
        int64_t flags = le16(h + 8), method = le16(h + 10), crc = le32(h + 16), csize = le32(h + 20);
        int64_t usize = le32(h + 24), name_len = le16(h + 28), offset = le32(h + 42);
        pos = start + name_len + le16(h + 30) + le16(h + 32);
        if (pos > size) return CS_REFUSED;
        if (usize == U32 || csize == U32 || offset == U32 || (flags & 1) || (method == 0 && csize != usize))
            return CS_REFUSED;
        for (int64_t k = 0; k < name_len; k++)
            if (dir[start + k] & 0x80) return CS_REFUSED;
        if (offset + LOCAL_HEADER + csize > cd_offset) return CS_REFUSED;
        if (offset <= last) *in_order = 0;
        last = offset;
        int64_t *row = rows + i * CS_DIRECTORY_FIELDS;
        row[0] = start;
        row[1] = name_len;
        row[2] = method;
        row[3] = flags;
        row[4] = csize;
        row[5] = usize;
        row[6] = offset;
        row[7] = crc;
    }
    return pos == size ? CS_DONE : CS_REFUSED;
}
