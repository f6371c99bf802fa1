/* The compiled scanner's third part: a torch.distributed.checkpoint .metadata pickle (FileSystemWriter.finish's
 * pickle.dump(Metadata)) read into rows (ckptfs/formats/dcp_columns.py), a typed stack machine like _cscan.c.
 *
 * It accepts only torch's form: a Metadata object whose state is a dict of a state_dict_metadata dict (str keys,
 * TensorStorageMetadata with TensorProperties' 5-tuple state, torch.Size and a list of ChunkStorageMetadata, or a
 * BytesStorageMetadata), a planner_data dict (str keys, tuples of str and int) or None, a storage_data dict
 * (MetadataIndex keys, _StorageInfo values without transforms) and other attributes of inert values; ASCII strings
 * only; memo gets of strings, globals, scalars, tuples of ints, sizes and inert objects only. Anything else, and
 * any input on which the reference interpreter or dcp_metadata's checks would raise, makes it return CS_REFUSED:
 * the pure-Python paths then parse the same bytes and their value or error is the answer. Limits are passed in and
 * it refuses before reaching them.
 */
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

static int grow(vec *v, int64_t need, size_t item) {
    if (need <= v->cap) return 1;
    int64_t cap = v->cap ? v->cap : 64;
    while (cap < need) cap *= 2;
    void *grown = realloc(v->data, (size_t)cap * item);
    if (!grown) return 0;
    v->data = grown;
    v->cap = cap;
    return 1;
}

static int put(vec *v, const int64_t *row, int64_t width) {
    if (!grow(v, v->len + width, sizeof(int64_t))) return 0;
    memcpy(I64(*v) + v->len, row, (size_t)width * sizeof(int64_t));
    v->len += width;
    return 1;
}

static int put_value(vec *v, value x) {
    if (!grow(v, v->len + 1, sizeof(value))) return 0;
    ((value *)v->data)[v->len++] = x;
    return 1;
}

static int64_t base(const scanner *s) { return s->nframes ? s->frames[s->nframes - 1] : 0; }

static int push(scanner *s, value v) {
    if (s->stack.len - base(s) + 2 >= s->max_depth) return 0; /* one short of the reference's limit */
    return put_value(&s->stack, v);
}

static int need(const scanner *s, int64_t k) { return s->pos + k <= s->n; }

