/* Fuzzes the compiled scanner (ckptfs/pickle/_cscan*.c), built with
 * -fsanitize=address,undefined by tests/hostile/test_cscan.py: deterministic mutations of real data.pkl files, DCP
 * .metadata pickles, the hostile seeds' pickles and real zip central directories. Every input goes through the
 * pickle scanner, the DCP scanner and the directory reader.
 *
 *   cscan_fuzz ITERATIONS SEED_FILE...
 *
 * Half the mutants come from the seeds the scanner accepts as they are. Each input is copied into a buffer of its
 * exact size (ASan reports any read past it) and scanned under limits drawn from small and default ones; every
 * accepted scan's rows are checked to point inside the input and inside one another. Prints
 * "seeds S accepted A; mutants M accepted B" (accepted: by any reader) and exits 0, or 1 at the first broken row.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../ckptfs/pickle/_cscan.h"
#include "../xorshift.h"

typedef struct {
    uint8_t *data;
    int64_t len;
} input;

static int64_t below(int64_t n) { return n > 0 ? (int64_t)(next_random() % (uint64_t)n) : 0; }

static int fail(const char *what, int64_t row) {
    fprintf(stderr, "cscan_fuzz: broken row: %s (row %lld)\n", what, (long long)row);
    return 0;
}

static int inside(int64_t at, int64_t len, int64_t size) { return at >= 0 && len >= 0 && at + len <= size; }

/* The rows of an accepted scan point inside the input and inside one another. */
/* A storage row's key number against its text: -1, or the value of decimal digits without a leading zero. */
static int key_number_holds(const uint8_t *data, const int64_t *s) {
    char text[24];
    if (s[7] == -1) {
        if (s[3] > 18 || s[3] < 1) return 1;
        int64_t k = 0;
        while (k < s[3] && data[s[2] + k] >= '0' && data[s[2] + k] <= '9') k++;
        return k < s[3] || (data[s[2]] == '0' && s[3] > 1);
    }
    int n = snprintf(text, sizeof text, "%lld", (long long)s[7]);
    return s[7] >= 0 && n == s[3] && memcmp(text, data + s[2], (size_t)n) == 0;
}

static int rows_hold(const cs_result *r, const uint8_t *data, int64_t len) {
    if (r->end < 1 || r->end > len) return fail("end", 0);
    for (int64_t i = 0; i < r->storage_rows; i++) {
        const int64_t *s = r->storages + i * 8;
        if (!inside(s[0], s[1], len) || !inside(s[2], s[3], len) || !inside(s[4], s[5], len) || s[6] < 0 ||
            !key_number_holds(data, s))
            return fail("storage", i);
    }
    for (int64_t i = 0; i < r->tensor_rows; i++) {
        const int64_t *t = r->tensors + i * 8;
        if (t[0] < 0 || t[0] >= r->storage_rows || t[1] < 0 || !inside(t[2], t[3], r->pool_len) ||
            !inside(t[4], t[3], r->pool_len) || t[3] > 64 || (t[5] != 0 && t[5] != 1) || (t[6] != 0 && t[6] != 1) ||
            t[7] < 0)
            return fail("tensor", i);
    }
    for (int64_t i = 0; i < r->item_rows; i++) {
        const int64_t *it = r->items + i * 3;
        if (!inside(it[0], it[1], len) || it[2] < 0 || it[2] >= r->tensor_rows) return fail("item", i);
    }
    return 1;
}

static void mutate(uint8_t *buf, int64_t *len, int64_t cap, const input *seeds, int nseeds) {
    int64_t n = *len;
    switch (below(7)) {
    case 0: /* a bit */
        if (n) buf[below(n)] ^= (uint8_t)(1u << below(8));
        break;
    case 1: /* a byte */
        if (n) buf[below(n)] = (uint8_t)next_random();
        break;
    case 2: /* an interesting byte: opcodes and lengths the scanner reads */
        if (n) {
            static const uint8_t bytes[] = {0, 1, 2, 0x7f, 0x80, 0xff, '(', ')', '}', 't', 'u', 's', 'b', 'R', 'Q',
                                            'h', 'j', 'q', 'r', 'K', 'M', 'J', 'X', 'c', '.', 0x8a, 0x8c, 0x94};
            buf[below(n)] = bytes[below(sizeof bytes)];
        }
        break;
    case 3: /* cut the end */
        *len = below(n + 1);
        break;
    case 4: /* delete a span */
        if (n) {
            int64_t at = below(n), span = 1 + below(n - at < 16 ? n - at : 16);
            memmove(buf + at, buf + at + span, (size_t)(n - at - span));
            *len = n - span;
        }
        break;
    case 5: /* repeat a span (a record twice, a frame left open) */
        if (n) {
            int64_t at = below(n), span = 1 + below(n - at < 64 ? n - at : 64);
            if (n + span <= cap) {
                memmove(buf + at + span, buf + at, (size_t)(n - at));
                *len = n + span;
            }
        }
        break;
    default: { /* a span of another seed over this one */
        const input *other = &seeds[below(nseeds)];
        if (n && other->len) {
            int64_t from = below(other->len), span = 1 + below(other->len - from < 64 ? other->len - from : 64);
            int64_t at = below(n);
            if (at + span > n) span = n - at;
            memcpy(buf + at, other->data + from, (size_t)span);
        }
    }
    }
}

