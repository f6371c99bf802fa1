/* The DCP scanner's second part (see _cscan_dcp.c): what BUILD makes of torch's DCP classes (TensorStorageMetadata,
 * TensorProperties, ChunkStorageMetadata, MetadataIndex, _StorageInfo, Metadata) from their attribute dicts, with
 * dcp_records' checks (refused where one would fail); torch.Size and inert calls; a tensor's chunk list; the dicts'
 * items, into the rows of state_dict_metadata, planner_data and storage_data. */
#include "_cscan_dcp.h"

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
    int64_t header[4] = {has_version == V_STR ? version.a : -1, has_version == V_STR ? version.b : -1, planner == 1,
                         0};
    return put(&s->out[CS_DCP_HEADER], header, 4);
}

int dcp_build(scanner *s) {
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

int dcp_call(scanner *s, int newobj) {
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

int dcp_append(scanner *s, int64_t from, int64_t target) {
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

int dcp_set_items(scanner *s, int64_t from, int64_t target) {
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