static uint32_t u32(const uint8_t *q) {
    return (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
}

static int is(const scanner *s, value v, const char *text) {
    int64_t len = (int64_t)strlen(text);
    return v.kind == V_STR && v.b == len && memcmp(s->p + v.a, text, (size_t)len) == 0;
}

static int new_container(scanner *s, vec *table, int64_t width, int kind) {
    int64_t row[3] = {kind == V_DICT ? R_EMPTY : -1, 0, 0};
    if (!put(table, row, width)) return 0;
    return push(s, VAL(kind, 0, table->len / width - 1, 0));
}

static int memo_put(scanner *s, int64_t index) {
    if (s->stack.len <= base(s) || index != s->memo.len || s->memo.len + 2 > s->max_memo) return 0;
    return put_value(&s->memo, V(s)[s->stack.len - 1]);
}

static int memo_get(scanner *s, int64_t index) {
    if (index < 0 || index >= s->memo.len) return 0;
    value v = ((value *)s->memo.data)[index];
    /* An inert object (torch's layout and memory format) is got again: only ever read as any value, no BUILD. */
    if (v.kind == V_OBJ && v.sub == G_OTHER) v.a = 1;
    else if (v.kind != V_STR && v.kind != V_GLOBAL && v.kind != V_INT && v.kind != V_BOOL && v.kind != V_NONE &&
             v.kind != V_INTS && v.kind != V_SIZE) /* immutable: a torch.Size is got again as a chunk's */
        return 0;
    return push(s, v);
}

/* A global's kind by its module and name (strings), pushed as the reference's inert Global. */
static int push_global(scanner *s, value module, value name) {
    static const char *const names[] = {"Metadata", "TensorStorageMetadata", "TensorProperties",
                                        "ChunkStorageMetadata", "MetadataIndex"};
    int g = G_OTHER;
    if (is(s, module, "torch.distributed.checkpoint.metadata")) {
        for (int i = 0; i < 5; i++)
            if (is(s, name, names[i])) g = i;
        if (is(s, name, "BytesStorageMetadata")) g = G_BYTES;
    } else if (is(s, module, "torch.distributed.checkpoint.filesystem") && is(s, name, "_StorageInfo")) {
        g = G_INFO;
    } else if (is(s, module, "torch")) {
        g = is(s, name, "Size") ? G_SIZE : G_DTYPE;
    }
    return push(s, VAL(V_GLOBAL, g, name.a, name.b));
}

static int stack_global(scanner *s) {
    if (s->stack.len - base(s) < 2) return 0;
    value module = V(s)[s->stack.len - 2], name = V(s)[s->stack.len - 1];
    if (module.kind != V_STR || name.kind != V_STR) return 0;
    s->stack.len -= 2;
    return push_global(s, module, name);
}

/* A line of GLOBAL's argument, ASCII (the reference decodes it with errors replaced). */
static int line(scanner *s, value *text) {
    int64_t start = s->pos;
    while (s->pos < s->n && s->p[s->pos] != '\n')
        if (s->p[s->pos++] & 0x80) return 0;
    if (s->pos >= s->n || s->pos - start > MAX_COUNT) return 0;
    *text = VAL(V_STR, 0, start, s->pos++ - start);
    return 1;
}

static int text_global(scanner *s) {
    value module, name;
    return line(s, &module) && line(s, &name) && push_global(s, module, name);
}

/* TUPLE over the values from `from` on: ints into the pool, anything else into items. */
static int make_tuple(scanner *s, int64_t from) {
    int64_t count = s->stack.len - from;
    value made;
    if (count > MAX_COUNT) return 0;
    if (!count) {
        s->stack.len = from;
        return push(s, VAL(V_INTS, 0, 0, 0));
    }
    value *v = V(s) + from;
    int ints = 1;
    for (int64_t i = 0; i < count; i++) ints &= v[i].kind == V_INT;
    if (ints) {
        if (!grow(&s->out[CS_DCP_POOL], s->out[CS_DCP_POOL].len + count, sizeof(int64_t))) return 0;
        for (int64_t i = 0; i < count; i++) I64(s->out[CS_DCP_POOL])[s->out[CS_DCP_POOL].len + i] = v[i].a;
        made = VAL(V_INTS, 0, s->out[CS_DCP_POOL].len, count);
        s->out[CS_DCP_POOL].len += count;
    } else {
        made = VAL(V_TUPLE, 0, s->items.len, count);
        for (int64_t i = 0; i < count; i++)
            if (!put_value(&s->items, v[i])) return 0;
    }
    s->stack.len = from;
    return push(s, made);
}

/* An attribute dict's value for a name, once at most; its kind when found, -1 when absent, -2 when twice. */
static int attr(const scanner *s, int64_t dict, const char *name, value *found) {
    const int64_t *d = I64(s->dicts) + dict * 3;
    const value *e = (const value *)s->entries.data + d[1] * 2;
    int kind = -1;
    for (int64_t i = 0; i < d[2]; i++)
        if (is(s, e[2 * i], name)) {
            if (kind != -1) return -2;
            *found = e[2 * i + 1];
            kind = found->kind;
        }
    return kind;
}

/* Whether an attribute dict has no names but these (each at most once: attr finds twice). */
static int only(const scanner *s, int64_t dict, const char *const *names, int count) {
    const int64_t *d = I64(s->dicts) + dict * 3;
    const value *e = (const value *)s->entries.data + d[1] * 2;
    for (int64_t i = 0; i < d[2]; i++) {
        int known = 0;
        for (int k = 0; k < count; k++) known |= is(s, e[2 * i], names[k]);
        if (!known) return 0;
    }
    return 1;
}

static int build_tensor(scanner *s, int64_t dict, value *made) {
    static const char *const names[] = {"properties", "size", "chunks"};
    value props, size, chunks;
    if (!only(s, dict, names, 3) || attr(s, dict, "properties", &props) != V_PROPS ||
        attr(s, dict, "size", &size) != V_SIZE || attr(s, dict, "chunks", &chunks) != V_LIST)
        return 0;
    const int64_t *list = I64(s->lists) + chunks.a * 2, *pool = I64(s->out[CS_DCP_POOL]);
    /* dcp_records' checks: fewer elements than int64 holds, each chunk of the tensor's rank and inside it */
    __int128 numel = 1;
    for (int64_t i = 0; i < size.b && numel; i++)
        if ((numel *= pool[size.a + i]) >= LIMIT_62) return 0;
    for (int64_t c = list[0]; c >= 0 && c < list[0] + list[1]; c++) {
        const int64_t *chunk = I64(s->out[CS_DCP_CHUNKS]) + c * 4;
        if (chunk[1] != size.b || chunk[3] != size.b) return 0;
        for (int64_t i = 0; i < size.b; i++)
            if (pool[chunk[0] + i] + pool[chunk[2] + i] > pool[size.a + i]) return 0;
    }
    int64_t row[7] = {props.a, props.b, props.sub, size.a, size.b, list[0] < 0 ? 0 : list[0], list[1]};
    if (!put(&s->out[CS_DCP_TENSORS], row, 7)) return 0;
    *made = VAL(V_TENSOR, 0, s->out[CS_DCP_TENSORS].len / 7 - 1, 0);
    return 1;
}

static int build_chunk(scanner *s, int64_t dict, value *made) {
    static const char *const names[] = {"offsets", "sizes"};
    value offsets, sizes;
    if (!only(s, dict, names, 2) || attr(s, dict, "offsets", &offsets) != V_SIZE ||
        attr(s, dict, "sizes", &sizes) != V_SIZE)
        return 0;
    int64_t row[4] = {offsets.a, offsets.b, sizes.a, sizes.b};
    if (!put(&s->out[CS_DCP_CHUNKS], row, 4)) return 0;
    *made = VAL(V_CHUNK, 0, s->out[CS_DCP_CHUNKS].len / 4 - 1, 0);
    return 1;
}

static int build_index(scanner *s, int64_t dict, value *made) {
    static const char *const names[] = {"fqn", "offset", "index"};
    value fqn, offset, index;
    int has_offset = attr(s, dict, "offset", &offset), has_index = attr(s, dict, "index", &index);
    if (!only(s, dict, names, 3) || attr(s, dict, "fqn", &fqn) != V_STR || has_index == -2 ||
        (has_offset != -1 && has_offset != V_NONE && has_offset != V_SIZE))
        return 0;
    int64_t row[4] = {fqn.a, fqn.b, has_offset == V_SIZE ? offset.a : -1, has_offset == V_SIZE ? offset.b : 0};
    if (!put(&s->index, row, 4)) return 0;
    *made = VAL(V_INDEX, 0, s->index.len / 4 - 1, 0);
    return 1;
}

static int build_info(scanner *s, int64_t dict, value *made) {
    static const char *const names[] = {"relative_path", "offset", "length", "transform_descriptors"};
    value path, offset, length, transforms;
    int has_transforms = attr(s, dict, "transform_descriptors", &transforms);
    if (!only(s, dict, names, 4) || attr(s, dict, "relative_path", &path) != V_STR ||
        attr(s, dict, "offset", &offset) != V_INT || attr(s, dict, "length", &length) != V_INT ||
        (has_transforms != -1 && has_transforms != V_NONE) || offset.a < 0 || length.a < 0 || !path.b ||
        is(s, path, ".") || is(s, path, ".."))
        return 0;
    for (int64_t i = 0; i < path.b; i++)
        if (s->p[path.a + i] == '/' || s->p[path.a + i] == '\\' || s->p[path.a + i] == 0) return 0;
    int64_t row[4] = {path.a, path.b, offset.a, length.a};
    if (!put(&s->info, row, 4)) return 0;
    *made = VAL(V_INFO, 0, s->info.len / 4 - 1, 0);
    return 1;
}

/* A field of the root that must be the one dict of a role, or empty: 1; None or absent (planner_data): 2; else 0. */
static int role_field(scanner *s, int64_t dict, const char *name, int role, int may_be_none) {
    value v;
    int kind = attr(s, dict, name, &v);
    if (may_be_none && (kind == -1 || kind == V_NONE)) return s->role_dict[role] < 0 ? 2 : 0;
    if (kind != V_DICT) return 0;
    int64_t r = I64(s->dicts)[v.a * 3];
    return (r == role && s->role_dict[role] == v.a) || (r == R_EMPTY && s->role_dict[role] < 0);
}

static int build_root(scanner *s, int64_t dict) {
    value version;
    int planner = role_field(s, dict, "planner_data", R_PLANNER, 1);
    if (s->roots++ || !role_field(s, dict, "state_dict_metadata", R_ITEMS, 0) ||
        !role_field(s, dict, "storage_data", R_STORAGE, 0) || !planner)
        return 0;
    int has_version = attr(s, dict, "version", &version);
    if (has_version == -2) return 0;
    int64_t header[3] = {has_version == V_STR ? version.a : -1, has_version == V_STR ? version.b : -1, planner == 1};
    return put(&s->out[CS_DCP_HEADER], header, 3);
}

static int build(scanner *s) {
    if (s->stack.len - base(s) < 2) return 0;
    value state = V(s)[s->stack.len - 1], *target = &V(s)[s->stack.len - 2], made = VAL(V_OBJ, G_OTHER, 0, 0);
    if (target->kind != V_OBJ || target->a) return 0;
    if (target->sub == G_PROPS) {
        if (state.kind != V_TUPLE || state.b != 5) return 0;
        const value *t = (const value *)s->items.data + state.a;
        if (t[0].kind != V_GLOBAL || t[0].sub != G_DTYPE || t[2].kind != V_BOOL) return 0;
        made = VAL(V_PROPS, t[2].a, t[0].a, t[0].b);
    } else {
        if (state.kind != V_DICT) return 0;
        int64_t dict = state.a, role = I64(s->dicts)[dict * 3];
        if (role != R_ATTR && role != R_EMPTY) return 0;
        int ok = 1;
        switch (target->sub) {
        case G_TENSOR: ok = build_tensor(s, dict, &made); break;
        case G_CHUNK: ok = build_chunk(s, dict, &made); break;
        case G_INDEX: ok = build_index(s, dict, &made); break;
        case G_INFO: ok = build_info(s, dict, &made); break;
        case G_METADATA: ok = build_root(s, dict); made = VAL(V_ROOT, 0, 0, 0); break;
        case G_OTHER: made.a = 1; break; /* an inert object with its state */
        case G_BYTES: made = *target; break; /* a bytes item is None whatever its state */
        default: ok = 0;
        }
        if (!ok) return 0;
    }
    s->stack.len -= 1;
    *target = made;
    return 1;
}

static int call(scanner *s, int newobj) {
    if (s->stack.len - base(s) < 2) return 0;
    value func = V(s)[s->stack.len - 2], args = V(s)[s->stack.len - 1], made = VAL(V_OBJ, G_OTHER, 0, 0);
    if (func.kind != V_GLOBAL || (args.kind != V_TUPLE && args.kind != V_INTS)) return 0;
    if (newobj) {
        if (args.kind != V_INTS || args.b != 0) return 0;
        if (func.sub < G_SIZE) made.sub = func.sub;
    } else if (func.sub == G_SIZE) {
        if (args.kind != V_TUPLE || args.b != 1) return 0;
        const value *inner = (const value *)s->items.data + args.a;
        if (inner->kind != V_INTS || inner->b > MAX_RANK) return 0;
        for (int64_t i = 0; i < inner->b; i++) {
            int64_t d = I64(s->out[CS_DCP_POOL])[inner->a + i];
            if (d < 0 || d >= LIMIT_62) return 0;
        }
        made = VAL(V_SIZE, 0, inner->a, inner->b);
    } else if (func.sub < G_SIZE) {
        return 0; /* a call of a DCP class: not torch's form */
    }
    s->stack.len -= 1;
    V(s)[s->stack.len - 1] = made;
    return 1;
}

static int append(scanner *s, int64_t from, int64_t target) {
    if (target < 0 || V(s)[target].kind != V_LIST) return 0;
    int64_t *list = I64(s->lists) + V(s)[target].a * 2;
    for (int64_t i = from; i < s->stack.len; i++) {
        value v = V(s)[i];
        if (v.kind != V_CHUNK) return 0;
        if (list[0] < 0) list[0] = v.a;
        if (v.a != list[0] + list[1]) return 0; /* a tensor's chunks are rows in a run */
        list[1]++;
    }
    s->stack.len = from;
    return 1;
}

static int role_of(value key, value v) {
    if (key.kind == V_INDEX) return v.kind == V_INFO ? R_STORAGE : -1;
    if (key.kind != V_STR) return -1;
    if (v.kind == V_TENSOR || (v.kind == V_OBJ && v.sub == G_BYTES && !v.a)) return R_ITEMS;
    if (v.kind == V_TUPLE || v.kind == V_INTS) return R_PLANNER;
    if (v.kind == V_INFO || v.kind == V_INDEX || v.kind == V_CHUNK || v.kind == V_ROOT) return -1;
    return R_ATTR;
}

static int set_items(scanner *s, int64_t from, int64_t target) {
    if (target < 0 || V(s)[target].kind != V_DICT || (s->stack.len - from) % 2) return 0;
    int64_t dict = V(s)[target].a, *d = I64(s->dicts) + dict * 3;
    for (int64_t i = from; i < s->stack.len; i += 2) {
        value key = V(s)[i], v = V(s)[i + 1];
        int role = role_of(key, v);
        if (role < 0 || (d[0] != R_EMPTY && d[0] != role)) return 0;
        if (d[0] == R_EMPTY) {
            if (role != R_ATTR && s->role_dict[role] >= 0) return 0;
            if (role != R_ATTR) s->role_dict[role] = dict;
            d[0] = role;
            d[1] = s->entries.len / 2;
        }
        if (role == R_ATTR) {
            if (d[1] + d[2] != s->entries.len / 2) return 0; /* an attribute dict's pairs in a run */
            if (!put_value(&s->entries, key) || !put_value(&s->entries, v)) return 0;
            d = I64(s->dicts) + dict * 3;
            d[2]++;
        } else if (role == R_ITEMS) {
            int64_t row[3] = {key.a, key.b, v.kind == V_TENSOR ? v.a : -1};
            if (!put(&s->out[CS_DCP_ITEMS], row, 3)) return 0;
        } else if (role == R_STORAGE) {
            const int64_t *k = I64(s->index) + key.a * 4, *info = I64(s->info) + v.a * 4;
            int64_t row[8] = {k[0], k[1], k[2], k[3], info[0], info[1], info[2], info[3]};
            if (!put(&s->out[CS_DCP_STORAGE], row, 8)) return 0;
        } else {
            int64_t first = s->out[CS_DCP_PATHS].len / 3, count = v.b;
            if (!count) return 0; /* dcp_metadata refuses an empty path */
            for (int64_t j = 0; j < count; j++) {
                value e = v.kind == V_INTS ? VAL(V_INT, 0, I64(s->out[CS_DCP_POOL])[v.a + j], 0)
                                           : ((value *)s->items.data)[v.a + j];
                int64_t path[3] = {e.kind == V_STR ? 0 : 1, e.a, e.kind == V_STR ? e.b : 0};
                if ((e.kind != V_STR && e.kind != V_INT) || !put(&s->out[CS_DCP_PATHS], path, 3)) return 0;
            }
            int64_t row[4] = {key.a, key.b, first, count};
            if (!put(&s->out[CS_DCP_PLANNER], row, 4)) return 0;
        }
    }
    s->stack.len = from;
    return 1;
}

static int string(scanner *s, int64_t width) {
    if (!need(s, width)) return 0;
    int64_t len = width == 4 ? (int64_t)u32(s->p + s->pos) : s->p[s->pos];
    s->pos += width;
    if (!need(s, len) || len > MAX_COUNT) return 0;
    for (int64_t i = 0; i < len; i++)
        if (s->p[s->pos + i] & 0x80) return 0; /* ASCII only: the reference decodes the rest */
    s->pos += len;
    return push(s, VAL(V_STR, 0, s->pos - len, len));
}

static int step(scanner *s) {
    if (!need(s, 1)) return 0;
    uint8_t op = s->p[s->pos++];
    int64_t from = base(s), top = s->stack.len;
    const uint8_t *q = s->p + s->pos;
    switch (op) {
    case 0x80: /* PROTO */
        if (!need(s, 1) || q[0] < 2 || q[0] > 5) return 0;
        s->pos++;
        return 1;
    case 0x95: { /* FRAME */
        if (!need(s, 8)) return 0;
        uint64_t size = 0;
        for (int i = 7; i >= 0; i--) size = size << 8 | q[i];
        s->pos += 8;
        return size <= (uint64_t)(s->n - s->pos);
    }
    case '}': return new_container(s, &s->dicts, 3, V_DICT);
    case ']': return new_container(s, &s->lists, 2, V_LIST);
    case ')': return push(s, VAL(V_INTS, 0, 0, 0));
    case 'N': return push(s, VAL(V_NONE, 0, 0, 0));
    case 0x88: return push(s, VAL(V_BOOL, 0, 1, 0));
    case 0x89: return push(s, VAL(V_BOOL, 0, 0, 0));
    case 'K': return need(s, 1) && ++s->pos && push(s, VAL(V_INT, 0, q[0], 0));
    case 'M': return need(s, 2) && (s->pos += 2) && push(s, VAL(V_INT, 0, q[0] | q[1] << 8, 0));
    case 'J': return need(s, 4) && (s->pos += 4) && push(s, VAL(V_INT, 0, (int32_t)u32(q), 0));
    case 0x8a: { /* LONG1 of at most 8 bytes */
        if (!need(s, 1) || q[0] > 8 || !need(s, 1 + q[0])) return 0;
        int64_t len = q[0];
        uint64_t v = 0;
        for (int64_t i = len - 1; i >= 0; i--) v = v << 8 | q[1 + i];
        if (len > 0 && len < 8 && (q[len] & 0x80)) v |= ~UINT64_C(0) << (8 * len);
        s->pos += 1 + len;
        return push(s, VAL(V_INT, 0, (int64_t)v, 0));
    }
    case 'X': return string(s, 4);
    case 0x8c: return string(s, 1);
    case 0x93: return stack_global(s);
    case 'c': return text_global(s);
    case 'q': return need(s, 1) && ++s->pos && memo_put(s, q[0]);
    case 'r': return need(s, 4) && (s->pos += 4) && memo_put(s, u32(q));
    case 0x94: return memo_put(s, s->memo.len);
    case 'h': return need(s, 1) && ++s->pos && memo_get(s, q[0]);
    case 'j': return need(s, 4) && (s->pos += 4) && memo_get(s, u32(q));
    case '(':
        if (s->nframes >= MAX_FRAMES || s->nframes + 2 >= s->max_depth) return 0;
        s->frames[s->nframes++] = top;
        return 1;
    case 't':
        if (!s->nframes) return 0;
        s->nframes--;
        return make_tuple(s, from);
    case 0x85:
    case 0x86:
    case 0x87:
        if (top - from < op - 0x84) return 0;
        return make_tuple(s, top - (op - 0x84));
    case 'R': return call(s, 0);
    case 0x81: return call(s, 1);
    case 'b': return build(s);
    case 'a':
        if (top - from < 2) return 0;
        return append(s, top - 1, top - 2);
    case 'e':
        if (!s->nframes) return 0;
        s->nframes--;
        return append(s, from, base(s) == from ? -1 : from - 1);
    case 's':
        if (top - from < 3) return 0;
        return set_items(s, top - 2, top - 3);
    case 'u':
        if (!s->nframes) return 0;
        s->nframes--;
        return set_items(s, from, base(s) == from ? -1 : from - 1);
    default: return 0;
    }
}

int cs_dcp(const uint8_t *data, int64_t len, int64_t max_memo, int64_t max_depth, cs_dcp_result *out) {
    memset(out, 0, sizeof *out);
    if (max_depth < 16 || max_memo < 16) return CS_REFUSED;
    scanner s;
    memset(&s, 0, sizeof s);
    s.p = data;
    s.n = len;
    s.max_memo = max_memo;
    s.max_depth = max_depth;
    for (int i = 0; i < 5; i++) s.role_dict[i] = -1;
    int status = CS_REFUSED;
    while (s.pos < s.n) {
        if (s.p[s.pos] == '.') {
            s.pos++;
            if (s.nframes == 0 && s.stack.len == 1 && V(&s)[0].kind == V_ROOT) status = CS_DONE;
            break;
        }
        if (!step(&s)) break;
    }
    vec *scratch[] = {&s.stack, &s.memo, &s.items, &s.entries, &s.dicts, &s.lists, &s.index, &s.info};
    for (size_t i = 0; i < sizeof scratch / sizeof *scratch; i++) free(scratch[i]->data);
    out->end = s.pos;
    for (int i = 0; i < CS_DCP_TABLES; i++) {
        if (status == CS_DONE) {
            out->tables[i] = s.out[i].data;
            out->lens[i] = s.out[i].len;
        } else {
            free(s.out[i].data);
        }
    }
    return status;
}

void cs_dcp_free(cs_dcp_result *result) {
    for (int i = 0; i < CS_DCP_TABLES; i++) free(result->tables[i]);
    memset(result, 0, sizeof *result);
}