/* The rows of an accepted DCP scan point inside the input, the pool and one another. */
static int dcp_rows_hold(const cs_dcp_result *r, int64_t len) {
    static const int64_t widths[CS_DCP_TABLES] = CS_DCP_WIDTHS;
    int64_t rows[CS_DCP_TABLES];
    if (r->end < 1 || r->end > len) return fail("dcp end", 0);
    for (int t = 0; t < CS_DCP_TABLES; t++) {
        if (r->lens[t] < 0 || r->lens[t] % widths[t]) return fail("dcp table", t);
        rows[t] = r->lens[t] / widths[t];
    }
    const int64_t pool = r->lens[CS_DCP_POOL], *h = r->tables[CS_DCP_HEADER];
    if (rows[CS_DCP_HEADER] != 1 || (h[0] != -1 && !inside(h[0], h[1], len)) || (h[2] != 0 && h[2] != 1) ||
        (h[3] != 0 && h[3] != 1) || rows[CS_DCP_DIRECT] != (h[3] ? rows[CS_DCP_ITEMS] : 0))
        return fail("dcp header", 0);
    for (int64_t i = 0; i < rows[CS_DCP_ITEMS]; i++) {
        const int64_t *it = r->tables[CS_DCP_ITEMS] + i * 3;
        if (!inside(it[0], it[1], len) || it[2] < -1 || it[2] >= rows[CS_DCP_TENSORS]) return fail("dcp item", i);
    }
    for (int64_t i = 0; i < rows[CS_DCP_TENSORS]; i++) {
        const int64_t *t = r->tables[CS_DCP_TENSORS] + i * 7;
        if (!inside(t[0], t[1], len) || (t[2] != 0 && t[2] != 1) || !inside(t[3], t[4], pool) || t[4] > 64 ||
            !inside(t[5], t[6], rows[CS_DCP_CHUNKS]))
            return fail("dcp tensor", i);
        for (int64_t c = t[5]; c < t[5] + t[6]; c++) {
            const int64_t *k = r->tables[CS_DCP_CHUNKS] + c * 4;
            if (k[1] != t[4] || k[3] != t[4] || !inside(k[0], k[1], pool) || !inside(k[2], k[3], pool))
                return fail("dcp chunk", c);
        }
    }
    for (int64_t i = 0; i < rows[CS_DCP_PLANNER]; i++) {
        const int64_t *pl = r->tables[CS_DCP_PLANNER] + i * 4;
        if (!inside(pl[0], pl[1], len) || pl[3] < 1 || !inside(pl[2], pl[3], rows[CS_DCP_PATHS]))
            return fail("dcp planner", i);
    }
    for (int64_t i = 0; i < rows[CS_DCP_PATHS]; i++) {
        const int64_t *pa = r->tables[CS_DCP_PATHS] + i * 3;
        if ((pa[0] != 0 && pa[0] != 1) || (pa[0] == 0 && !inside(pa[1], pa[2], len))) return fail("dcp path", i);
    }
    for (int64_t i = 0; i < rows[CS_DCP_STORAGE]; i++) {
        const int64_t *st = r->tables[CS_DCP_STORAGE] + i * 8;
        if (!inside(st[0], st[1], len) || (st[2] != -1 && !inside(st[2], st[3], pool)) || st[3] > 64 ||
            !inside(st[4], st[5], len) || st[5] < 1 || st[6] < 0 || st[7] < 0)
            return fail("dcp storage", i);
    }
    for (int64_t i = 0; i < rows[CS_DCP_SHAPES]; i++) {
        const int64_t *sh = r->tables[CS_DCP_SHAPES] + i * 2;
        if (!inside(sh[0], sh[1], pool) || sh[1] > 64) return fail("dcp shape", i);
    }
    for (int t = CS_DCP_FILES; t <= CS_DCP_DTYPES; t++)
        for (int64_t i = 0; i < rows[t]; i++)
            if (!inside(r->tables[t][2 * i], r->tables[t][2 * i + 1], len)) return fail("dcp file or dtype", i);
    for (int64_t i = 0; i < rows[CS_DCP_DIRECT]; i++) {
        const int64_t *d = r->tables[CS_DCP_DIRECT] + i * CS_DCP_DIRECT_FIELDS, *it = r->tables[CS_DCP_ITEMS] + i * 3;
        if (d[0] != it[0] || d[1] != it[1]) return fail("dcp direct item", i);
        if (d[2] == -1) continue;
        if (it[2] < 0) return fail("dcp direct bytes item", i);
        const int64_t *t = r->tables[CS_DCP_TENSORS] + it[2] * 7;
        if (!inside(d[2], d[3], len) || d[4] < 0 || d[4] >= rows[CS_DCP_DTYPES] ||
            (d[5] != 0 && d[5] != 1) || d[6] < 0 || d[6] >= rows[CS_DCP_SHAPES] || d[7] < 0 ||
            d[7] >= rows[CS_DCP_SHAPES] || d[8] < 0 || d[8] >= rows[CS_DCP_FILES] || d[9] < 0 || d[10] < 0 ||
            r->tables[CS_DCP_SHAPES][2 * d[6] + 1] != t[4] || r->tables[CS_DCP_SHAPES][2 * d[7] + 1] != t[4])
            return fail("dcp direct", i);
    }
    return 1;
}

