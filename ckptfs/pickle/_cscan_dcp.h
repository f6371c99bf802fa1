/* The DCP scanner's own interface between its two parts (_cscan_dcp.c: the opcodes, _cscan_dcp_objects.c: what
 * the DCP classes' BUILDs, calls, appends and dict items make): its values, the scanner's state, shared helpers. */
#ifndef CKPTFS_CSCAN_DCP_H
#define CKPTFS_CSCAN_DCP_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_cscan.h"

enum kind { V_STR, V_INT, V_BOOL, V_NONE, V_GLOBAL, V_INTS, V_TUPLE, V_OBJ, V_DICT, V_LIST, V_SIZE, V_PROPS,
            V_CHUNK, V_TENSOR, V_INDEX, V_INFO, V_ROOT };
enum global { G_METADATA, G_TENSOR, G_PROPS, G_CHUNK, G_INDEX, G_INFO, G_BYTES, G_SIZE, G_DTYPE, G_OTHER };
enum role { R_EMPTY, R_ATTR, R_ITEMS, R_PLANNER, R_STORAGE };

typedef struct {
    int64_t a;        /* V_STR, V_GLOBAL (a dtype's name): offset; V_INT, V_BOOL: value; V_INTS: pool offset; V_TUPLE:
                         offset in items; V_DICT, V_LIST: number; V_SIZE: pool offset; V_PROPS: dtype name offset;
                         V_CHUNK, V_TENSOR, V_INDEX, V_INFO: row */
    int32_t b;        /* a length, a count or a rank (longer strings and tuples are refused) */
    uint8_t kind, sub; /* sub: V_GLOBAL, V_OBJ: its global; V_PROPS: requires_grad */
} value;
#define VAL(k, s, x, y) ((value){.a = (x), .b = (int32_t)(y), .kind = (uint8_t)(k), .sub = (uint8_t)(s)})
#define MAX_COUNT INT32_MAX

typedef struct {
    void *data;
    int64_t len, cap; /* in items */
} vec;

typedef struct {
    const uint8_t *p;
    int64_t n, pos, max_memo, max_depth;
    vec stack, memo, items, entries; /* of values; items: the generic tuples' */
    int64_t frames[8];
    int64_t nframes;
    vec dicts;  /* 3 int64 per dict: role, first entry, entries (attribute dicts' pairs in entries) */
    vec lists;  /* 2 int64 per list: first chunk row (-1: none yet), chunks */
    vec index, info; /* 4 int64 per MetadataIndex (fqn offset, length, offset's pool offset or -1, rank) and
                        _StorageInfo (path offset, length, offset, length) */
    vec out[CS_DCP_TABLES];
    int64_t role_dict[5]; /* the one dict of each role but R_ATTR, or -1 */
    int roots;
} scanner;

#define MAX_FRAMES 8
#define MAX_RANK 64
#define LIMIT_62 (INT64_C(1) << 62)
#define V(s) ((value *)(s)->stack.data)
#define I64(v) ((int64_t *)(v).data)

static inline int grow(vec *v, int64_t need, size_t item) {
    if (need <= v->cap) return 1;
    int64_t cap = v->cap ? v->cap : 64;
    while (cap < need) cap *= 2;
    void *grown = realloc(v->data, (size_t)cap * item);
    if (!grown) return 0;
    v->data = grown;
    v->cap = cap;
    return 1;
}

static inline int put(vec *v, const int64_t *row, int64_t width) {
    if (!grow(v, v->len + width, sizeof(int64_t))) return 0;
    memcpy(I64(*v) + v->len, row, (size_t)width * sizeof(int64_t));
    v->len += width;
    return 1;
}

static inline int put_value(vec *v, value x) {
    if (!grow(v, v->len + 1, sizeof(value))) return 0;
    ((value *)v->data)[v->len++] = x;
    return 1;
}

static inline int64_t base(const scanner *s) { return s->nframes ? s->frames[s->nframes - 1] : 0; }

static inline int push(scanner *s, value v) {
    if (s->stack.len - base(s) + 2 >= s->max_depth) return 0; /* one short of the reference's limit */
    return put_value(&s->stack, v);
}

static inline int need(const scanner *s, int64_t k) { return s->pos + k <= s->n; }

static inline uint32_t u32(const uint8_t *q) {
    return (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
}

static inline int is(const scanner *s, value v, const char *text) {
    int64_t len = (int64_t)strlen(text);
    return v.kind == V_STR && v.b == len && memcmp(s->p + v.a, text, (size_t)len) == 0;
}

/* _cscan_dcp_objects.c */
int dcp_build(scanner *s);
int dcp_call(scanner *s, int newobj);
int dcp_append(scanner *s, int64_t from, int64_t target);
int dcp_set_items(scanner *s, int64_t from, int64_t target);
/* _cscan_dcp_join.c */
int dcp_join(scanner *s);
#endif
