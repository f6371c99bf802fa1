/* The compiled scanner's second part: a zip central directory read into rows (ckptfs/formats/zip_directory.py),
 * its storage records found by their keys' numbers and their data offsets computed (ckptfs/formats/zip_records.py).
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

#define MAX_KEY_DIGITS 18

/* The number of a name "<prefix>data/<n>" (prefix: the first name's, up to its first slash; n in decimal without
 * leading zeros, below count), else -1. */
static int64_t storage_number(const uint8_t *dir, const int64_t *row, int64_t prefix_len, const uint8_t *first,
                              int64_t count) {
    const uint8_t *name = dir + row[0];
    int64_t len = row[1], at = prefix_len + 5;
    if (len <= at || len - at > MAX_KEY_DIGITS) return -1;
    for (int64_t k = 0; k < prefix_len; k++)
        if (name[k] != first[k]) return -1;
    if (name[prefix_len] != 'd' || name[prefix_len + 1] != 'a' || name[prefix_len + 2] != 't' ||
        name[prefix_len + 3] != 'a' || name[prefix_len + 4] != '/')
        return -1;
    if (name[at] == '0' && len - at > 1) return -1;
    int64_t number = 0;
    for (int64_t k = at; k < len; k++) {
        if (name[k] < '0' || name[k] > '9') return -1;
        number = number * 10 + (name[k] - '0');
    }
    return number < count ? number : -1;
}

int64_t cs_directory_keys(const uint8_t *dir, const int64_t *rows, int64_t count, int64_t *number_of_row,
                          int64_t *row_of_number) {
    if (count <= 0) return -1;
    const uint8_t *first = dir + rows[0];
    int64_t prefix_len = 0;
    while (prefix_len < rows[1] && first[prefix_len] != '/') prefix_len++;
    if (prefix_len == 0 || prefix_len == rows[1]) return -1;
    prefix_len++;
    for (int64_t i = 0; i < count; i++) row_of_number[i] = -1;
    int64_t found = 0;
    for (int64_t i = 0; i < count; i++) {
        int64_t number = storage_number(dir, rows + i * CS_DIRECTORY_FIELDS, prefix_len, first, count);
        number_of_row[i] = number;
        if (number < 0) continue;
        if (row_of_number[number] >= 0) return -1;
        row_of_number[number] = i;
        found++;
    }
    return found;
}

void cs_data_offsets(const int64_t *rows, int64_t count, int64_t cd_offset, int64_t alignment,
                     int64_t *data_offset) {
    for (int64_t i = 0; i < count; i++) {
        const int64_t *row = rows + i * CS_DIRECTORY_FIELDS;
        int64_t name_len = row[1], flags = row[3], csize = row[4], header = row[6];
        int64_t next = i + 1 < count ? rows[(i + 1) * CS_DIRECTORY_FIELDS + 6] : cd_offset;
        int64_t start = header + LOCAL_HEADER + name_len + 4;
        int64_t predicted = start + (alignment - start % alignment) % alignment;
        int64_t trailer = next - predicted - csize;
        int fits = (flags & 8) ? (trailer == 12 || trailer == 16 || trailer == 20 || trailer == 24) : trailer == 0;
        data_offset[i] = predicted - header <= LOCAL_HEADER + name_len + 0xFFFF && fits ? predicted : -1;
    }
}