/* Numbers and data offsets of accepted rows: each number's row names it, and a computed data offset leaves room
 * for the local header before it and ends at or before the next record. */
static int directory_columns_hold(const uint8_t *exact, const int64_t *rows, int64_t count, int64_t cd_offset,
                                  int64_t in_order) {
    int64_t *numbers = malloc((size_t)(count ? count : 1) * 3 * sizeof(int64_t));
    if (!numbers) return 0;
    int64_t *row_of = numbers + count, *offsets = numbers + 2 * count;
    int ok = 1;
    int64_t found = cs_directory_keys(exact, rows, count, numbers, row_of);
    for (int64_t i = 0; ok && found >= 0 && i < count; i++) {
        if (numbers[i] < -1 || numbers[i] >= count || (numbers[i] >= 0 && row_of[numbers[i]] != i))
            ok = fail("directory numbers", i);
        if (row_of[i] < -1 || row_of[i] >= count || (row_of[i] >= 0 && numbers[row_of[i]] != i))
            ok = fail("directory rows of numbers", i);
    }
    static const int64_t alignments[] = {1, 64, 4096};
    for (int a = 0; ok && in_order && a < 3; a++) {
        cs_data_offsets(rows, count, cd_offset, alignments[a], offsets);
        for (int64_t i = 0; ok && i < count; i++) {
            const int64_t *r = rows + i * CS_DIRECTORY_FIELDS;
            int64_t next = i + 1 < count ? r[CS_DIRECTORY_FIELDS + 6] : cd_offset;
            if (offsets[i] != -1 && (offsets[i] < r[6] + 30 + r[1] || offsets[i] + r[4] > next))
                ok = fail("directory data offset", i);
        }
    }
    free(numbers);
    return ok;
}

/* The directory reader on the input, with the entry count its signatures suggest (and one more): accepted rows
 * must lie inside the input and below cd_offset. */
static int directory_once(const uint8_t *exact, int64_t len, int *accepted) {
    int64_t signatures = 0;
    for (int64_t i = 0; i + 4 <= len; i++)
        signatures += exact[i] == 'P' && exact[i + 1] == 'K' && exact[i + 2] == 1 && exact[i + 3] == 2;
    for (int64_t count = signatures; count <= signatures + 1; count++) {
        int64_t *rows = malloc((size_t)(count ? count : 1) * CS_DIRECTORY_FIELDS * sizeof(int64_t));
        int64_t in_order = -1, cd_offset = INT64_C(1) << 40;
        if (!rows) return 0;
        int status = cs_directory(exact, len, count, cd_offset, rows, &in_order);
        int ok = 1;
        if (status == CS_DONE) {
            *accepted = 1;
            for (int64_t i = 0; ok && i < count; i++) {
                const int64_t *r = rows + i * CS_DIRECTORY_FIELDS;
                if (!inside(r[0], r[1], len) || r[4] < 0 || r[5] < 0 || r[6] < 0 || r[6] + 30 + r[4] > cd_offset)
                    ok = fail("directory", i);
            }
            if (in_order != 0 && in_order != 1) ok = fail("directory order", 0);
            if (ok) ok = directory_columns_hold(exact, rows, count, cd_offset, in_order);
        } else if (status != CS_REFUSED) {
            ok = fail("directory status", status);
        }
        free(rows);
        if (!ok) return 0;
    }
    return 1;
}

static int scan_once(const uint8_t *src, int64_t len, int64_t max_memo, int64_t max_depth, int *accepted) {
    uint8_t *exact = malloc(len ? (size_t)len : 1);
    if (!exact) return 0;
    memcpy(exact, src, (size_t)len);
    cs_result r;
    int status = cs_scan(exact, len, max_memo, max_depth, &r);
    int ok = 1;
    if (status == CS_DONE) {
        *accepted = 1;
        ok = rows_hold(&r, exact, len);
        cs_free(&r);
    } else if (status != CS_REFUSED) {
        ok = fail("status", status);
    }
    if (ok) {
        cs_dcp_result d;
        status = cs_dcp(exact, len, max_memo, max_depth, &d);
        if (status == CS_DONE) {
            *accepted = 1;
            ok = dcp_rows_hold(&d, len);
            cs_dcp_free(&d);
        } else if (status != CS_REFUSED) {
            ok = fail("dcp status", status);
        }
    }
    if (ok) ok = directory_once(exact, len, accepted);
    free(exact);
    return ok;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: cscan_fuzz ITERATIONS SEED_FILE...\n");
        return 2;
    }
    long long iterations = atoll(argv[1]);
    int nseeds = argc - 2;
    input *seeds = calloc((size_t)nseeds, sizeof *seeds);
    int64_t longest = 0;
    for (int i = 0; i < nseeds; i++) {
        FILE *f = fopen(argv[i + 2], "rb");
        if (!f || fseek(f, 0, SEEK_END) || (seeds[i].len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
            fprintf(stderr, "cscan_fuzz: cannot read %s\n", argv[i + 2]);
            return 2;
        }
        seeds[i].data = malloc(seeds[i].len ? (size_t)seeds[i].len : 1);
        if (fread(seeds[i].data, 1, (size_t)seeds[i].len, f) != (size_t)seeds[i].len) return 2;
        fclose(f);
        if (seeds[i].len > longest) longest = seeds[i].len;
    }
    long long seeds_accepted = 0, mutants_accepted = 0;
    int *scanned = calloc((size_t)nseeds, sizeof *scanned); /* the seeds accepted unmutated: half the mutants' */
    for (int i = 0; i < nseeds; i++) {
        int accepted = 0;
        if (!scan_once(seeds[i].data, seeds[i].len, 10000000, 10000000, &accepted)) return 1;
        if (accepted) scanned[seeds_accepted++] = i;
    }
    int64_t cap = longest * 2 + 64;
    uint8_t *buf = malloc((size_t)cap);
    static const int64_t limits[] = {10000000, 10000000, 16, 17, 20, 24, 40, 100};
    for (long long k = 0; k < iterations; k++) {
        const input *seed = &seeds[seeds_accepted && below(2) ? scanned[below(seeds_accepted)] : below(nseeds)];
        int64_t len = seed->len;
        memcpy(buf, seed->data, (size_t)len);
        for (int64_t m = 1 + below(4); m > 0; m--) mutate(buf, &len, cap, seeds, nseeds);
        int accepted = 0;
        int64_t max_memo = limits[below(8)], max_depth = limits[below(8)];
        if (!scan_once(buf, len, max_memo, max_depth, &accepted)) {
            fprintf(stderr, "cscan_fuzz: at iteration %lld\n", k);
            return 1;
        }
        mutants_accepted += accepted;
    }
    printf("seeds %d accepted %lld; mutants %lld accepted %lld\n", nseeds, seeds_accepted, iterations,
           mutants_accepted);
    free(buf);
    for (int i = 0; i < nseeds; i++) free(seeds[i].data);
    free(seeds);
    free(scanned);
    return 0;
}
